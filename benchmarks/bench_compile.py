"""Compile time and the kernel cache: a new process's first fused forward+backward call with a
cold cache directory, then with the warm one.

Run: `python benchmarks/bench_compile.py [loss ...]`. Each measurement is a fresh process.
"""
import json
import os
import subprocess
import sys
import tempfile

CHILD = r"""
import time, json, sys
t0 = time.perf_counter()
import torch, autogen
from autogen.bench import inputs, OPTIONS
from autogen import functional as AF
imported = time.perf_counter() - t0
t0 = time.perf_counter()
from numba.core.registry import cpu_target
cpu_target.target_context.refresh()  # numba's one-time target setup (~0.3 s), paid by any first kernel
numba_init = time.perf_counter() - t0
name = sys.argv[1]
args = inputs(name, 1 << 16)
with autogen.policy("aggressive"):
    t0 = time.perf_counter()
    out = getattr(AF, name)(*args, **OPTIONS.get(name, {}), use_autogen=True)
    out.backward()
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    out = getattr(AF, name)(*args, **OPTIONS.get(name, {}), use_autogen=True)
    out.backward()
    second = time.perf_counter() - t0
print(json.dumps({"import": imported, "numba_init": numba_init, "first": first, "second": second}))
"""


def run(name, cache):
    env = dict(os.environ, AUTOGEN_CACHE_DIR=cache)
    proc = subprocess.run([sys.executable, "-P", "-c", CHILD, name], capture_output=True, text=True, env=env,
                          cwd=tempfile.gettempdir())
    if proc.returncode:
        raise SystemExit(proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main():
    names = sys.argv[1:] or ["mse_loss", "huber_loss", "cross_entropy", "kl_div", "triplet_margin_loss",
                             "cosine_embedding_loss"]
    print("first fused forward+backward call in a new process (65K elements), seconds: cold and warm kernel "
          "cache; numba's one-time target setup timed apart (init), as no cache can save it")
    print(f"{'loss':30s} {'cold':>7s} {'warm':>7s} {'cold/warm':>9s} {'+init cold':>10s} {'+init warm':>10s} "
          f"{'ratio':>6s} {'init':>6s} {'import':>7s}")
    for name in names:
        with tempfile.TemporaryDirectory() as cache:
            cold = run(name, cache)
            warm = run(name, cache)
        ci, wi = cold["first"] + cold["numba_init"], warm["first"] + warm["numba_init"]
        print(f"{name:30s} {cold['first']:7.2f} {warm['first']:7.3f} {cold['first'] / warm['first']:8.1f}x "
              f"{ci:10.2f} {wi:10.3f} {ci / wi:5.1f}x {warm['numba_init']:6.2f} {warm['import']:7.2f}")


if __name__ == "__main__":
    main()

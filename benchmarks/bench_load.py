"""Latency under load: each fused loss's and torch's forward+backward median with one busy process beside it,
over the quiet median, per runtime setting (issue: no latency cliffs when the cores are shared).

Run: `python benchmarks/bench_load.py [--reps N] [--configs default,passive,...] [--json PATH]`.
Each setting runs in a child process of its own (the OpenMP runtimes read their environment at start):

    default     torch's and numba's threads as they come (the cores), their runtimes' own wait policy
    passive     OMP_WAIT_POLICY=passive: idle OpenMP threads sleep instead of spinning (both runtimes)
    active      OMP_WAIT_POLICY=active: they spin
    numba-passive  OMP_WAIT_POLICY=passive for numba's runtime alone (set after torch's has loaded)
    numba-spin10k  GOMP_SPINCOUNT=10000 for numba's runtime alone: a short spin, then sleep
    workqueue   NUMBA_THREADING_LAYER=workqueue: numba's own thread pool instead of OpenMP
    threads1    one thread for torch and numba
    par64k      generated kernels' prange variant from 64K elements (executor's default is 256K)
    par1m       from 1M elements

Cases: mse_loss at 32K and 4M elements (the generated kernel, policy aggressive), cross_entropy on (8192, 512)
rows (the handwritten kernel) and a soft Dice @autogen_loss at 1M elements (a multi-pass generated kernel),
each beside the same call of torch's own loss. A ratio above 1.5, or above torch's own, is a cliff.
"""
import argparse
import json
import os
import subprocess
import sys

CONFIGS = {
    "default": {},
    "passive": {"OMP_WAIT_POLICY": "passive"},
    "active": {"OMP_WAIT_POLICY": "active"},
    "workqueue": {"NUMBA_THREADING_LAYER": "workqueue"},
    "threads1": {"OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"},
    "numba-passive": {"AUTOGEN_BENCH_NUMBA_ENV": "OMP_WAIT_POLICY=passive"},
    "numba-spin10k": {"AUTOGEN_BENCH_NUMBA_ENV": "GOMP_SPINCOUNT=10000"},
    "par64k": {"AUTOGEN_BENCH_PAR": str(1 << 16)},
    "par1m": {"AUTOGEN_BENCH_PAR": str(1 << 20)},
}

CHILD = r"""
import json, os, subprocess, sys
import torch, torch.nn.functional as TF
# numba's OpenMP runtime is a libgomp of its own, loaded at its first parallel kernel: set after torch's loaded
numba_env = dict(kv.split("=") for kv in os.environ.get("AUTOGEN_BENCH_NUMBA_ENV", "").split(",") if kv)
os.environ.update(numba_env)
import autogen
from autogen import launch
from autogen.corpus import SoftDice
from autogen.timing import fwd_bwd, measure
if os.environ.get("AUTOGEN_BENCH_PAR"):
    launch._PAR_ELEMENTS = int(os.environ["AUTOGEN_BENCH_PAR"])
reps = int(sys.argv[1])
torch.manual_seed(0)
def pair(n):
    return torch.randn(n, requires_grad=True), torch.randn(n)
x32, y32 = pair(1 << 15)
x4m, y4m = pair(1 << 22)
logits, t = torch.randn(8192, 512, requires_grad=True), torch.randint(0, 512, (8192,))
dl, dt = torch.randn(16, 4, 128, 128, requires_grad=True), (torch.rand(16, 4, 128, 128) > 0.5).float()
dice = SoftDice(use_autogen=True)
eager_dice = SoftDice(use_autogen=False)
cases = {
    "mse 32K": ((x32, y32), lambda a, b: autogen.functional.mse_loss(a, b, use_autogen=True), TF.mse_loss),
    "mse 4M": ((x4m, y4m), lambda a, b: autogen.functional.mse_loss(a, b, use_autogen=True), TF.mse_loss),
    "ce 8192x512": ((logits, t), lambda a, b: autogen.functional.cross_entropy(a, b, use_autogen=True), TF.cross_entropy),
    "dice 1M": ((dl, dt), dice, eager_dice),
}
fns = {}
for name, (args, mine, theirs) in cases.items():
    fns[name + "|ours"] = fwd_bwd(mine, args)
    fns[name + "|torch"] = fwd_bwd(theirs, args)
autogen.set_policy("aggressive")
quiet = measure(fns, reps)
for k in numba_env:
    os.environ.pop(k)  # the busy process and any other child: their own runtimes' defaults
busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
try:
    loaded = measure(fns, reps)
finally:
    busy.kill()
out = {}
for key in fns:
    name, who = key.split("|")
    out.setdefault(name, {})[who] = {"quiet_ms": quiet[key]["median"] * 1e3, "loaded_ms": loaded[key]["median"] * 1e3}
import numba
out["_layer"] = numba.threading_layer() if hasattr(numba, "threading_layer") else None
out["_threads"] = [torch.get_num_threads(), numba.get_num_threads()]
print(json.dumps(out))
"""


def run(config, reps):
    env = dict(os.environ, **CONFIGS[config])
    proc = subprocess.run([sys.executable, "-P", "-c", CHILD, str(reps)], env=env, capture_output=True, text=True,
                          cwd="/")
    if proc.returncode:
        raise RuntimeError(f"{config}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=21)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)
    results = {}
    print(f"{'setting':10s} {'case':12s} {'ours quiet':>10s} {'loaded':>8s} {'ratio':>6s}   "
          f"{'torch quiet':>11s} {'loaded':>8s} {'ratio':>6s}   layer, threads")
    for config in args.configs.split(","):
        res = results[config] = run(config, args.reps)
        for case, r in res.items():
            if case.startswith("_"):
                continue
            o, t = r["ours"], r["torch"]
            print(f"{config:10s} {case:12s} {o['quiet_ms']:10.3f} {o['loaded_ms']:8.3f} "
                  f"{o['loaded_ms'] / o['quiet_ms']:6.2f}   {t['quiet_ms']:11.3f} {t['loaded_ms']:8.3f} "
                  f"{t['loaded_ms'] / t['quiet_ms']:6.2f}   {res['_layer']}, {res['_threads']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()

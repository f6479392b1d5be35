"""Nonlinearities in place with a gradient: torch's in-place op against ours, forward+backward.

In place with a gradient our path copies the input first (the kernel keeps it for backward) and copies the
result back: two passes over memory more than torch's in-place op. This measures, for each nonlinearity
whose torch function takes `inplace` and whose activations.FASTER_FROM size with a gradient is finite (the
ones policy medium would otherwise send to our kernel), eager / ours (its size tables off) on a non-leaf
input (`x * 1`, as a layer's output; the same op on both sides), at 64K-4M float32 elements, on one thread
(CPU time) and on torch's threads (wall time), in both allocator states (glibc's page faults taken out in a
child process, as `autogen bench` does). It prints activations.FASTER_FROM_INPLACE: the size from which
ours was faster in every setting at every size measured from there up.

Run: `python benchmarks/bench_inplace.py [--reps 15] [name ...]`
"""
import argparse
import inspect
import json
import os
import sys
import time

import torch  # noqa: E402
import torch.nn.functional as TF  # noqa: E402

import autogen  # noqa: E402
from autogen import activations, bench  # noqa: E402
from autogen import functional as AF  # noqa: E402

SIZES = (1 << 16, 1 << 18, 1 << 20, 1 << 22)


def _takes_inplace(fn):
    try:
        return "inplace" in inspect.signature(fn).parameters
    except ValueError:  # a builtin (F.logsigmoid): no `inplace`
        return False


def candidates():
    """The nonlinearities torch runs in place whose FASTER_FROM size with a gradient is finite."""
    return [name for name, (grad, _) in activations.FASTER_FROM.items()
            if grad is not None and _takes_inplace(getattr(TF, name))]


def _step(fn, x, g):
    def run():
        x.grad = None
        fn(x * 1.0, inplace=True).backward(g)
    return run


def child(names, sizes, reps, threads):
    """eager / ours per name and size, in this process's allocator state."""
    torch.set_num_threads(threads)
    clock = time.thread_time if threads == 1 else time.perf_counter
    saved, activations.FASTER_FROM = activations.FASTER_FROM, None  # ours at every size
    try:
        return _ratios(names, sizes, reps, clock)
    finally:
        activations.FASTER_FROM = saved


def _ratios(names, sizes, reps, clock):
    out = {}
    for name in names:
        for n in sizes:
            x, g = torch.randn(n, requires_grad=True), torch.ones(n)
            ours = getattr(AF, name)

            def medium(y, inplace):
                with autogen.policy("medium"):
                    return ours(y, inplace=inplace)
            fns = {"eager": _step(getattr(TF, name), x, g), "ours": _step(medium, x, g)}
            for _ in range(3):
                for f in fns.values():
                    f()
            st = bench.measure(fns, bench.reps_for(n, reps), clock)
            out[f"{name} {n}"] = st["eager"]["median"] / st["ours"]["median"]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--sizes", type=bench._sizes, default=list(SIZES), help="e.g. 64K,1M (default 64K-4M)")
    ap.add_argument("names", nargs="*")
    args = ap.parse_args(argv)
    names, sizes = args.names or candidates(), args.sizes
    settings = [(f"{threads}t {state}", bench.child_json([sys.executable, os.path.abspath(__file__), "--child",
                                                          json.dumps([names, sizes, args.reps, threads])], env))
                for threads, state, env in bench.settings()]
    print(f"in place with a gradient, float32: eager / ours (>1: ours is faster), per setting "
          f"({', '.join(s for s, _ in settings)})")
    table = {}
    for name in names:
        first = bench.faster_from(sizes, lambda n: all(r[f"{name} {n}"] > 1.0 for _, r in settings))
        cells = [f"{bench._size_label(n)}: " + "/".join(f"{r[f'{name} {n}']:.2f}" for _, r in settings) for n in sizes]
        print(f"{name:12s} " + "  ".join(cells))
        if first is not None:
            table[name] = first
    print("FASTER_FROM_INPLACE = {" + ", ".join(f'"{k}": 1 << {v.bit_length() - 1}' for k, v in table.items()) + "}")
    return table


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        print(json.dumps(child(*json.loads(sys.argv[2]))))
    else:
        main()

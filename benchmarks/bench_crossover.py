"""Where our kernels start to beat torch eager: forward+backward time ratio by input size.

Run: `python benchmarks/bench_crossover.py [loss ...]`. The size thresholds below which autogen.functional
hands a loss to torch's own kernel (functional.SMALL_ELEMENTS) come from this table.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from autogen.bench import VARIANTS, fwd_bwd, inputs, timed  # noqa: E402

from autogen import functional as AF  # noqa: E402

SIZES = [1 << 10, 1 << 13, 1 << 15, 1 << 17, 1 << 19, 1 << 20, 1 << 22]


def main():
    AF.SMALL_ELEMENTS = dict.fromkeys(AF.SMALL_ELEMENTS, 0)  # measure our kernels at every size
    print("eager time / our default-path time, forward+backward (>1: ours is faster)")
    print(f"{'loss':34s} " + " ".join(f"{n:>9d}" for n in SIZES))
    for name in sys.argv[1:] or AF.LOSSES:
        ratios = []
        for n in SIZES:
            args = inputs(name, n)
            reps = max(10, min(200, (1 << 22) // n))
            eager = timed(fwd_bwd(VARIANTS["eager"](name), args), reps)["median"]
            ours = timed(fwd_bwd(VARIANTS["default"](name), args), reps)["median"]
            ratios.append(eager / ours)
        print(f"{name:34s} " + " ".join(f"{r:9.2f}" for r in ratios))


if __name__ == "__main__":
    main()

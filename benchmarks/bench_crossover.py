"""Where our kernels start to beat torch eager: time ratio by input size.

Run: `python benchmarks/bench_crossover.py [--fwd] [loss ...]`. The size thresholds below which
autogen.functional hands a loss to torch's own kernel come from this table: forward+backward for
functional.SMALL_ELEMENTS, forward only (--fwd, under torch.no_grad) for functional.SMALL_ELEMENTS_NO_GRAD.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from autogen.bench import VARIANTS, fwd_bwd, fwd_only, inputs, measure  # noqa: E402

from autogen import functional as AF  # noqa: E402

SIZES = [1 << 10, 1 << 13, 1 << 15, 1 << 17, 1 << 19, 1 << 20, 1 << 22]


def main():
    argv = sys.argv[1:]
    fwd = "--fwd" in argv
    names = [a for a in argv if a != "--fwd"] or AF.LOSSES
    mode = fwd_only if fwd else fwd_bwd
    # measure our kernels at every size
    AF.SMALL_ELEMENTS = AF.SMALL_ELEMENTS_NO_GRAD = dict.fromkeys(AF.SMALL_ELEMENTS, 0)
    print(f"eager time / our default-path time, {'forward only' if fwd else 'forward+backward'} (>1: ours is faster)")
    print(f"{'loss':34s} " + " ".join(f"{n:>9d}" for n in SIZES))
    for name in names:
        ratios = []
        for n in SIZES:
            args = inputs(name, n)
            reps = max(10, min(200, (1 << 22) // n))
            st = measure({"eager": mode(VARIANTS["eager"](name), args), "ours": mode(VARIANTS["default"](name), args)},
                         reps)  # interleaved
            ratios.append(st["eager"]["median"] / st["ours"]["median"])
        print(f"{name:34s} " + " ".join(f"{r:9.2f}" for r in ratios), flush=True)


if __name__ == "__main__":
    main()

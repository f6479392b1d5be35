"""What the rendered loss fronts (templates/front.py.j2) save per call against a plain closure over *args.

Run: `python benchmarks/bench_fronts.py [--elems 1024] [--rounds 30]`. At a small size every variant goes to
torch's own kernel; the rendered front calls the ATen op with the loss's own signature, a plain front (the same
size gate, then torch.nn.functional's Python function with the arguments as given) pays that function's
wrapper. Prints microseconds a call, best and median of the rounds, interleaved.
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as TF

import autogen
from autogen import functional as AF
from autogen.policies import calm, thread_state

CASES = {"mse_loss": lambda n: (torch.randn(n), torch.randn(n)),
         "huber_loss": lambda n: (torch.randn(n), torch.randn(n)),
         "cross_entropy": lambda n: (torch.randn(n // 10, 10), torch.randint(0, 10, (n // 10,)))}


def plain_front(name):
    """A front as a plain closure: functional's one size gate, then torch's Python function."""
    full, torch_fn = getattr(AF, name), getattr(TF, name)

    def front(input, target, *args, use_autogen=False, **kwargs):
        if type(input) is torch.Tensor and type(target) is torch.Tensor and AF._small(name, input, target):
            out = torch_fn(input, target, *args, **kwargs)
            return out if calm[0] or not thread_state.recorders else out
        return full(input, target, *args, use_autogen=use_autogen, **kwargs)
    return front


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--elems", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args(argv)
    print(f"{autogen.__version__}: {args.elems} elements, us a call (best / median of {args.rounds} rounds)")
    for name, make in CASES.items():
        x, y = make(args.elems)
        ours, plain, theirs = getattr(AF, name), plain_front(name), getattr(TF, name)
        variants = {"rendered": lambda: ours(x, y), "plain": lambda: plain(x, y), "torch": lambda: theirs(x, y),
                    "rendered, sum": lambda: ours(x, y, reduction="sum"),
                    "plain, sum": lambda: plain(x, y, reduction="sum")}
        times = {k: [] for k in variants}
        for fn in variants.values():
            for _ in range(args.calls):
                fn()
        for _ in range(args.rounds):
            for k, fn in variants.items():
                t0 = time.perf_counter()
                for _ in range(args.calls):
                    fn()
                times[k].append((time.perf_counter() - t0) / args.calls * 1e6)
        print(f"{name:14s} " + "  ".join(f"{k} {min(v):.2f}/{statistics.median(v):.2f}" for k, v in times.items()))


if __name__ == "__main__":
    main()

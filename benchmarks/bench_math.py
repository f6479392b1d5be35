"""Our math library's functions against ATen's vectorized ones: time per element on one thread.

Each of autogen.mathlib's functions (what every generated and handwritten kernel calls: exp, expm1, log,
log1p, log1pexp, tanh, sigmoid, erf) in a numba loop over a cache-resident array, with the kernels' own
compile flags, and gelu's kernels (their own float32 erf), against torch's op for the same function writing
into a preallocated output (`out=`), both on one thread (torch.set_num_threads(1); CPU time of the thread),
float32 and float64. A ratio over 1: ours is faster. Kernel math that is slower than ATen's here makes a
nonlinearity or loss built on it slower than eager however few passes over memory it saves.

Run: `python benchmarks/bench_math.py [--elems 64K] [--reps 7] [--dtypes float32,float64] [fn ...]`
"""
import os
import statistics
import sys
import time

import numba  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from autogen import mathlib  # noqa: E402

_nn = torch._C._nn
# function -> (torch's op writing into `out`, the input range: where a training step's values fall)
FUNCTIONS = {
    "exp": (lambda x, out: torch.exp(x, out=out), (-10.0, 10.0)),
    "expm1": (lambda x, out: torch.expm1(x, out=out), (-10.0, 10.0)),
    "log": (lambda x, out: torch.log(x, out=out), (1e-3, 1e3)),
    "log1p": (lambda x, out: torch.log1p(x, out=out), (-0.5, 1e3)),
    "log1pexp": (lambda x, out: _nn.softplus(x, 1.0, 20.0, out=out), (-20.0, 20.0)),  # softplus, beta 1
    "tanh": (lambda x, out: torch.tanh(x, out=out), (-5.0, 5.0)),
    "sigmoid": (lambda x, out: torch.sigmoid(x, out=out), (-10.0, 10.0)),
    "erf": (lambda x, out: torch.special.erf(x, out=out), (-4.0, 4.0)),
    # gelu's kernels bring their own float32 erf: torch's float32 gelu (oneDNN's) against them, forward and
    # backward (grad_output 1)
    "gelu": (lambda x, out: _nn.gelu(x, out=out), (-6.0, 6.0)),
    "gelu_backward": (lambda x, out: torch.ops.aten.gelu_backward.grad_input(_ones(x), x, grad_input=out),
                      (-6.0, 6.0)),
}
_ONES = {}


def _ones(x):
    """A grad_output of ones like x (a tensor or an array), made once per kind, size and dtype: made per call,
    its allocation would be timed with the op."""
    key = (type(x), x.shape, str(x.dtype))
    if key not in _ONES:
        _ONES[key] = torch.ones_like(x) if isinstance(x, torch.Tensor) else np.ones_like(x)
    return _ONES[key]


def _gelu(backward):
    """x -> out through the gelu kernel (backward: its gradient for grad_output 1)."""
    from autogen.kernels.nonlinear import _gelu_kernels

    def loop(x, out):
        kernel = _gelu_kernels(x.dtype.type, False)[backward]
        blocks = -(-x.size // (1 << 14))
        if backward:
            kernel(0, blocks, x, _ones(x), out)
        else:
            kernel(0, blocks, x, out)
    return loop


def _loop(fn):
    """x -> out elementwise through mathlib's `fn`, compiled as the kernels are."""
    @numba.njit(nogil=True, fastmath=mathlib.KERNEL_FASTMATH, error_model="numpy")
    def loop(x, out):
        for i in range(x.size):
            out[i] = fn(x[i])
    return loop


def _best(call, number, reps):
    """Fastest of `reps` runs of `number` calls, seconds a call (CPU time of this thread)."""
    times = []
    for _ in range(reps):
        t0 = time.thread_time()
        for _ in range(number):
            call()
        times.append((time.thread_time() - t0) / number)
    return min(times)


def measure(name, dtype, n, reps, number=None):
    """(torch's ns an element, ours, the largest difference of ours from torch's in units of torch's value
    where it is over 1, absolute below)."""
    op, (lo, hi) = FUNCTIONS[name]
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, generator=g, dtype=torch.float64).mul_(hi - lo).add_(lo).to(dtype)
    ref, out = torch.empty_like(x), torch.empty_like(x)
    loop = _gelu(name == "gelu_backward") if name.startswith("gelu") else _loop(getattr(mathlib, name))
    xa, oa = x.numpy(), out.numpy()
    loop(xa, oa)
    op(x, ref)
    number = number or max(10, (1 << 24) // n)
    ours, theirs = [], []
    for _ in range(3):  # alternated, so that a slow spell of the machine falls on both
        theirs.append(_best(lambda: op(x, ref), number, reps))
        ours.append(_best(lambda: loop(xa, oa), number, reps))
    err = ((out - ref).abs() / ref.abs().clamp_min(1.0)).max().item()
    return statistics.median(theirs) / n * 1e9, statistics.median(ours) / n * 1e9, err


def main():
    argv = sys.argv[1:]
    from autogen.bench import _sizes
    n = _sizes(argv[argv.index("--elems") + 1])[0] if "--elems" in argv else 1 << 16
    reps = int(argv[argv.index("--reps") + 1]) if "--reps" in argv else 7
    dtypes = argv[argv.index("--dtypes") + 1].split(",") if "--dtypes" in argv else ["float32", "float64"]
    values = {argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("--elems", "--reps", "--dtypes")}
    names = [a for a in argv if not a.startswith("--") and a not in values] or list(FUNCTIONS)
    torch.set_num_threads(1)
    print(f"mathlib against ATen, one thread, {n} elements (cache-resident), ns an element (CPU time of the thread); "
          f"torch/ours > 1: ours is faster; diff: largest |ours - torch| / max(|torch|, 1)")
    print(f"{'function':13s} {'dtype':8s} {'torch':>7s} {'ours':>7s} {'torch/ours':>10s} {'diff':>9s}")
    for name in names:
        for dt in dtypes:
            theirs, ours, err = measure(name, getattr(torch, dt), n, reps)
            print(f"{name:13s} {dt:8s} {theirs:7.3f} {ours:7.3f} {theirs / ours:10.2f} {err:9.1e}", flush=True)


if __name__ == "__main__":
    main()

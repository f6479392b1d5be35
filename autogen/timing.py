"""Timing and memory of the benchmark's calls: interleaved repetitions, forward and backward as a training step
runs them, a call's peak resident memory (autogen bench and autogen bench --train use these)."""
import ctypes
import gc
import random
import statistics
import time

import torch

from .pool import empty_cache


def _stats(times):
    times = sorted(times)
    return {"median": statistics.median(times), "p20": times[len(times) // 5], "p80": times[(4 * len(times)) // 5]}


def timed(fn, reps):
    """One callable alone (median, p20, p80 of reps calls after two warm-up calls)."""
    return measure({"_": fn}, reps)["_"]


def measure(fns, reps, clock=time.perf_counter):
    """Interleaved repetitions: each round calls every variant once, in a fresh random order (seeded:
    the same in every run), so a slow spell of this shared machine falls on all variants alike and no
    variant always runs after the same one. A fixed cycle did that: the fused kernel always ran after
    the op-by-op path, paying for the dirty cache it leaves, and eager after the light default path
    (docs/performance.md has the figures)."""
    for fn in fns.values():  # compile / warm up
        fn()
        fn()
    keys = list(fns)
    times = {k: [] for k in keys}
    rng = random.Random(0)
    for _ in range(reps):
        order = keys[:]
        rng.shuffle(order)
        for k in order:
            t0 = clock()
            fns[k]()
            times[k].append(clock() - t0)
    return {k: _stats(v) for k, v in times.items()}


def fwd_bwd(fn, args):
    """Forward, then backward as a training step runs it: .grad set to None (zero_grad's default), then
    out.backward(), which makes the gradient .grad. torch.autograd.grad would hide a copy .backward()
    makes of a gradient that something else still holds (our fused losses did that until this harness
    used .backward())."""
    grad_out = []
    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]

    def run():
        for a in leaves:
            a.grad = None
        out = fn(*args)
        if not grad_out:
            grad_out.append(torch.ones_like(out))
        out.backward(grad_out[0])
    return run


def fwd_only(fn, args):
    def run():
        with torch.no_grad():
            fn(*args)
    return run


MODES = {"fwd+bwd": fwd_bwd, "fwd": fwd_only}

try:
    _libc = ctypes.CDLL(None)
    _malloc_trim = _libc.malloc_trim
except (OSError, AttributeError):  # not glibc
    _malloc_trim = None


def _status_kb(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise OSError(field)


def peak_mb(fn):
    """Peak resident memory one call adds (MB): the allocator's free memory handed back first, the
    kernel's high-water mark reset (/proc/self/clear_refs), then VmHWM - VmRSS. None off Linux."""
    try:
        gc.collect()
        empty_cache()  # our pool's free buffers too: a call's outputs count as new memory
        if _malloc_trim is not None:
            _malloc_trim(0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        before = _status_kb("VmRSS")
        fn()
        return max(_status_kb("VmHWM") - before, 0) / 1024
    except OSError:
        return None


def reps_for(n, base):
    """More repetitions for small inputs (their calls are short and noisier)."""
    return base * max(1, min(20, (1 << 20) // max(n, 1)))


# -- variants ----------------------------------------------------------------------------------

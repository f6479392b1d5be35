"""torch's argument and value checks of the losses, with torch's messages and error types: the fronts call
them, and an @autogen_loss trace defers the value checks (inline.defer) and runs them on its values later."""
import operator

import numba
import numpy as np
import torch

from . import inline
from .pool import host, NP_ZERO
from .mathlib import at
from .policies import thread_state


def broadcast_shapes(*shapes):
    """torch.broadcast_shapes for concrete shapes, without its first-call import of sympy (0.45 s)."""
    ndim = max((len(s) for s in shapes), default=0)
    out = [1] * ndim
    for shape in shapes:
        for i, size in enumerate(shape):
            j = ndim - len(shape) + i
            if size != 1 and out[j] != 1 and size != out[j]:
                raise RuntimeError(f"The size of tensor a ({out[j]}) must match the size of tensor b ({size}) at "
                                   f"non-singleton dimension {i}")
            if size != 1 or out[j] == 1:
                out[j] = size if size != 1 else out[j]
    return torch.Size(out)


def check_unit_interval(x, what):
    if thread_state.tracing and inline.active():
        return inline.defer("unit_interval", x, what)
    if not x.numel():
        return
    mem = small_values(x)
    if mem is not None:
        inside = _inside_unit(*mem)
    else:
        lo, hi = torch.aminmax(x.detach())
        inside = lo >= 0 and hi <= 1
    if not inside:  # NaN fails too, as in torch
        raise RuntimeError(f"all elements of {what} should be between 0 and 1")


_CHECKED = {dt: NP_ZERO[dt] for dt in (torch.float32, torch.float64)}  # dtypes a value check reads, their zero


def small_values(x):
    """(address, count, a zero of its dtype) of a small contiguous float32/float64 tensor, else None: a value
    check on it is one serial numba pass over its memory (~5-10 us less than torch ops; from its address, ~1 us
    less than a numpy view); a large one takes torch's vectorized threads."""
    n = x.numel()
    if n < 1 << 16 and x.is_contiguous() and x.is_cpu:
        zero = _CHECKED.get(x.dtype)
        if zero is not None:
            return x.data_ptr(), n, zero
    return None


@numba.njit(nogil=True, cache=True)
def _inside_unit(address, n, zero):
    a = numba.carray(at(address, zero), n)
    for i in range(n):
        if not (a[i] >= 0 and a[i] <= 1):
            return False
    return True


_TNAMES = {torch.float32: "Float", torch.float64: "Double", torch.float16: "Half", torch.bfloat16: "BFloat16",
           torch.int64: "Long", torch.int32: "Int", torch.int16: "Short", torch.int8: "Char", torch.uint8: "Byte",
           torch.bool: "Bool"}


def tname(dtype):
    """torch's C++ name of a dtype, as its error messages print it."""
    return _TNAMES.get(dtype, str(dtype).replace("torch.", ""))


def int_arg(op, name, position, value):
    """`value` as an int, as torch's argument parser takes one: a bool or a float is a TypeError, an int
    beyond int64 a ValueError (numba would fail to type it)."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        raise TypeError(f"{op}(): argument '{name}' (position {position}) must be int, not {type(value).__name__}")
    value = operator.index(value)
    if not -(1 << 63) <= value < (1 << 63):
        raise ValueError("Overflow when unpacking long long")
    return value


@numba.njit(nogil=True, cache=True)
def first_bad_target(t, C, ignore_index):
    """Index of the first target outside [0, C) that is not ignore_index (None: none is), or -1. The test
    pass has no early exit, so that it vectorizes; only a bad target pays for the search."""
    c = np.uint64(C)
    bad = False
    if ignore_index is None:
        for i in range(t.size):
            bad |= np.uint64(t[i]) >= c  # a negative index wraps above C
    else:
        for i in range(t.size):
            k = t[i]
            bad |= (k != ignore_index) & (np.uint64(k) >= c)
    if bad:
        for i in range(t.size):
            k = t[i]
            if (ignore_index is None or k != ignore_index) and (k < 0 or k >= C):
                return i
    return -1


@numba.njit(nogil=True, cache=True)
def _first_bad_target_at(address, n, C, ignore_index):
    """first_bad_target of the n int64 targets at `address` (a contiguous tensor's: no numpy view, ~1 us)."""
    return first_bad_target(numba.carray(at(address, np.int64(0)), n), C, ignore_index)


def check_targets(target, C, ignore_index):
    """Class-index targets as a contiguous int64 tensor, after torch's IndexError for one out of range."""
    if thread_state.tracing and inline.active():
        t = target.detach().long().contiguous()
        inline.defer("targets", t, C, ignore_index)
        return t
    t = host(target if target.dtype is torch.int64 else target.long())  # integers: never requires_grad
    if t.numel():
        i = _first_bad_target_at(t.data_ptr(), t.numel(), C, ignore_index)
        if i >= 0:
            raise IndexError(f"Target {int(t.view(-1)[i])} is out of bounds.")
    return t  # integer: never differentiated, so the detached tensor serves


def check_reduction(reduction, message="{} is not a valid value for reduction"):
    if reduction not in ("none", "mean", "sum"):
        raise ValueError(message.format(reduction))


def check_nonnegative(var):
    mem = small_values(var) if type(var) is torch.Tensor else None  # else torch's own error for a non-tensor
    if _any_negative(*mem) if mem is not None else torch.any(var < 0):
        raise ValueError("var has negative entry/entries")


@numba.njit(nogil=True, cache=True)
def _any_negative(address, n, zero):
    a = numba.carray(at(address, zero), n)
    for i in range(n):
        if a[i] < 0:
            return True
    return False


def check_margin_targets(target, C):
    if target.numel():
        if target.dtype is torch.int64 and target.is_contiguous() and target.is_cpu:  # one numba pass
            bad = _first_bad_target_at(target.data_ptr(), target.numel(), C, None)
        else:
            t = target.detach().reshape(-1)
            bad = 0 if bool(((t < 0) | (t >= C)).any()) else -1
        if bad >= 0:
            raise RuntimeError("target out of range")


inline.CHECKS.update(targets=check_targets, margin_targets=check_margin_targets, unit_interval=check_unit_interval)

"""Launching kernels: the generated kernel's launch plan (its entry point, arguments and outputs), threads and
their locks, the prange trampoline of the handwritten kernels, and tiled copies on our threads."""
import functools
import math
import os
import threading
import time
import warnings

import numba
import numpy as np
import torch

from . import compiler as _compiler
from .compiler import get_kernel
from .errors import AutogenError, CompileError
from .pool import FROM16, LOW16, NP_OUT, NP_STORAGE, NP_ZERO, POOL_MIN, TORCH_KIND, flat_np, host, pooled

def _memory_order(t):
    """t's dims by stride, largest first (size-1 dims last): t.permute of it is contiguous where t is dense."""
    return sorted(range(t.dim()), key=lambda d: (-t.stride(d), t.shape[d] == 1))


def _batched_transpose(t):
    """(P, X, Y) when `t` is a batched transpose of contiguous memory: its dims in order are P X Y, in memory
    P Y X (a channels-last tensor read channel-first: F.one_hot(t, C).movedim(-1, 1)); else None."""
    dims = [d for d in range(t.dim()) if t.shape[d] > 1]
    mem = [d for d in _memory_order(t) if t.shape[d] > 1]
    size = 1
    for d in reversed(mem):  # memory order must be dense
        if t.stride(d) != size:
            return None
        size *= t.shape[d]
    for p in range(len(dims)):
        for q in range(p + 1, len(dims)):
            if mem == dims[:p] + dims[q:] + dims[p:q]:
                return [math.prod(t.shape[d] for d in ds) for ds in (dims[:p], dims[p:q], dims[q:])]
    return None


_TILE = 16  # a tile's rows are 16 strided lines: more thrash L1 where the stride is a power of two


@numba.njit(nogil=True, cache=True)
def _transpose_tiles(lo, hi, s, d):
    """d[p, x, y] = s[p, y, x] over tiles [lo, hi) of _TILE rows y of one p."""
    P, Y, X = s.shape
    nty = (Y + _TILE - 1) // _TILE
    for k in range(lo, hi):
        p = k // nty
        y0 = (k - p * nty) * _TILE
        y1 = min(y0 + _TILE, Y)
        for x0 in range(0, X, _TILE):
            for x in range(x0, min(x0 + _TILE, X)):
                for y in range(y0, y1):
                    d[p, x, y] = s[p, y, x]


_INT_OF = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class _Copy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t, pxy):
        P, X, Y = pxy
        src = t.permute(_memory_order(t))
        out = torch.empty(t.shape, dtype=t.dtype)
        it = _INT_OF[t.element_size()]
        s = src.view(it).reshape(P, Y, X).numpy()
        split_run(_transpose_tiles, P * -(-Y // _TILE), (s, out.view(it).view(P, X, Y).numpy()), work=t.numel())
        return out

    @staticmethod
    def backward(ctx, g):
        return g, None


def contiguous(t):
    """t.contiguous(); a batched transpose (a channels-last tensor read channel-first) by tiles on our
    threads, where torch's strided copy is several times slower."""
    if t.is_contiguous():
        return t
    if not isinstance(t.numel(), int) or isinstance(t, torch._subclasses.FakeTensor):  # a trace: torch's op
        return t.contiguous()
    pxy = _batched_transpose(t) if t.numel() >= POOL_MIN // 4 and t.element_size() in _INT_OF else None
    if pxy is None or min(pxy[1:]) < _TILE or t.is_complex() or t.device.type != "cpu":
        return t.contiguous()
    return _Copy.apply(t, pxy)


_warned = set()


def warn_once(op, exc):
    key = (op, type(exc).__name__)
    if key not in _warned:
        _warned.add(key)
        warnings.warn(f"autogen: kernel for {op} failed ({type(exc).__name__}: {exc}); "
                      "using the torch fallback", RuntimeWarning, stacklevel=3)


def _signature(spec, dtype):
    """What run_spec needs from a spec, computed once: names, converters, output kinds."""
    sig = spec.memo.get("sig")
    if sig is None or sig[0] is not dtype:
        conv = {"i": np.int64, "b": np.bool_}
        sig = spec.memo["sig"] = (dtype, [x.attr for x in spec.inputs],
                           [(p.attr, conv.get(p.kind, NP_STORAGE[dtype])) for p in spec.params],
                           [(level, FROM16[spec.storage[j]] if j in spec.storage
                             else TORCH_KIND.get(node.kind, dtype)) for j, (node, level) in enumerate(spec.outputs)],
                           len(spec.reduce_all))
    return sig


@functools.lru_cache(maxsize=256)
def _no_parts(r):
    return np.empty((0, r), dtype=np.float64)  # read-only in effect: a kernel with no partial sums


def _parts(k, r):
    """The kernel's scratch of per-row partial sums, reused by this thread's next call of that shape (a
    fresh one of a large batch is megabytes the allocator may map anew: page faults in every call)."""
    key = (k, r)
    cached = _tls.parts
    if cached is None or cached[0] != key:
        cached = _tls.parts = (key, np.empty(key, dtype=np.float64))
    return cached[1]


def load_kernel(spec, parallel=False):
    """get_kernel, its failures as the engine's errors (a ScheduleError stays one)."""
    try:
        return get_kernel(spec, parallel=parallel)
    except AutogenError:
        raise
    except Exception as exc:  # noqa: BLE001 - rendering or loading failed: the caller falls back
        raise CompileError(f"{type(exc).__name__}: {exc}") from exc


class _Launch:
    """What launching a spec's kernel in one dtype needs, built at its first call: the serial kernel
    loaded, the argument order, the params' converters, each output's allocation (small ones as numpy
    arrays handed to torch: no torch.empty and .numpy() per output). After the first call it holds the
    compiled overload's entry point (numba's dispatcher resolves a dozen argument types on every call,
    ~2 us at 1K): used while each input has the element type that overload was compiled for (the only
    thing the key does not fix). Inputs go to the kernel as (address, length, zero of the element type)."""
    __slots__ = ("spec", "dtype", "fn", "entry", "in_dtypes", "names", "params", "outputs", "nparts", "kernels")

    def __init__(self, spec, dtype):
        self.spec = spec
        self.kernels = _compiler.compiled_kernels  # a new compiler cache (emptied) loads the kernel again
        self.fn = load_kernel(spec)
        self.entry, self.in_dtypes = None, ()
        self.dtype, self.names, self.params, outputs, self.nparts = _signature(spec, dtype)
        self.outputs = [(level, dt, NP_OUT.get(dt)) for level, dt in outputs]

    def run(self, prob, ins, params, shapes=()):
        """The kernel on `ins` (the spec's input tensors in its order) and `params` (name -> value); output j
        is shaped shapes[j] where given, else flat at its level. What depends only on the problem (its
        dimensions, converted params, each output's allocation) is bound to it at its first call here: a
        problem cached per call signature then pays only for the arrays and the kernel."""
        bounds = prob.memo.get("bounds")
        if bounds is None:
            bounds = prob.memo["bounds"] = {}  # per launch: a forward's and a backward's kernel alternate
        bound = bounds.get(self)
        if bound is None or bound[1] is not params or bound[2] != shapes:
            bound = bounds[self] = self._bind(prob, params, shapes)
        n, c, r, pvals, outputs, nparts = bound[3:]
        args = []
        entry = self.entry
        in_dtypes = self.in_dtypes
        held = []
        for k, t in enumerate(ins):  # each as its address, length and element type (codegen's kernel arguments)
            if not (t.is_contiguous() and t.is_cpu) or t.is_neg():  # read as one flat array: a contiguous copy
                # (a negative-bit view's values resolved), held through the call
                t = host(t)
                held.append(t)
            zero = NP_ZERO.get(t.dtype)
            if zero is None:  # another integer type, say: numpy's scalar of it
                zero = NP_ZERO[t.dtype] = t.new_empty(0).numpy().dtype.type(0)
            if entry and zero is not in_dtypes[k]:
                entry = None
            args += (t.data_ptr(), t.numel(), zero)
        args += pvals
        outs = []
        for small, shape, flat, npdt, dt, size in outputs:
            if small:  # numpy's allocation handed to torch: no torch.empty and .numpy() per output
                a = np.empty(shape, npdt)
                outs.append(torch.from_numpy(a))
                args.append(a if flat else a.ravel())
            else:
                o = pooled(size, dt, shape) if size is not None else torch.empty((), dtype=dt)
                outs.append(o)
                args.append(flat_np(o))
        args.append(_parts(nparts, r) if nparts else _no_parts(r))
        fn = self.fn
        if n >= _PAR_ELEMENTS and r > 1 and not _fork_child:
            # by size alone, whatever the thread count or the timings so far: one input, one compiled variant,
            # one bit pattern (its rows' code is the same on one thread and on several)
            par = load_kernel(self.spec, parallel=True)
            _numba_threads(torch.get_num_threads())
            lock = _parallel_lock()
            if lock is None or lock.acquire(blocking=False):  # else another thread has numba's threads: serial
                try:
                    par(n, c, 0, r, r, True, *args)
                finally:
                    if lock is not None:
                        lock.release()
                return outs
        if entry and _untimed(fn, n):  # entry: fn has run
            entry(n, c, 0, r, r, True, *args)
        else:
            _timed(fn, n, lambda: fn(n, c, 0, r, r, True, *args))
            if self.entry is None:
                self._specialise(n, c, r, args, len(ins))
        return outs

    def _bind(self, prob, params, shapes):
        """(self, params, shapes, n, c, r, converted params, per output its allocation, partial-sum count)."""
        n, c, r = prob.launch_dims()
        pvals, key = [], params
        for name, conv in self.params:
            v = params[name]
            if isinstance(v, torch.Tensor):  # read per call: not bound
                key, v = None, v.item()
            pvals.append(conv(v))
        outputs = []
        for j, (level, dt, npdt) in enumerate(self.outputs):
            shape = shapes[j] if j < len(shapes) else None
            if not level and npdt is not None:  # a 0-dim result: the kernel writes its one element
                outputs.append((True, () if shape is None else tuple(shape), False, npdt, dt, 1))
                continue
            size = prob.flat_size(level) if level else 1
            if npdt is None or size * dt.itemsize >= POOL_MIN:
                outputs.append((False, shape, False, npdt, dt, size if level else None))
            else:  # a plain tuple: numpy reads a torch.Size as a sequence
                outputs.append((True, size if shape is None else tuple(shape), shape is None, npdt, dt, size))
        return (self, key, shapes, n, c, r, pvals, outputs, self.nparts)

    def _specialise(self, n, c, r, args, count):
        """The overload the dispatcher just ran for these argument types (False: none matches exactly, the
        dispatcher stays), and its inputs' dtypes."""
        try:
            overload = self.fn.overloads.get(tuple(numba.typeof(a) for a in (n, c, 0, r, r, True, *args)))
        except Exception:  # noqa: BLE001 - an argument numba types differently: keep the dispatcher
            overload = None
        self.in_dtypes = tuple(args[2:3 * count:3])
        self.entry = False if overload is None else overload.entry_point


def launch_of(spec, dtype):
    """The spec's launch plan in `dtype` (built at its first call; rebuilt when the compiler's cache was emptied)."""
    launch = spec.memo.get("launch")
    if launch is None or launch.dtype is not dtype or launch.kernels is not _compiler.compiled_kernels:
        launch = spec.memo["launch"] = _Launch(spec, dtype)
    return launch


def run_spec(spec, prob, values, shapes=(), params=None):
    """Launch `spec`'s kernel; `values` maps input/param names to tensors or numbers (`params`: the dict its
    params are read from where not `values`: a problem's own params keep the launch's binding to it)."""
    launch = launch_of(spec, prob.dtype)
    return launch.run(prob, [values[a] for a in launch.names], values if params is None else params, shapes)


def widened(prob, tensors):
    """16-bit floating tensors in the compute dtype (autograd-tracked), for the paths that do not read them
    in the kernel: op by op, torch ops, kernels without 16-bit support."""
    if not any(t.dtype in LOW16 for t in tensors):
        return tensors
    return tuple(t.to(prob.dtype) if t.dtype in LOW16 else t for t in tensors)


def storage_codes(graph, tensors):
    """Per input, its 16-bit storage code or None; then the output's (the promoted floating dtype's). None
    when no input is 16-bit (the common case, checked per call)."""
    for t in tensors:
        if t.dtype in LOW16:
            break
    else:
        return None
    dtypes = tuple(t.dtype for t in tensors)
    codes = _STORAGE_CODES.get(dtypes)
    if codes is None:  # a handful of dtype combinations per process
        floats = [d for d in dtypes if d.is_floating_point]
        out = LOW16.get(functools.reduce(torch.promote_types, floats)) if floats else None
        codes = _STORAGE_CODES[dtypes] = tuple(LOW16.get(d) for d in dtypes) + (out,)
    return codes


_STORAGE_CODES = {}  # storage_codes's result per tuple of input dtypes


_PAR_SECONDS = 1e-5  # handwritten kernels use threads only when one thread would take longer than this: a
# parallel launch costs more than a small kernel's whole run (docs/performance.md); they then run a prange
# trampoline over row chunks (split_run), whose per-block partials do not depend on the split.
_PAR_ELEMENTS = 1 << 18  # generated kernels run their prange variant from this size, on any thread count
_ran = set()         # kernels called at least once (compiled for the types they take here)
# per kernel and size class (work.bit_length(): a call's fixed cost weighs more per element in a smaller one)
_rates = {}          # (kernel, class) -> fastest seen seconds per element on one thread (measured as we go)
_RATE_MIN = 4096     # elements: a smaller call says more about overhead than about the kernel
_SAMPLES = 8         # timed calls per kernel and class: its later calls run untimed (and through the entry point)
_timings = {}        # (kernel, class) -> timed calls so far


class _ThreadState(threading.local):
    parts = None    # this thread's partial-sum scratch: ((count, rows), array)
    threads = None  # numba's thread count last set on this thread


_tls = _ThreadState()  # class defaults: a missing attribute of a threading.local raises


def _numba_threads(want):
    """Give numba's parallel kernels `want` threads (torch's count) on this thread; remembered here,
    as numba.get_num_threads() costs ~6 us a call."""
    want = min(want, numba.config.NUMBA_NUM_THREADS)
    if _tls.threads != want:
        numba.set_num_threads(want)
        _tls.threads = want
    return want


def _use_threads(kernel, work, count):
    """Whether one thread would take over _PAR_SECONDS, by the kernel's measured time per element at this size
    class: the fastest of its _SAMPLES timed calls (a process's first calls run with cold caches and fresh
    memory, and the choice of threads stops the timing)."""
    key = (kernel, work.bit_length())
    rate = _rates.get(key)
    return (rate is not None and count > 1 and work * rate >= _PAR_SECONDS
            and _timings.get(key, 0) >= _SAMPLES
            and torch.get_num_threads() > 1 and not _fork_child)


_layer_lock = threading.Lock()
_layer_threadsafe = None


def _parallel_lock():
    """None where numba's threading layer is thread-safe (omp, tbb: concurrent launches from two
    threads measured fine); else the lock a parallel launch holds: numba's workqueue layer, its
    fallback where no OpenMP or TBB runtime loads, aborts the process on a second concurrent launch.
    Known once numba's threads are up (_numba_threads launches them)."""
    global _layer_threadsafe
    if _layer_threadsafe is None:
        _layer_threadsafe = numba.threading_layer() != "workqueue"
    return None if _layer_threadsafe else _layer_lock


# numba's GNU OpenMP layer does not survive fork(): a child of a process that launched it dies
# (SIGTERM, "fork() called from a process already using GNU OpenMP") or hangs at its first parallel
# kernel. Such a child, and its own children, run every kernel on the calling thread.
_fork_child = False


def _after_fork_in_child():
    global _fork_child
    from numba.np.ufunc import parallel
    _fork_child = _fork_child or getattr(parallel, "_is_initialized", True)  # unknown: assume launched


os.register_at_fork(after_in_child=_after_fork_in_child)


def _untimed(kernel, work):
    """Whether a call of `work` elements runs untimed: the compiled kernel's speed is learnt (its first _SAMPLES
    calls of at least _RATE_MIN elements were timed), or the call is too small to say more about overhead than
    about the kernel."""
    return work < _RATE_MIN and kernel in _ran or _timings.get((kernel, work.bit_length()), 0) >= _SAMPLES


def _timed(kernel, work, call):
    """Run call() on this thread and learn the kernel's time per element (not from a compiling call,
    nor from a call too small to say more about overhead than about the kernel)."""
    compiled = kernel in _ran  # numba's own `signatures` is slow to read
    t0 = time.perf_counter()
    call()
    if not compiled:
        _ran.add(kernel)
    elif work >= _RATE_MIN:
        seconds = (time.perf_counter() - t0) / work
        key = (kernel, work.bit_length())
        rate = _rates.get(key)
        _rates[key] = seconds if rate is None else min(rate, seconds)
        _timings[key] = _timings.get(key, 0) + 1


def _trampoline(fn):
    """fn's parallel trampoline: fn(lo, hi, *args) over [0, count) in nthreads chunks, on numba's threads (as
    prange kernels). One per kernel, fn a constant of its closure: a dispatcher passed as an argument costs
    numba ~5 us a call to type."""
    pfor = _trampolines.get(fn)
    if pfor is None:
        @numba.njit(parallel=True, nogil=True)
        def pfor(count, nthreads, *args):
            for k in numba.prange(nthreads):
                fn(count * k // nthreads, count * (k + 1) // nthreads, *args)
        pfor = _trampolines[fn] = pfor
    return pfor


_trampolines = {}  # kernel -> its parallel trampoline
_serial_only = set()  # kernels the parallel trampoline could not compile for


def split_run(fn, count, args, work=None):
    """Call the nogil kernel fn(lo, hi, *args) over [0, count), split across torch's threads when
    that pays (`work`, default `count`: the element count the kernel's speed is measured by)."""
    work = count if work is None else work
    if fn in _serial_only or not _use_threads(fn, work, count):
        if _untimed(fn, work):
            fn(0, count, *args)
        else:
            _timed(fn, work, lambda: fn(0, count, *args))
        return
    threads = _numba_threads(min(torch.get_num_threads(), count))
    lock = _parallel_lock()
    if lock is not None and not lock.acquire(blocking=False):  # another thread has numba's threads
        fn(0, count, *args)
        return
    try:
        _trampoline(fn)(count, threads, *args)
    except Exception as exc:  # noqa: BLE001 - a typing failure: run this kernel serially from now on
        if not type(exc).__module__.startswith("numba"):
            raise
        _serial_only.add(fn)
        fn(0, count, *args)
    finally:
        if lock is not None:
            lock.release()

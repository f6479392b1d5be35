"""Memory for the kernels: dtype tables, a caching pool for large outputs, tensors as the flat memory a
kernel reads (contiguous CPU memory, 16-bit data as its bits)."""
import threading
import weakref

import numpy as np
import torch

NP_STORAGE = {torch.float32: np.float32, torch.float64: np.float64, torch.bfloat16: np.uint16, torch.float16: np.uint16}
DTYPE_NAME = {torch.float32: "float32", torch.float64: "float64"}
# 16-bit floating data: kernels read and write its bits (uint16 arrays) and compute in float32 (codegen storage)
LOW16 = {torch.bfloat16: "bf16", torch.float16: "f16"}
FROM16 = {code: dtype for dtype, code in LOW16.items()}
TORCH_KIND = {"i": torch.int64, "b": torch.bool}


# -- large outputs: a caching pool ------------------------------------------------------------
# A fresh large output is new memory to the OS whenever glibc has handed the last one back: page
# faults on every call, costing more than a memory-bound kernel itself (docs/performance.md). Large
# kernel outputs therefore come from a pool: a buffer returns to it when the tensor that used it is
# freed (a weakref callback on the numpy view torch.from_numpy holds: cheaper than weakref.finalize), and the next call of that size reuses its pages.
POOL_MIN = 1 << 20                  # bytes: smaller outputs come from torch.empty
_POOL_PER_SIZE = 4                   # free buffers kept per size
_POOL_MAX_BYTES = 1 << 30            # and in all
_pool = {}                           # nbytes -> free buffers of that size
_pool_lock = threading.Lock()
_lent = {}                           # id(weakref) -> (the weakref, its buffer): buffers in use


def pool_bytes():
    """Bytes the pool holds free."""
    return sum(nbytes * len(free) for nbytes, free in _pool.items())


def _release(ref, lent=_lent, pool=_pool, lock=_pool_lock, per_size=_POOL_PER_SIZE, most=_POOL_MAX_BYTES):
    # (its globals bound here: it may run while the interpreter exits)
    buf = lent.pop(id(ref))[1]
    with lock:
        free = pool.setdefault(buf.nbytes, [])
        if len(free) < per_size and sum(n * len(f) for n, f in pool.items()) + buf.nbytes <= most:
            free.append(buf)


def empty_cache():
    """Hand the pool's free buffers back to the allocator (autogen.empty_cache)."""
    with _pool_lock:
        _pool.clear()


_ALIGN = 64  # bytes: an AVX-512 vector, a cache line


def _aligned(nbytes):
    """An uninitialized uint8 array of `nbytes` at an address a multiple of _ALIGN: a vector store then writes
    one cache line, not two (numpy's own large arrays start 16 bytes into a page, as glibc's mmapped chunks do;
    torch's are 64-byte aligned)."""
    raw = np.empty(nbytes + _ALIGN, np.uint8)
    off = -raw.__array_interface__["data"][0] % _ALIGN
    return raw[off:off + nbytes]


def _pool_array(nbytes, npdt, shape=None):
    """A numpy array of `nbytes` bytes of dtype npdt from the pool, flat or `shape`d; its buffer returns to
    the pool when this array is freed. Hand torch this array itself: another view of it (a reshape) has
    the buffer as its base, not this array, so it would not keep the buffer out of the pool."""
    with _pool_lock:
        free = _pool.get(nbytes)
        buf = free.pop() if free else None
    if buf is None:
        buf = _aligned(nbytes)
    arr = buf.view(npdt)
    if shape is not None:
        arr = arr.reshape(shape)
    ref = weakref.ref(arr, _release)
    _lent[id(ref)] = ref, buf
    return arr


def out_array(nbytes, npdt, shape):
    """An uninitialized numpy array of `shape` and `nbytes` bytes: numpy's below POOL_MIN, else the pool's
    (hand torch this array itself, as _pool_array says)."""
    if nbytes < POOL_MIN:
        return np.empty(shape, npdt)
    return _pool_array(nbytes, npdt, shape)


def pooled(size, dtype, shape=None):
    """An uninitialized tensor of `size` elements (1-D, or `shape`d), its memory from the pool when large."""
    nbytes = size * dtype.itemsize
    if nbytes < POOL_MIN or dtype not in NP_STORAGE:
        return torch.empty(size if shape is None else shape, dtype=dtype)
    return _tensor_of(_pool_array(nbytes, NP_STORAGE[dtype], shape), dtype)


def _tensor_of(a, dtype):
    """A tensor over the pool's numpy array `a` (holding it: see _pool_array) in `dtype` (16-bit: `a` holds
    its bits), not a view: an autograd Function's output that is a view cannot be changed in place."""
    t = torch.from_numpy(a)
    if dtype in LOW16:
        t = torch.empty(0, dtype=dtype).set_(t.untyped_storage(), 0, a.shape)
    return t


def shaped(out, shape):
    """`out` viewed as `shape`, itself where it has that shape already (a kernel writes a per-element or per-row
    result in its input's): under autograd a view is a node more per call."""
    return out if out.shape == shape else out.view(shape)


def pooled_like(t):
    """An uninitialized contiguous tensor shaped and typed like `t`, its memory from the pool when large
    (a small one from numpy, shaped there: torch's view by a torch.Size costs more than the allocation)."""
    return pooled_flat(t)[0]


def pooled_flat(t):
    """pooled_like(t) and its flat numpy view, which a kernel writes."""
    npdt = NP_OUT.get(t.dtype)
    if npdt is None:  # 16-bit: shaped at allocation (a gradient that is a view costs autograd's accumulation more)
        out = pooled(t.numel(), t.dtype, t.shape)
        return out, flat_np(out)
    a = out_array(t.numel() * t.dtype.itemsize, npdt, t.shape)  # the tensor holds the array the pool watches
    return torch.from_numpy(a), a.ravel()


NP_OUT = {torch.float32: np.float32, torch.float64: np.float64, torch.int64: np.int64, torch.bool: np.bool_}
# a kernel input's element type, as the zero passed beside its address (16-bit floating data: its bits)
NP_ZERO = {dt: np.dtype(npdt).type(0) for dt, npdt in {**NP_OUT, **dict.fromkeys(LOW16, np.uint16)}.items()}


def host(t):
    """`t` as contiguous CPU memory, which a kernel reads from its address (a copy where it is strided); torch's
    TypeError for a tensor on another device, as its numpy() raises (a kernel given that address would crash).
    A negative-bit view (torch._neg_view) is resolved: its memory holds the values negated."""
    if not t.is_cpu:
        raise TypeError(f"can't run autogen's CPU kernels on a {t.device.type} tensor: use Tensor.cpu() first, or "
                        "policy 'disabled'")
    if t.is_neg():
        t = t.resolve_neg()
    return t if t.is_contiguous() else t.contiguous()


def flat_np(t):
    """The flat numpy view of a contiguous tensor; 16-bit floating data as its uint16 bits (per call
    and tensor: detach and reshape only where needed, ~1 us of a 1K call's ~3); a negative-bit view resolved."""
    if t.is_neg():
        t = t.detach().resolve_neg()
    if t.dtype in LOW16:
        a = t.detach().view(torch.uint16).numpy()
    else:  # force: detached in C++ (a detach() here costs more)
        a = t.numpy(force=True) if t.requires_grad else t.numpy()
    return a if a.ndim == 1 else a.ravel()

"""Compile rendered kernels: source written to the cache dir under its content hash, then imported.

A file-backed module lets numba's own `cache=True` keep the machine code between processes.
"""
import hashlib
import importlib.util
import logging
import os
import sys
import tempfile
import threading
import time
import warnings

from .codegen import render

log = logging.getLogger("autogen")
_lock = threading.RLock()
_kernels = {}
_warned_dirs = set()


def cache_dir():
    from .config import cache_dir as configured
    return configured()


def _write_atomic(path, text):
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-", suffix=".py")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)  # readers see the old file or the whole new one, never a part
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _load_file(spec, parallel):
    source = render(spec, cache=True, parallel=parallel)
    digest = hashlib.sha1(source.encode()).hexdigest()[:24]
    directory = cache_dir()
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"k_{digest}.py")
    try:
        with open(path) as f:
            intact = f.read() == source
    except OSError:
        intact = False
    if not intact:  # missing, truncated or corrupted: write it anew
        _write_atomic(path, source)
    _load_file.hit = intact
    name = f"autogen_kernel_{digest}"
    mod_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(mod_spec)
    sys.modules[name] = module  # numba's cache rebuilds the kernel's environment by module name
    mod_spec.loader.exec_module(module)
    return module.kernel


def _load_memory(spec, parallel):
    source = render(spec, cache=False, parallel=parallel)
    namespace = {"__name__": f"autogen_kernel_{spec.key}"}
    exec(compile(source, f"<autogen {spec.label}>", "exec"), namespace)
    return namespace["kernel"]


def get_kernel(spec, parallel=False):
    """The compiled kernel for `spec` (numba compiles it at its first call)."""
    key = (spec.key, parallel)
    fn = _kernels.get(key)
    if fn is not None:
        return fn
    with _lock:
        fn = _kernels.get(key)
        if fn is None:
            t0 = time.perf_counter()
            _load_file.hit = False
            try:
                fn = _load_file(spec, parallel)
            except OSError as e:
                if cache_dir() not in _warned_dirs:
                    _warned_dirs.add(cache_dir())
                    warnings.warn(f"autogen: kernel cache dir {cache_dir()!r} is not usable ({e}); "
                                  "compiling in memory", RuntimeWarning, stacklevel=2)
                fn = _load_memory(spec, parallel)
            hit = _load_file.hit
            log.info("kernel %s%s: autogen, loaded in %.3fs, cache %s (%s)", spec.label,
                     " (parallel)" if parallel else "", time.perf_counter() - t0, "hit" if hit else "miss",
                     spec.key)
            if log.isEnabledFor(logging.DEBUG):
                log.debug("generated source of %s:\n%s", spec.label, render(spec, cache=True, parallel=parallel))
            _kernels[key] = fn
    return fn

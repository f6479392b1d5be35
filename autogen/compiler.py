"""Compile rendered kernels: source written to the cache dir under its content hash, then imported.

A file-backed module lets numba's own `cache=True` keep the machine code between processes: beside
k_<digest>.py numba writes __pycache__/k_<digest>.kernel-<line>.py<ver>.nbi (an index) and .<n>.nbc
(machine code). Any of them may be damaged (a process killed mid-write, a full disk, a user's
editor): a damaged file is logged once, removed, and its kernel compiled anew.
"""
import glob
import hashlib
import io
import logging
import os
import pickletools
import shutil
import sys
import tempfile
import threading
import time
import types
import warnings

from .codegen import render
from .config import cache_dir

log = logging.getLogger("autogen")
_lock = threading.RLock()
compiled_kernels = {}
_warned_dirs = set()


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


def _digest(data):
    return hashlib.sha1(data).hexdigest()[:24]


def remove(path):
    """Remove a file, or whatever took its name (a directory); gone already is fine."""
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass


def damage(path):
    """Why the cache file at `path` is unusable (a short reason), or None if it reads back whole.

    Our k_<digest>.py must hash to its name. numba's .nbi holds two pickles (its version, then the
    index), an .nbc one: their opcodes are walked to the end (pickletools, which runs nothing and
    imports nothing, so a kernel's data can be checked without its module)."""
    name = os.path.basename(path)
    if not os.path.isfile(path):
        return "not a regular file" if os.path.lexists(path) else None
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"
    if name.endswith((".nbi", ".nbc")):
        stream = io.BytesIO(data)
        try:
            for _ in range(2 if name.endswith(".nbi") else 1):
                for _ in pickletools.genops(stream):
                    pass
        except Exception as exc:  # noqa: BLE001 - whatever a damaged pickle raises
            return f"not a whole pickle ({exc})"
        return "trailing bytes" if stream.read(1) else None
    if name.startswith("k_") and name.endswith(".py"):
        return None if _digest(data) == name[2:-3] else "content does not match its hash"
    return None


def scan(directory=None):
    """[(path, reason)] for every damaged file of the kernel cache in `directory` (default: ours)."""
    directory = cache_dir() if directory is None else directory
    paths = glob.glob(os.path.join(directory, "k_*.py"))
    paths += glob.glob(os.path.join(directory, "__pycache__", "k_*.nb[ic]"))
    found = [(p, damage(p)) for p in sorted(paths)]
    return [(p, why) for p, why in found if why]


def _numba_entry(index_path):
    """The index and data files numba keeps for one kernel."""
    return [index_path] + sorted(glob.glob(glob.escape(index_path[:-len(".nbi")]) + ".*.nbc"))


def _drop_damaged(source, index_path, exc=None):
    """Log and remove a damaged numba cache entry; whether one was found."""
    files = _numba_entry(index_path)
    bad = [(p, why) for p, why in ((p, damage(p)) for p in files) if why]
    if exc is not None and not bad:  # numba could not use it, though each file reads back
        bad = [(index_path, f"numba could not load it: {type(exc).__name__}: {exc}")]
    if not bad:
        return False
    log.warning("autogen: damaged kernel cache file %s; removed, compiling %s again",
                "; ".join(f"{p} ({why})" for p, why in bad), os.path.basename(source))
    for p in files:
        try:
            remove(p)
        except OSError:
            pass  # another process may hold it; numba then compiles without it
    return True


def _guard_numba_cache(kernel, source):
    """numba reads its cache at a kernel's first call and raises on a damaged index (an
    UnpicklingError out of the user's loss call) or takes a damaged data file for a miss and then
    fails writing over it. Its loader is wrapped here, where every read happens: any failure, or a
    miss with damaged files present, removes the entry and compiles. Checking files before the
    first call instead would read them twice on every load and still race a writer."""
    cache = getattr(kernel, "_cache", None)
    index_path = getattr(getattr(cache, "_cache_file", None), "_index_path", None)
    if index_path is None:
        return  # another numba: its own loader, unguarded
    load, save = cache.load_overload, cache.save_overload

    def load_overload(sig, target_context):
        try:
            result = load(sig, target_context)
        except Exception as exc:  # noqa: BLE001 - anything from reading the cache: compile instead
            _drop_damaged(source, index_path, exc)
            return None
        if result is None:  # a miss (about to compile anyway): damaged files numba skipped?
            _drop_damaged(source, index_path)
        return result

    def save_overload(sig, data):
        try:
            save(sig, data)
        except Exception as exc:  # noqa: BLE001 - the kernel is compiled and right; only the cache failed
            log.warning("autogen: could not write numba's cache for %s (%s: %s)", source, type(exc).__name__, exc)

    cache.load_overload, cache.save_overload = load_overload, save_overload


def _load_file(spec, parallel):
    source = render(spec, cache=True, parallel=parallel)
    digest = _digest(source.encode())
    directory = cache_dir()
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"k_{digest}.py")
    try:
        with open(path, "rb") as f:
            intact = f.read() == source.encode()
    except FileNotFoundError:
        intact = None
    except OSError:  # unreadable, or a directory took its name
        intact = False
    if not intact:  # missing, or damaged: write it anew (its name is its content's hash)
        if intact is False:
            log.warning("autogen: damaged kernel cache file %s (%s); written again", path, damage(path))
            if os.path.isdir(path):
                remove(path)  # os.replace below swaps a file atomically, not a directory
        _write_atomic(path, source)
    _load_file.hit = bool(intact)
    name = f"autogen_kernel_{digest}"
    module = types.ModuleType(name)
    module.__file__ = path
    sys.modules[name] = module  # numba's cache rebuilds the kernel's environment by module name
    # compiled from the text in hand (the file holds the same): no .pyc beside it, one file less to damage
    exec(compile(source, path, "exec"), module.__dict__)
    _guard_numba_cache(module.kernel, path)
    return module.kernel


def _load_memory(spec, parallel):
    source = render(spec, cache=False, parallel=parallel)
    namespace = {"__name__": f"autogen_kernel_{spec.key}"}
    exec(compile(source, f"<autogen {spec.label}>", "exec"), namespace)
    return namespace["kernel"]


def get_kernel(spec, parallel=False):
    """The compiled kernel for `spec` (numba compiles it at its first call)."""
    key = (spec.key, parallel)
    fn = compiled_kernels.get(key)
    if fn is not None:
        return fn
    with _lock:
        fn = compiled_kernels.get(key)
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
            compiled_kernels[key] = fn
    return fn

"""The instruction sets our kernels and torch's run with on this machine: the benchmark's header prints them,
and policy medium reads the size thresholds measured on the same instruction set (thresholds.json)."""
import functools
import json
from importlib import resources
import os
import platform

import torch


@functools.lru_cache(maxsize=None)
def numba_target():
    """(CPU name, feature string) that numba compiles for: NUMBA_CPU_NAME / NUMBA_CPU_FEATURES where set (the
    features default to the host's, as numba's JIT does), else the host's."""
    import llvmlite.binding as ll
    from numba.core import config
    name = config.CPU_NAME or ll.get_host_cpu_name()
    features = config.CPU_FEATURES if config.CPU_FEATURES is not None else ll.get_host_cpu_features().flatten()
    return name, features


def numba_isa():
    """'avx512', 'avx2' or 'generic': the widest vector set numba's kernels use."""
    name, features = numba_target()
    flags = set(features.split(","))
    if name == "generic" and not features:
        return "generic"
    if "+avx512f" in flags and "-avx512f" not in flags:
        return "avx512"
    if "+avx2" in flags or name in ("haswell", "broadwell", "skylake", "znver1", "znver2", "znver3"):
        return "avx2"
    return "generic"


def torch_isa():
    """torch's vectorized kernels' capability ('AVX512', 'AVX2', 'DEFAULT'; ATEN_CPU_CAPABILITY lowers it)."""
    return torch.backends.cpu.get_cpu_capability()


def kernel_isa():
    """The key of the size thresholds that apply here: 'avx512' only where both numba's and torch's kernels use
    AVX-512 (where they were measured), else 'avx2' (AVX2 and generic machines)."""
    return "avx512" if numba_isa() == "avx512" and torch_isa().upper().startswith("AVX512") else "avx2"


@functools.lru_cache(maxsize=None)
def cpu_model():
    """The CPU's model name (/proc/cpuinfo on Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe():
    """One line for a benchmark's header: the CPU, numba's target and torch's capability."""
    name, _ = numba_target()
    return (f"CPU {cpu_model()} ({os.cpu_count()} cores); numba target {name} ({numba_isa()}), torch "
            f"{torch_isa()}; thresholds {kernel_isa()}")


THRESHOLDS = "thresholds.json"


def load_json(name):
    """A data file of the package (the measured size thresholds)."""
    return json.loads(resources.files("autogen").joinpath(name).read_text())


def load_thresholds():
    """{isa: {dtype or 'inplace': {name: [elements with a gradient, without] or elements}}} from thresholds.json
    (written by `autogen bench --crossovers --write`); sizes in elements, null for never."""
    return load_json(THRESHOLDS)


def dump_thresholds(tables):
    """thresholds.json's text: one line per name, so that a remeasured table diffs by row."""
    lines = ["{"]
    for i, (isa, dtypes) in enumerate(tables.items()):
        lines.append(f' "{isa}": {{')
        for j, (dtype, table) in enumerate(dtypes.items()):
            rows = [f'   {json.dumps(name)}: {json.dumps(v)}' for name, v in table.items()]
            lines.append(f'  "{dtype}": {{\n' + ",\n".join(rows) + "\n  }" + ("," if j < len(dtypes) - 1 else ""))
        lines.append(" }" + ("," if i < len(tables) - 1 else ""))
    lines.append("}")
    return "\n".join(lines) + "\n"

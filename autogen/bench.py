"""The benchmark: losses, nonlinearities and custom losses against torch eager and torch.compile.

Run: `make bench` (or `autogen bench`, `python benchmarks/bench_losses.py`); `--sweep` for sizes 1K to
16M, `--quick` for fewer repetitions. Every variant of one (name, size, mode) is timed in the same
run with interleaved repetitions (each round in a fresh seeded random order), so the machine's drift
falls on all of them alike; median, p20 and p80 are kept, and each variant's peak memory.
Prints the tables (a progress bar on stderr while it runs) and writes under benchmarks/results/:
bench.csv (one row per name x size x mode x variant), bench.json (the same with the summary),
losses.csv/losses.json and nonlinearities.csv (the main size), speedup.png (speedup vs size).
"""
import argparse
import csv
import functools
import json
import math
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as TF

import autogen
from autogen import functional as AF
from autogen import isa as _isa
from autogen import activations, train_bench
from autogen.corpus import CORPUS, make
from autogen.corpus_shapes import CASES as SHAPES
from autogen.policies import policy, record
from autogen.executor import tensors_in
from autogen import report
from autogen.report import TORCH_LEGEND, TORCH_MARK
from autogen.timing import MODES, fwd_bwd, fwd_only, measure, peak_mb, reps_for, timed  # noqa: F401 - bench API


ROWS = ("multilabel_soft_margin_loss", "multi_margin_loss", "triplet_margin_loss",
        "triplet_margin_with_distance_loss", "cosine_embedding_loss")
OPTIONS = {"kl_div": {"reduction": "batchmean"}}


def inputs(name, n_elems):
    """Inputs of about n_elems elements (row losses as rows of 512 classes or features)."""
    if name in ROWS:
        c = 512 if n_elems >= 512 * 8 else 32
        r = max(n_elems // c, 1)
        x = torch.randn(r, c).requires_grad_()
        if name == "multilabel_soft_margin_loss":
            return [x, torch.randint(0, 2, (r, c)).float()]
        if name == "multi_margin_loss":
            return [x, torch.randint(0, c, (r,))]
        if name == "cosine_embedding_loss":
            return [x, torch.randn(r, c), torch.randint(0, 2, (r,)).float() * 2 - 1]
        return [x, torch.randn(r, c), torch.randn(r, c)]
    side = int(math.sqrt(n_elems))
    if name == "gaussian_nll_loss":
        return [torch.randn(side, side).requires_grad_(), torch.randn(side, side), torch.rand(side, side) + 0.1]
    if name == "hinge_embedding_loss":
        return [torch.randn(side, side).requires_grad_(), torch.randint(0, 2, (side, side)).float() * 2 - 1]
    if name == "kl_div":
        return [torch.randn(side, side).log_softmax(-1).requires_grad_(), torch.randn(side, side).softmax(-1)]
    if name == "margin_ranking_loss":
        return [torch.randn(side * side).requires_grad_(), torch.randn(side * side),
                torch.randint(0, 2, (side * side,)).float() * 2 - 1]
    if name == "poisson_nll_loss":
        return [torch.randn(side, side).requires_grad_(), torch.rand(side, side) * 4]
    if name in ("cross_entropy", "nll_loss"):
        c = 512 if n_elems >= 512 * 8 else 32
        r = max(n_elems // c, 1)
        x = torch.randn(r, c)
        if name == "nll_loss":
            x = torch.log_softmax(x, -1)
        return [x.requires_grad_(), torch.randint(0, c, (r,))]
    side = int(math.sqrt(n_elems))
    x, t = torch.randn(side, side), torch.randn(side, side)
    if name == "binary_cross_entropy":
        x, t = x.sigmoid(), t.sigmoid()
    elif name == "binary_cross_entropy_with_logits":
        t = t.sigmoid()
    return [x.requires_grad_(), t]


def _call(fn, opts, arity):
    """`fn` called as user code calls it: the tensors positional, the options as keywords, one lambda
    frame (eager and ours alike). `lambda *a: fn(*a, **opts)` would copy the dict and match its
    keywords on every call: with use_autogen=True in it, ~0.4 us more than torch's call with none, 2% of
    a loss's forward+backward at 1K."""
    args = [f"x{i}" for i in range(arity)]
    values = {f"__o{i}": v for i, v in enumerate(opts.values())}  # each option's value, by name
    kws = [f"{k}=__o{i}" for i, k in enumerate(opts)]
    return eval(f"lambda {', '.join(args)}: fn({', '.join(args + kws)})", {"fn": fn, **values})


def _eager(name):
    """torch's function for a loss."""
    return _call(getattr(TF, name), OPTIONS.get(name, {}), len(inputs(name, 64)))


def _ours(pol, name, use_autogen):
    """Our function for a loss, called as a user calls it (use_autogen=False, the default, left out);
    under a per-call policy context only when the process policy is another one (the context costs
    ~2 us: at 1K elements a tenth of torch's own call)."""
    opts = dict(OPTIONS.get(name, {}), **({"use_autogen": True} if use_autogen else {}))
    return _policed(pol, _call(getattr(AF, name), opts, len(inputs(name, 64))))


def _policed(pol, fn):
    """`fn` under policy `pol`: a policy() block per call unless the process already runs it."""
    if pol is None or autogen.get_policy() == pol:
        return fn
    return lambda *a: _under_policy(pol, lambda: fn(*a))


def _under_policy(pol, fn):
    with autogen.policy(pol):
        return fn()


_COMPILED = {}


def _raise_recompile_limit():
    # one compiled function per loss is recompiled per size and grad mode; past dynamo's default
    # limit of 8 it would silently run eagerly
    cfg = torch._dynamo.config
    for attr in ("recompile_limit", "cache_size_limit"):
        if hasattr(cfg, attr):
            setattr(cfg, attr, max(getattr(cfg, attr), 64))


def compiled(name, options=None):
    """torch.compile (Inductor) of torch's function with the benchmark's options; compiled at first call."""
    fn = _COMPILED.get(name)
    if fn is None:
        _raise_recompile_limit()
        # torch's function itself (a partial for options): dynamo keys its cache by code object, and
        # one shared lambda would hit its recompile limit after eight losses and run eagerly
        opts = OPTIONS.get(name, {}) if options is None else options
        fn = _COMPILED[name] = torch.compile(functools.partial(getattr(TF, name), **opts), dynamic=False)
    return fn


VARIANTS = {  # losses: name -> callable(*inputs)
    "eager": lambda name: _eager(name),
    "compile": lambda name: compiled(name),
    "primitive": lambda name: _ours("medium", name, False),
    "fused": lambda name: _ours("aggressive", name, True),
    "default": lambda name: _ours("medium", name, True),
}

NL_OPTIONS = {"threshold": {"threshold": 0.1, "value": 0.0}}


def _nl(fn, name, pol):
    return _policed(pol, _call(fn, NL_OPTIONS.get(name, {}), len(nonlinearity_args(name, 512))))


NL_VARIANTS = {  # nonlinearities: the policy alone picks the kernel
    "eager": lambda name: _nl(getattr(TF, name), name, None),
    "compile": lambda name: compiled(name, NL_OPTIONS.get(name, {})),
    "autogen": lambda name: _nl(getattr(AF, name), name, "aggressive"),
    "default": lambda name: _nl(getattr(AF, name), name, "medium"),
}


# -- nonlinearities in two allocator states, with the bytes saved for backward -----------------
# A fresh 16 MB tensor costs eager thousands of page faults whenever glibc has handed the last one
# back, and ours (from the pool) none: the ratios then compare allocators. So every variant is also
# timed in a child process where glibc keeps freed memory (these tunables), to compare kernels.
NO_PAGE_FAULTS = {"MALLOC_MMAP_THRESHOLD_": "4294967296", "MALLOC_TRIM_THRESHOLD_": "4294967296"}
STATES = {"default": {}, "no page faults": NO_PAGE_FAULTS}


class ChildError(RuntimeError):
    """A benchmark child process failed; the message is its own stderr (the exception), not the command line."""


def child_json(cmd, env):
    """The JSON that the child process `cmd` prints last, run with `env` (an allocator state's glibc settings)
    added to this process's environment. A failed child raises ChildError with its stderr."""
    res = subprocess.run(cmd, env=dict(os.environ, **env), capture_output=True, text=True)
    lines = res.stdout.strip().splitlines()
    if res.returncode or not lines:
        raise ChildError(f"benchmark child process exited with {res.returncode}:\n{res.stderr.strip()}")
    return json.loads(lines[-1])


def python_c(code, *args):
    """A command line running `code` with `python -c` on the installed package: -P keeps the working
    directory (the repository root, whose autogen/ has no templates or kernels) off sys.path."""
    return [sys.executable, "-P", "-c", code, *args]


def in_child(child, args, env):
    """bench.<child>(*args) in a child process (child_json)."""
    return child_json(python_c("import json, sys; from autogen import bench; "
                               f"print(json.dumps(bench.{child}(*json.loads(sys.argv[1]))))", json.dumps(args)), env)


def settings():
    """(threads, allocator state, its env) per setting a size table is measured in: one thread and torch's
    threads (a kernel that wins alone can lose beside torch's thread pool), each allocator state."""
    return [(t, state, env) for t in sorted({1, torch.get_num_threads()}) for state, env in STATES.items()]
NL_STATE_VARIANTS = ("eager", "default", "ours", "autogen")


def _table_off(fn):
    """`fn` with activations.FASTER_FROM off: policy medium's kernel at every size (handwritten, else generated)."""

    def run(*a):
        saved, activations.FASTER_FROM = activations.FASTER_FROM, None
        try:
            return fn(*a)
        finally:
            activations.FASTER_FROM = saved
    return run


STATE_VARIANTS = dict(NL_VARIANTS, ours=lambda name: _table_off(_nl(getattr(AF, name), name, "medium")))


def saved_bytes(fn, args):
    """Bytes one forward call keeps for backward: what autograd packs (saved_tensors_hooks; an input counts,
    as it is kept alive for backward), and the tensors our autograd Functions hold on their context
    (executor._LossFunction's `saved`), each memory once."""
    seen = set()
    total = [0]

    def count(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in seen:
            seen.add(ptr)
            total[0] += t.numel() * t.element_size()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: (count(t), t)[1], lambda t: t):
        out = fn(*args)
    nodes, visited = [out.grad_fn], set()
    while nodes:  # the graph this call made, down to the inputs' AccumulateGrad
        node = nodes.pop()
        if node is None or id(node) in visited:
            continue
        visited.add(id(node))
        saved = getattr(node, "saved", None)
        for t in tensors_in(() if saved is None else saved):
            count(t)
        nodes += [f for f, _ in node.next_functions]
    return total[0]


def _ran_ours(fn):
    """Whether a call of fn runs one of our kernels anywhere (False: policy medium handed it all to torch's own
    op, so eager's kernel is on both sides of the ratio and it measures the harness's noise alone)."""
    with autogen.record() as rec:
        fn()
    return any(c.path != "fallback" for c in rec.calls)


def nonlinearity_child(names, n, reps, modes, threads):
    """One allocator state (this process's): per nonlinearity and mode, each variant's median ms (interleaved)
    and the bytes it saves for backward. On one thread, the thread's CPU time (a shared machine's other
    processes then take no time from the figures, only memory bandwidth)."""
    torch.set_num_threads(threads)
    clock = time.thread_time if threads == 1 else time.perf_counter
    rows = []
    for name in names:
        args = nonlinearity_args(name, n)
        row = {"name": name, "size": args[0].numel()}
        for v in NL_STATE_VARIANTS:
            row[f"{v}_saved_bytes"] = saved_bytes(STATE_VARIANTS[v](name), args)
        for mode in modes:
            fns = {v: MODES[mode](STATE_VARIANTS[v](name), args) for v in NL_STATE_VARIANTS}
            for _ in range(4):  # glibc's dynamic mmap threshold settles over the first calls of each size
                for fn in fns.values():
                    fn()
            row[f"{mode} default on torch's op"] = not _ran_ours(fns["default"])
            for v, st in measure(fns, reps, clock).items():
                row[f"{mode} {v}_ms"] = st["median"] * 1e3
        rows.append(row)
    return rows


def nonlinearity_states(names, n, reps, modes, threads=None):
    """nonlinearity_child in a child process per allocator state; prints the table, returns the rows."""
    threads = threads or torch.get_num_threads()
    out = {state: in_child("nonlinearity_child", [names, n, reps, modes, threads], env) for state, env in STATES.items()}
    return print_states(names, n, modes, threads, out)


def print_states(names, n, modes, threads, out):
    """Print the table of nonlinearity_child's results per allocator state (`out`); return its rows."""
    print(f"\nnonlinearities, ~{_size_label(n)} elements float32, {threads} thread(s) "
          f"({'CPU time of the thread' if threads == 1 else 'wall time'}), two allocator states "
          f"(no page faults: glibc's "
          f"{' and '.join(NO_PAGE_FAULTS)} = {NO_PAGE_FAULTS['MALLOC_MMAP_THRESHOLD_']} in a child process); "
          f"eager/ours per mode (med = policy medium; kernel = medium's kernel at every size, its size table off: "
          f"handwritten, else generated; aggr = aggressive: generated); saved MB = what autograd keeps "
          f"for backward; {TORCH_LEGEND}; {TORCH_MARK} spread: the lowest and highest marked ratio, eager's kernel "
          f"against itself, so the resolution of this run")
    cols = [(state, mode, v) for state in STATES for mode in modes for v in ("default", "ours", "autogen")]
    label = {"default": "med", "ours": "kernel", "autogen": "aggr"}
    print(f"{'':14s}{'saved MB':^{7 * len(NL_STATE_VARIANTS)}s}  "
          + "  ".join(f"{state:^{16 * 3 * len(modes) - 2}s}" for state in STATES))
    print(f"{'nonlinearity':14s}" + "".join(f"{label.get(v, v):>7s}" for v in NL_STATE_VARIANTS) + "  "
          + "  ".join(f"{mode[:7] + ' ' + label[v]:>14s}" for _, mode, v in cols))
    rows, ratios, on_torch = [], {c: [] for c in cols}, {c: [] for c in cols}
    for k, name in enumerate(names):
        row = dict(out["default"][k])
        line = f"{name:14s}" + "".join(f"{row[f'{v}_saved_bytes'] / 2**20:7.1f}" for v in NL_STATE_VARIANTS) + "  "
        cells = []
        for c in cols:
            state, mode, v = c
            r = out[state][k]
            ratio = r[f"{mode} eager_ms"] / r[f"{mode} {v}_ms"]
            ratios[c].append(ratio)
            row[f"{state} {mode} eager_over_{v}"] = ratio
            row[f"{state} {mode} eager_ms"], row[f"{state} {mode} {v}_ms"] = r[f"{mode} eager_ms"], r[f"{mode} {v}_ms"]
            torch_op = v == "default" and bool(r.get(f"{mode} default on torch's op"))
            on_torch[c].append(torch_op)
            cells.append(f"{ratio:13.2f}{TORCH_MARK if torch_op else 'x'}")
        print(line + "  ".join(cells))
        rows.append(row)
    pad = 14 + 7 * len(NL_STATE_VARIANTS)
    print(f"{'geometric mean':{pad}s}  " + "  ".join(f"{_geo(ratios[c]):13.2f}x" for c in cols))
    print(f"{'below 1x':{pad}s}  " + "  ".join(f"{sum(r < 1 for r in ratios[c]):14d}" for c in cols))
    print(f"{'ours below 1x':{pad}s}  " + "  ".join(  # the rows that ran one of our kernels
        f"{sum(r < 1 and not t for r, t in zip(ratios[c], on_torch[c])):14d}" for c in cols))
    marked = f"{TORCH_MARK} (torch's op)"
    print(f"{marked:{pad}s}  " + "  ".join(f"{sum(on_torch[c]):14d}" for c in cols))
    # the marked rows time eager's kernel against itself: their spread is how far this run's interleaving and
    # allocator alone move a ratio
    spread = [[r for r, t in zip(ratios[c], on_torch[c]) if t] for c in cols]
    print(f"{TORCH_MARK + ' spread':{pad}s}  " + "  ".join(
        f"{f'{min(s):.2f}-{max(s):.2f}':>14s}" if s else f"{'':14s}" for s in spread))
    return rows


CROSSOVER_SIZES = (1 << 16, 1 << 18, 1 << 20, 1 << 22)


def crossover_child(names, sizes, reps, dtype="float32", threads=1):
    """eager / ours (policy medium, its size table off) per name, size and mode, on `dtype` data; on one thread
    timed by its CPU time, or on `threads` timed by the wall clock."""
    activations.FASTER_FROM = None  # every size to our kernel
    torch.set_num_threads(threads)
    clock = time.thread_time if threads == 1 else time.perf_counter
    ratios = {}
    for name in names:
        for n in sizes:
            args = _in_dtype(nonlinearity_args(name, n), getattr(torch, dtype))
            for mode in MODES:
                fns = {v: MODES[mode](NL_VARIANTS[v](name), args) for v in ("eager", "default")}
                for _ in range(4):
                    for fn in fns.values():
                        fn()
                st = measure(fns, reps_for(n, reps), clock)
                ratios[f"{name} {n} {mode}"] = st["eager"]["median"] / st["default"]["median"]
    return ratios


def faster_from(sizes, wins):
    """The smallest of `sizes` (ascending) from which wins(n) holds at every size up, None where at none."""
    ok = [wins(n) for n in sizes]
    return next((sizes[k] for k in range(len(sizes)) if all(ok[k:])), None)


# A win must clear the noise of one run (ratios move about 5% between runs at 4M), or a threshold at a size where
# the two kernels tie flips with the run that measured it, and medium may pick the slower one.
WIN_MARGIN = 1.05


def crossovers(names, sizes=CROSSOVER_SIZES, reps=15, dtype="float32", write=None):
    """The size from which ours measured faster than eager by WIN_MARGIN in both allocator states, on one thread and
    on torch's threads (a kernel that wins alone can lose beside torch's thread pool), at every size measured from
    there up: {name: (with gradient, without)}, None where at no size. Prints it as activations.FASTER_FROM
    (FASTER_FROM_BF16 or FASTER_FROM_F16 for a 16-bit dtype), and with `write` (a thresholds.json) stores it
    there under this machine's instruction set (isa.kernel_isa), which policy medium reads."""
    print(_isa.describe())
    states = [in_child("crossover_child", [names, sizes, reps, dtype, threads], env) for threads, _, env in settings()]
    table = {}
    for name in names:
        row = []
        for mode in MODES:
            row.append(faster_from(sizes, lambda n: min(st[f"{name} {n} {mode}"] for st in states) >= WIN_MARGIN))
            print(f"{name:12s} {mode:8s} " + " ".join(f"{_size_label(n)}: " + "/".join(
                f"{st[f'{name} {n} {mode}']:.2f}" for st in states) for n in sizes))
        table[name] = tuple(row)
    print(f"FASTER_FROM{ {'bfloat16': '_BF16', 'float16': '_F16'}.get(dtype, '')} = {{  # name: (elements from which "
          f"ours is faster with a gradient, without), {dtype}")
    for name, row in table.items():
        print(f"    {name!r}: ({', '.join('None' if v is None else f'1 << {v.bit_length() - 1}' for v in row)}),")
    print("}")
    if write:
        with open(write) as f:
            tables = json.load(f)
        tables.setdefault(_isa.kernel_isa(), {}).setdefault(dtype, {}).update(
            {name: list(row) for name, row in table.items()})
        with open(write, "w") as f:
            f.write(_isa.dump_thresholds(tables))
        print(f"wrote {_isa.kernel_isa()} {dtype} to {write}")
    return table


# -- bfloat16 and float16 beside float32 --------------------------------------------------------------
# forward+backward per dtype, eager and ours (policy medium: the handwritten kernel where one exists), all
# dtypes interleaved in one measure() so that their ratios share the machine's state; in a child process per
# allocator state: as it is, and with glibc keeping freed memory (no page faults: kernel against kernel).
DTYPE_COLUMNS = (torch.float32, torch.bfloat16, torch.float16)


def _in_dtype(args, dtype):
    """A case's floating tensors in `dtype`, leaves again (so that .grad lands on them)."""
    return [a.detach().to(dtype).requires_grad_(a.requires_grad) if a.is_floating_point() else a for a in args]


def dtype_child(names, n, reps, threads):
    """This process's allocator state: per (kind, name), each dtype's eager and ours median ms (None where
    torch has no kernel for the dtype). On one thread, the thread's CPU time (a shared machine's other
    processes then take no time from the figures, only memory bandwidth)."""
    torch.set_num_threads(threads)
    clock = time.thread_time if threads == 1 else time.perf_counter
    rows = []
    for kind, name in names:
        base = inputs(name, n) if kind == "loss" else nonlinearity_args(name, n)
        eager = _eager(name) if kind == "loss" else NL_VARIANTS["eager"](name)
        ours = _ours("medium", name, True) if kind == "loss" else NL_VARIANTS["default"](name)
        fns, paths = {}, {}
        for dt in DTYPE_COLUMNS:
            args = _in_dtype(base, dt)
            pair = {f"{dt} eager": fwd_bwd(eager, args), f"{dt} ours": fwd_bwd(ours, args)}
            try:
                for _ in range(5):  # compile (threaded after a timed call), let glibc's mmap threshold settle
                    for fn in pair.values():
                        fn()
            except (RuntimeError, NotImplementedError):  # torch's own kernel has no such dtype
                continue
            fns.update(pair)
            paths[f"{dt} on torch's op"] = not _ran_ours(pair[f"{dt} ours"])
        st = measure(fns, reps, clock)
        rows.append({"kind": kind, "name": name, **{k: v["median"] * 1e3 for k, v in st.items()}, **paths})
    return rows


def dtype_table(names, n, reps, out=None, threads=None):
    """dtype_child in a child process per allocator state; prints eager/ours per dtype and ours' 16-bit time
    over its own float32 time; writes dtypes.json to `out`."""
    threads = threads or torch.get_num_threads()
    states = {state: in_child("dtype_child", [names, n, reps, threads], env) for state, env in STATES.items()}
    low = [str(dt) for dt in DTYPE_COLUMNS[1:]]
    print(f"\nforward+backward in float32, bfloat16, float16, ~{_size_label(n)} elements, {threads} thread(s) "
          f"({'CPU time of the thread' if threads == 1 else 'wall time'}): eager/ours (policy medium) per dtype, "
          f"and ours' 16-bit time / ours' float32 time; per allocator state (no page faults: "
          f"{' and '.join(NO_PAGE_FAULTS)} = {NO_PAGE_FAULTS['MALLOC_MMAP_THRESHOLD_']} in the child); {TORCH_LEGEND}")
    head = "  ".join(f"{'f32':>6s}{'bf16':>6s}{'f16':>6s}{'bf/32':>7s}{'f16/32':>7s}" for _ in states)
    print(f"{'':34s}" + "  ".join(f"{s:^32s}" for s in states))
    print(f"{'':34s}" + head)
    geo = {(s, dt, kind): [] for s in states for dt in map(str, DTYPE_COLUMNS) for kind in ("loss", "nonlinearity")}
    for k, (kind, name) in enumerate(names):
        cells = []
        for s, rows in states.items():
            row = rows[k]
            ratio = {str(dt): row[f"{dt} eager"] / row[f"{dt} ours"] if f"{dt} ours" in row else None
                     for dt in DTYPE_COLUMNS}
            own = [row[f"{d} ours"] / row[f"{DTYPE_COLUMNS[0]} ours"] if f"{d} ours" in row else None for d in low]
            for dt, r in ratio.items():
                if r is not None:
                    geo[(s, dt, kind)].append(r)
            cells.append("".join(f"{'-':>6s}" if r is None else f"{r:5.2f}{TORCH_MARK}"
                                 if row.get(f"{dt} on torch's op") else f"{r:6.2f}" for dt, r in ratio.items())
                         + "".join(f"{r:7.2f}" if r is not None else f"{'-':>7s}" for r in own))
        print(f"{name:34s}" + "  ".join(cells))
    for kind, label in (("loss", "losses"), ("nonlinearity", "nonlinearities")):
        if not any(k == kind for k, _ in names):
            continue
        print(f"{'geometric mean, ' + label:34s}" + "  ".join(
            "".join(f"{_geo(geo[(s, str(dt), kind)]):6.2f}" for dt in DTYPE_COLUMNS) + " " * 14 for s in states))
    if out:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "dtypes.json"), "w") as f:
            json.dump({"elements": n, "threads": threads, "states": states}, f, indent=1)
    return states


def nonlinearity_args(name, n_elems):
    x = torch.randn(max(n_elems // 512, 1), 512, requires_grad=True)
    if name == "prelu":
        return [x, torch.rand(512, requires_grad=True)]
    return [x]


KINDS = {  # kind -> (variants, inputs, the variant the speedups are of, its label)
    "loss": (VARIANTS, inputs, "fused"),
    "nonlinearity": (NL_VARIANTS, nonlinearity_args, "autogen"),
}


def triad_bandwidth(n=1 << 24, reps=10):
    """The machine's memory bandwidth in bytes/s: a = b + s * c over float32 (torch's threads)."""
    a, b, c = torch.empty(n), torch.rand(n), torch.rand(n)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.add(b, c, alpha=1.5, out=a)
        best = min(best, time.perf_counter() - t0)
    return 3 * 4 * n / best


# elementwise losses: bytes a fused forward+backward moves (every input read once, input 0's
# gradient written once; float32)
ELEMENTWISE = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy",
               "binary_cross_entropy_with_logits", "gaussian_nll_loss", "hinge_embedding_loss", "kl_div",
               "margin_ranking_loss", "poisson_nll_loss")


def _bytes_moved(args):
    return sum(a.numel() * a.element_size() for a in args) + args[0].numel() * args[0].element_size()


# -- one cell: every variant of one (kind, name, size, mode) -----------------------------------
def run_cell(kind, name, n, mode, variants, reps, memory=True):
    table, make_inputs, _ = KINDS[kind]
    args = make_inputs(name, n)
    fns = {v: MODES[mode](table[v](name), args) for v in variants}
    compile_s = None
    if "compile" in fns:  # Inductor's first call (compile + run), timed apart
        t0 = time.perf_counter()
        fns["compile"]()
        compile_s = time.perf_counter() - t0
    stats = measure(fns, reps_for(n, reps))
    size = args[0].numel()
    records = []
    for v in fns:
        rec = {"kind": kind, "name": name, "size": size, "nominal": n, "mode": mode, "variant": v,
               "median_ms": stats[v]["median"] * 1e3, "p20_ms": stats[v]["p20"] * 1e3,
               "p80_ms": stats[v]["p80"] * 1e3, "peak_mb": peak_mb(fns[v]) if memory else None,
               "compile_s": compile_s if v == "compile" else None}
        if kind == "loss" and mode == "fwd+bwd" and name in ELEMENTWISE:
            rec["bytes"] = _bytes_moved(args)
        if v == "default":  # policy medium handed the call to torch's own op: eager's kernel on both sides
            rec["on_torch"] = not _ran_ours(fns[v])
        records.append(rec)
    return records


class Progress:
    """A progress bar on stderr (a line per step where stderr is not a terminal)."""

    def __init__(self, total, enabled=True):
        self.total, self.done, self.enabled = total, 0, enabled
        self.tty = sys.stderr.isatty()
        self.t0 = time.perf_counter()

    def step(self, label):
        self.done += 1
        if not self.enabled:
            return
        frac = self.done / max(self.total, 1)
        bar = "#" * int(30 * frac) + "." * (30 - int(30 * frac))
        text = f"[{bar}] {self.done}/{self.total} {time.perf_counter() - self.t0:5.0f}s {label}"
        if self.tty:
            sys.stderr.write("\r" + text[:100].ljust(100))
            if self.done == self.total:
                sys.stderr.write("\n")
        else:
            sys.stderr.write(text + "\n")
        sys.stderr.flush()


# -- tables ------------------------------------------------------------------------------------
def _geo(values):
    values = [v for v in values if v and v > 0 and math.isfinite(v)]
    return math.exp(statistics.mean(math.log(v) for v in values)) if values else float("nan")


def _index(records):
    return {(r["kind"], r["name"], r["size"], r["mode"], r["variant"]): r for r in records}


def _fmt_mb(v):
    return f"{v:7.1f}" if v is not None else f"{'-':>7s}"


def print_table(kind, mode, size_label, names, idx, size_of, variants, bandwidth, small=None):
    """One table: per name, each variant's median, the speedups of our kernel, peak memory."""
    target = KINDS[kind][2]
    others = [v for v in ("eager", "compile", "primitive") if v in variants]
    cols = [v for v in variants]
    medium = "default" in variants  # eager / policy medium's pick at this size, marked where that is torch's op
    head = (f"{kind:34s} " + " ".join(f"{v + ' ms':>11s}" for v in cols)
            + " " + " ".join(f"{v + '/' + target:>16s}" for v in others)
            + (f" {'eager/default':>16s}" if medium else "")
            + (f" {'eager/default@1K':>16s}" if small is not None else "")
            + (f" {'BW %':>5s}" if kind == "loss" and mode == "fwd+bwd" else "")
            + f" {'peak MB eager':>13s} {'peak MB ' + target:>14s}")
    print(f"\n{kind} x {mode}, {size_label}: median of interleaved repetitions (p20-p80 in the CSV)")
    print(head)
    print("-" * len(head))
    summary = {v: [] for v in others}
    summary["eager/default@1K"] = []
    mediums = []  # (eager / default, whether default ran torch's op)
    for name in names:
        n = size_of(name)
        get = lambda v: idx.get((kind, name, n, mode, v))  # noqa: E731
        t = get(target)
        if t is None:
            continue
        line = f"{name:34s} " + " ".join(f"{get(v)['median_ms']:11.2f}" if get(v) else f"{'-':>11s}" for v in cols)
        for v in others:
            ratio = get(v)["median_ms"] / t["median_ms"] if get(v) else None
            if ratio is not None:
                summary[v].append(ratio)
            line += f" {ratio:15.2f}x" if ratio is not None else f" {'-':>16s}"
        if medium:
            d, e = get("default"), get("eager")
            if d and e:
                ratio = e["median_ms"] / d["median_ms"]
                mediums.append((ratio, bool(d.get("on_torch"))))
                line += f" {ratio:15.2f}{TORCH_MARK if d.get('on_torch') else 'x'}"
            else:
                line += f" {'-':>16s}"
        if small is not None:
            s = small.get(name)
            if s is not None:
                summary["eager/default@1K"].append(s)
            line += f" {s:15.2f}x" if s is not None else f" {'-':>16s}"
        if kind == "loss" and mode == "fwd+bwd":
            line += f" {100 * t['bytes'] / (t['median_ms'] / 1e3) / bandwidth:4.0f}%" if t.get("bytes") else f" {'':5s}"
        line += f" {_fmt_mb(get('eager')['peak_mb'] if get('eager') else None):>13s} {_fmt_mb(t['peak_mb']):>14s}"
        print(line)
    print("-" * len(head))
    geo = {k: _geo(v) for k, v in summary.items() if v}
    print("geometric mean: " + ", ".join(f"{k} {g:.2f}x" if "/" in k else f"{k}/{target} {g:.2f}x"
                                         for k, g in geo.items())
          + "; below 1x: " + (", ".join(f"{k} {sum(r < 1 for r in summary[k])}" for k in summary if summary[k])))
    if mediums:  # a marked row times eager's kernel against itself: below 1x there is the run's noise
        print(f"eager/default below 1x: {sum(r < 1 for r, _ in mediums)}, of them where medium ran ours: "
              f"{sum(r < 1 and not t for r, t in mediums)}; {TORCH_MARK}: medium ran torch's op "
              f"({sum(t for _, t in mediums)} rows)")
    return geo


def print_sweep(kind, mode, names, records, target=None):
    """eager / ours by requested size (a loss's actual element count can differ: sqrt-shaped inputs)."""
    target = target or KINDS[kind][2]
    idx = {(r["name"], r["nominal"], r["variant"]): r for r in records if r["kind"] == kind and r["mode"] == mode}
    any_sizes = sorted({n for (_, n, v) in idx if v == target})
    print(f"\n{kind} x {mode}: eager/{target} by size (>1: ours is faster)")
    head = f"{kind:34s} " + " ".join(f"{_size_label(s):>8s}" for s in any_sizes)
    print(head)
    print("-" * len(head))
    for name in names:
        cells = []
        for s in any_sizes:
            e, t = idx.get((name, s, "eager")), idx.get((name, s, target))
            cells.append(f"{e['median_ms'] / t['median_ms']:7.2f}x" if e and t else f"{'-':>8s}")
        print(f"{name:34s} " + " ".join(cells))


def _size_label(n):
    for unit, k in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k}{unit}"
    return str(n)


def plot(records, path):
    """speedup (eager / ours, forward+backward) vs size, one line per name, a panel per kind."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no plot: matplotlib is not installed (pip install matplotlib; `make bench` installs it)")
        return None
    idx = _index(records)
    kinds = [k for k in KINDS if any(r["kind"] == k for r in records)]
    fig, axes = plt.subplots(1, len(kinds), figsize=(8 * len(kinds), 6), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        target = KINDS[kind][2]
        names = list(dict.fromkeys(r["name"] for r in records if r["kind"] == kind))
        for name in names:
            pts = sorted((r["size"], idx[(kind, name, r["size"], "fwd+bwd", "eager")]["median_ms"] / r["median_ms"])
                         for r in records if r["kind"] == kind and r["name"] == name and r["mode"] == "fwd+bwd"
                         and r["variant"] == target and (kind, name, r["size"], "fwd+bwd", "eager") in idx)
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
        ax.axhline(1.0, color="black", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xlabel("elements")
        ax.set_ylabel(f"eager time / {target} time (forward+backward)")
        ax.set_title(f"{kind}: speedup over torch eager")
        ax.legend(fontsize=7, ncol=2)
        ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# -- custom losses (@autogen_loss): the corpus's fused kernels against the same modules run eagerly ------
from .corpus import PseudoHuber as RobustLoss  # noqa: E402,F401 - the pseudo-Huber loss under its older name


def _module_times(cls, fused, args, reps, compile):
    """Median forward+backward seconds of the module run eagerly, `fused` under policy medium, and
    torch.compile of the module (nan without compile), interleaved."""
    fns = {"eager": fwd_bwd(cls(), args),
           "fused": fwd_bwd(lambda *a, _m=fused: _under_policy("medium", lambda: _m(*a)), args)}
    if compile:
        fns["compile"] = fwd_bwd(torch.compile(cls(), dynamic=False), args)
    res = measure(fns, reps)
    c = res["compile"]["median"] if compile else float("nan")
    return res["eager"]["median"], res["fused"]["median"], c


def bench_custom(n_elems, reps, compile=True):
    """The custom-loss corpus (autogen.corpus) at about n_elems elements: eager module, the fused kernel
    (policy medium: every corpus loss is fused), and torch.compile (Inductor) of the module."""
    cols = 512
    rows = max(n_elems // cols, 1)
    print()
    print(f"custom losses (@autogen_loss, autogen/corpus.py), {rows}x{cols}, forward+backward, median of {reps} "
          "interleaved repetitions")
    head = f"{'loss':24s} {'eager ms':>9s} {'fused ms':>9s} {'compile ms':>10s} {'eager/fused':>11s} {'compile/fused':>13s}"
    print(head)
    print("-" * len(head))
    out = []
    _raise_recompile_limit()
    for entry in CORPUS:
        torch.manual_seed(0)
        args = [a.requires_grad_(i in entry.diff) for i, a in enumerate(make(entry.kind, torch.float32, rows, cols))]
        e, f, c = _module_times(entry.cls, entry.cls(use_autogen=True), args, reps, compile)
        out.append({"loss": entry.cls.__name__, "eager_ms": e * 1e3, "fused_ms": f * 1e3, "compile_ms": c * 1e3,
                    "eager_over_fused": e / f, "compile_over_fused": c / f})
        print(f"{entry.cls.__name__:24s} {e * 1e3:9.2f} {f * 1e3:9.2f} {c * 1e3:10.2f} {e / f:10.2f}x {c / f:12.2f}x")
    geo_e = _geo([r["eager_over_fused"] for r in out])
    slower = [r["loss"] for r in out if r["eager_over_fused"] < 1]
    line = f"geometric mean: eager/fused {geo_e:.2f}x"
    if compile:
        line += f", compile/fused {_geo([r['compile_over_fused'] for r in out]):.2f}x"
    print(line + (f"; slower than eager: {', '.join(slower)}" if slower else "; none slower than eager"))
    return out


def bench_shapes(n_elems, reps, compile=True):
    """The corpus of losses of any shape (autogen.corpus_shapes) at about n_elems elements in the largest
    input (the pairwise ones: an n x n matrix of that many): eager, policy medium (fused kernels, with torch
    ops between them where the partition cut), compile."""
    print(f"\ncustom losses of any shape (autogen/corpus_shapes.py), about {n_elems} elements, forward+backward, "
          f"median of {reps}")
    head = f"{'loss':28s} {'path':>7s} {'eager ms':>9s} {'fused ms':>9s} {'compile ms':>10s} {'eager/fused':>11s} " \
           f"{'compile/fused':>13s}"
    print(head)
    print("-" * len(head))
    out = []
    _raise_recompile_limit()
    for case in SHAPES:
        probe = max(a.numel() for a in case.make(torch.float32, 64, torch.Generator().manual_seed(0)))
        n = max(int(math.isqrt(n_elems)), 1) if case.pairwise else max(n_elems * 64 // probe, 1)  # the largest
        args = [a.requires_grad_(i in case.diff) for i, a in
                enumerate(case.make(torch.float32, n, torch.Generator().manual_seed(0)))]
        fused = case.cls(use_autogen=True)
        with policy("medium"), record() as rec:
            fused(*args)
        forwards = sum(c.path != "torch" and c.phase == "forward" for c in rec.calls)
        path = "eager" if not rec.calls else "split" if any(c.path == "torch" for c in rec.calls) else \
            "kernels" if forwards > 1 else "fused"
        e, f, c = _module_times(case.cls, fused, args, reps, compile)
        name = case.cls.__name__
        out.append({"loss": name, "path": path, "eager_ms": e * 1e3, "fused_ms": f * 1e3, "compile_ms": c * 1e3,
                    "eager_over_fused": e / f, "compile_over_fused": c / f})
        print(f"{name:28s} {path:>7s} {e * 1e3:9.2f} {f * 1e3:9.2f} {c * 1e3:10.2f} {e / f:10.2f}x {c / f:12.2f}x")
    slower = [r["loss"] for r in out if r["eager_over_fused"] < 1]
    line = f"geometric mean: eager/fused {_geo([r['eager_over_fused'] for r in out]):.2f}x"
    if compile:
        line += f", compile/fused {_geo([r['compile_over_fused'] for r in out]):.2f}x"
    paths = {p: sum(r["path"] == p for r in out) for p in ("fused", "kernels", "split", "eager")}
    print(line + f"; paths {paths}" + (f"; slower than eager: {', '.join(slower)}" if slower else
                                       "; none slower than eager"))
    return out


# -- channel-first cross-entropy: (N, C, d1..dK) logits, classes read in place (no transposed copy) --------
CHANNEL_FIRST = ((8, 19, 128, 128), (16, 1000, 8, 16))  # ~2M elements: segmentation-like, many classes


def channel_first_child(shapes, reps, compile):
    """One allocator state: per shape, median ms of eager, ours (policy medium), the transposed copy into rows
    of C that ours made before, and torch.compile; forward+backward."""
    torch.manual_seed(0)
    out = []
    for shape in shapes:
        x = torch.randn(shape, requires_grad=True)
        t = torch.randint(0, shape[1], (shape[0], *shape[2:]))
        ours = _policed("medium", functools.partial(AF.cross_entropy, use_autogen=True))
        rows = lambda a, b: ours(a.movedim(1, -1).reshape(-1, a.size(1)), b.reshape(-1))  # noqa: E731
        fns = {"eager": fwd_bwd(TF.cross_entropy, [x, t]), "ours": fwd_bwd(ours, [x, t]),
               "rows": fwd_bwd(rows, [x, t])}
        if compile:
            fns["compile"] = fwd_bwd(compiled("cross_entropy", {}), [x, t])
        out.append({k: v["median"] * 1e3 for k, v in measure(fns, reps).items()})
    return out


def channel_first_table(reps, compile=True, shapes=CHANNEL_FIRST):
    """channel_first_child in a child process per allocator state; prints eager/ours, compile/ours, rows/ours."""
    print(f"\nchannel-first cross_entropy (N, C, d1..dK), float32, forward+backward, median of {reps}; "
          "rows = the transposed copy into rows of C")
    print(f"{'shape':20s} {'state':15s} {'eager ms':>9s} {'ours ms':>8s} {'eager/ours':>10s} {'compile/ours':>12s} "
          f"{'rows/ours':>9s}")
    res = {state: in_child("channel_first_child", [shapes, reps, compile], env) for state, env in STATES.items()}
    for k, shape in enumerate(shapes):
        for state in STATES:
            r = res[state][k]
            c = r["compile"] / r["ours"] if compile else float("nan")
            print(f"{str(tuple(shape)):20s} {state:15s} {r['eager']:9.2f} {r['ours']:8.2f} {r['eager'] / r['ours']:9.2f}x "
                  f"{c:11.2f}x {r['rows'] / r['ours']:8.2f}x")
    return res


# -- main --------------------------------------------------------------------------------------
SWEEP = [1 << 10, 1 << 14, 1 << 17, 1 << 20, 1 << 22, 1 << 24]


def _sizes(text):
    out = []
    for part in text.split(","):
        part = part.strip().upper()
        mult = {"K": 1 << 10, "M": 1 << 20}.get(part[-1:], 1)
        out.append(int(part[:-1] if mult > 1 else part) * mult)
    return out


def _parser():
    ap = argparse.ArgumentParser(prog="autogen bench", description="losses and nonlinearities: ours vs torch eager "
                                 "and torch.compile, forward+backward and forward only")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--elems", type=int, default=1 << 22, help="the main size (default 4M elements)")
    ap.add_argument("--sizes", type=_sizes, help="sizes to time, e.g. 1K,64K,4M (default: the main size)")
    ap.add_argument("--sweep", action="store_true", help="sizes 1K, 16K, 128K, 1M, 4M, 16M")
    ap.add_argument("--modes", nargs="*", default=list(MODES), choices=list(MODES))
    ap.add_argument("--losses", nargs="*", default=list(AF.LOSSES), help="losses to time (default: all)")
    ap.add_argument("--nonlinearities", nargs="*", default=None, help="nonlinearities to time (default: all)")
    ap.add_argument("--no-nonlinearities", action="store_true", help="skip the nonlinearity table")
    ap.add_argument("--no-states", action="store_true",
                    help="skip the nonlinearity table in two allocator states (a child process each)")
    ap.add_argument("--states-only", action="store_true", help="only the nonlinearity table in two allocator states")
    ap.add_argument("--crossovers", action="store_true",
                    help="measure activations.FASTER_FROM: where ours is faster than eager (1 and torch's threads, both states)")
    ap.add_argument("--write", metavar="JSON", help="with --crossovers: store the table in JSON (autogen/thresholds.json)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                    help="with --crossovers: the nonlinearities' dtype (16 bits: activations.FASTER_FROM_BF16, _F16)")
    ap.add_argument("--states-threads", type=int, default=None,
                    help="threads for that table (default torch's; 1: timed by the thread's CPU time)")
    ap.add_argument("--no-custom", action="store_true", help="skip the custom-loss table")
    ap.add_argument("--dtypes", action="store_true", help="only the float32/bfloat16/float16 table (fwd+bwd)")
    ap.add_argument("--no-dtypes", action="store_true", help="skip the float32/bfloat16/float16 table")
    ap.add_argument("--dtypes-threads", type=int, default=None,
                    help="threads for that table (default torch's; 1: timed by the thread's CPU time)")
    ap.add_argument("--train", nargs="*", metavar="MODEL", default=None,
                    help="only the training-step table: lm, seg, mlp (default all; autogen/train_bench.py)")
    ap.add_argument("--load", action="store_true", help="with --train: also time each step beside a busy process")
    ap.add_argument("--custom", action="store_true", help="only the custom-loss table (autogen/corpus.py), ~2M elements")
    ap.add_argument("--channel-first", action="store_true",
                    help="only channel-first cross_entropy on (N, C, H, W), both allocator states")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile (Inductor)")
    ap.add_argument("--no-memory", action="store_true", help="skip the peak-memory measurement")
    ap.add_argument("--no-plot", action="store_true", help="skip speedup.png")
    ap.add_argument("--out", default=os.path.join("benchmarks", "results"),
                    help="directory for bench.csv/.json, losses.csv/.json, nonlinearities.csv, speedup.png")
    ap.add_argument("--report", metavar="DOC", help="time nothing: write DOC (docs/performance.md) from --out's results")
    ap.add_argument("--readme", metavar="README", help="with --report: also rewrite README's results table")
    return ap


def _dump(out, name, data):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, name), "w") as f:
        json.dump(data, f, indent=1)


def main(argv=None):
    args = _parser().parse_args(argv)
    if args.report:
        return report.write(args.report, args.out, args.readme)
    reps = 5 if args.quick else 15
    sizes = SWEEP if args.sweep else (args.sizes or [args.elems])
    main_size = args.elems if args.elems in sizes else max(sizes)
    nl_names = [] if args.no_nonlinearities else (args.nonlinearities or list(AF.NONLINEARITIES))
    dtype_names = [("loss", name) for name in args.losses] + [("nonlinearity", name) for name in nl_names]
    if _one_table(args, reps, main_size, nl_names, dtype_names):
        return None
    return _all_tables(args, argv, reps, sizes, main_size, nl_names, dtype_names)


def _one_table(args, reps, main_size, nl_names, dtype_names):
    """Run the one table an option asks for alone (--train, --channel-first, --custom, --dtypes, --crossovers,
    --states-only); False when none does."""
    if args.train is not None:
        _dump(args.out, "train.json", train_bench.main(args.train or list(train_bench.SIZES), quick=args.quick,
                                                       load=args.load))
    elif args.channel_first:
        channel_first_table(reps, compile=not args.no_compile)
    elif args.custom:  # the custom-loss section alone, at about 2M elements unless --elems says otherwise
        elems = args.elems if args.elems != 1 << 22 else 1 << 21
        rows = bench_custom(elems, reps, compile=not args.no_compile)
        shapes = bench_shapes(elems, reps, compile=not args.no_compile)
        _dump(args.out, "custom.json", {"elements": elems, "threads": torch.get_num_threads(), "rows": rows,
                                        "shapes": shapes})
    elif args.dtypes:
        dtype_table(dtype_names, main_size, reps, args.out, args.dtypes_threads)
    elif args.crossovers:
        crossovers(nl_names, sizes=args.sizes or CROSSOVER_SIZES, reps=reps, dtype=args.dtype, write=args.write)
    elif args.states_only:
        rows = nonlinearity_states(nl_names, main_size, reps, args.modes, args.states_threads)
        _dump(args.out, "nonlinearity_states.json",
              {"elements": main_size, "threads": torch.get_num_threads(), "rows": rows})
    else:
        return False
    return True


def _all_tables(args, argv, reps, sizes, main_size, nl_names, dtype_names):
    """The loss and nonlinearity tables at every size and mode, then the custom, dtype and allocator-state ones."""
    drop = {"compile"} if args.no_compile else set()
    loss_variants = [v for v in VARIANTS if v not in drop]
    nl_variants = [v for v in NL_VARIANTS if v not in drop]
    small_cells = [] if 1024 in sizes else [("loss", name) for name in args.losses]
    cells = [("loss", name, n, mode, loss_variants) for n in sizes for mode in args.modes for name in args.losses]
    cells += [("loss", name, 1024, "fwd+bwd", ["eager", "default"]) for _, name in small_cells]
    cells += [("nonlinearity", name, n, mode, nl_variants) for n in sizes for mode in args.modes for name in nl_names]
    bandwidth = triad_bandwidth()
    run_info = _run_info(argv, reps)  # how this run was made, for `autogen bench --report`
    print(_isa.describe())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; sizes "
          f"{', '.join(_size_label(s) for s in sizes)} elements (class and row losses: rows of 512); "
          f"{reps} interleaved repetitions (more below 1M); triad bandwidth {bandwidth / 1e9:.1f} GB/s")
    progress = Progress(len(cells))
    records = []
    for kind, name, n, mode, variants in cells:
        memory = not args.no_memory and n >= 1 << 16
        records += run_cell(kind, name, n, mode, variants, reps if n > 1024 else reps * 2, memory)
        progress.step(f"{kind} {name} {_size_label(n)} {mode}")
    idx = _index(records)
    size_of = functools.partial(_size_of, records, main_size)
    small = _small_ratios(records, args.losses)
    summary = {"threads": torch.get_num_threads(), "triad_bandwidth_bytes_per_s": bandwidth,
               "sizes": sizes, "main_size": main_size, "tables": {}, **run_info}
    for kind, names, variants in (("loss", args.losses, loss_variants), ("nonlinearity", nl_names, nl_variants)):
        for mode in args.modes if names else ():
            geo = print_table(kind, mode, f"~{_size_label(main_size)} elements", names, idx, size_of(kind),
                              variants, bandwidth, small if kind == "loss" and mode == "fwd+bwd" else None)
            summary["tables"][f"{kind} {mode}"] = geo
            if len(sizes) > 1:
                print_sweep(kind, mode, names, records)
                print_sweep(kind, mode, names, records, "default")  # what users get: torch's below thresholds
    print(f"\nBW % = bytes a fused forward+backward must move (inputs read once, gradient written once) per second, "
          f"as a fraction of the triad bandwidth ({bandwidth / 1e9:.1f} GB/s). peak MB = resident memory one call "
          f"adds at its peak. compile = torch.compile (Inductor) after its first call; its compile time is in the "
          f"CSV (compile_s).")
    print("fused/autogen = our generated kernel (policy aggressive); default = policy medium (a handwritten "
          "kernel where one exists, torch's own below the size threshold); primitive = use_autogen=False (op by op; "
          "policy medium, so below the size threshold torch's own loss: NLL at 4M)")
    custom_rows = [] if args.no_custom else bench_custom(main_size, reps, compile=not args.no_compile)
    if not args.no_dtypes:
        dtype_table(dtype_names, main_size, max(reps // 3, 5), args.out, args.dtypes_threads)
    state_rows = [] if args.no_states or not nl_names else nonlinearity_states(nl_names, main_size, reps, args.modes,
                                                                                args.states_threads)
    return _write_results(args, records, summary, size_of, small, bandwidth, nl_names, custom_rows, state_rows)


def _size_of(records, main_size, kind):
    """name -> the size of its main-size records of `kind`."""
    def f(name):
        return next((r["size"] for r in records if r["kind"] == kind and r["name"] == name
                     and r["variant"] != "default" and _near(r["size"], main_size)), None)
    return f


def _small_ratios(records, losses):
    """loss -> eager / default at 1K elements (forward+backward)."""
    small = {}
    for name in losses:
        ks = [r for r in records if r["kind"] == "loss" and r["name"] == name and r["mode"] == "fwd+bwd"
              and r["size"] <= 1024]
        e = next((r for r in ks if r["variant"] == "eager"), None)
        d = next((r for r in ks if r["variant"] == "default"), None)
        if e and d:
            small[name] = e["median_ms"] / d["median_ms"]
    return small


def _write_results(args, records, summary, size_of, small, bandwidth, nl_names, custom_rows, state_rows):
    """bench.csv/.json, losses.csv/.json, nonlinearities.csv and the plot under args.out."""
    out = args.out
    os.makedirs(out, exist_ok=True)
    fields = list(dict.fromkeys(k for r in records for k in r))
    with open(os.path.join(out, "bench.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(records)
    rows = _wide(records, "loss", args.losses, size_of("loss"), small, bandwidth)
    nl_rows = _wide(records, "nonlinearity", nl_names, size_of("nonlinearity"), {}, bandwidth)
    for fname, data in (("losses.csv", rows), ("nonlinearities.csv", nl_rows)):
        if data:
            with open(os.path.join(out, fname), "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in data for k in r)))
                w.writeheader()
                w.writerows(data)
    png = None if args.no_plot else plot(records, os.path.join(out, "speedup.png"))
    summary["plot"] = png
    summary["loadavg_end"] = os.getloadavg()[0]  # the report shows how busy the machine was
    _dump(out, "bench.json", {"summary": summary, "records": records, "custom": custom_rows,
                              "nonlinearity_states": state_rows})
    _dump(out, "losses.json", {"rows": rows, "nonlinearities": nl_rows, "custom": custom_rows, **summary})
    print(f"wrote {os.path.join(out, 'bench.csv')}, bench.json, losses.csv/.json, nonlinearities.csv"
          + (f", {os.path.basename(png)}" if png else ""))
    return summary


def _run_info(argv, reps):
    """The command, date, repetitions, torch version, load and glibc settings of a run (the report shows them)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    return {"command": " ".join(["autogen bench"] + argv), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "reps": reps, "torch": torch.__version__, "loadavg": os.getloadavg()[0], "machine": _isa.describe(),
            "isa": _isa.kernel_isa(),
            "malloc_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("MALLOC_")}}


def _near(size, main):
    return main / 2 < size <= main * 2


def _wide(records, kind, names, size_of, small, bandwidth):
    """One row per name at the main size, forward+backward and forward-only medians side by side."""
    target = KINDS[kind][2]
    idx = _index(records)
    rows = []
    for name in names:
        n = size_of(name)
        if n is None:
            continue
        row = {kind: name, "size": n}
        for mode in MODES:
            tag = "" if mode == "fwd+bwd" else "fwd_"
            t = idx.get((kind, name, n, mode, target))
            for v in KINDS[kind][0]:
                r = idx.get((kind, name, n, mode, v))
                if r is None:
                    continue
                row[f"{tag}{v}_ms"] = r["median_ms"]
                row[f"{tag}{v}_p20_ms"] = r["p20_ms"]
                row[f"{tag}{v}_p80_ms"] = r["p80_ms"]
                row[f"{tag}{v}_peak_mb"] = r["peak_mb"]
                if v != target and t is not None:
                    row[f"{tag}{v}_over_{target}"] = r["median_ms"] / t["median_ms"]
                if r["compile_s"] is not None:
                    row[f"{tag}compile_seconds"] = r["compile_s"]
            if mode == "fwd+bwd" and t is not None and t.get("bytes"):
                row["fused_bandwidth_fraction"] = t["bytes"] / (t["median_ms"] / 1e3) / bandwidth
        if name in small:
            row["eager_over_default_1k"] = small[name]
        rows.append(row)
    return rows


if __name__ == "__main__":
    main()

"""docs/performance.md and the README's results table, written from the benchmark's results JSON.

`autogen bench --report docs/performance.md [--readme README.md] [--out benchmarks/results]` reads
bench.json under --out (and the runs in its subfolders, e.g. another allocator state), renders
templates/performance.md.j2 and, with --readme, replaces the README's block between its results markers.
No benchmark runs: the figures are the last run's.
"""
import glob
import json
import math
import os
import re
import shutil
import statistics
from importlib import resources

import jinja2

from . import functional as AF, isa

TARGETS = {"loss": "fused", "nonlinearity": "autogen"}  # the variant each kind's speedups are of
KIND_LABELS = {"loss": "losses", "nonlinearity": "nonlinearities"}
BEGIN = "<!-- results: written by `autogen bench --report docs/performance.md --readme README.md` -->"
END = "<!-- end of results -->"

_ENV = jinja2.Environment(loader=jinja2.FunctionLoader(
    lambda name: resources.files("autogen.templates").joinpath(name).read_text()),
    undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)


def load_run(path):
    """One run's bench.json: {"summary", "records", "custom"}."""
    with open(path) as f:
        run = json.load(f)
    run.setdefault("custom", [])
    run["path"] = path
    return run


def _geo(values):
    values = [v for v in values if v and v > 0 and math.isfinite(v)]
    return math.exp(statistics.mean(math.log(v) for v in values)) if values else None


def _index(records):
    return {(r["kind"], r["name"], r["nominal"], r["mode"], r["variant"]): r for r in records}


def _label(n):
    for unit, k in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= k and n % k == 0:
            return f"{n // k}{unit}"
    return str(n)


def tables(run):
    """The main size's tables, one per (kind, mode): a row per name with each variant's median and the ratios."""
    records, main = run["records"], run["summary"]["main_size"]
    idx = _index(records)
    bandwidth = run["summary"].get("triad_bandwidth_bytes_per_s")
    out = []
    for kind, target in TARGETS.items():
        for mode in dict.fromkeys(r["mode"] for r in records):
            names = list(dict.fromkeys(r["name"] for r in records if r["kind"] == kind and r["mode"] == mode
                                       and r["nominal"] == main))
            if not names:
                continue
            variants = list(dict.fromkeys(r["variant"] for r in records if r["kind"] == kind and r["mode"] == mode
                                          and r["nominal"] == main))
            rows = []
            for name in names:
                cell = {v: idx.get((kind, name, main, mode, v)) for v in variants}
                t = cell.get(target)
                row = {"name": name, "ms": {v: r["median_ms"] for v, r in cell.items() if r}, "peak": {}}
                row["peak"] = {v: r.get("peak_mb") for v, r in cell.items() if r}
                row["ratio"] = {v: r["median_ms"] / t["median_ms"] for v, r in cell.items() if r and t and v != target}
                row["bw"] = (t["bytes"] / (t["median_ms"] / 1e3) / bandwidth
                             if t and t.get("bytes") and bandwidth else None)
                rows.append(row)
            others = [v for v in variants if v != target]
            out.append({"kind": kind, "mode": mode, "target": target, "variants": variants, "others": others,
                        "rows": rows, "geo": {v: _geo([r["ratio"].get(v) for r in rows]) for v in others},
                        "slower": {v: sum(1 for r in rows if r["ratio"].get(v, 1) < 1) for v in others},
                        "any_bw": any(r["bw"] for r in rows)})
    return out


def small(run):
    """eager/default at 1K elements (the losses' small-input path), per loss."""
    idx = _index(run["records"])
    rows = []
    for (kind, name, n, mode, v), r in idx.items():
        if kind == "loss" and n == 1024 and mode == "fwd+bwd" and v == "default":
            e = idx.get((kind, name, n, mode, "eager"))
            if e:
                rows.append({"name": name, "ratio": e["median_ms"] / r["median_ms"]})
    return rows


def sweeps(run):
    """eager/ours by size, one table per (kind, mode), where the run timed more than one size."""
    records = run["records"]
    sizes = sorted({r["nominal"] for r in records if r["nominal"] > 1024 or len(run["summary"]["sizes"]) > 1})
    if len(run["summary"].get("sizes", [])) < 2:
        return []
    idx = _index(records)
    out = []
    for kind, target in TARGETS.items():
        for mode in dict.fromkeys(r["mode"] for r in records):
            names = list(dict.fromkeys(r["name"] for r in records if r["kind"] == kind and r["mode"] == mode))
            rows = []
            for name in names:
                cells = []
                for s in sizes:
                    e, t = idx.get((kind, name, s, mode, "eager")), idx.get((kind, name, s, mode, target))
                    cells.append(e["median_ms"] / t["median_ms"] if e and t else None)
                rows.append({"name": name, "cells": cells})
            if rows:
                out.append({"kind": kind, "mode": mode, "target": target, "sizes": [_label(s) for s in sizes],
                            "rows": rows})
    return out


def states(runs):
    """eager/ours and compile/ours per name (forward+backward, main size) in each allocator state side by side."""
    if len(runs) < 2:
        return None
    per = [{(t["kind"], row["name"]): row["ratio"] for t in tables(run) if t["mode"] == "fwd+bwd"
            for row in t["rows"]} for run in runs]
    keys = [k for k in per[0] if all(k in p for p in per[1:])]  # what every state timed
    rows = [{"kind": k[0], "name": k[1], "cells": [(p.get(k, {}).get("eager"), p.get(k, {}).get("compile"))
                                                   for p in per]} for k in keys]
    return {"labels": [state_label(run) for run in runs], "rows": rows,
            "runs": [(state_label(run), run["summary"].get("command", "?"), run["summary"].get("date", "?"))
                     for run in runs]}


def nonlinearity_states(run):
    """The nonlinearity table in two allocator states (bench.json's "nonlinearity_states"): eager / ours per
    state, mode and variant, and the bytes each variant saves for backward."""
    rows = run.get("nonlinearity_states") or []
    if not rows:
        return None
    ratio = re.compile(r"(.+) (fwd\+bwd|fwd) eager_over_(\w+)$")  # "<state> <mode> eager_over_<variant>"
    cols = [m.groups() for m in map(ratio.match, rows[0]) if m]
    saved = [k[:-len("_saved_bytes")] for k in rows[0] if k.endswith("_saved_bytes")]
    return {"cols": cols, "saved": saved,
            "rows": [{"name": r["name"], "saved": [r[f"{v}_saved_bytes"] / 2 ** 20 for v in saved],
                      "cells": [marked(r.get(f"{st} {mode} eager_over_{v}"),
                                       v == "default" and r.get(f"{mode} default on torch's op"))
                                for st, mode, v in cols]} for r in rows],
            "geo": [_geo([r.get(f"{st} {mode} eager_over_{v}") for r in rows]) for st, mode, v in cols]}


def dtypes(out):
    """dtypes.json (`autogen bench`'s float32/bfloat16/float16 table): per allocator state and name, eager / ours per
    dtype and ours' 16-bit time over its float32 time."""
    path = os.path.join(out, "dtypes.json")
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        data = json.load(f)
    states = data["states"]
    dts = list(dict.fromkeys(k[:-len(" ours")] for rows in states.values() for r in rows for k in r
                             if k.endswith(" ours")))
    rows = []
    for k, first in enumerate(next(iter(states.values()))):
        cells = []
        for st_rows in states.values():
            r = st_rows[k]
            cells += [marked(r[f"{dt} eager"] / r[f"{dt} ours"] if f"{dt} ours" in r else None, r.get(f"{dt} on torch's op"))
                      for dt in dts]
            cells += [marked(r[f"{dt} ours"] / r[f"{dts[0]} ours"] if f"{dt} ours" in r and f"{dts[0]} ours" in r
                             else None) for dt in dts[1:]]
        rows.append({"kind": first["kind"], "name": first["name"], "cells": cells})
    cols = [c for st in states for c in [f"{st}: eager / ours, {dt}" for dt in dts]
            + [f"{st}: ours {dt} / ours {dts[0]}" for dt in dts[1:]]]
    return {"elements": data.get("elements"), "threads": data.get("threads"), "cols": cols, "rows": rows}


def linear_ce(out):
    """Rows of `python benchmarks/bench_linear_ce.py --json DIR/linear_ce*.json` runs found in the results folder."""
    rows = []
    for path in sorted(glob.glob(os.path.join(out, "linear_ce*.json"))):
        with open(path) as f:
            rows += json.load(f)
    for r in rows:
        mem = r["mem"]
        r["peak_mb"] = {v: m / 2 ** 20 for v, m in mem.items()}
        r["mem_over_eager"] = mem["ours"] / mem["eager"] if mem.get("eager") else None
    return rows


def train(out):
    """Rows of `autogen bench --train` (train.json in the results folder): per model, each variant's median
    step, the speedups of the autogen variants, the shares of eager's step, the loss after N steps."""
    path = os.path.join(out, "train.json")
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        results = json.load(f)
    rows = []
    for r in results:
        vs = r["variants"]
        ref = vs["eager"]["loss_after"]
        rows.append({"model": r["model"], "ms": {v: vs[v]["median_ms"] for v in vs},
                     "autogen": vs["eager"]["median_ms"] / vs["autogen"]["median_ms"],
                     "compile_autogen": vs["compile"]["median_ms"] / vs["compile+autogen"]["median_ms"],
                     "loss_share": r["shares"]["loss"], "act_share": r["shares"]["act"],
                     "peak_mb": {v: vs[v]["peak_mb"] for v in vs},
                     "loss_rel": {v: (vs[v]["loss_after"] - ref) / abs(ref) if ref else 0.0 for v in vs},
                     "loaded": {v: vs[v].get("loaded_over_quiet") for v in vs}, "steps": r["steps"]})
    return rows


def state_label(run):
    env = run["summary"].get("malloc_env") or {}
    return "default" if not env else " ".join(f"{k}={v}" for k, v in env.items())


def thresholds():
    """The size thresholds as the code has them now."""
    return [{"name": n, "grad": AF.SMALL_ELEMENTS[n], "no_grad": AF.SMALL_ELEMENTS_NO_GRAD[n]}
            for n in AF.LOSSES]


def nl_thresholds():
    """The nonlinearities' float32 sizes from which policy medium runs our kernel (None: torch's op at every
    size), per instruction set (thresholds.json): {"name", "avx512": (grad, no_grad), "avx2": (...)}."""
    tables = isa.load_thresholds()
    return [{"name": n, **{k: tuple(tables[k]["float32"][n]) for k in ("avx512", "avx2")}}
            for n in tables["avx512"]["float32"]]


def fmt(v, spec=".2f", none="-"):
    return none if v is None else format(v, spec)


# the benchmark's mark of a ratio where policy medium ran torch's own op: the ratio measures the harness's noise
TORCH_MARK = "*"
TORCH_LEGEND = f"{TORCH_MARK}: policy medium ran torch's own op (eager's kernel on both sides)"


def marked(v, torch_op=False):
    """A ratio's cell: `fmt`, with TORCH_MARK where policy medium ran torch's own op."""
    return fmt(v) + (TORCH_MARK if torch_op and v is not None else "")


def size(n):
    if n is None:
        return "never"
    if n >= 1 << 60:
        return "always"
    return "none" if n == 0 else _label(n)


_ENV.filters.update(fmt=fmt, size=size)
_ENV.globals.update(KINDS=KIND_LABELS,
                    MODES={"fwd+bwd": "forward+backward", "fwd": "forward only"})


def find_runs(out):
    """The run in `out` first (the default allocator state), then one per subfolder holding a bench.json."""
    runs = [load_run(os.path.join(out, "bench.json"))]
    for sub in sorted(os.listdir(out)):
        path = os.path.join(out, sub, "bench.json")
        if os.path.isfile(path):
            runs.append(load_run(path))
    return runs


def plot_bars(run, path):
    """Speedup over torch eager at the main size, forward+backward: a horizontal bar per name for ours and for
    torch.compile, sorted, eager = 1 marked; a panel per kind. False without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        return False
    panels = [t for t in tables(run) if t["mode"] == "fwd+bwd" and t["rows"]]
    if not panels:
        return False
    heights = [len(t["rows"]) for t in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 1.5 + 0.32 * sum(heights)), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    for ax, t in zip(axes[:, 0], panels):
        rows = sorted(t["rows"], key=lambda r: r["ratio"].get("eager") or 0)
        ys = range(len(rows))
        ours = [r["ratio"].get("eager") or float("nan") for r in rows]  # eager time / ours: ours' speedup
        comp = [r["ratio"]["eager"] / r["ratio"]["compile"] if r["ratio"].get("eager") and r["ratio"].get("compile")
                else float("nan") for r in rows]  # eager time / compile time
        for off, vals, label, color in ((0.2, ours, "ours", "tab:blue"), (-0.2, comp, "torch.compile", "tab:orange")):
            # each bar runs from eager's 1x to the variant's speedup, right of it when faster
            ax.barh([y + off for y in ys], [abs(v - 1) for v in vals], left=[min(v, 1) for v in vals], height=0.4,
                    label=label, color=color)
        ax.axvline(1.0, color="black", linewidth=1)
        ax.set_xscale("log", base=2)
        seen = [v for v in ours + comp if math.isfinite(v)] + [1.0]
        ax.set_xlim(min(seen) / 1.2, max(seen) * 1.2)
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
        ax.set_yticks(list(ys), [r["name"] for r in rows], fontsize=8)
        ax.set_title(f"{KIND_LABELS[t['kind']]}, forward+backward, ~{_label(run['summary']['main_size'])} elements: "
                     "speedup over torch eager (1 = eager)", fontsize=10)
        ax.grid(True, axis="x", which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def _plot(run, doc):
    """The plot beside the document: bars at one size (drawn here), the run's own speedup-vs-size plot for a
    sweep. Its name relative to the document, or None."""
    if len(run["summary"].get("sizes", [])) < 2:
        name = "speedup.png"
        return name if plot_bars(run, os.path.join(os.path.dirname(os.path.abspath(doc)), name)) else None
    src = run["summary"].get("plot")
    if not src:
        return None
    src = src if os.path.isabs(src) or os.path.exists(src) else os.path.join(os.path.dirname(run["path"]), src)
    if not os.path.exists(src):
        src = os.path.join(os.path.dirname(run["path"]), os.path.basename(src))
    if not os.path.exists(src):
        return None
    name = os.path.basename(src)
    dst = os.path.join(os.path.dirname(os.path.abspath(doc)), name)
    if os.path.abspath(src) != dst:
        shutil.copyfile(src, dst)
    return name


def context(runs, doc):
    run = runs[0]
    s = run["summary"]
    return {"s": s, "run": run, "tables": tables(run), "small": small(run), "sweeps": sweeps(run),
            "states": states(runs), "custom": run["custom"], "thresholds": thresholds(),
            "nl_states": nonlinearity_states(run), "linear_ce": linear_ce(os.path.dirname(run["path"])),
            "dtypes": dtypes(os.path.dirname(run["path"])), "train": train(os.path.dirname(run["path"])),
            "threshold_env": os.environ.get("AUTOGEN_SMALL_ELEMENTS"), "nl_thresholds": nl_thresholds(),
            "custom_geo": _geo([r.get("eager_over_fused") for r in run["custom"]]),
            "custom_geo_compile": _geo([r.get("compile_over_fused") for r in run["custom"]]),
            "small_geo": _geo([r["ratio"] for r in small(run)]),
            "quick": "--quick" in s.get("command", ""), "plot": _plot(run, doc) if doc else None,
            "bandwidth": (s.get("triad_bandwidth_bytes_per_s") or 0) / 1e9, "main": _label(s["main_size"]),
            "torch_legend": TORCH_LEGEND}


def render_readme_block(runs, doc, plot=None):
    """The README's results table; `doc` and `plot` are paths relative to the README."""
    return _ENV.get_template("results_block.md.j2").render(**dict(context(runs, None), plot=plot), doc=doc).strip()


def replace_block(text, block):
    """The README's text with the results block between the markers replaced."""
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"README has no results block: it needs the lines {BEGIN!r} and {END!r}")
    return text[:start + len(BEGIN)] + "\n" + block + "\n" + text[end:]


def write(doc, out, readme=None):
    """Render the document from the runs in `out`; with `readme`, its results block too."""
    if not os.path.isfile(os.path.join(out, "bench.json")):
        raise ValueError(f"no benchmark results in {out}: run `autogen bench` first (or pass --out DIR)")
    runs = find_runs(out)
    os.makedirs(os.path.dirname(os.path.abspath(doc)), exist_ok=True)
    ctx = context(runs, doc)
    text = _ENV.get_template("performance.md.j2").render(**ctx)
    with open(doc, "w") as f:
        f.write(text)
    written = [doc]
    if readme:
        rel = os.path.relpath(os.path.abspath(doc), os.path.dirname(os.path.abspath(readme)))
        with open(readme) as f:
            old = f.read()
        with open(readme, "w") as f:
            plot = ctx["plot"] and os.path.join(os.path.dirname(rel), ctx["plot"])
            f.write(replace_block(old, render_readme_block(runs, rel, plot)))
        written.append(readme)
    print("wrote " + ", ".join(written))
    return written

"""The README and docs/: code examples run, names they mention exist, the performance report renders a run."""
import importlib
import importlib.util
import json
import os
import re
import types

import pytest

import autogen
from autogen import cli, report

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
DOCS = ["README.md", "docs/design.md", "docs/performance.md", "docs/performance-avx2.md"]
# README blocks that need more than one process or an Inductor compile; each is run by its own test
SKIP = {"init_process_group": "test_reliability.py::test_ddp_two_gloo_ranks_match_the_torch_loss",
        "DistributedDataParallel": "test_reliability.py::test_ddp_two_gloo_ranks_match_the_torch_loss"}


def _read(path):
    with open(os.path.join(ROOT, path)) as f:
        return f.read()


def _python_blocks():
    return re.findall(r"```python\n(.*?)```", _read("README.md"), re.S)


def test_readme_python_examples_run_in_order():
    """Every python block, top to bottom in one namespace, as a reader runs them."""
    scope, ran = {}, 0
    try:
        for i, block in enumerate(_python_blocks()):
            if not any(word in block for word in SKIP):
                exec(compile(block, f"README.md python block {i}", "exec"), scope)
                ran += 1
    finally:
        autogen.set_policy(None)
    assert ran == len(_python_blocks()) - 1  # all but DDP's


@pytest.mark.parametrize("doc", [d for d in DOCS if os.path.exists(os.path.join(ROOT, d))])
def test_paths_and_names_the_docs_mention_exist(doc):
    text = _read(doc)
    for path in set(re.findall(r"`((?:autogen|kernels|templates|benchmarks|tests|examples)/[\w./]+)`", text)):
        if path.startswith("benchmarks/results"):  # what a benchmark run writes
            continue
        assert os.path.exists(os.path.join(ROOT, path.split("::")[0])), f"{doc} names {path}, which does not exist"
    for dotted in set(re.findall(r"`autogen\.(\w+(?:\.\w+)*)", text)):
        obj = autogen
        for part in dotted.split("."):
            if not hasattr(obj, part) and isinstance(obj, types.ModuleType):  # a submodule not imported by autogen
                importlib.util.find_spec(f"{obj.__name__}.{part}") and importlib.import_module(f"{obj.__name__}.{part}")
            assert hasattr(obj, part), f"{doc} names autogen.{dotted}, which does not exist"
            obj = getattr(obj, part)
    for module, name in set(re.findall(r"(?<![\w.])(\w+)\.(_?[A-Za-z]\w*)\b", text)):  # functional._ATEN, executor.fused_plan
        if os.path.exists(os.path.join(ROOT, "autogen", module + ".py")) and name not in ("py", "md", "j2"):
            mod = importlib.import_module("autogen." + module)
            assert hasattr(mod, name), f"{doc} names {module}.{name}, which does not exist"


def _code_words():
    """Every word of the code, tests, benchmarks, examples and build files (not the docs' templates or this file)."""
    words = set(re.findall(r"\w+", _read("Makefile") + _read("pyproject.toml")))
    for top in ("autogen", "kernels", "templates", "tests", "benchmarks", "examples"):
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            for name in files:
                if name.endswith((".py", ".j2", ".yaml")) and not name.endswith(".md.j2") and name != "test_docs.py":
                    with open(os.path.join(folder, name)) as f:
                        words |= set(re.findall(r"\w+", f.read()))
    return words


@pytest.mark.parametrize("doc", [d for d in DOCS if os.path.exists(os.path.join(ROOT, d))])
def test_every_name_the_docs_quote_is_in_the_code(doc):
    words = _code_words()
    missing = {n for n in re.findall(r"`([A-Za-z_]\w*)`", _read(doc)) if n not in words}
    assert not missing, f"{doc} quotes names no code has: {sorted(missing)}"


def _record(kind, name, mode, variant, ms, nominal=1 << 22):
    return {"kind": kind, "name": name, "size": nominal, "nominal": nominal, "mode": mode, "variant": variant,
            "median_ms": ms, "p20_ms": ms * 0.9, "p80_ms": ms * 1.1, "peak_mb": 16.0, "compile_s": None}


def _run(tmp, malloc_env, scale=1.0):
    """A synthetic results file as `autogen bench` writes it: two losses, one nonlinearity, both modes."""
    times = {("loss", "mse_loss"): {"eager": 4.0, "compile": 3.0, "primitive": 8.0, "fused": 2.0, "default": 2.5},
             ("loss", "nll_loss"): {"eager": 1.0, "compile": 1.2, "primitive": 1.1, "fused": 1.25, "default": 1.0},
             ("nonlinearity", "gelu"): {"eager": 6.0, "compile": 5.0, "autogen": 3.0, "default": 3.0}}
    records = [_record(k, n, mode, v, ms * scale * (0.5 if mode == "fwd" else 1))
               for (k, n), vs in times.items() for mode in ("fwd+bwd", "fwd") for v, ms in vs.items()]
    records += [_record("loss", "mse_loss", "fwd+bwd", "eager", 0.02, 1024),
                _record("loss", "mse_loss", "fwd+bwd", "default", 0.025, 1024)]
    for r in records:  # bench.py gives every variant of an elementwise loss's fwd+bwd cell the bytes moved
        if r["name"] == "mse_loss" and r["mode"] == "fwd+bwd":
            r["bytes"] = 3 * 4 * (1 << 22)
    summary = {"threads": 2, "triad_bandwidth_bytes_per_s": 20e9, "sizes": [1 << 22], "main_size": 1 << 22,
               "tables": {}, "command": "autogen bench --quick", "date": "2026-01-01 00:00 UTC", "reps": 5,
               "torch": "2.13.0", "loadavg": 1.5, "malloc_env": malloc_env, "plot": None}
    custom = [{"loss": "FocalLoss", "eager_ms": 3.0, "fused_ms": 1.0, "compile_ms": 2.0,
               "eager_over_fused": 3.0, "compile_over_fused": 2.0}]
    states = [{"name": "gelu", "size": 1 << 22, "eager_saved_bytes": 16 << 20, "default_saved_bytes": 16 << 20,
               "autogen_saved_bytes": 32 << 20, "default fwd+bwd eager_over_autogen": 1.5,
               "no page faults fwd+bwd eager_over_autogen": 1.25}]
    os.makedirs(tmp, exist_ok=True)
    with open(os.path.join(tmp, "bench.json"), "w") as f:
        json.dump({"summary": summary, "records": records, "custom": custom, "nonlinearity_states": states}, f)
    with open(os.path.join(tmp, "dtypes.json"), "w") as f:  # autogen bench's dtype table
        json.dump({"elements": 1 << 22, "threads": 1, "states": {s: [
            {"kind": "loss", "name": "mse_loss", "torch.float32 eager": 4.0, "torch.float32 ours": 2.0,
             "torch.bfloat16 eager": 9.0, "torch.bfloat16 ours": 3.0, "torch.bfloat16 on torch's op": True}]
            for s in ("default", "no page faults")}}, f)
    with open(os.path.join(tmp, "train.json"), "w") as f:  # autogen bench --train
        variants = {v: {"median_ms": ms, "p20_ms": ms, "p80_ms": ms, "peak_mb": 10.0, "loss_after": 2.0,
                        "first_steps_s": 1.0, "loaded_over_quiet": 1.5}
                    for v, ms in (("eager", 120.0), ("autogen", 100.0), ("compile", 90.0), ("compile+autogen", 80.0))}
        json.dump([{"model": "lm", "size": {}, "variants": variants, "steps": 14,
                    "shares": {"loss": 0.25, "act": 0.05}}], f)
    with open(os.path.join(tmp, "linear_ce.json"), "w") as f:  # bench_linear_ce.py --json
        json.dump([{"tokens": 2048, "vocab": 32768, "dtype": "float32", "state": "heap", "median": {"ours": 2.5},
                    "per_ours": {"eager": 1.1, "compile": 0.9}, "cpu_per_ours": {"eager": 1.2, "compile": 0.8},
                    "mem": {"eager": 800 << 20, "compile": 300 << 20, "ours": 100 << 20}}], f)


def test_report_renders_a_run_and_rewrites_only_the_readme_block(tmp_path):
    out = tmp_path / "results"
    _run(str(out), {})
    _run(str(out / "heap"), {"MALLOC_TRIM_THRESHOLD_": "4294967296"}, scale=0.5)
    readme = tmp_path / "README.md"
    readme.write_text(f"# title\n\nbefore\n\n{report.BEGIN}\nold table\n{report.END}\n\nafter\n")
    doc = tmp_path / "docs" / "performance.md"
    assert cli.main(["bench", "--report", str(doc), "--readme", str(readme), "--out", str(out)]) == 0
    text = doc.read_text()
    assert "autogen bench --quick" in text and "quick run" in text
    row = next(line for line in text.splitlines() if line.startswith("| `mse_loss` |") and "4.000" in line)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:6] == [f"{ms:.3f}" for ms in (4.0, 3.0, 8.0, 2.0, 2.5)]
    assert cells[6:10] == [f"{r:.2f}" for r in (4.0 / 2.0, 3.0 / 2.0, 8.0 / 2.0, 2.5 / 2.0)]
    assert cells[10] == f"{100 * 3 * 4 * (1 << 22) / 2e-3 / 20e9:.0f}"
    geo = (4.0 / 2.0 * 1.0 / 1.25) ** 0.5
    assert f"eager / fused {geo:.2f}x (1 of 2 below 1)" in text
    assert "`MALLOC_TRIM_THRESHOLD_=4294967296`" in text  # the second allocator state's table
    assert "| `FocalLoss` |" in text and "| `gelu` |" in text
    assert f"| `mse_loss` | {0.02 / 0.025:.2f} |" in text  # 1K: eager / default
    from autogen import functional as AF
    assert f"| `nll_loss` | {report.size(AF.SMALL_ELEMENTS['nll_loss'])} |" in text
    from autogen import activations, isa
    tables = isa.load_thresholds()
    assert activations.FASTER_FROM == {k: tuple(v) for k, v in tables[isa.kernel_isa()]["float32"].items()}
    for name in activations.FASTER_FROM:
        cells = [report.size(v) for k in ("avx512", "avx2") for v in tables[k]["float32"][name]]
        assert f"| `{name}` | " + " | ".join(cells) + " |" in text
    assert "| `gelu` | 16 / 16 / 32 | 1.50 | 1.25 |" in text  # nonlinearities in both allocator states
    # dtypes: eager/ours, bf16/f32; a ratio where policy medium ran torch's op is marked, and the mark explained
    assert "| loss | `mse_loss` | 2.00 | 3.00* | 1.50 | 2.00 | 3.00* | 1.50 |" in text
    assert report.TORCH_LEGEND in text
    assert "| ce | 2048 | 32768 | float32 | heap | 2.50 | 1.10, 1.20 | 0.90, 0.80 | 800 / 300 / 100 | 0.12 |" in text
    if importlib.util.find_spec("matplotlib"):
        assert "![speedup over torch eager](speedup.png)" in text and (doc.parent / "speedup.png").stat().st_size
    new = readme.read_text()
    assert new.startswith("# title\n\nbefore\n\n" + report.BEGIN) and new.endswith(report.END + "\n\nafter\n")
    assert "old table" not in new and "performance.md" in new and f"| {geo:.2f}x |" in new
    # the training steps beside the per-loss figures: eager/autogen 1.20x, compile/compile+autogen 1.12x
    assert "| lm | 120.0 | 100.0 | 90.0 | 80.0 | 1.20x | 1.12x | 25% |" in new
    assert "| lm | 120.0 | 100.0 | 90.0 | 80.0 | 1.20 | 1.12 | 25% | 5% |" in text
    assert ("(docs/speedup.png)" in new) == bool(importlib.util.find_spec("matplotlib"))


def test_report_without_results_is_a_one_line_error(tmp_path, capsys):
    assert cli.main(["bench", "--report", str(tmp_path / "p.md"), "--out", str(tmp_path)]) == 1
    assert "run `autogen bench` first" in capsys.readouterr().err

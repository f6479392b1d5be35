"""Config precedence and errors, the CLI through subprocesses, and the runner on the examples."""
import os
import subprocess
import sys
import tempfile

import pytest
import torch

import autogen
from autogen import config, policies

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")
CWD = tempfile.gettempdir()


@pytest.fixture(autouse=True)
def clean_layers():
    saved = (dict(policies.policy_layers), dict(policies.strict_layers), dict(config._cache_layers),
             dict(config._level_layers))
    policies.policy_layers["code"] = policies.strict_layers["code"] = None
    yield
    for layers, old in zip((policies.policy_layers, policies.strict_layers, config._cache_layers,
                            config._level_layers), saved):
        layers.clear()
        layers.update(old)
    config._apply_log_level()


def _yaml(tmp_path, text):
    path = tmp_path / "params.yaml"
    path.write_text(text)
    return str(path)


def test_config_sets_policy_and_returns_the_file(tmp_path):
    path = _yaml(tmp_path, "model: {loss: MSELoss}\nruntime: 3\nrunconfig:\n  autogen_policy: default\n"
                           "  autogen_strict: true\n  autogen_log_level: info\n  num_steps: 5\n")
    params = autogen.load_config(path)
    assert params["model"] == {"loss": "MSELoss"} and params["runconfig"]["num_steps"] == 5
    s = autogen.settings()
    assert s["autogen_policy"] == ("medium", "config")  # 'default' is reported as medium
    assert s["autogen_strict"] == (True, "config") and s["autogen_log_level"] == ("INFO", "config")


def test_precedence_code_over_config_over_env_over_default(tmp_path):
    policies.policy_layers.update(code=None, config=None, env=None)
    assert autogen.get_policy() == "medium" and policies.policy_source() == "default"
    policies.policy_layers["env"] = "disabled"
    assert autogen.get_policy() == "disabled" and policies.policy_source() == "env"
    autogen.load_config(_yaml(tmp_path, "runconfig: {autogen_policy: aggressive}\n"))
    assert autogen.get_policy() == "aggressive" and policies.policy_source() == "config"
    autogen.set_policy("disabled")
    assert autogen.get_policy() == "disabled" and policies.policy_source() == "code"
    with autogen.policy("medium"):
        assert autogen.get_policy() == "medium"
    autogen.set_policy(None)
    assert autogen.get_policy() == "aggressive"
    autogen.reset_config()
    assert autogen.get_policy() == "disabled"


def test_cache_dir_precedence(tmp_path):
    config._cache_layers.update(config=None, env=str(tmp_path / "env"))
    assert config.cache_dir() == str(tmp_path / "env")
    autogen.load_config(_yaml(tmp_path, f"runconfig: {{autogen_cache_dir: {tmp_path / 'cfg'}}}\n"))
    assert config.cache_dir() == str(tmp_path / "cfg")
    from autogen import compiler
    assert compiler.cache_dir() == str(tmp_path / "cfg")


@pytest.mark.parametrize("text,match", [
    ("runconfig: {autogen_policy: fast}\n", "autogen_policy.*'fast'.*disabled, default, medium, aggressive"),
    ("runconfig: {autogen_polcy: medium}\n", "unknown runconfig key 'autogen_polcy'.*autogen_policy"),
    ("runconfig: {autogen_strict: maybe}\n", "autogen_strict.*'maybe'"),
    ("runconfig: {autogen_log_level: loud}\n", "autogen_log_level.*'loud'.*DEBUG"),
    ("runconfig: [1, 2]\n", "runconfig must be a mapping"),
    ("- just\n- a list\n", "must hold a mapping"),
    ("runconfig: {autogen_policy: [\n", "not valid YAML"),
])
def test_bad_config_values_are_value_errors(tmp_path, text, match):
    with pytest.raises(ValueError, match=match):
        autogen.load_config(_yaml(tmp_path, text))


def test_missing_file_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="cannot read params file"):
        autogen.load_config(str(tmp_path / "nope.yaml"))


@pytest.mark.parametrize("var,value", [("AUTOGEN_POLICY", "fast"), ("AUTOGEN_STRICT", "maybe"),
                                       ("AUTOGEN_LOG_LEVEL", "loud")])
def test_invalid_environment_is_an_error_at_import(var, value):
    env = dict(os.environ, **{var: value})
    proc = subprocess.run([sys.executable, "-c", "import autogen"], env=env, capture_output=True, text=True)
    assert proc.returncode != 0 and var in proc.stderr and value in proc.stderr


def test_logging_one_line_per_kernel(tmp_path, caplog, monkeypatch):
    import logging

    from autogen import compiler
    monkeypatch.setattr(compiler, "compiled_kernels", {})  # load again, from the new cache dir
    autogen.load_config(_yaml(tmp_path, f"runconfig: {{autogen_log_level: debug, autogen_cache_dir: {tmp_path}}}\n"))
    with caplog.at_level(logging.DEBUG, logger="autogen"), autogen.policy("aggressive"):
        autogen.functional.huber_loss(torch.randn(7, 3), torch.randn(7, 3), delta=0.37, use_autogen=True)
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any("huber_loss" in m and "cache miss" in m for m in infos)
    assert any("def kernel" in r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG)


def cli(*args, env=None):
    # from a directory without the source tree, so the installed package runs
    return subprocess.run([sys.executable, "-m", "autogen", *args], capture_output=True, text=True, cwd=CWD,
                          env=dict(os.environ, **(env or {})), timeout=600)


def test_cli_list_and_show():
    out = cli("list")
    assert out.returncode == 0
    lines = out.stdout.splitlines()
    assert any(line.startswith("cross_entropy") and "handwritten" in line for line in lines)
    assert any(line.split()[:2] == ["cross_entropy", "CrossEntropyLoss"] for line in lines)  # torch.nn's names
    assert any(line.split()[:2] == ["leaky_relu", "LeakyReLU"] for line in lines)
    assert sum(1 for line in lines if " loss " in line) == 18
    assert any(line.startswith("leaky_relu") and line.split()[-2:] == ["handwritten", "autogen"] for line in lines)
    out = cli("show", "CrossEntropyLoss", "--dtype", "float64")
    assert out.returncode == 0 and "shift_row" in out.stdout and "def kernel" in out.stdout
    out = cli("show", "gelu", "--backward")
    assert out.returncode == 0 and "def kernel" in out.stdout


def test_cli_explain_examples():
    out = cli("explain", os.path.join(EXAMPLES, "leaky_relu_mlp.yaml"))
    assert out.returncode == 0
    assert "policy: medium (from config)" in out.stdout and "nonlinearity leaky_relu: handwritten" in out.stdout


@pytest.mark.parametrize("args,match", [(("frob",), "invalid choice"), (("show", "no_such_loss"), "unknown loss"),
                                        (("explain", "/no/such.yaml"), "cannot read"),
                                        (("run",), "required")])
def test_cli_errors_are_one_line(args, match):
    out = cli(*args)
    assert out.returncode != 0
    assert match in out.stderr and "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_cli_cache_info_clear_and_precompile(tmp_path):
    env = {"AUTOGEN_CACHE_DIR": str(tmp_path)}
    out = cli("precompile", "--losses", "mse_loss", "--dtypes", "float64", env=env)
    assert out.returncode == 0, out.stderr
    out = cli("cache", "info", env=env)
    assert out.returncode == 0 and str(tmp_path) in out.stdout
    assert int(out.stdout.split("kernel sources:")[1].split()[0]) > 0
    out = cli("cache", "clear", env=env)
    assert out.returncode == 0 and os.listdir(tmp_path) == []


def test_cli_run_example():
    out = cli("run", "--params", os.path.join(EXAMPLES, "leaky_relu_mlp.yaml"), "--steps", "15", "--quiet")
    assert out.returncode == 0, out.stderr
    # 64 x 64 elements: torch's own leaky_relu and mse_loss (policy medium's size tables)
    assert "leaky_relu" in out.stdout and "fallback" in out.stdout and "ms per step" in out.stdout


@pytest.mark.parametrize("name,expect", [
    ("leaky_relu_mlp.yaml", {("leaky_relu", "fallback")}),  # torch's faster at this size (activations.FASTER_FROM)
    ("classification.yaml", {("gelu", "fallback")}),
    ("custom_loss.yaml", {("FocalLoss", "autogen"), ("silu", "autogen")}),
])
def test_runner_examples_learn_and_take_the_policys_paths(name, expect):
    from autogen.runner import Runner

    class Counting(Runner):
        seen = []

        def on_train_batch_end(self, step, loss):
            self.seen.append(step)

    runner = Counting.from_file(os.path.join(EXAMPLES, name), progress=False)
    runner.num_steps = 30
    runner.fit()
    assert Counting.seen == list(range(30))
    first, last = sum(runner.losses[:5]) / 5, sum(runner.losses[-5:]) / 5
    assert last < first, runner.losses
    paths = {(c.op, c.path) for c in runner.calls}
    assert expect <= paths, paths


def test_cli_bench_quick(tmp_path):
    out = cli("bench", "--quick", "--elems", "4096", "--losses", "mse_loss", "kl_div", "--no-nonlinearities",
              "--no-custom", "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "mse_loss" in out.stdout and "kl_div" in out.stdout
    assert os.path.exists(tmp_path / "losses.json") and os.path.exists(tmp_path / "losses.csv")
    import csv
    with open(tmp_path / "bench.csv") as f:
        rows = list(csv.DictReader(f))
    cells = {(r["name"], r["mode"], r["variant"]) for r in rows}
    for name in ("mse_loss", "kl_div"):  # every variant, forward+backward and forward only, and the 1K check
        for mode in ("fwd+bwd", "fwd"):
            assert {(name, mode, v) for v in ("eager", "compile", "primitive", "fused", "default")} <= cells
        assert any(r["name"] == name and r["size"] == "1024" and r["variant"] == "default" for r in rows)
    for r in rows:
        assert float(r["p20_ms"]) <= float(r["median_ms"]) <= float(r["p80_ms"]), r
        assert (r["on_torch"] in ("True", "False")) == (r["variant"] == "default"), r
    assert any(r["compile_s"] for r in rows if r["variant"] == "compile")
    assert "eager/default below 1x:" in out.stdout


@pytest.mark.parametrize("text,match", [
    ("runconfig: {num_steps: many}\n", "runconfig.num_steps: expected an integer, got 'many'"),
    ("runconfig: {learning_rate: fast}\n", "runconfig.learning_rate: expected a number, got 'fast'"),
    ("model: {hidden_size: [1]}\n", "model.hidden_size: expected an integer"),
    ("model: {name: rnn}\n", "unknown model.name 'rnn'"),
    ("model: {loss: NoSuchLoss}\n", "unknown model.loss 'NoSuchLoss'"),
    ("model: {nonlinearity: swishy}\n", "unknown nonlinearity 'swishy'"),
])
def test_runner_rejects_bad_params_naming_the_key(tmp_path, text, match):
    from autogen.runner import Runner
    with pytest.raises(ValueError, match=match.replace("[", r"\[").replace("(", r"\(")):
        Runner.from_file(_yaml(tmp_path, text), progress=False)


def test_cli_bench_custom_times_the_whole_corpus(tmp_path):
    import json
    from autogen.corpus import CORPUS
    out = cli("bench", "--custom", "--quick", "--no-compile", "--elems", "4096", "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr
    rows = json.load(open(tmp_path / "custom.json"))["rows"]
    assert [r["loss"] for r in rows] == [e.cls.__name__ for e in CORPUS]
    assert all(r["eager_ms"] > 0 and r["fused_ms"] > 0 for r in rows)
    assert "geometric mean: eager/fused" in out.stdout


def test_states_table_prints_the_spread_of_the_marked_rows(capsys):
    """The nonlinearity table's '* spread' line: per column, the lowest and highest ratio among the rows where
    medium ran torch's op (eager's kernel against itself), blank where no row is marked."""
    from autogen import bench

    def row(name, default_ms, on_torch):
        r = {"name": name, "size": 8, f"fwd+bwd default on torch's op": on_torch}
        r.update({f"{v}_saved_bytes": 0 for v in bench.NL_STATE_VARIANTS})
        r.update({"fwd+bwd eager_ms": 1.0, "fwd+bwd default_ms": default_ms, "fwd+bwd ours_ms": 0.5,
                  "fwd+bwd autogen_ms": 0.5})
        return r
    out = {state: [row("relu", 1.25, True), row("elu", 0.5, False), row("gelu", 0.8, True)] for state in bench.STATES}
    bench.print_states(["relu", "elu", "gelu"], 8, ["fwd+bwd"], 1, out)
    spread = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("* spread"))
    assert spread.split()[2:] == ["0.80-1.25", "0.80-1.25"]


def test_loss_table_gives_eager_over_medium_marked_where_medium_ran_torchs_op(capsys):
    """The loss table's eager/default column: policy medium's pick against eager, marked where medium ran
    torch's own op (eager's kernel on both sides: below 1x there is the run's noise), and the count of rows below
    1x where it ran ours."""
    from autogen import bench
    recs = []
    for name, default_ms, on_torch in (("mse_loss", 1.25, True), ("kl_div", 2.5, False), ("l1_loss", 0.5, False)):
        for v, ms in (("eager", 2.0 if name == "kl_div" else 1.0), ("fused", 0.5), ("default", default_ms)):
            recs.append({"kind": "loss", "name": name, "size": 8, "mode": "fwd+bwd", "variant": v, "median_ms": ms,
                         "peak_mb": None, **({"on_torch": on_torch} if v == "default" else {})})
    bench.print_table("loss", "fwd+bwd", "8", ["mse_loss", "kl_div", "l1_loss"], bench._index(recs), lambda n: 8,
                      ["eager", "fused", "default"], 1e9)
    out = capsys.readouterr().out
    cells = {line.split()[0]: line.split()[-3] for line in out.splitlines() if line.split()[:1] in
             (["mse_loss"], ["kl_div"], ["l1_loss"])}
    assert cells == {"mse_loss": "0.80*", "kl_div": "0.80x", "l1_loss": "2.00x"}, out
    assert "eager/default below 1x: 2, of them where medium ran ours: 1; *: medium ran torch's op (1 rows)" in out


def test_bench_tables_mark_the_rows_medium_hands_to_torch(monkeypatch):
    """The nonlinearity and dtype tables say where policy medium ran torch's own op (eager's kernel on both sides
    of the ratio): relu with a gradient at 64K (its size table never sends it to ours), mse_loss below its size
    threshold (64K); and not where it ran ours: mish (ours from 64K), mse_loss at 64K."""
    from autogen import bench, functional
    n = 1 << 16
    monkeypatch.setitem(functional.SMALL_ELEMENTS, "mse_loss", n)  # the suite runs every size on ours
    relu, mish = bench.nonlinearity_child(["relu", "mish"], n, 2, ["fwd+bwd"], 1)
    assert relu["fwd+bwd default on torch's op"] and not mish["fwd+bwd default on torch's op"]
    rows = bench.dtype_child([("nonlinearity", "relu"), ("nonlinearity", "mish"), ("loss", "mse_loss")], n, 2, 1)
    rows += bench.dtype_child([("loss", "mse_loss")], n // 4, 2, 1)
    for row, torch_op in zip(rows, (True, False, False, True)):
        assert [row[f"{dt} on torch's op"] for dt in bench.DTYPE_COLUMNS] == [torch_op] * 3, row


def test_bench_children_import_the_installed_package_from_the_repository_root(monkeypatch):
    """A benchmark child started from the repository root (as `make bench` does) imports the installed
    package, whose templates and kernels the source tree's autogen/ lacks; a failing child raises its own
    stderr, not its command line."""
    from autogen import bench
    monkeypatch.chdir(ROOT)
    got = bench.child_json(bench.python_c("import json, autogen; from autogen import codegen; "
                                          "print(json.dumps([autogen.__file__, codegen.TEMPLATES.get_template("
                                          "'kernel.py.j2').name]))"), {})
    assert not got[0].startswith(os.path.join(ROOT, "autogen")), got
    assert got[1] == "kernel.py.j2"
    with pytest.raises(bench.ChildError, match="ZeroDivisionError: division by zero") as err:
        bench.child_json(bench.python_c("1 / 0"), {})
    assert "-c" not in str(err.value)

"""The machinery: hash-consed IR, kernel cache, compile failures falling back to torch."""
import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as TF

import autogen
from autogen import compiler, executor, functional as AF, launch, plans, pool
from autogen.ir import ELEM, apply, input as leaf


def test_hash_consing_shares_equal_subgraphs():
    x, t = leaf("x", ELEM), leaf("t", ELEM)
    a = apply("mul", apply("sub", x, t), apply("sub", x, t))
    b = (x - t) * (x - t)
    assert a is b and a.digest == b.digest
    assert a.args[0] is a.args[1]
    assert (x * 1.0) is x and (x + 0.0) is x


def test_options_do_not_recompile():
    x, t = torch.randn(5, 4), torch.randn(5, 4)
    with autogen.policy("aggressive"):
        AF.huber_loss(x, t, delta=0.5, use_autogen=True)
        before = len(compiler.compiled_kernels)
        for delta in (0.1, 2.0, 7.0):
            for reduction in ("mean", "sum"):
                out = AF.huber_loss(x, t, delta=delta, reduction=reduction, use_autogen=True)
                torch.testing.assert_close(out, TF.huber_loss(x, t, delta=delta, reduction=reduction))
        AF.huber_loss(torch.randn(50, 3), torch.randn(50, 3), use_autogen=True)  # new size
    assert len(compiler.compiled_kernels) == before


def test_compile_failure_warns_once_and_falls_back(monkeypatch):
    def broken(spec, **kwargs):
        raise RuntimeError("template exploded")

    monkeypatch.setattr(compiler, "render", broken)
    monkeypatch.setattr(compiler, "compiled_kernels", {})
    monkeypatch.setattr(launch, "_warned", set())
    x, t = torch.randn(3, 4, requires_grad=True), torch.randn(3, 4)
    with autogen.policy("aggressive"), warnings.catch_warnings(record=True) as caught, autogen.record() as rec:
        warnings.simplefilter("always")
        out = AF.smooth_l1_loss(x, t, beta=0.5, use_autogen=True)
        out.backward()
        AF.smooth_l1_loss(x, t, beta=0.5, use_autogen=True)
    torch.testing.assert_close(out, TF.smooth_l1_loss(x, t, beta=0.5))
    msgs = [str(w.message) for w in caught if "template exploded" in str(w.message)]
    assert len(msgs) == 1 and "smooth_l1_loss" in msgs[0]
    assert {c.path for c in rec.calls} == {"fallback"}


def test_cache_files_are_named_by_content_and_rebuilt_when_corrupt(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOGEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(compiler, "compiled_kernels", {})
    x, t = torch.randn(4, 3), torch.randn(4, 3)
    with autogen.policy("aggressive"):
        AF.l1_loss(x, t, use_autogen=True)
    files = [f for f in os.listdir(tmp_path) if f.endswith(".py")]
    assert files and all(f.startswith("k_") for f in files)
    for f in files:  # truncate every entry: the next process must rebuild, not crash
        with open(tmp_path / f, "w") as fh:
            fh.write("def kernel(")
    monkeypatch.setattr(compiler, "compiled_kernels", {})
    monkeypatch.setattr(plans, "_plans", {})  # a plan's specs hold their loaded kernels (run_spec's launch)
    with autogen.policy("aggressive"):
        torch.testing.assert_close(AF.l1_loss(x, t, use_autogen=True), TF.l1_loss(x, t))
    assert "def kernel(" in (tmp_path / files[0]).read_text() and "__m" in (tmp_path / files[0]).read_text()


def test_unwritable_cache_dir_compiles_in_memory(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("AUTOGEN_CACHE_DIR", str(blocker / "sub"))
    monkeypatch.setattr(compiler, "compiled_kernels", {})
    monkeypatch.setattr(compiler, "_warned_dirs", set())
    x, t = torch.randn(4, 3), torch.randn(4, 3)
    with autogen.policy("aggressive"), pytest.warns(RuntimeWarning, match="compiling in memory"):
        out = AF.mse_loss(x, t, reduction="sum", use_autogen=True)
    torch.testing.assert_close(out, TF.mse_loss(x, t, reduction="sum"))


def test_invalid_policy_in_environment_fails_at_import():
    env = dict(os.environ, AUTOGEN_POLICY="turbo")
    proc = subprocess.run([sys.executable, "-c", "import autogen"], env=env, capture_output=True, text=True)
    assert proc.returncode != 0 and "turbo" in proc.stderr and "aggressive" in proc.stderr


def test_policy_from_environment():
    env = dict(os.environ, AUTOGEN_POLICY="aggressive")
    proc = subprocess.run([sys.executable, "-c", "import autogen; print(autogen.get_policy())"], env=env,
                          capture_output=True, text=True)
    assert proc.stdout.strip() == "aggressive"


def test_threaded_variants_match_serial(monkeypatch):
    """Force the threaded path (prange kernels, the split_run trampoline) for every kernel kind."""
    monkeypatch.setattr(launch, "_use_threads", lambda kernel, work, count: count > 1)
    monkeypatch.setattr(launch, "_PAR_ELEMENTS", 0)  # generated kernels: their prange variant
    x = torch.randn(40000, 8, requires_grad=True)
    t = torch.randint(0, 8, (40000,))
    y = torch.randn(40000, 8)
    checks = [
        ("medium", lambda F, **k: F.cross_entropy(x, t, **k)),                      # handwritten CE
        ("aggressive", lambda F, **k: F.cross_entropy(x, t, label_smoothing=0.1, **k)),  # generated
        ("medium", lambda F, **k: F.mse_loss(x, y, **k)),                           # handwritten MSE
        ("medium", lambda F, **k: F.huber_loss(x, y, reduction="none", **k)),       # generated none
    ]
    for pol, call in checks:
        ref = call(TF)
        with autogen.policy(pol):
            out = call(AF, use_autogen=True)
        torch.testing.assert_close(out, ref)
        g = torch.rand_like(ref)
        torch.testing.assert_close(torch.autograd.grad(out, x, g)[0], torch.autograd.grad(ref, x, g)[0])
    with autogen.policy("medium"):
        for name in ["relu", "gelu", "silu", "tanh"]:
            torch.testing.assert_close(getattr(AF, name)(x), getattr(TF, name)(x))
        with autogen.record() as rec:  # op by op: the handwritten elementwise kernels
            out = AF.l1_loss(x, y, reduction="sum")
        torch.testing.assert_close(out, TF.l1_loss(x, y, reduction="sum"))
        assert {c.path for c in rec.calls} == {"handwritten"} and not any(c.fused for c in rec.calls), rec.calls
    assert not launch._serial_only, "the threaded trampoline failed to compile for a kernel"
    assert any(p.signatures for p in list(launch._trampolines.values())), "no handwritten kernel ran threaded"


@pytest.mark.parametrize("name,way", [("sigmoid", "output"), ("silu", "derivative"), ("tanh", "output"),
                                      ("mish", "derivative"), ("relu", "inputs"), ("elu", "inputs"),
                                      ("hardtanh", "inputs")])
def test_backward_reads_the_derivative_the_output_or_the_inputs(name, way):
    """silu's backward needs the sigmoid again: the forward kernel writes the derivative and backward
    multiplies. sigmoid's and tanh's derivative is a function of the output: backward reads the output, as
    torch's. elu's needs an exp its forward (expm1) lacks, relu's nothing costly: recomputed from the input.
    Each twice from one forward (retain_graph), as torch's."""
    from autogen import activations
    graph = activations.graph(name)
    plan = executor.fused_plan(graph, (True,), torch.float32)
    assert plan.derivative is (way == "derivative") and plan.from_output is (way == "output")
    assert (plan.backward is None) is (way == "derivative")
    x = torch.randn(64, 33, dtype=torch.float64, requires_grad=True)
    xt = x.detach().clone().requires_grad_()
    g1, g2 = torch.randn(64, 33, dtype=torch.float64), torch.randn(64, 33, dtype=torch.float64)
    with autogen.policy("aggressive"), autogen.record() as rec:
        y = getattr(AF, name)(x)
        first = torch.autograd.grad(y, [x], g1, retain_graph=True)[0]
        second = torch.autograd.grad(y, [x], g2)[0]  # the saved derivative is not consumed by the first
    yt = getattr(TF, name)(xt)
    torch.testing.assert_close(y, yt)
    torch.testing.assert_close(first, torch.autograd.grad(yt, [xt], g1, retain_graph=True)[0])
    torch.testing.assert_close(second, torch.autograd.grad(yt, [xt], g2)[0])
    assert [(c.op, c.path, c.phase) for c in rec.calls] == [(name, "autogen", "forward")] + [
        (name, "autogen", "backward")] * 2


def test_large_outputs_come_from_a_pool_and_are_never_shared_while_alive():
    import gc
    autogen.empty_cache()
    x = torch.randn(512, 1024, requires_grad=True)  # 2 MB: above the pool's threshold
    t = torch.randn(512, 1024)
    with autogen.policy("aggressive"):
        y = AF.sigmoid(x)
        y2 = AF.sigmoid(x * 2)
        assert y.data_ptr() != y2.data_ptr()
        first = y.data_ptr()
        del y
        gc.collect()
        y3 = AF.sigmoid(x)  # the freed buffer is reused, and overwritten with this call's values
        assert y3.data_ptr() == first
        torch.testing.assert_close(y3, torch.sigmoid(x))
        torch.testing.assert_close(y2, torch.sigmoid(x * 2))
        loss = AF.mse_loss(x, t, reduction="none", use_autogen=True)  # a zero-filled or fresh gradient
        (g,) = torch.autograd.grad(loss, [x], torch.ones_like(loss))
        torch.testing.assert_close(g, 2 * (x - t).detach())
        logp, t = x.detach().log_softmax(-1), torch.randint(0, 1024, (512,))
        torch.testing.assert_close(AF.nll_loss(logp, t, use_autogen=True), TF.nll_loss(logp, t))
    autogen.empty_cache()
    assert pool._pool == {} and pool.pool_bytes() == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_pooled_outputs_start_on_a_cache_line(dtype):
    """Pool buffers are 64-byte aligned, as torch's own tensors: numpy's large arrays start 16 bytes into a page,
    and every vector store to them then wrote two cache lines."""
    autogen.empty_cache()
    n = (1 << 20) // dtype.itemsize + 3
    outs = [pool.pooled(n, dtype) for _ in range(3)] + [pool.pooled_flat(torch.empty(n + 5, dtype=dtype))[0]]
    assert all(o.data_ptr() % 64 == 0 and o.numel() in (n, n + 5) for o in outs), [o.data_ptr() % 64 for o in outs]
    first = outs[0].data_ptr()
    del outs
    assert pool.pooled(n, dtype).data_ptr() == first  # reused as it was lent
    autogen.empty_cache()


@pytest.mark.parametrize("call", [
    lambda x, t: torch.autograd.grad(AF.mse_loss(x, t, use_autogen=True), [x])[0],         # handwritten loss
    lambda x, t: AF.relu(x),                                                                # handwritten nonlinearity
    lambda x, t: torch.autograd.grad(AF.relu(x), [x], t)[0],
    lambda x, t: torch.autograd.grad(AF.cross_entropy(x, t.argmax(-1), use_autogen=True), [x])[0],
])
def test_handwritten_kernels_take_large_outputs_from_the_pool(call, monkeypatch):
    """The default path's handwritten kernels too: a fresh 2 MB output would page-fault."""
    import gc
    monkeypatch.setattr(autogen.activations, "FASTER_FROM", None)  # relu: our kernel at this size too
    autogen.empty_cache()
    x, t = torch.randn(512, 1024, requires_grad=True), torch.randn(512, 1024)
    with autogen.policy("medium"), autogen.record() as rec:
        out = call(x, t)
        del out
        gc.collect()
        free = {buf.ctypes.data for bufs in pool._pool.values() for buf in bufs}
        assert free  # returned to the pool when freed
        again = call(x, t)
    assert again.data_ptr() in free and "handwritten" in {c.path for c in rec.calls}
    autogen.empty_cache()


@pytest.mark.parametrize("call", [
    lambda x, t: torch.autograd.grad(AF.mse_loss(x, t, use_autogen=True), [x])[0],      # a loss's gradient
    lambda x, t: torch.autograd.grad(AF.cross_entropy(x, t.argmax(-1), use_autogen=True), [x])[0],
    lambda x, t: AF.relu(x),                                                             # value and mask
    lambda x, t: torch.autograd.grad(AF.leaky_relu(x), [x], t)[0],
    lambda x, t: torch.autograd.grad(AF.gelu(x), [x], t)[0],
], ids=["mse-grad", "ce-grad", "relu", "leaky-relu-grad", "gelu-grad"])
def test_live_pooled_outputs_keep_their_buffers(call, monkeypatch):
    """An output from the pool stays out of it while the tensor lives, whatever view the kernel wrote
    through: the next call gets another buffer and the first output keeps its values."""
    import gc
    monkeypatch.setattr(autogen.activations, "FASTER_FROM", None)
    autogen.empty_cache()
    x, t = torch.randn(512, 1024, requires_grad=True), torch.randn(512, 1024)  # 2 MB outputs
    with autogen.policy("medium"), autogen.record() as rec:
        first = call(x, t)
        want = first.clone()
        gc.collect()
        outs = [call(x * k, t * k) for k in (2.0, 3.0)]
    assert "handwritten" in {c.path for c in rec.calls}
    assert len({first.data_ptr()} | {o.data_ptr() for o in outs}) == 3
    assert torch.equal(first, want)
    autogen.empty_cache()


def test_pool_under_threads_frees_and_reuses_without_sharing_live_buffers():
    """Tensors freed on other threads return their buffers; no two live outputs ever share one."""
    import threading
    autogen.empty_cache()
    x = torch.randn(300, 1000)  # 1.2 MB outputs
    ref = torch.tanh(x)
    errors, live = [], []

    def work(k):
        try:
            for i in range(20):
                y = AF.tanh(x)
                torch.testing.assert_close(y, ref)
                live.append(y)  # handed to the main thread, which frees them
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    with autogen.policy("aggressive"):
        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        ptrs = [y.data_ptr() for y in live]
        assert len(set(ptrs)) == len(ptrs)  # all alive at once: all distinct
        for y in live:
            torch.testing.assert_close(y, ref)
        live.clear()
        assert sum(len(v) for v in pool._pool.values()) > 0  # returned on this thread's frees
        assert pool.pool_bytes() <= pool._POOL_MAX_BYTES
    autogen.empty_cache()


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_costly_values_are_stashed_and_pure_scatters_are_zero_filled(reduction):
    """Cross-entropy's exp is computed once per element, stashed in the gradient row between the
    sum pass and the gradient pass (forward+grad kernel for 'mean', forward+derivative for 'none');
    NLL's gradient is a zero-filled row plus one store. The numbers are torch's, ignored rows too."""
    from autogen import codegen
    x = torch.randn(6, 9, dtype=torch.float64)
    x[1, 2] = float("nan")  # a NaN row: the stashed exp carries it into the gradient as torch's does
    t = torch.tensor([0, 8, 3, -100, 4, 4])
    g = torch.rand(6, dtype=torch.float64) if reduction == "none" else torch.tensor(1.0, dtype=torch.float64)
    for name in ("cross_entropy", "nll_loss"):
        ours, ref = x.clone().requires_grad_(), x.clone().requires_grad_()
        with autogen.policy("aggressive"), autogen.record() as rec:
            out = getattr(AF, name)(ours, t, reduction=reduction, use_autogen=True)
            (grad,) = torch.autograd.grad(out, [ours], g)
        assert {(c.path, c.fused) for c in rec.calls} == {("autogen", True)}
        expected = getattr(TF, name)(ref, t, reduction=reduction)
        torch.testing.assert_close(out, expected, equal_nan=True)
        torch.testing.assert_close(grad, torch.autograd.grad(expected, [ref], g)[0], equal_nan=True)
        graph = AF.D.cross_entropy(reduction, False, False) if name == "cross_entropy" else AF.D.nll_loss(reduction, False)
        plan = executor.fused_plan(graph, (True, False), torch.float64)
        # cross-entropy 'none' writes its derivative in the forward (torch keeps log_softmax, not the input)
        source = codegen.render(plan.backward or plan.forward)
        if name == "cross_entropy":
            assert source.count("__m.exp(") == 1 and "= __o" in source  # stashed, read back
        else:
            assert "if 0 <= " in source and "if __j ==" not in source

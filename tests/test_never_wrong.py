"""Defects that gave a wrong number or a crash, each with the test that finds it: negative-bit views, an
outer broadcast the level IR cannot represent, a positional `inplace` inside torch.compile, a distance whose eps the
kernel's reassociation rounded away, a gather deferred past the loop that reads it."""
import pytest
import torch
import torch.nn.functional as TF

import autogen
from autogen import functional as AF

from hypothesis import given, settings, strategies as st

from cases import assert_matches


@pytest.mark.parametrize("policy", ["medium", "aggressive"])
def test_negative_bit_views_are_read_with_their_sign(policy, monkeypatch):
    from autogen import activations
    monkeypatch.setattr(activations, "FASTER_FROM", None)  # our kernels at every size
    x = torch.randn(3000)
    n = torch._neg_view(x)
    assert n.is_neg()
    with autogen.policy(policy), autogen.record() as rec:
        y = AF.relu(n)
        loss = AF.mse_loss(n, x, use_autogen=True)
        g = AF.gelu(n)
    assert {c.path for c in rec.calls} & {"autogen", "handwritten"}, rec.calls
    assert_matches(y, TF.relu(n.resolve_neg()))
    assert_matches(g, TF.gelu(n.resolve_neg()))
    assert_matches(loss, TF.mse_loss(n.resolve_neg(), x))


@autogen.autogen_loss
class _Outer(torch.nn.Module):
    def forward(self, v):
        return (v.unsqueeze(1) - v.unsqueeze(0)).pow(2).sum()


@autogen.autogen_loss
class _RankHinge(torch.nn.Module):
    def forward(self, x):
        return torch.relu(1 - (x.unsqueeze(2) - x.unsqueeze(1))).sum()


@pytest.mark.parametrize("cls,shape", [(_Outer, (6,)), (_RankHinge, (4, 6))])
def test_an_outer_broadcast_is_refused_not_guessed(cls, shape):
    """Values by levels cannot tell an outer product's two axes apart: the broadcast runs in torch, the
    rest fused, and the record says so."""
    import warnings
    x = torch.randn(shape, requires_grad=True)
    ref = cls()(x)  # use_autogen=False: the module as written
    with autogen.policy("aggressive"), autogen.record() as rec, warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        out = cls(use_autogen=True)(x)
    assert any(c.path == "torch" for c in rec.calls), rec.calls  # the broadcast, or ops reading it
    assert any(c.path == "autogen" for c in rec.calls), rec.calls
    assert_matches(out, ref)


def test_compile_absorbs_relu_with_a_positional_inplace():
    fn = torch.compile(lambda x, t: AF.mse_loss(TF.relu(x * 2, False), t, use_autogen=True))
    x, t = torch.randn(64, 33), torch.randn(64, 33)
    with autogen.policy("aggressive"):
        out = fn(x, t)
    assert_matches(out, TF.mse_loss(TF.relu(x * 2), t))


@pytest.mark.parametrize("name", ["mse_loss", "cross_entropy", "kl_div", "cosine_embedding_loss"])
def test_compiled_losses_under_autocast_return_torchs_dtype(name):
    """torch.compile + CPU autocast with a gradient: the loss's autocast cast to float32 happens before our
    operator, which runs outside autocast, so the result has torch's dtype."""
    torch._dynamo.reset()
    lin = torch.nn.Linear(8, 8)
    h = torch.randn(16, 8)
    t = {"cross_entropy": torch.randint(0, 8, (16,)), "kl_div": torch.softmax(torch.randn(16, 8), -1)}.get(
        name, torch.randn(16, 8))
    extra = (torch.randint(0, 2, (16,)).float() * 2 - 1,) if name == "cosine_embedding_loss" else ()

    def ours(h, t):
        return getattr(AF, name)(lin(h), t, *extra, use_autogen=True)

    def theirs(h, t):
        return getattr(TF, name)(lin(h), t, *extra)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = theirs(h, t)
        got = torch.compile(ours, backend="aot_eager")(h, t)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("name,dtypes", [
    ("binary_cross_entropy_with_logits", (torch.float32, torch.bfloat16)),
    ("binary_cross_entropy_with_logits", (torch.bfloat16, torch.float32)),
    ("hinge_embedding_loss", (torch.bfloat16, torch.float32)),
    ("hinge_embedding_loss", (torch.float32, torch.bfloat16)),
    ("mse_loss", (torch.float32, torch.float16)),
])
@pytest.mark.parametrize("policy", ["medium", "aggressive"])
def test_mixed_16_bit_dtypes_give_torchs_dtype(name, dtypes, policy):
    x = torch.randn(16, 9, dtype=dtypes[0], requires_grad=True)
    t = (torch.randint(0, 2, (16, 9)) * 2 - 1 if name == "hinge_embedding_loss" else torch.rand(16, 9)).to(dtypes[1])
    want = getattr(TF, name)(x, t)
    for _ in range(2):  # the first call and a later one
        with autogen.policy(policy):
            got = getattr(AF, name)(x, t, use_autogen=True)
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


def test_torch_func_grad_through_a_traced_loss_with_class_targets():
    from autogen.corpus import Focal
    x, t = torch.randn(8, 5), torch.randint(0, 5, (8,))
    ours, theirs = Focal(use_autogen=True), Focal()
    with autogen.policy("aggressive"):
        got = torch.func.grad(lambda x: ours(x, t))(x)
    assert_matches(got, torch.func.grad(lambda x: theirs(x, t))(x))


@autogen.autogen_loss
class _SizesToList(torch.nn.Module):
    """MONAI's idiom: the reduction axes as a list computed from the input's rank."""
    def forward(self, x, t):
        axes = torch.arange(2, len(x.shape)).tolist()
        return ((x - t) ** 2).sum(dim=axes).mean()


@autogen.autogen_loss
class _DataToList(torch.nn.Module):
    def forward(self, x, t):
        k = int(t.sum().item())
        return (x[:, :k] ** 2).mean()


def test_a_number_from_sizes_alone_falls_back_and_one_from_data_raises():
    x, t = torch.randn(2, 3, 4, 5, requires_grad=True), torch.randn(2, 3, 4, 5)
    with pytest.warns(RuntimeWarning, match="depends on no input"), autogen.policy("aggressive"):
        out = _SizesToList(use_autogen=True)(x, t)
    assert_matches(out, _SizesToList()(x, t))
    with pytest.raises(autogen.TracingError), autogen.policy("aggressive"):
        _DataToList(use_autogen=True)(torch.randn(4, 6), torch.ones(4, 1))


@pytest.mark.parametrize("policy", ["medium", "aggressive"])
def test_compiled_prelu_under_autocast_returns_torchs_dtype(policy):
    torch._dynamo.reset()
    lin, w = torch.nn.Linear(8, 8), torch.rand(8, requires_grad=True)
    h = torch.randn(16, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = TF.prelu(lin(h), w)
        with autogen.policy(policy):
            got = torch.compile(lambda h: AF.prelu(lin(h), w), backend="aot_eager")(h)
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("policy", ["aggressive", "medium"])
def test_triplet_where_the_anchor_is_the_negative(swap, policy):
    """||a - n + eps|| at a == n is eps alone: (a - n) + eps rounded as torch writes it, not reassociated
    into a + (eps - n), which loses eps's low bits in float32 (its gradient was 5% off)."""
    torch.manual_seed(0)
    a, p = torch.randn(64, 32), torch.randn(64, 32)
    n = a.clone()
    n[::2] = torch.randn(32, 32)
    xs = [t.clone().requires_grad_() for t in (a, p, n)]
    ys = [t.clone().requires_grad_() for t in (a, p, n)]
    ref = TF.triplet_margin_loss(*xs, swap=swap)
    ref.backward()
    with autogen.policy(policy), autogen.record() as rec:
        out = AF.triplet_margin_loss(*ys, swap=swap, use_autogen=True)
        out.backward()
    assert {c.path for c in rec.calls} & {"autogen", "handwritten"}, rec.calls
    torch.testing.assert_close(out, ref)
    for x, y in zip(xs, ys):
        torch.testing.assert_close(y.grad, x.grad)


class _Margin(torch.nn.Module):
    """A row value read by the first loop over the row (1 - x[target]) that is itself a gather of the row."""
    def forward(self, x, t):
        return torch.clamp(1 - x.gather(1, t.unsqueeze(1)) + x, min=0).mean()


@pytest.mark.parametrize("cols", [4, 13], ids=["across-rows", "along-rows"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_a_gather_that_the_first_loop_reads_is_not_deferred_past_it(cols, dtype):
    # walked across rows (layout 'rt'), a gather waited until after the first loop over the row's elements,
    # which read a value computed from it: multi_margin_loss and this loss gave numbers of an uninitialized row
    fused = autogen.autogen_loss(type("Margin", (_Margin,), {}))(use_autogen=True)
    x = torch.randn(40, cols, dtype=dtype)
    t = torch.randint(0, cols, (40,))
    xs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
    with autogen.policy("aggressive"), autogen.record() as rec:
        out = fused(xs[0], t)
        out.backward()
    assert [(c.path, c.phase) for c in rec.calls] == [("autogen", "forward"), ("autogen", "backward")]
    ref = _Margin()(xs[1], t)
    ref.backward()
    assert_matches(out, ref)
    assert_matches(xs[0].grad, xs[1].grad, what="gradient")
    with autogen.policy("aggressive"):
        got = AF.multi_margin_loss(x, t, reduction="none", use_autogen=True)
    assert_matches(got, TF.multi_margin_loss(x, t, reduction="none"))


_CAST = {"none": lambda t: t, "f32": lambda t: t.float(), "f64": lambda t: t.double(),
         "to64": lambda t: t.to(torch.float64)}
_BODY = {"square": lambda d: d * d, "exp": lambda d: (0.1 * d).exp() + d, "log1p": lambda d: d.abs().log1p() * d,
         "softmax": lambda d: d.log_softmax(-1) * d}
_REDUCE = {"sum": lambda v: v.sum(), "rows": lambda v: v.sum(1).mean(), "mean": lambda v: v.mean()}


# what x goes through in its own dtype before its cast: float32 ops inside a float64 kernel round as torch's
_PRE = {"none": lambda t: t, "affine": lambda t: t * 0.1 + 0.3, "ratio": lambda t: t / (t * t + 3.0)}


def _cast_module(cx, cy, body, reduce, pre="none"):
    def forward(self, x, y):
        return _REDUCE[reduce](_BODY[body](_CAST[cx](_PRE[pre](x)) - _CAST[cy](y)))
    return autogen.autogen_loss(type(f"Cast_{cx}_{cy}_{body}_{reduce}_{pre}", (torch.nn.Module,),
                                     {"forward": forward}))


@settings(max_examples=20, deadline=None)
@given(st.sampled_from([torch.float32, torch.float64]), st.sampled_from([torch.float32, torch.float64]),
       st.sampled_from(sorted(_CAST)), st.sampled_from(sorted(_CAST)), st.sampled_from(sorted(_BODY)),
       st.sampled_from(sorted(_REDUCE)), st.sampled_from(sorted(_PRE)))
def test_a_kernel_computes_in_the_dtype_of_the_values_torch_computes(dx, dy, cx, cy, body, reduce, pre):
    """A float cast inside a loss decides the dtype the kernel computes in, as it does torch's: float32 inputs
    made float64 (x.double() - y.double()) are computed in float64 (they were computed in float32: a float64
    result off by float32 rounding), and a float64 input read only through .float() is rounded to float32
    before the kernel, as torch rounds it (the kernel computed in float64: twice the memory and two copies).
    A float32 value computed before its cast to float64 is rounded after each op, as torch's float32 ops round
    (it was kept in float64: off by float32's rounding)."""
    import warnings
    g = torch.Generator().manual_seed(hash((dx, dy, cx, cy, body, reduce)) % 1000)
    args = [torch.randn(37, 13, dtype=dx, generator=g), torch.randn(37, 13, dtype=dy, generator=g)]
    cls = _cast_module(cx, cy, body, reduce, pre)
    ours, theirs = [[a.clone().requires_grad_() for a in args] for _ in range(2)]
    with autogen.policy("medium"), autogen.record() as rec, warnings.catch_warnings():
        warnings.simplefilter("error")  # a module that ran eagerly would pass by comparing torch with itself
        out = cls(use_autogen=True)(*ours)
        got = torch.autograd.grad(out, ours)
    assert [(c.path, c.fused) for c in rec.calls] == [("autogen", True)] * 2, rec.calls
    ref = cls(use_autogen=False)(*theirs)
    want = torch.autograd.grad(ref, theirs)
    # torch computes in the promotion of the cast inputs: where that is float32, so are its numbers (and a
    # float64 gradient of a float64 input read as float32 is a float32 number): compared at float32's tolerance
    computes = torch.promote_types(_CAST[cx](args[0]).dtype, _CAST[cy](args[1]).dtype)
    assert out.dtype == ref.dtype
    # the loss sums hundreds of terms that partly cancel: its error, torch's included, scales with the sum of
    # their magnitudes (the same reduction of |term|), not with the result
    x64, y64 = _PRE[pre](args[0].double()), args[1].double()
    scale = 1.0 + _REDUCE[reduce](_BODY[body](x64 - y64).abs()).item()
    for (a, b), s in zip([(out, ref)] + list(zip(got, want)), [scale, 1.0, 1.0]):
        assert a.dtype == b.dtype
        tol = torch.promote_types(b.dtype, computes) if b.dtype == computes else torch.float32
        assert_matches(a.to(tol), b.to(tol), s, what=f"{a.dtype} computed in {computes}")


# the labels a loss reads as a part of a larger tensor (a causal LM's labels[:, 1:] against logits[:, :-1])
_LABEL_PARTS = {"shift": ("[:, 1:]", "[:, :-1]"), "head": ("[:, :-1]", "[:, :-1]"), "tail_rows": ("[1:]", "[1:]"),
                "same": ("[:, 1:]", "[:, 1:]"), "whole_logits": ("[:, 1:]", None)}
_LABEL_USES = {
    "ce": "TF.cross_entropy(x.reshape(-1, x.shape[-1]), y.reshape(-1))",
    "ce_ignore_smooth": "TF.cross_entropy(x.reshape(-1, x.shape[-1]), y.reshape(-1), ignore_index=-100, "
                        "label_smoothing=0.1)",
    "gather": "x.log_softmax(-1).gather(-1, y.clamp(min=0).unsqueeze(-1)).squeeze(-1).mean()",
    "nll_weighted": "(TF.cross_entropy(x.transpose(1, 2), y.clamp(min=0), reduction='none') * w).mean()",
}


@settings(max_examples=12, deadline=None)
@given(st.sampled_from(sorted(_LABEL_PARTS)), st.sampled_from(sorted(_LABEL_USES)),
       st.sampled_from([torch.float32, torch.float64]), st.integers(1, 6), st.sampled_from([3, 8, 17]))
def test_labels_read_as_a_part_of_a_tensor_pick_that_part(part, use, dtype, b, v):
    """An index input read through a slice (labels[:, 1:]) is that slice: the kernel read the whole labels
    tensor's first rows (every later call of a causal LM's shifted cross-entropy: wrong by 3-15%)."""
    import warnings
    ys, xs = _LABEL_PARTS[part]
    body = f"x = logits{xs or ''}\n    y = labels{ys}\n    w = torch.ones(y.shape, dtype=x.dtype)\n" \
           f"    return {_LABEL_USES[use]}"
    if part == "whole_logits":  # logits shaped as the part already
        body = body.replace("x = logits", "x = logits[:, :labels.shape[1] - 1]")
    env = {"torch": torch, "TF": TF}
    exec(f"def forward(self, logits, labels):\n    {body}\n", env)  # noqa: S102 - a generated test program
    cls = autogen.autogen_loss(type(f"Parts_{part}_{use}", (torch.nn.Module,), {"forward": env["forward"]}))
    g = torch.Generator().manual_seed(b * 100 + v)
    logits = torch.randn(b + 1, 5, v, dtype=dtype, generator=g)
    labels = torch.randint(0, v, (b + 1, 5), generator=g)
    labels[:, 2] = -100 if "ignore" in use else labels[:, 2]
    x = [logits.clone().requires_grad_(), logits.clone().requires_grad_()]
    ref = cls()(x[0], labels)
    want, = torch.autograd.grad(ref, x[0])
    with autogen.policy("aggressive"), autogen.record() as rec, warnings.catch_warnings():
        warnings.simplefilter("error")  # a module that ran eagerly would pass by comparing torch with itself
        out = cls(use_autogen=True)(x[1], labels)
        got, = torch.autograd.grad(out, x[1])
    assert any(c.path == "autogen" for c in rec.calls), rec.calls
    assert_matches(out, ref, what=body)
    assert_matches(got, want, what="gradient: " + body)


_ROUNDINGS = {"half": lambda t: t.half().float(), "bf16": lambda t: t.bfloat16().to(t.dtype),
              "half_to": lambda t: t.to(torch.float16).to(t.dtype)}


@settings(max_examples=12, deadline=None)
@given(st.sampled_from(sorted(_ROUNDINGS)), st.sampled_from([torch.float32, torch.float64]),
       st.sampled_from(["softmax", "square"]))
def test_a_rounding_to_16_bits_inside_a_loss_rounds(rounding, dtype, body):
    """teacher.half().float() (a teacher's logits cached in 16 bits): the cast rounds, in torch's op between
    the kernels (it was taken for no op: 1e-4 relative off)."""
    import warnings

    def forward(self, x, y):
        r = _ROUNDINGS[rounding](y)
        return (x.log_softmax(-1) * r.softmax(-1)).sum(-1).mean() if body == "softmax" else ((x - r) ** 2).mean()
    cls = autogen.autogen_loss(type(f"Round16_{rounding}_{body}", (torch.nn.Module,), {"forward": forward}))
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(19, 11, dtype=dtype, generator=g), torch.randn(19, 11, dtype=dtype, generator=g) * 3
    xs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
    ref = cls()(xs[0], y)
    want, = torch.autograd.grad(ref, xs[0])
    with autogen.policy("aggressive"), autogen.record() as rec, warnings.catch_warnings():
        warnings.simplefilter("error")  # not eagerly: a split is fine, the cast in torch
        out = cls(use_autogen=True)(xs[1], y)
        got, = torch.autograd.grad(out, xs[1])
    assert any(c.path == "autogen" for c in rec.calls), rec.calls
    tol = torch.float32 if rounding == "half" else dtype  # .half().float(): that part is torch's float32 math
    assert_matches(out.to(tol), ref.to(tol))
    assert_matches(got.to(tol), want.to(tol), what="gradient")

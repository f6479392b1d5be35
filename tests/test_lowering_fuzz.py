"""A fuzzer of the @autogen_loss lowering: random small programs of elementwise ops, broadcasts along any axes
(outer sums and differences included), reductions over random dims, slices and where, at random small shapes
with random aliasing between the inputs, each compared with eager. Whatever the tracer accepts must be right;
whatever it cannot express must be refused (one warning, then eager)."""
import os
import re
import warnings

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

import autogen

from cases import assert_matches, magnitude, short_rows_across

# CI runs a fixed set of examples (derandomized); AUTOGEN_FUZZ=long runs 20 times as many, at random
LONG = os.environ.get("AUTOGEN_FUZZ") == "long"
SCALE = 20 if LONG else 1

UNARY = ["torch.exp(-{0}.abs())", "torch.tanh({0})", "torch.sigmoid({0})", "torch.relu({0})", "{0}.abs()",
         "-{0}", "{0} * {0}", "torch.nn.functional.softplus({0})", "torch.log1p({0}.abs())"]
BINARY = ["({0} + {1})", "({0} - {1})", "({0} * {1})", "torch.where({0} > {1}, {0}, {1})",
          "torch.maximum({0}, {1})"]
# views of a 2-D value: as it is, a row or column broadcast, the outer axes of a pairwise op
VIEWS = ["{0}", "{0}.unsqueeze(-1)", "{0}.unsqueeze(-2)", "{0}.mean(-1, keepdim=True)", "{0}.sum(0, keepdim=True)",
         "{0}[:, :1]", "{0}.transpose(0, 1)"]
FINAL = ["{0}.mean()", "{0}.sum()", "{0}.sum(-1).mean()", "{0}.mean(0).sum()", "{0}.amax(-1).mean()",
         "torch.logsumexp({0}, -1).mean()"]


@st.composite
def programs(draw):
    """(forward's body, input shapes): a few steps on inputs a and b, each an op of earlier values."""
    vals = ["a", "b"]
    lines = []
    for i in range(draw(st.integers(1, 4))):
        if draw(st.booleans()):
            expr = draw(st.sampled_from(UNARY)).format(draw(st.sampled_from(vals)))
        else:
            x, y = draw(st.sampled_from(vals)), draw(st.sampled_from(vals))
            x, y = draw(st.sampled_from(VIEWS)).format(x), draw(st.sampled_from(VIEWS)).format(y)
            expr = draw(st.sampled_from(BINARY)).format(x, y)
        lines.append(f"v{i} = {expr}")
        vals.append(f"v{i}")
    last = vals[-1]
    lines.append("return " + draw(st.sampled_from(FINAL)).format(f"{last}.reshape({last}.shape[0], -1)"))
    # rows of 11 run along each row, shorter ones across the rows (layout rt) where the test says so or the
    # graph has the work per element
    rows, cols = draw(st.sampled_from([1, 2, 5])), draw(st.sampled_from([1, 3, 7, 11]))
    b_shape = draw(st.sampled_from([(rows, cols), (cols,), (rows, 1), (1, cols)]))
    return lines, (rows, cols), b_shape


def _module(lines):
    source = "class M(torch.nn.Module):\n    def forward(self, a, b):\n" + \
        "".join(f"        {line}\n" for line in lines)
    env = {"torch": torch}
    exec(source, env)  # noqa: S102 - a generated test program
    return env["M"], source


@settings(max_examples=24 * SCALE, derandomize=not LONG, database=None, deadline=None,
          suppress_health_check=list(HealthCheck))
@given(programs(), st.sampled_from(["none", "same"]), st.sampled_from([torch.float32, torch.float64]), st.booleans())
def test_random_programs_give_eagers_numbers_or_are_refused(program, alias, dtype, across):
    lines, a_shape, b_shape = program
    cls, source = _module(lines)
    a = torch.randn(a_shape, dtype=dtype)
    b = a if alias == "same" and b_shape == a_shape else torch.randn(b_shape, dtype=dtype)
    try:
        want_a = a.clone().requires_grad_()
        want_b = want_a if b is a else b.clone().requires_grad_()
        ref = cls()(want_a, want_b)
    except Exception:  # noqa: BLE001 - a program torch itself rejects (shapes that do not broadcast)
        return
    leaves = [want_a] if b is a else [want_a, want_b]
    g = torch.autograd.grad(ref, leaves, allow_unused=True)
    got_a = a.clone().requires_grad_()
    got_b = got_a if b is a else b.clone().requires_grad_()
    fused = autogen.autogen_loss(type("F", (cls,), {}))(use_autogen=True)
    with warnings.catch_warnings(record=True), autogen.policy("aggressive"), short_rows_across(across):
        warnings.simplefilter("always")
        out = fused(got_a, got_b)
        assert_matches(out, ref, magnitude(ref.shape, [a, b]), what=source)
        got = torch.autograd.grad(out, [got_a] if b is a else [got_a, got_b], allow_unused=True)
    for gi, wi in zip(got, g):
        if wi is None:
            assert gi is None or not gi.any(), source
        else:
            assert gi is not None, source
            assert_matches(gi, wi, magnitude(wi.shape, [a, b]), what="gradient: " + source)


# -- values picked from each row (gather, an index, a one-hot sum), beside the row's own reductions --------
PICKS = ["a.gather(1, y.unsqueeze(1)).squeeze(1)", "a.log_softmax(1).gather(1, y.unsqueeze(1)).squeeze(1)",
         "(a * torch.nn.functional.one_hot(y, a.shape[1]).movedim(-1, 1).to(a.dtype)).sum(1)"]
ROWWISE = ["a.logsumexp(1)", "a.amax(1)", "a.sum(1)", "a.sigmoid().mean(1)"]
ROW_UNARY = ["{0}.clamp(min=-0.5)", "{0}.clamp(-1.0, 1.0)", "torch.log({0}.clamp(min=1e-3))",
             "torch.log({0}.abs().clamp(min=1e-3))", "torch.log({0}.sigmoid().clamp(1e-4, 1 - 1e-4))",
             "torch.sqrt({0}.abs() + 1e-2)", "torch.exp(-{0}.abs())", "torch.tanh({0})", "{0} * {0}",
             "torch.nn.functional.softplus({0})"]
ROW_BINARY = BINARY + ["({0} / ({1}.abs() + 1))"]
ROW_FINAL = ["{0}.mean()", "{0}.sum()", "({0} * w).sum() / w.sum()", "-({0} * w).mean()"]


@st.composite
def picked_programs(draw, first):
    """(forward's body, shape of a): row values picked from a's rows (dim 1) and reduced along them, `first`
    applied to a pick, then random ops; a of (N, C) or channel-first (N, C, L), its rows short (walked
    across) or long."""
    lines = [f"p0 = {draw(st.sampled_from(PICKS))}", f"p1 = {draw(st.sampled_from(ROWWISE + PICKS))}",
             "v0 = " + first.format("p0")]
    vals = ["p0", "p1", "v0"]
    for i in range(1, draw(st.integers(1, 3))):
        if draw(st.booleans()):
            expr = draw(st.sampled_from(ROW_UNARY)).format(draw(st.sampled_from(vals)))
        else:
            expr = draw(st.sampled_from(ROW_BINARY)).format(draw(st.sampled_from(vals)), draw(st.sampled_from(vals)))
        lines.append(f"v{i} = {expr}")
        vals.append(f"v{i}")
    lines.append("return " + draw(st.sampled_from(ROW_FINAL)).format(vals[-1]))
    n, c = draw(st.sampled_from([6, 13, 1])), draw(st.sampled_from([5, 8, 16, 37, 2]))
    shape = (n, c) if draw(st.booleans()) else (n, c, draw(st.sampled_from([1, 3])))
    return lines, shape


@pytest.mark.parametrize("first", ROW_UNARY)
@settings(max_examples=4 * SCALE, derandomize=not LONG, database=None, deadline=None,
          suppress_health_check=list(HealthCheck))
@given(data=st.data(), dtype=st.sampled_from([torch.float32, torch.float64]),
       grad=st.sampled_from([True, True, False]), across=st.booleans())
def test_random_programs_over_picked_values_give_eagers_numbers(first, data, dtype, grad, across):
    lines, shape = data.draw(picked_programs(first))
    source = "class M(torch.nn.Module):\n    def forward(self, a, y, w):\n" + \
        "".join(f"        {line}\n" for line in lines)
    env = {"torch": torch}
    exec(source, env)  # noqa: S102 - a generated test program
    cls = env["M"]
    g = torch.Generator().manual_seed(len(source))
    a = torch.randn(shape, dtype=dtype, generator=g)
    y = torch.randint(0, shape[1], (shape[0],) + shape[2:], generator=g)
    w = torch.rand((shape[0],) + shape[2:], dtype=dtype, generator=g) + 0.5
    want_a = a.clone().requires_grad_(grad)
    ref = cls()(want_a, y, w)
    got_a = a.clone().requires_grad_(grad)
    fused = autogen.autogen_loss(type("F", (cls,), {}))(use_autogen=True)
    with warnings.catch_warnings(record=True) as caught, autogen.policy("aggressive"), autogen.record() as rec, \
            short_rows_across(across):
        warnings.simplefilter("always")
        out = fused(got_a, y, w)
        got = torch.autograd.grad(out, got_a)[0] if grad else None
    assert not [m for m in caught if str(m.message).startswith("autogen")], (source, caught[0].message)
    assert any(c.op == "F" and c.path == "autogen" for c in rec.calls), (source, rec.calls)
    assert_matches(out, ref, magnitude(ref.shape, [a]), what=source)
    if grad:
        assert_matches(got, torch.autograd.grad(ref, want_a)[0], magnitude(shape, [a]), what="gradient: " + source)


@settings(max_examples=16 * SCALE, derandomize=not LONG, database=None, deadline=None,
          suppress_health_check=list(HealthCheck))
@given(programs(), st.sampled_from([torch.float32, torch.float64]))
def test_random_programs_in_their_parallel_kernels_compile_and_give_eagers_numbers(program, dtype):
    """The prange variant of each kernel (large inputs) at a small size: it must compile (a pass that read an
    input its loop never loaded compiled serially, on the earlier loop's variable, and failed in parfor
    lowering: the module ran eagerly at 1M elements) and give eager's numbers."""
    from autogen import launch
    lines, a_shape, b_shape = program
    cls, source = _module(lines)
    a, b = torch.randn(a_shape, dtype=dtype), torch.randn(b_shape, dtype=dtype)
    try:
        want_a, want_b = a.clone().requires_grad_(), b.clone().requires_grad_()
        ref = cls()(want_a, want_b)
    except Exception:  # noqa: BLE001 - shapes that do not broadcast
        return
    want = torch.autograd.grad(ref, [want_a, want_b], allow_unused=True)
    got_a, got_b = a.clone().requires_grad_(), b.clone().requires_grad_()
    fused = autogen.autogen_loss(type("F", (cls,), {}))(use_autogen=True)
    saved = launch._PAR_ELEMENTS
    launch._PAR_ELEMENTS = 0
    try:
        with warnings.catch_warnings(record=True) as caught, autogen.policy("aggressive"):
            warnings.simplefilter("always")
            out = fused(got_a, got_b)
            got = torch.autograd.grad(out, [got_a, got_b], allow_unused=True)
    finally:
        launch._PAR_ELEMENTS = saved
    assert not [m for m in caught if "the fused kernel failed" in str(m.message)], (source, caught[0].message)
    assert_matches(out, ref, magnitude(ref.shape, [a, b]), what=source)
    for gi, wi in zip(got, want):
        if wi is None:
            assert gi is None or not gi.any(), source
        else:
            assert_matches(gi, wi, magnitude(wi.shape, [a, b]), what="gradient: " + source)


# -- values that vary along the class dim only (a per-class buffer through costly functions: lgamma of a
# prior), computed once per class before the rows, beside per-element values ----------------------------
COL_COSTLY = ["torch.lgamma({0}.abs() + 0.5)", "torch.log({0}.abs() + 0.1)", "torch.exp(-{0}.abs())",
              "torch.digamma({0}.abs() + 1.0)", "torch.sqrt({0}.abs() + 0.01)", "torch.tanh({0})", "torch.erf({0})",
              "({0} * 0.5 + 1.0)"]
# the loss over the class dim (dim 1: the last of a 2-D input, channel-first of a 4-D one), or whole
CLASS_FINAL = ["{0}.mean()", "torch.logsumexp({0}, 1).mean()", "{0}.log_softmax(1).mean()",
               "torch.nn.functional.cross_entropy({0}, y)", "({0}.softmax(1) * {1}).sum(1).mean()"]


@settings(max_examples=18 * SCALE, derandomize=not LONG, database=None, deadline=None,
          suppress_health_check=list(HealthCheck), phases=[Phase.generate])  # each example compiles: no shrinking
@given(st.lists(st.sampled_from(COL_COSTLY), min_size=1, max_size=3), st.sampled_from(BINARY),
       st.sampled_from(UNARY + ["{0}"]), st.sampled_from(CLASS_FINAL),
       st.sampled_from([(1, 3), (5, 1), (5, 7), (64, 11), (3, 5, 2, 3), (2, 7, 4, 4)]),
       st.sampled_from([torch.float32, torch.float64]), st.booleans(), st.booleans(), st.booleans())
def test_per_class_values_of_costly_functions_give_eagers_numbers(col_ops, binary, unary, final, shape, dtype,
                                                                   parallel, learned, twice):
    """Random programs of a per-class buffer or learned parameter through costly functions (each class's
    value computed once, before the rows; a parameter's gradient summed over the rows per class in the
    kernel), combined with the per-element input and reduced over the classes; serial and parallel
    kernels, every layout (rows along, rows across, channel-first): fused, with eager's values and
    gradients."""
    from autogen import launch
    col = "self.p"
    lines = []
    for i, op in enumerate(col_ops):
        lines.append(f"c{i} = {op.format(col)}")
        col = f"c{i}"
    lines.append(f"v = {unary.format(binary.format('a', col))}")
    if twice:  # the buffer or parameter read a second time
        lines.append("v = v + self.p")
    lines.append("return " + final.format("v", col))
    keep = "self.p = torch.nn.Parameter(p)" if learned else "self.register_buffer('p', p)"
    source = f"class M(torch.nn.Module):\n    def __init__(self, p):\n        super().__init__()\n        {keep}\n" \
        "    def forward(self, a, y):\n" + "".join(f"        {line}\n" for line in lines)
    env = {"torch": torch}
    exec(source, env)  # noqa: S102 - a generated test program
    cls = env["M"]
    g = torch.Generator().manual_seed(len(source))
    C = shape[1]
    a = torch.randn(shape, dtype=dtype, generator=g)
    p = torch.randn((C,) + (1,) * (len(shape) - 2), dtype=dtype, generator=g)
    y = torch.randint(0, C, (shape[0],) + shape[2:], generator=g)
    want_a = a.clone().requires_grad_()
    module = cls(p.clone())
    ref = module(want_a, y)
    want = torch.autograd.grad(ref, [want_a] + list(module.parameters()))
    got_a = a.clone().requires_grad_()
    fused = autogen.autogen_loss(type("F", (cls,), {}))(p.clone(), use_autogen=True)
    saved = launch._PAR_ELEMENTS
    launch._PAR_ELEMENTS = 0 if parallel else saved
    try:
        with warnings.catch_warnings(record=True) as caught, autogen.policy("aggressive"), autogen.record() as rec:
            warnings.simplefilter("always")
            out = fused(got_a, y)
            got = torch.autograd.grad(out, [got_a] + list(fused.parameters()))
    finally:
        launch._PAR_ELEMENTS = saved
    assert not caught and {(c.path, c.fused) for c in rec.calls} == {("autogen", True)}, \
        (source, [str(m.message) for m in caught], rec.calls)
    assert_matches(out, ref, magnitude(ref.shape, [a, p]), what=source)
    for gi, wi in zip(got, want):
        assert_matches(gi, wi, magnitude(wi.shape, [a, p]), what="gradient: " + source)
    if learned:  # create_graph=True: the gradients as torch ops, differentiable again
        with autogen.policy("aggressive"):
            got = torch.autograd.grad(fused(got_a, y), [got_a] + list(fused.parameters()), create_graph=True)
        for gi, wi in zip(got, want):
            assert_matches(gi, wi, magnitude(wi.shape, [a, p]), what="create_graph gradient: " + source)
    if final != CLASS_FINAL[0] and C > 1 and a.numel() > C and any(op != COL_COSTLY[-1] for op in col_ops):
        # reduced over the classes: a costly per-class value is an array filled before the rows
        with autogen.policy("aggressive"):
            assert re.search(r"__h\d+ = __np.empty\(__C", str(autogen.explain(fused, got_a, y))), source

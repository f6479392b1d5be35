"""A fuzzer of the @autogen_loss lowering: random small programs of elementwise ops, broadcasts along any axes
(outer sums and differences included), reductions over random dims, slices and where, at random small shapes
with random aliasing between the inputs, each compared with eager. Whatever the tracer accepts must be right;
whatever it cannot express must be refused (one warning, then eager)."""
import os
import warnings

import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import autogen

from cases import assert_matches, magnitude

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
    # rows of 11 run along each row, shorter ones across the rows (layout rt)
    rows, cols = draw(st.sampled_from([1, 2, 5])), draw(st.sampled_from([1, 3, 7, 11]))
    b_shape = draw(st.sampled_from([(rows, cols), (cols,), (rows, 1), (1, cols)]))
    return lines, (rows, cols), b_shape


def _module(lines):
    source = "class M(torch.nn.Module):\n    def forward(self, a, b):\n" + \
        "".join(f"        {line}\n" for line in lines)
    env = {"torch": torch}
    exec(source, env)  # noqa: S102 - a generated test program
    return env["M"], source


@settings(max_examples=40 * SCALE, derandomize=not LONG, database=None, deadline=None,
          suppress_health_check=list(HealthCheck))
@given(programs(), st.sampled_from(["none", "same"]), st.sampled_from([torch.float32, torch.float64]))
def test_random_programs_give_eagers_numbers_or_are_refused(program, alias, dtype):
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
    with warnings.catch_warnings(record=True), autogen.policy("aggressive"):
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

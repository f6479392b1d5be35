"""PyTorch's own OpInfo sample inputs for the eighteen losses, through the fused path."""
import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db

import autogen
from autogen import functional as AF
from cases import tolerances

NAMES = list(AF.LOSSES)
OPS = {op.name.split(".")[-1]: op for op in op_db if op.name.split(".")[-1] in NAMES and op.name.startswith("nn.")}


def test_all_eighteen_have_opinfo_samples():
    assert sorted(OPS) == sorted(NAMES)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("name", NAMES)
def test_opinfo_samples_fused(name, dtype):
    op = OPS[name]
    count = 0
    for sample in op.sample_inputs("cpu", dtype, requires_grad=True):
        tensors = [sample.input] + [a for a in sample.args if isinstance(a, torch.Tensor)]
        ref = op.op(sample.input, *sample.args, **sample.kwargs)
        diff = [t for t in tensors if t.requires_grad]
        gout = torch.rand_like(ref) + 0.5
        want = torch.autograd.grad(ref, diff, gout, allow_unused=True)
        ours_in = [t.detach().clone().requires_grad_(t.requires_grad) for t in tensors]
        with autogen.policy("aggressive"), autogen.record() as rec:
            out = getattr(AF, name)(ours_in[0], *ours_in[1:], **sample.kwargs, use_autogen=True)
            got = torch.autograd.grad(out, [t for t in ours_in if t.requires_grad], gout, allow_unused=True)
        tol = tolerances(dtype)
        torch.testing.assert_close(out, ref, **tol, msg=lambda m: f"{sample}: {m}")
        for g, w in zip(got, want):
            if w is None:
                assert g is None or not g.any()
            else:
                torch.testing.assert_close(g, w, **tol, msg=lambda m: f"{sample}: {m}")
        assert rec.calls and all(c.path == "autogen" and c.fused for c in rec.calls)
        count += 1
    assert count > 0

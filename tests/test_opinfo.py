"""PyTorch's own OpInfo sample inputs for the eighteen losses, through the fused path."""
import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db

from autogen import functional as AF
from cases import compare

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
        try:
            compare(lambda *t: getattr(AF, name)(*t, **sample.kwargs, use_autogen=True),
                    lambda *t: op.op(*t, **sample.kwargs), tensors, policy="aggressive", paths={"autogen"},
                    fused=True)
        except AssertionError as exc:
            raise AssertionError(f"{sample}: {exc}") from None
        count += 1
    assert count > 0

"""The README's determinism sentence: one input gives one bit pattern, for 1 and 2 threads, on the first call
and the hundredth (after the parallel kernel has taken over from the serial one)."""
import pytest
import torch

import autogen
from autogen.corpus import CORPUS, make
from cases import short_rows_across

NAMES = ["SoftDice", "Pearson", "HeteroscedasticGaussian", "Tversky", "FocalTversky", "NormalizedMSE",
         "MaskedMean", "GeneralizedCE", "MixedRegression"]


# rows of 1024 run along each row; rows of 4 across them (layout 'rt', whatever the work per element), both past
# the parallel threshold
SHAPES = [(name, (256, 1024)) for name in NAMES] + [(name, (1 << 16, 4)) for name in
                                                     ("SoftDice", "GeneralizedCE", "MaskedMean", "Pearson")]


@pytest.mark.parametrize("name,shape", SHAPES, ids=lambda v: v if isinstance(v, str) else "x".join(map(str, v)))
def test_same_bits_for_one_and_two_threads_first_call_and_later(name, shape):
    entry = next(e for e in CORPUS if e.cls.__name__ == name)
    inputs = make(entry.kind, torch.float32, *shape, torch.Generator().manual_seed(0))
    module = entry.cls(use_autogen=True)
    threads = torch.get_num_threads()
    seen = []
    try:
        for nthreads in (1, 2, 1):
            torch.set_num_threads(nthreads)
            for _ in range(12):  # past the timed calls, after which a large call may run on threads
                args = [t.clone().requires_grad_(i in entry.diff) for i, t in enumerate(inputs)]
                with autogen.policy("aggressive"), autogen.record() as rec, short_rows_across(shape[1] < 16):
                    out = module(*args)
                    grads = torch.autograd.grad(out, [args[i] for i in entry.diff])
                assert {c.path for c in rec.calls} == {"autogen"}, rec.calls
                seen.append([out.detach()] + list(grads))
    finally:
        torch.set_num_threads(threads)
    first = seen[0]
    for k, got in enumerate(seen[1:], 1):
        for a, b in zip(got, first):
            assert torch.equal(a, b), (name, k, (a - b).abs().max().item())

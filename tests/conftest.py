import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))  # the shared case tables


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _kernels_at_every_size(monkeypatch):
    """Tests use small tensors: run them through our kernels, not torch's below-threshold path."""
    from autogen import functional
    monkeypatch.setattr(functional, "SMALL_ELEMENTS", dict.fromkeys(functional.SMALL_ELEMENTS, 0))
    monkeypatch.setattr(functional, "SMALL_ELEMENTS_NO_GRAD", dict.fromkeys(functional.SMALL_ELEMENTS, 0))


@pytest.fixture(autouse=True)
def _fallback_warnings_every_test(monkeypatch):
    """The engine warns of a fallback once per process: each test starts with none warned, so the
    filterwarnings rule (pyproject.toml) fails every test that falls back, not only the first."""
    import importlib
    for name in ("autogen.executor", "autogen.tracing", "autogen.linear_loss"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if isinstance(getattr(module, "_warned", None), set):
            monkeypatch.setattr(module, "_warned", set())

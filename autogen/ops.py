"""The implementations of the autogen::call and autogen::call_backward operators (their schemas, and how a call's
name, tensors and options are written: opcall.py), for torch.compile, torch.export and fake/meta tensors.

The CPU implementation runs the ordinary eager path of that call (policy, size thresholds and
kernels read when the graph runs); where the graph differentiates the call, it runs it under
autograd as eagerly and keeps that graph for `call_backward`, which hands its gradients over
(the fused kernel's, written in the forward pass) or recomputes the call if none is kept. The
fake implementation runs our own function on the fake tensors as an @autogen_loss trace does
(torch's validation, no kernel) for the output's shape and dtype. So a compiled graph calls the
fused kernels forward and backward, as many times as eager does.

The eager path never goes through these operators: the fronts dispatch to them only while Dynamo
traces (torch.compile, strict torch.export) and for fake or meta tensors (`symbolic`: non-strict
torch.export, FakeTensorMode).
"""
import contextlib
import functools
import sys
import weakref

import torch
from torch.autograd.graph import get_gradient_edge

from . import functional, inductor_pass, inline
from .opcall import LIBRARY, decode, distance_of, live_module
from .policies import tracing_scope


def _module(name):
    if name.startswith("fused:"):  # a loss with its inputs' producers (inductor_pass.py): the name is its program
        return inductor_pass.module(name)
    return live_module(name)


# -- the operators' implementations -------------------------------------------------------------
def _run(name, tensors, options):
    """The call as the eager path runs it."""
    if name.startswith(("module:", "fused:")):
        return _module(name)(*tensors)
    names, kwargs, _ = decode(options)
    if isinstance(kwargs.get("distance_function"), str):
        kwargs = dict(kwargs, distance_function=distance_of(kwargs["distance_function"]))
    first, *rest = tensors  # positionally: nonlinearities name it `input`, losses `input` or `input1`...
    return getattr(functional, name)(first, **dict(zip(names[1:], rest)), **kwargs)


def _shape_only(name, tensors, options):
    """The call on tensors without data (fake or meta): our own function as an @autogen_loss trace runs
    it (inline.py), so it validates like torch, defers the checks of values and gives the output's shape
    and dtype without running a kernel. A module runs its forward as written, torch.nn.functional's
    losses and nonlinearities routed to ours as in a trace. (torch's own functions are not reliable on
    fake tensors inside a fake implementation: cross_entropy with reduction='none' gives a 0-dim
    result, hinge_embedding_loss raises, multi_margin_loss of a 1-D input is 1-D.)"""
    with tracing_scope(), inline.scope():
        if not name.startswith(("module:", "fused:")):
            return _run(name, tensors, options)
        module = _module(name)
        with inline.route():
            return type(module)._autogen_forward(module, *tensors)


def _fresh(out, tensors):
    """`out` contiguous and sharing no memory with the inputs, as the fake implementation says."""
    if not out.is_contiguous():
        return out.contiguous()
    ptr = out.untyped_storage().data_ptr()
    if out.numel() and any(t.untyped_storage().data_ptr() == ptr for t in tensors):
        return out.clone()
    return out


# The forward's autograd graph, kept for the backward: the memory of the output we returned -> the
# eager call's gradient edge (its graph, not its output) and the leaves it differentiates. The
# backward runs it as eager's backward does (the gradients a fused forward kernel wrote are handed
# over, or its backward kernel runs). An entry goes when the output's memory is freed (AOTAutograd
# saves an alias of it for the backward), when the backward takes it, or, past _KEPT entries, the
# oldest first: a graph that holds the output itself (relu's saves its result, the op-by-op path its
# values) outlives a forward whose backward never runs. A backward that finds no entry (a second one
# through a retained graph) recomputes the call.
_graphs = {}
_KEPT = 64


def _call_impl(name, tensors, options):
    """The eager call: under no_grad, or, when the graph differentiates it (its `autograd` option), with
    its autograd graph kept for call_backward."""
    needs = decode(options)[2]
    if not any(needs):
        with torch.no_grad():
            return _fresh(_run(name, [t.detach() for t in tensors], options), tensors)
    with torch.enable_grad(), _autograd_keys():
        xs = [t.detach().requires_grad_(need) for t, need in zip(tensors, needs)]
        out = _run(name, xs, options)
    result = _fresh(out.detach(), tensors)
    if out.requires_grad and result.numel():
        storage = result.untyped_storage()
        key = storage.data_ptr()
        _graphs[key] = (get_gradient_edge(out), out.shape, [x for x in xs if x.requires_grad])
        weakref.finalize(storage, _graphs.pop, key, None).atexit = False
        while len(_graphs) > _KEPT:
            _graphs.pop(next(iter(_graphs)), None)
    return result


def _call_fake(name, tensors, options):
    if "torch._inductor.config" in sys.modules:  # Inductor will compile the graph Dynamo traces: our pass on it
        _register_pass()                          # (importing Inductor costs seconds: not at our import)
    out = _shape_only(name, tensors, options)
    return out.new_empty(out.shape)


@functools.cache
def _register_pass():
    inductor_pass.register()


def _call_backward_impl(name, tensors, options, output, grad, needs):
    """The gradients of the inputs in `needs`, from the forward's kept graph or the call recomputed under
    autograd."""
    kept = _graphs.pop(output.untyped_storage().data_ptr(), None) if output.numel() else None
    with torch.enable_grad(), _autograd_keys():
        if kept is not None and list(decode(options)[2]) == list(needs):
            edge, shape, wrt = kept
        else:
            xs = [t.detach().requires_grad_(need) for t, need in zip(tensors, needs)]
            edge, wrt = _run(name, xs, options), [x for x, need in zip(xs, needs) if need]
            shape = edge.shape
        got = torch.autograd.grad([edge], wrt, [grad.reshape(shape)], allow_unused=True) if wrt else ()
    return [(torch.zeros_like(x) if g is None else g).contiguous() for x, g in zip(wrt, got)]


_K = torch._C.DispatchKey
_AUTOGRAD_KEYS = functools.reduce(lambda a, b: a | b, [torch._C.DispatchKeySet(k) for k in (
    _K.AutogradCPU, _K.AutogradOther, _K.AutogradNestedTensor, _K.ADInplaceOrView)])


def _autograd_keys():
    """Autograd on for the recomputation, also where a TorchDispatchMode runs this implementation (a
    mode sees an operator below autograd: its implementation then records no graph)."""
    exclude = torch._C._dispatch_tls_local_exclude_set()
    kept = exclude - _AUTOGRAD_KEYS
    if kept == exclude:
        return contextlib.nullcontext()
    return torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), kept)


def _call_backward_fake(name, tensors, options, output, grad, needs):
    return [t.new_empty(t.shape) for t, need in zip(tensors, needs) if need]


def _setup_context(ctx, inputs, output):
    name, tensors, options = inputs
    ctx.name, ctx.options = name, options
    ctx.save_for_backward(output, *tensors)  # the output: the key of the forward's kept graph


def _backward(ctx, grad):
    needs = [bool(n) for n in ctx.needs_input_grad[1]]
    output, *tensors = ctx.saved_tensors
    got = iter(torch.ops.autogen.call_backward(ctx.name, tensors, ctx.options, output, grad, needs))
    return None, [next(got) if need else None for need in needs], None


LIBRARY.impl("call", _call_impl, "CPU")
LIBRARY.impl("call_backward", _call_backward_impl, "CPU")
torch.library.register_fake("autogen::call", _call_fake, lib=LIBRARY)
torch.library.register_fake("autogen::call_backward", _call_backward_fake, lib=LIBRARY)
torch.library.register_autograd("autogen::call", _backward, setup_context=_setup_context, lib=LIBRARY)




"""The engine's calls as PyTorch operators: torch.compile, torch.export and fake/meta tensors.

Two generic schemas serve every loss, nonlinearity and @autogen_loss module, so a new graph needs
no new schema:

    autogen::call(str name, Tensor[] tensors, str options) -> Tensor
    autogen::call_backward(str name, Tensor[] tensors, str options, Tensor output, Tensor grad,
                           bool[] needs) -> Tensor[]

`name` is an autogen.functional name ('cross_entropy', 'leaky_relu') or 'module:<key>' for an
@autogen_loss module, or 'fused:<program>' for a loss with the pointwise ops before it (inductor_pass.py,
under Inductor); `tensors` are the call's tensor arguments (an absent optional one left out)
and `options` the rest, after the tensors' parameter names, as one canonical string (`encode`).
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
import itertools
import sys
import weakref

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.autograd.graph import get_gradient_edge

from . import inline

_lib = torch.library.Library("autogen", "FRAGMENT")
_lib.define("call(str name, Tensor[] tensors, str options) -> Tensor")
_lib.define("call_backward(str name, Tensor[] tensors, str options, Tensor output, Tensor grad, bool[] needs)"
            " -> Tensor[]")

_Tensor = torch.Tensor


# compiling(): Dynamo is tracing this call (torch.compile, strict torch.export), torch's own function
# (Dynamo folds it to True without a guard; bound here, as torch.compiler's lookup costs 0.1 us a call).
# Not the whole compile session (torch.compiler.is_compiling()): our fake implementations, which run our
# functions during one, and non-strict torch.export see fake tensors (`symbolic`) instead.
compiling = torch.compiler.is_dynamo_compiling


def symbolic(*tensors):
    """Whether a call sees tensors without data: meta or fake tensors (a FakeTensorMode makes the
    tensors created under it fake; torch.export fakes the inputs, parameters and buffers)."""
    for t in tensors:
        if isinstance(t, _Tensor) and (t.is_meta or type(t) is not _Tensor and isinstance(t, FakeTensor)):
            return True
    return False


# -- options: the call's non-tensor arguments as one canonical string --------------------------
# name=<tag><value> joined by ';', sorted by name, after the tensor arguments' names: f a float as
# float.hex (exact; under Dynamo it also specializes a symbolic float to its value, where repr and
# str of one are not traceable), i an int, b a bool, n None, s a string. Written with the operations
# Dynamo folds on constants, so under torch.compile the string is a constant of the graph.
def _encode_value(value):
    """The tagged text of one option value, or None when it has no text (a callable, a tensor)."""
    kind = type(value)
    if kind is bool:
        return "b1" if value else "b0"
    if kind is int:
        return "i" + str(value.__index__())
    if kind is float:
        return "f" + float(value).hex()
    if value is None:
        return "n"
    if kind is str and ";" not in value:
        return "s" + value
    if isinstance(value, torch.SymInt):
        return "i" + str(value.__index__())
    if isinstance(value, torch.SymFloat):
        return "f" + float(value).hex()
    return None


def encode(tensor_names, options):
    """`options` (name -> value) as the operator's string, or None when a value cannot be written."""
    parts = [",".join(tensor_names)]
    for key in sorted(options):
        text = _encode_value(options[key])
        if text is None:
            return None
        parts.append(key + "=" + text)
    return ";".join(parts)


def _decode_value(text):
    tag, body = text[0], text[1:]
    if tag == "f":
        return float.fromhex(body)
    if tag == "i":
        return int(body)
    if tag == "b":
        return body == "1"
    if tag == "n":
        return None
    return body


@functools.lru_cache(maxsize=4096)
def decode(options):
    """(tensor argument names, {option: value}, which tensors the call differentiates) of an options
    string (the last from its `autograd` entry, '1' or '0' per tensor; none without one)."""
    head, *rest = options.split(";")
    names = tuple(head.split(",")) if head else ()
    kwargs = {}
    for part in rest:
        key, text = part.split("=", 1)
        kwargs[key] = _decode_value(text)
    needs = tuple(c == "1" for c in kwargs.pop("autograd", "0" * len(names)))
    return names, kwargs, needs


# -- @autogen_loss modules: 'module:<key>' names a live module ----------------------------------
_modules = weakref.WeakValueDictionary()
_keys = itertools.count()


def register_module(module):
    """Give an @autogen_loss module its key (at construction, and again for a copy or an unpickled one)."""
    key = next(_keys)
    _modules[key] = module
    module.__dict__["_autogen_key"] = key


def _module(name):
    if name.startswith("fused:"):  # a loss with its inputs' producers (inductor_pass.py): the name is its program
        from . import inductor_pass
        return inductor_pass.module(name)
    module = _modules.get(int(name[len("module:"):]))
    if module is None:
        raise RuntimeError(f"autogen::call: the @autogen_loss module of {name!r} no longer exists")
    return module


# -- the operators' implementations -------------------------------------------------------------
def _run(name, tensors, options):
    """The call as the eager path runs it."""
    if name.startswith(("module:", "fused:")):
        return _module(name)(*tensors)
    names, kwargs, _ = decode(options)
    from . import functional
    if isinstance(kwargs.get("distance_function"), str):
        kwargs = dict(kwargs, distance_function=_distance(kwargs["distance_function"]))
    first, *rest = tensors  # positionally: nonlinearities name it `input`, losses `input` or `input1`...
    return getattr(functional, name)(first, **dict(zip(names[1:], rest)), **kwargs)


def _shape_only(name, tensors, options):
    """The call on tensors without data (fake or meta): our own function as an @autogen_loss trace runs
    it (inline.py), so it validates like torch, defers the checks of values and gives the output's shape
    and dtype without running a kernel. A module runs its forward as written, torch.nn.functional's
    losses and nonlinearities routed to ours as in a trace. (torch's own functions are not reliable on
    fake tensors inside a fake implementation: cross_entropy with reduction='none' gives a 0-dim
    result, hinge_embedding_loss raises, multi_margin_loss of a 1-D input is 1-D.)"""
    from .policies import tracing_scope
    with tracing_scope(), inline.scope():
        if not name.startswith(("module:", "fused:")):
            return _run(name, tensors, options)
        module = _module(name)
        with inline.route():
            return type(module)._autogen_forward(module, *tensors)


def _distance(text):
    """A distance_function option written as 'pairwise_distance' or 'PairwiseDistance(p,eps)'."""
    if text == "pairwise_distance":
        return torch.nn.functional.pairwise_distance
    p, eps = (float.fromhex(v) for v in text[len("PairwiseDistance("):-1].split(","))
    return torch.nn.PairwiseDistance(p=p, eps=eps)


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
    from . import inductor_pass
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


_lib.impl("call", _call_impl, "CPU")
_lib.impl("call_backward", _call_backward_impl, "CPU")
torch.library.register_fake("autogen::call", _call_fake, lib=_lib)
torch.library.register_fake("autogen::call_backward", _call_backward_fake, lib=_lib)
torch.library.register_autograd("autogen::call", _backward, setup_context=_setup_context, lib=_lib)

call = torch.ops.autogen.call.default
call_backward = torch.ops.autogen.call_backward.default


# -- the fronts' side: build a call ----------------------------------------------------------------
def loss(name, param_names, args, kwargs, use_autogen):
    """A loss call as the operator, or under torch.compile torch's own loss where an option has no text
    (a distance_function callable: the eager path runs that loss in torch too)."""
    tensor_names, tensors, options = [], [], {"use_autogen": bool(use_autogen)}
    for key, value in itertools.chain(zip(param_names, args), kwargs.items()):
        if isinstance(value, torch.Tensor):
            tensor_names.append(key)
            tensors.append(value)
        elif key == "distance_function" and value is not None:
            options[key] = _distance_text(value)
        else:
            options[key] = value
    text = _encode_call(tensor_names, tensors, options)
    if text is None or not isinstance(args[0], torch.Tensor):
        return getattr(torch.nn.functional, name)(*args, **kwargs)
    return call(name, tensors, text)


def _encode_call(tensor_names, tensors, options):
    """encode(), with the `autograd` entry when the call is differentiated (known when Dynamo traces: it
    guards on grad mode and requires_grad): the forward then keeps its graph for the backward."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        options["autograd"] = "".join(["1" if t.requires_grad else "0" for t in tensors])
    return encode(tensor_names, options)


def _distance_text(fn):
    if fn is torch.nn.functional.pairwise_distance or fn is torch.pairwise_distance:
        return "pairwise_distance"
    if type(fn) is torch.nn.PairwiseDistance and not fn.keepdim:
        return "PairwiseDistance(" + float(fn.norm).hex() + "," + float(fn.eps).hex() + ")"
    return fn  # no text: torch's own loss


def nonlinearity(name, tensors, options):
    """A nonlinearity call (options by torch's names) as the operator."""
    text = _encode_call(["input", "weight"][:len(tensors)], tensors, dict(options))
    if text is None:
        return getattr(torch.nn.functional, name)(*tensors, **options)
    return call(name, list(tensors), text)


def module_call(module, forward, args, kwargs):
    """An @autogen_loss module's call as the operator; its forward as written (traced by Dynamo)
    where the operator cannot carry it: keyword or non-tensor arguments, parameters that require grad
    (their gradients)."""
    key = module.__dict__.get("_autogen_key")
    if key is None or kwargs or not args or not all(isinstance(a, torch.Tensor) for a in args) or any(
            p.requires_grad for p in module.parameters()):
        return forward(module, *args, **kwargs)
    return call("module:" + str(key), list(args), _encode_call([], args, {}))

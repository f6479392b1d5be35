"""The autogen::call operator's schema and the fronts' side of a call: what the losses, nonlinearities and
@autogen_loss modules build under torch.compile, torch.export and fake tensors (ops.py implements it).

    autogen::call(str name, Tensor[] tensors, str options) -> Tensor
    autogen::call_backward(str name, Tensor[] tensors, str options, Tensor output, Tensor grad,
                           bool[] needs) -> Tensor[]

`name` is an autogen.functional name ('cross_entropy', 'leaky_relu') or 'module:<key>' for an
@autogen_loss module, or 'fused:<program>' for a loss with the pointwise ops before it (inductor_pass.py,
under Inductor); `tensors` are the call's tensor arguments (an absent optional one left out)
and `options` the rest, after the tensors' parameter names, as one canonical string (`encode`).
"""
import functools
import itertools
import weakref

import torch
from torch._subclasses.fake_tensor import FakeTensor

LIBRARY = torch.library.Library("autogen", "FRAGMENT")
LIBRARY.define("call(str name, Tensor[] tensors, str options) -> Tensor")
LIBRARY.define("call_backward(str name, Tensor[] tensors, str options, Tensor output, Tensor grad, bool[] needs)"
               " -> Tensor[]")

_Tensor = torch.Tensor


# compiling(): Dynamo is tracing this call (torch.compile, strict torch.export), torch's own function
# (Dynamo folds it to True without a guard; bound here: torch.compiler's attribute lookup costs a call more).
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
def encode_value(value):
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
        text = encode_value(options[key])
        if text is None:
            return None
        parts.append(key + "=" + text)
    return ";".join(parts)


def decode_value(text):
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
        kwargs[key] = decode_value(text)
    needs = tuple(c == "1" for c in kwargs.pop("autograd", "0" * len(names)))
    return names, kwargs, needs


def distance_of(text):
    """A distance_function option written as 'pairwise_distance' or 'PairwiseDistance(p,eps)'."""
    if text == "pairwise_distance":
        return torch.nn.functional.pairwise_distance
    p, eps = (float.fromhex(v) for v in text[len("PairwiseDistance("):-1].split(","))
    return torch.nn.PairwiseDistance(p=p, eps=eps)


# -- @autogen_loss modules: 'module:<key>' names a live module ----------------------------------
MODULES = weakref.WeakValueDictionary()
_keys = itertools.count()


def register_module(module):
    """Give an @autogen_loss module its key (at construction, and again for a copy or an unpickled one)."""
    key = next(_keys)
    MODULES[key] = module
    module.__dict__["_autogen_key"] = key


def live_module(name):
    """The module a 'module:<key>' name gives."""
    module = MODULES.get(int(name[len("module:"):]))
    if module is None:
        raise RuntimeError(f"autogen::call: the @autogen_loss module of {name!r} no longer exists")
    return module


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

"""An Inductor graph pass: a loss's autogen::call absorbs the pointwise ops that produce its inputs.

Inductor fuses a model's pointwise tail (x * scale + shift, an activation) into torch's own loss,
forward and backward, in one pass over the data; our operator would be a fusion boundary (the tail
writes its output, our kernel reads it and writes its gradient, Inductor's backward reads that again).
So before AOTAutograd (config.pre_grad_custom_pass, on Dynamo's graph) this pass replaces

    autogen::call(loss, [f(a0, a1, ..), t], options)      f: pointwise ops of POINTWISE, used only here

by one autogen::call('fused:<f and the loss as text>', [a0, a1, .., t], ..): an @autogen_loss module
(Fused) runs f and the loss as one traced kernel with the gradients of a0, a1, .. (a scalar parameter's
too). The name is the whole program, so a graph Inductor loads from its cache needs no state of this
process. A producer is absorbed only where its output has the loss input's shape and its tensor operands
that shape or one element (what a traced kernel reads without a broadcast of its own), and not past a
node that could change its value (an in-place op, a grad-mode or autocast switch).

The operator's fake implementation registers the pass once Inductor is loaded (ops._call_fake: Dynamo
runs it while tracing, before Inductor compiles); `ENABLED = False` compiles without it.
"""
import functools
import operator
import os

import torch

from . import opcall as _ops
from .functional import LOSSES
from .tracing import autogen_loss

# The arguments a loss checks by value (torch's errors): a traced kernel's check computes an absorbed
# producer op by op in torch first, which costs more than Inductor's fused producer.
CHECKED = {"binary_cross_entropy": ("input", "target"), "gaussian_nll_loss": ("var",)}

# the program's ops: name -> the function the fused module calls (Dynamo's graph holds operator.*,
# torch.* or Tensor methods for the same op; TARGETS maps each to the name)
POINTWISE = {"mul": operator.mul, "add": operator.add, "sub": operator.sub, "div": operator.truediv,
             "neg": operator.neg, "relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
             "exp": torch.exp, "log": torch.log, "abs": torch.abs}
TARGETS = {operator.mul: "mul", torch.mul: "mul", operator.add: "add", torch.add: "add", operator.sub: "sub",
           torch.sub: "sub", operator.truediv: "div", torch.div: "div", operator.neg: "neg", torch.neg: "neg",
           torch.relu: "relu", torch.nn.functional.relu: "relu", torch.sigmoid: "sigmoid",
           torch.tanh: "tanh", torch.exp: "exp", torch.log: "log", torch.abs: "abs"}
METHODS = {name: name for name in POINTWISE} | {"truediv": "div", "__mul__": "mul"}
ARITY = {name: 1 if name in ("neg", "relu", "sigmoid", "tanh", "exp", "log", "abs") else 2 for name in POINTWISE}


def _value(node):
    meta = getattr(node, "meta", None) or {}
    return meta.get("example_value", meta.get("val"))


def _op_name(node):
    """The program name of a pointwise node Dynamo recorded, or None."""
    if node.op == "call_function":
        name = TARGETS.get(node.target)
    elif node.op == "call_method":
        name = METHODS.get(node.target)
    else:
        return None
    if name is None or any(k != "inplace" or v for k, v in node.kwargs.items()) or _operands(node, name) is None:
        return None
    return name


def _operands(node, name):
    """The node's operands as the program's op takes them: F.relu's positional `inplace` (False) dropped;
    None for any other argument count (an in-place relu, torch.add's alpha)."""
    args, n = node.args, ARITY[name]
    if len(args) == n + 1 and name == "relu" and args[n] is False:
        return args[:n]
    return args if len(args) == n else None


def _absorbable(node, shape):
    """A pointwise node whose floating output has the loss input's shape, whose tensor operands have that
    shape or one element, its dtype, and whose other operands are numbers."""
    if _op_name(node) is None:
        return False
    out = _value(node)
    if not isinstance(out, torch.Tensor) or not out.is_floating_point() or out.shape != shape:
        return False
    for arg in _operands(node, _op_name(node)):
        if isinstance(arg, torch.fx.Node):
            v = _value(arg)
            if not isinstance(v, torch.Tensor) or v.dtype != out.dtype or \
                    v.shape != out.shape and (v.numel() != 1 or v.dim() > out.dim()):
                return False
        elif type(arg) not in (int, float, bool):
            return False
    return True


# Dynamo's nodes for grad mode and autocast: a producer moved past one would run under another mode
_MODES = {"_set_grad_enabled", "_enter_autocast", "_exit_autocast"}
_INPLACE = {"setitem", "iadd", "isub", "imul", "itruediv", "ifloordiv", "imod", "ipow", "iand", "ior", "ixor",
            "ilshift", "irshift", "imatmul"}  # operator's in-place functions (`x += y` in Dynamo's graph)


def _barrier(node):
    """Whether a node may change what a producer moved past it computes: it mutates a tensor (an in-place
    method or function, setitem, an out= or inplace=True argument, a mutable operator, a module) or
    changes grad mode or autocast."""
    if node.op == "call_module":
        return True
    if node.op not in ("call_function", "call_method"):
        return False
    name = node.target if node.op == "call_method" else getattr(node.target, "__name__", "")
    if name in _MODES or name in _INPLACE or name.endswith("_") and not name.endswith("__") or \
            name.startswith("__i") or node.kwargs.get("inplace") or node.kwargs.get("out") is not None:
        return True
    schema = getattr(node.target, "_schema", None)
    return schema is not None and schema.is_mutable


def _literal(value):
    return _ops.encode_value(value)


def absorb(graph):
    """Rewrite every loss's autogen::call of `graph` whose inputs have absorbable producers; the number
    rewritten."""
    done = 0
    for call in [n for n in graph.nodes if n.op == "call_function" and n.target is _ops.call]:
        name, tensors, options = call.args
        if name not in LOSSES or ";use_autogen=b1" not in options or "|" in options:  # '|' splits the name
            continue
        region, shape = {call}, _value(tensors[0]).shape
        checked = {t for t, arg in zip(tensors, options.split(";")[0].split(",")) if arg in CHECKED.get(name, ())}
        before = list(graph.nodes)[:list(graph.nodes).index(call)]
        for node in reversed(before):
            if node.users and all(u in region for u in node.users) and node not in checked and \
                    _absorbable(node, shape):
                region.add(node)
        if len(region) == 1:
            continue
        first = next(i for i, n in enumerate(before) if n in region)
        if any(_barrier(n) for n in before[first:] if n not in region):
            continue
        leaves, refs, steps = [], {}, []

        def ref(arg):
            if not isinstance(arg, torch.fx.Node):
                return _literal(arg)
            if arg not in refs:
                leaves.append(arg)
                refs[arg] = f"a{len(leaves) - 1}"
            return refs[arg]
        order = [n for n in graph.nodes if n in region and n is not call]
        for i, node in enumerate(order):
            op = _op_name(node)
            steps.append(op + "(" + ",".join(ref(a) for a in _operands(node, op)) + ")")
            refs[node] = f"v{i}"
        args = ",".join(ref(t) for t in tensors)
        head, *rest = options.split(";")
        kept = ";".join([head] + [p for p in rest if not p.startswith(("autograd=", "use_autogen="))])
        text = "fused:" + " ".join(steps) + "|" + name + "(" + args + ")|" + kept
        grads = {"autograd": "".join("1" if _value(a).requires_grad else "0" for a in leaves)} \
            if "autograd=" in options else {}
        with graph.inserting_before(call):
            new = graph.call_function(_ops.call, (text, leaves, _ops.encode([], grads)))
        new.meta.update(call.meta)
        call.replace_all_uses_with(new)
        for node in [call] + order[::-1]:
            graph.erase_node(node)
        done += 1
    return done


def _parse_arg(text):
    return text if text[0] in "av" else _ops.decode_value(text)


@functools.lru_cache(maxsize=None)
def module(name):
    """The @autogen_loss module of a 'fused:' name (one per program, kept: the name is its whole state)."""
    return _decorated()(name, use_autogen=True)


@functools.cache
def _decorated():
    return autogen_loss(Fused)


class Fused(torch.nn.Module):
    """The producers and the loss of a 'fused:' name, run in order (decorated by `module`)."""

    def __init__(self, name):
        super().__init__()
        self.program = name  # a string attribute: part of the trace's key
        steps, loss, options = name[len("fused:"):].split("|")
        self._steps = [(s[:s.index("(")], [_parse_arg(a) for a in s[s.index("(") + 1:-1].split(",") if a])
                       for s in steps.split()]
        self._loss, self._args = loss[:loss.index("(")], loss[loss.index("(") + 1:-1].split(",")
        names, kwargs, _ = _ops.decode(options)
        if isinstance(kwargs.get("distance_function"), str):
            kwargs = dict(kwargs, distance_function=_ops.distance_of(kwargs["distance_function"]))
        self._names, self._kwargs = names, kwargs

    def forward(self, *tensors):
        env = {f"a{i}": t for i, t in enumerate(tensors)}
        for i, (op, args) in enumerate(self._steps):
            env[f"v{i}"] = POINTWISE[op](*[env[a] if isinstance(a, str) else a for a in args])
        first, *rest = [env[a] for a in self._args]
        return getattr(torch.nn.functional, self._loss)(first, **dict(zip(self._names[1:], rest)), **self._kwargs)


# False: Inductor compiles graphs without the pass (our loss then a fusion boundary, as on aot_eager)
ENABLED = True


@functools.cache
def pass_class():
    """The pass's class, a CustomGraphPass (made at first use: importing Inductor costs seconds)."""
    from torch._inductor.custom_graph_pass import CustomGraphPass, get_hash_for_files

    class AbsorbPass(CustomGraphPass):
        """The pass as Inductor's config holds it (uuid: its part of Inductor's cache key, this file's and
        the operator files' text and ENABLED)."""

        def __call__(self, graph):
            if ENABLED:
                absorb(graph)

        def uuid(self):
            here = os.path.dirname(__file__)
            files = [os.path.join(here, name) for name in ("inductor_pass.py", "ops.py", "opcall.py")]
            return get_hash_for_files(tuple(files)).hex() + ("" if ENABLED else ":off")
    return AbsorbPass


def register():
    """Add the pass to torch._inductor.config.pre_grad_custom_pass (after a pass already there)."""
    from torch._inductor import config
    AbsorbPass = pass_class()
    current = config.pre_grad_custom_pass
    if any(isinstance(p, AbsorbPass) for p in (current if isinstance(current, (list, tuple)) else [current])):
        return
    if current is None:
        config.pre_grad_custom_pass = AbsorbPass()
    else:
        config.pre_grad_custom_pass = [*(current if isinstance(current, (list, tuple)) else [current]), AbsorbPass()]

"""An Inductor graph pass: a loss's autogen::call absorbs the ops that produce its inputs, and losses on the
same inputs whose results are summed become one call.

Inductor fuses a model's pointwise tail (x * scale + shift, an activation) into torch's own loss,
forward and backward, in one pass over the data, and fuses two losses of the same logits (cross-entropy
plus a soft Dice term on a one-hot target it never writes) into one loop; our operators would be fusion
boundaries (the tail writes its output, each of our kernels reads it and writes its gradient, Inductor's
backward reads that again). So before AOTAutograd (config.pre_grad_custom_pass, on Dynamo's graph) this
pass replaces

    autogen::call(loss1, [f(a0, ..), t], o1) * 0.5 + autogen::call('module:K', [f(a0, ..), g(t)], o2)

(f, g: ops of POINTWISE and STRUCTURAL, used only there; the losses sharing an input) by one
autogen::call('fused:<the program as text>', [a0, .., t], ..): an @autogen_loss module (Fused) runs the
program as one trace, fused kernels with the gradients of a0, .. (a scalar parameter's too). A loss's name
is the whole program, so a graph Inductor loads from its cache needs no state of this process (an
@autogen_loss module's step names the live module, as its own call does). A pointwise producer is absorbed
only where its tensor operands have its shape or one element (what a traced kernel reads without a
broadcast of its own), and nothing moves past a node that could change its value (an in-place op, a
grad-mode or autocast switch).

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
    if isinstance(value, torch.dtype):
        return "d" + str(value).split(".")[-1]
    return _ops.encode_value(value)


# Ops a region holds besides POINTWISE, which reshape or convert a loss's inputs (a segmentation loss's
# one-hot target): name -> its function
STRUCTURAL = {"one_hot": torch.nn.functional.one_hot, "permute": torch.Tensor.permute, "to": torch.Tensor.to,
              "float": torch.Tensor.float, "double": torch.Tensor.double}
_STRUCTURAL_TARGETS = {torch.nn.functional.one_hot: "one_hot", torch._C._nn.one_hot: "one_hot",
                       torch.permute: "permute"}


def _structural(node):
    """The STRUCTURAL name of a node whose operands the program can write (a tensor first, then ints, or
    one dtype for `to`), or None."""
    if node.kwargs or not node.args or not isinstance(node.args[0], torch.fx.Node):
        return None
    if node.op == "call_function":
        name = _STRUCTURAL_TARGETS.get(node.target)
    elif node.op == "call_method" and node.target in STRUCTURAL:
        name = node.target
    else:
        return None
    rest = node.args[1:]
    if name == "to":
        return name if len(rest) == 1 and isinstance(rest[0], torch.dtype) else None
    if name in ("float", "double"):
        return name if not rest else None
    if name == "one_hot" and (len(rest) != 1 or type(rest[0]) is not int or rest[0] < 0):
        return None  # one_hot(t) counts the classes from the data: not inside a traced kernel
    if name == "permute" and len(rest) == 1 and isinstance(rest[0], (tuple, list)):
        rest = rest[0]
    return name if all(type(a) is int for a in rest) else None


def _operand_list(node):
    """A region node's operands as its program step takes them."""
    name = _op_name(node)
    if name is not None:
        return list(_operands(node, name))
    args = list(node.args)
    if _structural(node) == "permute" and len(args) == 2 and isinstance(args[1], (tuple, list)):
        return [args[0], *args[1]]
    return args


def _absorbable(node):
    """A producer the program can hold: a STRUCTURAL op, or a pointwise node whose floating output's tensor
    operands have its shape or one element, its dtype, and whose other operands are numbers (what a traced
    kernel reads without a broadcast of its own)."""
    if _structural(node) is not None:
        return isinstance(_value(node), torch.Tensor)
    if _op_name(node) is None:
        return False
    out = _value(node)
    if not isinstance(out, torch.Tensor) or not out.is_floating_point():
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


def _anchor(node):
    """An autogen::call the pass builds a region around: a loss with use_autogen, or an @autogen_loss module."""
    if node.op != "call_function" or node.target is not _ops.call:
        return False
    name, _, options = node.args
    if name.startswith("module:"):
        return True
    return name in LOSSES and ";use_autogen=b1" in options and "|" not in options  # '|' splits the name


def _combining(node, group):
    """Whether a pointwise node combines loss results only (its tensor operands in `group`, or one
    floating element from outside, a learned weight): it then joins their regions."""
    name = _op_name(node)
    if name is None or not isinstance(_value(node), torch.Tensor):
        return False
    ins = [a for a in _operands(node, name) if isinstance(a, torch.fx.Node)]
    inside = [a for a in ins if a in group]
    if not inside:
        return False
    for a in ins:
        v = _value(a)
        if a not in group and not (isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel() == 1):
            return False
    return all(type(a) in (int, float, bool) for a in _operands(node, name) if not isinstance(a, torch.fx.Node))


def _regions(graph):
    """Each anchor's region before producers are added: the anchor alone, or anchors whose results
    pointwise ops combine into one value (a sum of two losses on the same logits, a weighted sum), with
    those ops. Regions whose anchors share no tensor input stay apart: one kernel then reads nothing once."""
    group = {}
    for node in graph.nodes:
        if _anchor(node):
            group[node] = {node}
        elif _combining(node, group):
            merged = {node}.union(*(group[a] for a in node.args if isinstance(a, torch.fx.Node) and a in group))
            for n in merged:
                group[n] = merged
    out, seen = [], set()
    for region in group.values():
        if id(region) in seen:
            continue
        seen.add(id(region))
        anchors = [n for n in graph.nodes if n in region and _anchor(n)]
        ends = [n for n in region if any(u not in region for u in n.users)]
        if len(anchors) == 1 or len(ends) != 1 or not _share_inputs(anchors):
            out.extend([{a} for a in anchors])
        else:
            out.append(region)
    return out


def _share_inputs(anchors):
    """Whether the anchors' inputs, or what those are computed from by ops a region can hold, connect them
    all (a tensor shared between each and the rest)."""
    def sources(call):
        seen, todo = set(), list(call.args[1])
        while todo:
            node = todo.pop()
            if node not in seen:
                seen.add(node)
                if _absorbable(node):
                    todo.extend(a for a in node.args if isinstance(a, torch.fx.Node))
        return seen
    reached, inputs = {anchors[0]}, sources(anchors[0])
    rest = {a: sources(a) for a in anchors[1:]}
    grew = True
    while grew:
        grew = False
        for a, found in rest.items():
            if a not in reached and inputs & found:
                reached.add(a)
                inputs |= found
                grew = True
    return len(reached) == len(anchors)


def absorb(graph):
    """Rewrite every region of `graph` (_regions) with producers to absorb or several anchors into one
    autogen::call of a 'fused:' program; the number rewritten."""
    done = 0
    for region in _regions(graph):
        if _rewrite(graph, region):
            done += 1
        elif len(region) > 1:  # a merge that cannot move: each anchor alone
            done += sum(_rewrite(graph, {a}) for a in [n for n in graph.nodes if n in region and _anchor(n)])
    return done


def _rewrite(graph, region):
    """Replace `region` (anchors and the ops combining them), with the producers it can absorb, by one
    'fused:' call; False where nothing would change or a node between could change what it computes."""
    nodes = list(graph.nodes)
    end = max(region, key=nodes.index)
    region = set(region)
    anchors = [n for n in nodes if n in region and _anchor(n)]
    checked = set()
    for call in anchors:
        name, tensors, options = call.args
        if not name.startswith("module:"):
            checked |= {t for t, arg in zip(tensors, options.split(";")[0].split(","))
                        if arg in CHECKED.get(name, ())}
    before = nodes[:nodes.index(end)]
    for node in reversed(before):
        if node not in region and node.users and all(u in region for u in node.users) and \
                node not in checked and _absorbable(node):
            region.add(node)
    if len(region) == 1:
        return False
    first = next(i for i, n in enumerate(before) if n in region)
    if any(_barrier(n) for n in before[first:] if n not in region):
        return False
    leaves, refs, steps, sections = [], {}, [], []

    def ref(arg):
        if not isinstance(arg, torch.fx.Node):
            return _literal(arg)
        if arg not in refs:
            leaves.append(arg)
            refs[arg] = f"a{len(leaves) - 1}"
        return refs[arg]
    order = [n for n in nodes if n in region]
    for i, node in enumerate(order):
        if node in anchors:
            name, tensors, options = node.args
            head, *rest = options.split(";")
            if not name.startswith("module:"):
                sections.append(";".join([head] + [p for p in rest
                                                   if not p.startswith(("autograd=", "use_autogen="))]))
            steps.append(name + "(" + ",".join(ref(t) for t in tensors) + ")")
        else:
            op = _op_name(node) or _structural(node)
            steps.append(op + "(" + ",".join(ref(a) for a in _operand_list(node)) + ")")
        refs[node] = f"v{i}"
    text = "fused:" + " ".join(steps) + "".join("|" + s for s in sections)
    grads = {"autograd": "".join("1" if _value(a).requires_grad else "0" for a in leaves)} \
        if any("autograd=" in a.args[2] for a in anchors) else {}
    with graph.inserting_before(end):
        new = graph.call_function(_ops.call, (text, leaves, _ops.encode([], grads)))
    new.meta.update(end.meta)
    end.replace_all_uses_with(new)
    for node in order[::-1]:
        graph.erase_node(node)
    return True


def _parse_arg(text):
    if text[0] in "av":
        return text
    if text[0] == "d":
        return getattr(torch, text[1:])
    return _ops.decode_value(text)


@functools.lru_cache(maxsize=None)
def module(name):
    """The @autogen_loss module of a 'fused:' name (one per program, kept: the name is its whole state)."""
    return _decorated()(name, use_autogen=True)


@functools.cache
def _decorated():
    return autogen_loss(Fused)


class Fused(torch.nn.Module):
    """The program of a 'fused:' name, its steps run in order (decorated by `module`): producers, losses
    (each with its options, the name's sections after the steps, in order), @autogen_loss modules and the
    pointwise ops combining them; the last step's value is the result."""

    def __init__(self, name):
        super().__init__()
        self.program = name  # a string attribute: part of the trace's key
        steps, *sections = name[len("fused:"):].split("|")
        self._steps = [(s[:s.index("(")], [_parse_arg(a) for a in s[s.index("(") + 1:-1].split(",") if a])
                       for s in steps.split()]
        self._options = []
        for options in sections:
            names, kwargs, _ = _ops.decode(options)
            if isinstance(kwargs.get("distance_function"), str):
                kwargs = dict(kwargs, distance_function=_ops.distance_of(kwargs["distance_function"]))
            self._options.append((names, kwargs))

    def forward(self, *tensors):
        env = {f"a{i}": t for i, t in enumerate(tensors)}
        options = iter(self._options)
        for i, (op, args) in enumerate(self._steps):
            args = [env[a] if isinstance(a, str) else a for a in args]
            if op in POINTWISE:
                out = POINTWISE[op](*args)
            elif op in STRUCTURAL:
                out = STRUCTURAL[op](*args)
            elif op.startswith("module:"):
                out = _ops.live_module(op)(*args)
            else:
                names, kwargs = next(options)
                out = getattr(torch.nn.functional, op)(args[0], **dict(zip(names[1:], args[1:])), **kwargs)
            env[f"v{i}"] = out
        return out


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

"""Immutable, hash-consed graph of primitive ops; a node's digest keys its compiled kernel."""
import hashlib
import math
import weakref

# Levels say where a value lives in the (rows x columns) iteration domain; they join by bitwise or.
SCALAR, ROW, COL, ELEM = 0, 1, 2, 3
LEVEL_NAMES = {SCALAR: "scalar", ROW: "row", COL: "col", ELEM: "elem"}

_interned = weakref.WeakValueDictionary()

# name -> primitive record: the table ir owns and primitives.py fills (a primitive knows no interpreter)
PRIMS = {}


class Node:
    """One primitive application (or leaf). Build through `apply`/the helpers, never directly."""

    __slots__ = ("op", "args", "attr", "level", "kind", "digest", "post", "__weakref__")

    def __repr__(self):
        return f"Node({self.op}, {self.attr!r}, {LEVEL_NAMES[self.level]}, {self.kind}, {self.digest[:8]})"

    # Operator sugar for decompositions; Python numbers become constants.
    def __add__(self, o): return apply("add", self, o)
    def __radd__(self, o): return apply("add", o, self)
    def __sub__(self, o): return apply("sub", self, o)
    def __rsub__(self, o): return apply("sub", o, self)
    def __mul__(self, o): return apply("mul", self, o)
    def __rmul__(self, o): return apply("mul", o, self)
    def __truediv__(self, o): return apply("div", self, o)
    def __rtruediv__(self, o): return apply("div", o, self)
    def __neg__(self): return apply("neg", self)


def _make(op, args, attr, level, kind, post):
    body = f"{op}|{attr!r}|{level}|{kind}|" + ",".join(a.digest for a in args)
    digest = hashlib.sha1(body.encode()).hexdigest()
    node = _interned.get(digest)
    if node is None:
        node = Node()
        node.op, node.args, node.attr, node.level, node.kind = op, tuple(args), attr, level, kind
        node.digest, node.post = digest, post
        _interned[digest] = node
    return node


def input(name, level, kind="f"):
    """A tensor argument of the kernel: 'f' float data, 'i' int64 indices."""
    return _make("input", (), name, level, kind, False)


def param(name, kind="f"):
    """A runtime scalar argument (an option such as delta or margin); changing it never recompiles."""
    return _make("param", (), name, SCALAR, kind, False)


def const(value, kind=None):
    if kind is None:
        kind = "i" if isinstance(value, int) and not isinstance(value, bool) else "f"
    value = int(value) if kind == "i" else float(value)
    return _make("const", (), value, SCALAR, kind, False)


def iota():
    """The column index within a row (the class index in a row of logits)."""
    return _make("iota", (), None, COL, "i", False)


def _wrap(args):
    nodes = [a for a in args if isinstance(a, Node)]
    anyfloat = any(a.kind == "f" for a in nodes)
    out = []
    for a in args:
        if not isinstance(a, Node):
            a = const(float(a) if anyfloat else a)
        elif a.op == "const" and a.kind == "i" and anyfloat:
            a = const(float(a.attr))  # keep float32 math in float32: no int constants beside floats
        out.append(a)
    return out


def apply(op, *args):
    """Build (or find) the node `op(*args)`, with its level and kind from the primitive table."""
    prim = PRIMS[op]
    if len(args) != prim.arity:
        raise TypeError(f"primitive {op} takes {prim.arity} arguments, got {len(args)}")
    args = _wrap(args)
    level, kind = prim.infer(args)
    if kind == "f" and prim.group == "elementwise" and op != "float":
        # an index beside a float computes as the float dtype (numba would widen float32 to float64)
        args = [apply("float", a) if a.kind == "i" and (prim.args or "f" * prim.arity)[j] == "f" else a
                for j, a in enumerate(args)]
    for j, unit in enumerate(prim.units):  # x * 1, x + 0, x / 1: no node at all
        other = args[1 - j]
        if unit is not None and args[j].op == "const" and args[j].attr == unit and other.kind == kind \
                and other.level == level:
            return other
    if op == "pow" and args[1].op == "const" and args[0].kind == "f" and args[1].attr in _SMALL_POWERS:
        return _power(args[0], int(args[1].attr))
    value_args = args[:1] if prim.group == "identity" else args  # identities carry only their first
    post = any(a.post for a in value_args) or prim.group == "reduce_all"
    return _make(op, args, None, level, kind, post)


# x ** k for these k as products: libm's pow is a scalar call in every loop that uses it (no vector pow)
_SMALL_POWERS = (2.0, 3.0, 4.0, 5.0, 6.0, 8.0)


def _power(x, k):
    """x ** k (k >= 2) by squaring: x * x, (x * x) * x, (x * x) * (x * x), ..."""
    if k == 1:
        return x
    half = _power(x, k // 2)
    sq = apply("mul", half, half)
    return apply("mul", sq, x) if k % 2 else sq


def is_leaf(node):
    return not node.args and node.op in ("input", "param", "const", "iota")


def toposort(outputs):
    """All nodes reachable from `outputs`, each after its arguments."""
    order, seen = [], set()
    stack = [(n, False) for n in reversed(outputs)]
    while stack:
        node, done = stack.pop()
        if done:
            order.append(node)
            continue
        if node.digest in seen:
            continue
        seen.add(node.digest)
        stack.append((node, True))
        stack.extend((a, False) for a in reversed(node.args) if a.digest not in seen)
    return order


_ORDERS = {}  # id(node) -> (node, its toposort): per-call evaluations of a trace's small graphs


def order_of(node):
    """toposort([node]), computed once per node object (the per-call index and check expressions of a trace)."""
    hit = _ORDERS.get(id(node))
    if hit is None or hit[0] is not node:
        if len(_ORDERS) > 4096:
            _ORDERS.clear()
        hit = _ORDERS[id(node)] = (node, toposort([node]))
    return hit[1]


def substitute(outputs, mapping):
    """Rebuild `outputs` with leaves replaced per `mapping` (digest -> node or number)."""
    memo = {}
    for node in toposort(outputs):
        if node.digest in mapping:
            memo[node.digest] = mapping[node.digest]
        elif node.args:
            memo[node.digest] = apply(node.op, *[memo[a.digest] for a in node.args])
        else:
            memo[node.digest] = node
    return [memo[o.digest] for o in outputs]


def fmt_const(value, kind):
    if kind == "i":
        return str(int(value))
    if math.isnan(value):
        return "__np.nan"
    if math.isinf(value):
        return "__np.inf" if value > 0 else "-__np.inf"
    return repr(float(value))


def describe(outputs):
    """Readable listing of a graph, one node per line (for explain and debugging)."""
    names, lines = {}, []
    for i, node in enumerate(toposort(outputs)):
        names[node.digest] = f"%{i}"
        inner = ", ".join(names[a.digest] for a in node.args)
        attr = "" if node.attr is None else f" {node.attr!r}"
        lines.append(f"%{i} = {node.op}{attr}({inner}) : {LEVEL_NAMES[node.level]} {node.kind}")
    return "\n".join(lines)

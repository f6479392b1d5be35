"""Reverse-mode differentiation over the IR, from the derivative rules of the primitive table."""
from .errors import ScheduleError
from .ir import COL, ROW, SCALAR, apply, is_leaf, toposort
from .primitives import PRIMS


def _unbroadcast(g, level):
    """Sum a cotangent over the axes its value was broadcast along to reach `g`'s level."""
    if g.level | level == level:
        return g
    if level == COL and g.level & ROW:  # a per-column value used in every row: summed over the rows
        return apply("sum_col", g)
    if level == SCALAR and g.level == COL:  # a scalar used along the columns: summed over them, once each
        return apply("sum_all", g)
    if level == COL or (level == SCALAR and not g.level & ROW):
        raise ScheduleError("a per-column value broadcast over rows needs a column reduction")
    if level == SCALAR and g.post:
        return _sum_all(g)
    if g.level & COL:
        g = apply("sum_row", g)
    if level == SCALAR and g.level & ROW:
        g = apply("sum_all", g)
    return g


def _scalar(x):
    """The scalar a broadcast cotangent (expand of a scalar) carries, or None."""
    return x.args[0] if x.op == "expand" and x.args[0].level == SCALAR else None


def _sum_all(g):
    """sum_all(g), with factors known only after a whole-tensor reduction taken out of the sum (and the
    sum split over + and -): sum(c1 * b + c2 * a) = c1 * sum(b) + c2 * sum(a) needs no pass waiting on
    c1 and c2 (Pearson's gradient through x - x.mean(): one pass less)."""
    if g.op == "mul":
        a, b = (_scalar(x) or x for x in g.args)
        if a.level == SCALAR and a.post and b.level != SCALAR:
            return a * _sum_all(b)
        if b.level == SCALAR and b.post and a.level != SCALAR:
            return _sum_all(a) * b
    elif g.op in ("add", "sub") and all(a.level != SCALAR for a in g.args):
        return apply(g.op, _sum_all(g.args[0]), _sum_all(g.args[1]))
    elif g.op == "neg":
        return -_sum_all(g.args[0])
    return apply("sum_all", g)


def vjp(outputs, seeds, wrt):
    """Cotangents of `wrt` (nodes) given `seeds` for `outputs`; None where no path leads."""
    order = toposort(outputs)
    targets = {w.digest for w in wrt}
    reaches = {}
    for node in order:  # does any wrt node lie under this one?
        reaches[node.digest] = node.digest in targets or any(reaches[a.digest] for a in node.args)
    cot = {}
    for out, seed in zip(outputs, seeds):
        if reaches[out.digest]:
            cot[out.digest] = seed if out.digest not in cot else cot[out.digest] + seed
    for node in reversed(order):
        g = cot.get(node.digest)
        if g is None or is_leaf(node):
            continue
        for arg, ga in zip(node.args, PRIMS[node.op].grad(g, node, *node.args)):
            if ga is None or not reaches[arg.digest]:
                continue
            ga = _unbroadcast(ga, arg.level)
            if ga.level != arg.level:  # a cotangent always lives at its primal's level
                ga = apply("expand", ga, arg)
            # accumulate: a value used twice receives both contributions
            cot[arg.digest] = ga if arg.digest not in cot else cot[arg.digest] + ga
    return [cot.get(w.digest) for w in wrt]

"""Reverse-mode differentiation over the IR, from the derivative rules of the primitive table."""
from .ir import is_leaf, toposort
from .primitives import PRIMS


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
            # accumulate: a value used twice receives both contributions
            cot[arg.digest] = ga if arg.digest not in cot else cot[arg.digest] + ga
    return [cot.get(w.digest) for w in wrt]

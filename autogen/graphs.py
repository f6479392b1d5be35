"""The records of a loss graph and of one call of it: what decompositions build and the runtime runs."""
import functools
from dataclasses import dataclass, field

import torch

from .ir import COL, ELEM, PRIMS, ROW, SCALAR

BLOCK = 1 << 14  # elements per block for losses without rows


@dataclass(frozen=True)
class LossGraph:
    """A decomposition: the loss node over its input leaves (in the order tensors are passed)."""
    name: str
    mode: str          # 'row': R rows of C (reductions along C); 'flat': n independent elements; 'cf': the
    # rows of a channel-first (outer, C, inner) tensor, read in place (params["__inner"]; codegen's layout)
    inputs: tuple
    loss: object
    level: int         # level of the loss: SCALAR for mean/sum, ROW or ELEM for reduction='none'
    kind: str = "loss"  # 'loss' or 'nonlinearity' (whose backward may read its input, as torch's does)
    saves: object = None  # the inputs torch's autograd keeps: ALL or attr names; None: not known (a trace)

    @functools.cached_property
    def kept(self):
        """Indices of the inputs torch's autograd keeps for this loss (None: not known)."""
        if self.saves is None:
            return None
        return tuple(i for i, x in enumerate(self.inputs) if self.saves == ALL or x.attr in self.saves)


ALL = "all"


@dataclass
class Problem:
    """One call: a graph with its sizes, option values and compute dtype."""
    graph: LossGraph
    n: int
    C: int
    R: int
    dtype: torch.dtype
    params: dict = field(default_factory=dict)
    # what the runtime and kernels work out once per problem (its plan, launch bindings, engine), by their keys
    memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def inner(self):
        """Mode 'cf': how far apart a row's C elements lie (R = outer * inner)."""
        return self.params["__inner"]

    def launch_dims(self):
        if self.graph.mode != "flat":
            return self.R * self.C, self.C, self.R
        return self.n, BLOCK, -(-self.n // BLOCK)

    def layout(self, level):
        """Shape of a value at `level` in the interpreters' broadcastable layout."""
        if self.graph.mode == "cf":
            o, c, i = self.R // self.inner if self.inner else 0, self.C, self.inner
            return {ELEM: (o, c, i), ROW: (o, 1, i), COL: (1, c, 1), SCALAR: ()}[level]
        r, c = (self.R, self.C) if self.graph.mode != "flat" else (1, self.n)
        return {ELEM: (r, c), ROW: (r, 1), COL: (1, c), SCALAR: ()}[level]

    def flat_size(self, level):
        n, c, r = (self.R * self.C, self.C, self.R) if self.graph.mode != "flat" else (self.n, self.n, 1)
        return {ELEM: n, ROW: r, COL: c, SCALAR: 1}[level]


def evaluate(order, leaf, values=None, apply=None):
    """The nodes of `order` (each after its arguments) computed into `values` (digest -> tensor; values already
    there are kept): the one interpreter of the IR. `leaf(node)` gives a leaf's tensor; `apply(node, args)` an
    op's, by default its primitive's torch reference (the op-by-op engine passes one that picks a kernel)."""
    values = {} if values is None else values
    for node in order:
        if node.digest in values:
            continue
        if not node.args:
            values[node.digest] = leaf(node)
        else:
            args = [values[a.digest] for a in node.args]
            values[node.digest] = apply(node, args) if apply is not None else PRIMS[node.op].torch(*args)
    return values

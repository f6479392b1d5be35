"""The schedule of one kernel: its passes over the rows, and what each pass reads, computes, writes and reduces.

A kernel is one or more passes, each a loop over rows (parallel over rows for large inputs). A value's
stage is how many whole-tensor reductions must finish before it is known: per-element work of stage s
runs in pass s, a whole-tensor reduction of a stage-s value writes one partial per row in pass s (in the
last pass where only the scalar outputs read it: the earlier passes then read only what they need), and
the partials are folded in row order (float64) after that pass, so results do not depend on the thread
count. A sum over the rows (dim 0: a per-column value) is accumulated per fixed chunk of rows in its
pass and the chunks folded in order after it. Scalar arithmetic on the folded sums runs between passes. A per-element value a later pass
needs again is recomputed there (not stored): a pass re-reads its inputs. A per-row value (softmax's max
and log-sum) a later pass needs again is kept, R values, and read there: its loops over the row are not redone. Within a pass, row
reductions (softmax's max and sum) nest as loops over the row: a value's depth (codegen renders them).
"""
from dataclasses import dataclass, field

from .ir import COL, ELEM, ROW, SCALAR, toposort
from .primitives import PRIMS


def group(node):
    return PRIMS[node.op].group if node.op in PRIMS else "leaf"


def late_set(nodes):
    """Digests of the nodes that need a whole-tensor reduction only known after a pass over the rows.

    A sum over rows of per-row values that need no reduction themselves (summed weights of the
    targets, say) is early: the kernel computes it in a prelude over the rows, so what depends on
    it (the 1/sum(w) of a weighted mean) can be used in the first pass.
    """
    late = {}
    for n in toposort(nodes):
        g = group(n)
        if g == "reduce_col":  # a sum over the rows: known after a whole pass
            late[n.digest] = True
        elif g == "reduce_all":
            arg = n.args[0]
            early = not arg.level & COL and not any(group(m).startswith("reduce") for m in toposort([arg]))
            late[n.digest] = not early or late[arg.digest]
        else:
            value_args = n.args[:1] if g == "identity" else n.args
            late[n.digest] = any(late[a.digest] for a in value_args)
    return {d for d, v in late.items() if v}


def is_early(node, late):
    return group(node) == "reduce_all" and node.digest not in late


def stages(order, late, at=None):
    """digest -> the pass from which a value is known (late whole-tensor reductions add one; `at`: the pass
    that reduces a sum, where not its argument's own)."""
    stage, at = {}, at or {}
    for n in order:
        g = group(n)
        if g == "reduce_col" or g == "reduce_all" and n.digest in late:
            stage[n.digest] = at.get(n.digest, stage[n.args[0].digest]) + 1
        elif g == "identity":
            stage[n.digest] = stage[n.args[0].digest]
        else:
            stage[n.digest] = max([stage[a.digest] for a in n.args], default=0)
    return stage


def depths(order, loaded=()):
    """digest -> how many nested row reductions a value waits on within its pass (0: none; `loaded`: per-row
    values read from an earlier pass)."""
    depth = {}
    for n in order:
        g = group(n)
        if g in ("reduce_all", "reduce_col") or n.digest in loaded:  # known before the pass that reads it
            depth[n.digest] = 0
        elif g == "reduce_row":
            depth[n.digest] = depth[n.args[0].digest] + 1
        elif g == "identity":  # only the first argument is a value; the rest steer gradients
            depth[n.digest] = depth[n.args[0].digest]
        else:
            depth[n.digest] = max([depth[a.digest] for a in n.args], default=0)
    return depth


@dataclass
class Pass:
    """One loop over the rows."""
    index: int
    scalars: list = field(default_factory=list)  # scalar values (and folds of reductions) computed before it
    nodes: list = field(default_factory=list)    # per-row and per-element values it computes, graph order
    reduces: list = field(default_factory=list)  # whole-tensor reductions whose per-row partials it writes
    col_reduces: list = field(default_factory=list)  # sums over the rows it accumulates (per chunk of rows)
    writes: list = field(default_factory=list)   # indices of the outputs it writes
    reads: list = field(default_factory=list)    # names of the inputs it reads
    stores: list = field(default_factory=list)   # per-row values it keeps for a later pass (one array of R)
    loads: list = field(default_factory=list)    # per-row values an earlier pass kept: read, not recomputed
    keeps: list = field(default_factory=list)    # (node, j): a costly per-element value it writes into output
    takes: list = field(default_factory=list)    # j's buffer for a later pass, which takes it back from there
    depth: dict = None                           # the row-reduction depth of its values (loads are 0)


# the first line of a kernel's description where its layout is not 'row'
_LAYOUTS = {"cf": "layout cf: blocks of rows as lanes, a row's elements `inner` apart (channel-first)",
            "rt": "layout rt: blocks of rows as lanes, a row's elements C apart (rows too short to vectorize along)"}


@dataclass
class Schedule:
    prelude: list           # early whole-tensor reductions (folded over per-row values before the passes)
    passes: list            # Pass, in order
    post: list              # scalar values (and folds) after the last pass
    scalar_outputs: list    # indices of outputs written at the end
    stage: dict
    col_outputs: list = field(default_factory=list)  # per-column outputs written at the end (a per-class
    # parameter's gradient, from its column sums)

    def describe(self, spec):
        """One line per pass: what it reads, computes, reduces and writes."""
        names = {n.digest: f"%{i}" for i, n in enumerate(spec.order)}
        outs = [f"out{j}" for j in range(len(spec.outputs))]
        lines = [_LAYOUTS[spec.layout]] if spec.layout in _LAYOUTS else []
        if self.prelude:
            lines.append("prelude: sums over per-row values " + ", ".join(names[n.digest] for n in self.prelude))
        for p in self.passes:
            parts = [f"pass {p.index}:"]
            if p.scalars:
                parts[0] += " first the scalars " + ", ".join(names[n.digest] for n in p.scalars) + ";"
            parts[0] += f" reads {', '.join(p.reads) or 'nothing'}"
            if p.loads:
                parts[0] += " and the per-row " + ", ".join(names[n.digest] for n in p.loads)
            if p.reduces or p.col_reduces:
                parts.append("reduces " + ", ".join(f"{names[n.digest]} = {n.op}({names[n.args[0].digest]})"
                                                    for n in p.reduces + p.col_reduces))
            if p.writes:
                parts.append("writes " + ", ".join(outs[j] for j in p.writes))
            if p.stores:
                parts.append("keeps per row " + ", ".join(names[n.digest] for n in p.stores))
            if p.keeps:
                parts.append("keeps per element " + ", ".join(f"{names[n.digest]} in out{j}" for n, j in p.keeps))
            if p.takes:
                parts.append("takes back " + ", ".join(f"{names[n.digest]} from out{j}" for n, j in p.takes))
            lines.append("; ".join(parts))
        if self.scalar_outputs or self.post or self.col_outputs:
            scalars = "the scalars " + ", ".join(names[n.digest] for n in self.post) + "; " if self.post else ""
            lines.append(f"end: {scalars}writes " + ", ".join(outs[j] for j in self.scalar_outputs + self.col_outputs))
        return lines


STASH_COST = 20  # a per-element value this costly (one polynomial function) is kept, not recomputed


def _inline(n):
    """Leaves used in place (params, constants, whole-tensor inputs) and identities (aliases)."""
    return n.op in ("param", "const") or (n.op == "input" and n.level == SCALAR) or group(n) == "identity"


def _sinks(spec, order, late):
    """(stage per digest, pass -> the nodes it must produce, the late whole-tensor sums, the column sums, the
    pass of each late sum)."""
    stage = stages(order, late)
    sinks = {}  # pass -> nodes it must produce
    for j, (n, level) in enumerate(spec.outputs):
        if level not in (SCALAR, COL):  # a per-column output is written at the end, from the column sums
            sinks.setdefault(stage[n.digest], []).append(n)
    late_sums = [n for n in order if group(n) == "reduce_all" and n.digest in late]
    col_sums = [n for n in order if group(n) == "reduce_col"]
    # a sum only the scalar outputs read (a normalized loss's numerator) is reduced in the last pass, so
    # the first reads only what the sums that later passes wait on need (the denominator's input)
    needed = {m.digest for n in [n for n, level in spec.outputs if level != SCALAR]
              + [s.args[0] for s in late_sums + col_sums] for m in toposort([n])}
    free = [s for s in late_sums if s.digest not in needed]
    for n in late_sums + col_sums:
        if n not in free:
            sinks.setdefault(stage[n.args[0].digest], []).append(n.args[0])
    last = max(sinks, default=0)
    at = {s.digest: max(last, stage[s.args[0].digest]) for s in free}
    for s in free:
        sinks.setdefault(at[s.digest], []).append(s.args[0])
    if any(at[s.digest] != stage[s.args[0].digest] for s in free):
        stage = stages(order, late, at)
    at.update({s.digest: stage[s.args[0].digest] for s in late_sums if s not in free})
    return stage, sinks, late_sums, col_sums, at


def _stash(p, order, need, taken, outs, done_elem, collect, cost):
    """Per-element values an earlier pass computed, read back here from an output buffer instead of
    recomputed, costliest saving first, while outputs `outs` are free and a saving reaches STASH_COST."""
    while outs:
        total = cost(need)
        best = None
        for n in order:
            if n.digest in need and n.digest in done_elem and n.digest not in taken and n.kind == "f":
                saved = total - cost(collect(p, {**taken, n.digest: None})[0]) + cost({n.digest})
                if saved >= STASH_COST and (best is None or saved > best[0]):
                    best = (saved, n)
        if best is None:
            break
        n, j = best[1], outs.pop(0)
        taken[n.digest] = (done_elem[n.digest], j)
        need = collect(p, taken)[0]
    return collect(p, taken)


def build(spec):
    """The passes of `spec`'s kernel: a pass per stage of its per-element work."""
    order, late = spec.order, spec.late
    stage, sinks, late_sums, col_sums, at = _sinks(spec, order, late)
    count = max(sinks, default=0) + 1
    passes = [Pass(k) for k in range(count)]
    p_writes = {}  # pass -> the per-element float outputs it writes
    for j, (n, level) in enumerate(spec.outputs):
        if level == ELEM and n.kind == "f":
            p_writes.setdefault(stage[n.digest], []).append(j)
    prelude, post = [], []
    for n in order:
        if n.level != SCALAR or _inline(n):
            continue
        if is_early(n, late):
            prelude.append(n)
        s = stage[n.digest]
        (passes[s].scalars if s < count else post).append(n)
    node_of = {n.digest: n for n in order}

    def _cost(digests):
        return sum(PRIMS[node_of[d].op].cost for d in digests if node_of[d].op in PRIMS)

    done = {}  # digest -> the earlier pass that computed a per-row value
    done_elem = {}  # digest -> the earlier pass that computed a per-element value

    def collect(p, taken):
        need, stack, loads = set(), list(sinks.get(p.index, [])), {}
        while stack:  # the non-scalar values the pass's sinks are made of (scalars are known before it)
            n = stack.pop()
            if n.level == SCALAR or n.digest in need:
                continue
            need.add(n.digest)
            if n.level == ROW and not _inline(n) and n.digest in done:
                loads[n.digest] = done[n.digest]  # R values kept by the earlier pass: its row loops not redone
                continue
            if n.digest in taken:
                continue
            if group(n) != "reduce_col":  # a sum over the rows is read from its pass's result
                stack.extend(n.args[:1] if group(n) == "identity" else n.args)
        return need, loads

    for p in passes:
        taken = {}  # digest -> (home pass, output): per-element values read back, not recomputed
        need, loads = collect(p, taken)
        # a costly per-element value an earlier pass computed (SoftDice's sigmoid) is written there into the
        # buffer of an output this pass writes, and read back before this pass overwrites it: one more
        # write and read per element, against the math (the kernels are compute-bound on it)
        # (only an output of the pass's last loop: a loop after its writer would read it overwritten)
        deep = depths(order, {d for d in need if node_of[d].level == ROW and d in done})
        last = max((deep[n.digest] for n in sinks.get(p.index, [])), default=0)
        outs = [j for j in p_writes.get(p.index, []) if j not in (spec.storage or {})
                and deep[spec.outputs[j][0].digest] == last]
        need, loads = _stash(p, order, need, taken, outs, done_elem, collect, _cost)
        for d, (home, j) in taken.items():
            n = node_of[d]
            passes[home].keeps.append((n, j))
            p.takes.append((n, j))
        p.nodes = [n for n in order if n.digest in need]
        p.loads = [n for n in p.nodes if n.digest in loads]
        for n in p.loads:
            if n not in passes[loads[n.digest]].stores:
                passes[loads[n.digest]].stores.append(n)
        for n in p.nodes:
            if n.level == ROW and not _inline(n):
                done.setdefault(n.digest, p.index)
            elif n.level == ELEM and not _inline(n) and n.digest not in taken and group(n) != "leaf":
                done_elem.setdefault(n.digest, p.index)
        p.depth = depths(order, {n.digest for n in p.loads} | set(taken))
        p.reduces = [n for n in late_sums if at[n.digest] == p.index]
        p.col_reduces = [n for n in col_sums if stage[n.args[0].digest] == p.index]
        p.reads = sorted({n.attr for n in p.nodes if n.op == "input"})
    for j, (n, level) in enumerate(spec.outputs):
        if level not in (SCALAR, COL):
            passes[stage[n.digest]].writes.append(j)
    scalar_outputs = [j for j, (n, level) in enumerate(spec.outputs) if level == SCALAR]
    col_outputs = [j for j, (n, level) in enumerate(spec.outputs) if level == COL]
    return Schedule(prelude, passes, post, scalar_outputs, stage, col_outputs)

"""explain(): the primitive graph of a loss call, the path each op took and why, the kernel source."""
import threading
from dataclasses import dataclass, field

import torch

from . import executor, functional as F, partition, schedule
from . import nn as agnn
from .codegen import render
from .plans import fused_plan, layout_of
from .policies import get_policy, record

class _Listening(threading.local):
    active = False  # a class default: a missing attribute of a threading.local raises


observe = _Listening()


def capture(prob):
    """Called by the executor for every loss call while an explain() runs; explain() reads the last one."""
    if observe.active:
        observe.problems.append(prob)


_listeners = [0]  # explain() calls running, on any thread: the executor calls observers only while one is
_listen_lock = threading.Lock()  # (an empty observer list costs a loss call nothing)


def _listen(on):
    with _listen_lock:
        _listeners[0] += 1 if on else -1
        if on and capture not in executor.observers:
            executor.observers.append(capture)
        elif not on and not _listeners[0]:
            executor.observers.remove(capture)


@dataclass
class Explanation:
    loss: str
    policy: str
    graph: str
    calls: list
    sources: dict = field(default_factory=dict)
    passes: dict = field(default_factory=dict)  # kernel label -> one line per pass (what it reads, reduces, writes)
    partition: list = field(default_factory=list)  # a custom loss cut into kernels and torch ops: one line each

    def __str__(self):
        lines = [f"loss {self.loss} under policy {self.policy}", ""]
        if self.partition:
            lines += ["partition (kernels in order, the torch ops between them and why):"]
            lines += [f"  {p}" for p in self.partition] + [""]
        lines += ["primitive graph" + (" (the last kernel)" if self.partition else "") + ":", self.graph, "", "paths:"]
        lines += [f"  {c.phase:8s} {c.op:34s} {c.path:11s} fused={c.fused}  ({c.reason})" for c in self.calls]
        for label, passes in self.passes.items():
            lines += ["", f"passes ({label}):"] + [f"  {p}" for p in passes]
        for label, src in self.sources.items():
            lines += ["", f"generated source ({label}):", src]
        return "\n".join(lines)


def _resolve(name_or_module):
    if isinstance(name_or_module, torch.nn.Module):
        return name_or_module, type(name_or_module).__name__
    name = str(name_or_module)
    if name in agnn.LOSSES:
        cls = getattr(agnn, name)
        return (lambda *a, **options: cls(**options, use_autogen=True)(*a)), name
    if name in F.LOSSES:
        fn = getattr(F, name)
        return (lambda *a, **options: fn(*a, **options, use_autogen=True)), name
    if name in F.NONLINEARITIES:  # no use_autogen: the policy alone picks the kernel
        return getattr(F, name), name
    known = ", ".join(list(F.LOSSES) + agnn.LOSSES + list(F.NONLINEARITIES))
    raise ValueError(f"unknown loss or nonlinearity {name!r}; known: {known}")


def explain(name_or_module, *example_inputs, **options):
    """Run the loss once (forward and backward) on the examples and explain what ran."""
    fn, label = _resolve(name_or_module)
    inputs = [t.detach().clone().requires_grad_(t.is_floating_point()) if isinstance(t, torch.Tensor) else t
              for t in example_inputs]
    observe.active, observe.problems = True, []
    partition.last.plan = None
    _listen(True)
    try:
        with record() as rec:
            out = fn(*inputs, **options) if options else fn(*inputs)
            if out.requires_grad:
                out.sum().backward()
        if not observe.problems:  # torch ran it (small input): still show the graph we would run
            saved = F.SMALL_ELEMENTS, F.SMALL_ELEMENTS_NO_GRAD
            F.SMALL_ELEMENTS = F.SMALL_ELEMENTS_NO_GRAD = dict.fromkeys(saved[0], 0)
            try:
                with record():
                    fn(*[t.detach() if isinstance(t, torch.Tensor) else t for t in inputs], **options)
            finally:
                F.SMALL_ELEMENTS, F.SMALL_ELEMENTS_NO_GRAD = saved
    finally:
        observe.active = False
        _listen(False)
    probs = observe.problems
    if not probs:  # nothing of ours ran: a custom loss that runs eagerly (its warning said why)
        return Explanation(label, get_policy(), "(no primitive graph: the loss ran eagerly)", rec.calls, {})
    prob = probs[-1]
    needs = tuple(isinstance(t, torch.Tensor) and t.requires_grad for t in inputs[:len(prob.graph.inputs)])
    needs = getattr(prob, "needs", None) or needs + (False,) * (len(prob.graph.inputs) - len(needs))  # its own: a
    # loss after a linear layer (chunked.ChunkedLoss), whose first input is the logits
    plan = fused_plan(prob.graph, needs, prob.dtype, layout=layout_of(prob.graph, prob.C),
                      plain=layout_of(prob.graph, prob.C, False))
    specs = [plan.forward] + ([plan.backward] if plan.backward is not None else [])
    sources = {spec.label: render(spec) for spec in specs}
    passes = {spec.label: schedule.build(spec).describe(spec) for spec in specs}
    split = partition.last.plan.describe() if partition.last.plan is not None else []
    return Explanation(label, get_policy(), plan.forward.graph_text(), rec.calls, sources, passes, split)

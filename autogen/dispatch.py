"""Where a call goes before any kernel: the one ladder that losses, nonlinearities and @autogen_loss modules
climb, in this order, before their own path (size thresholds, plans, kernels) decides the rest."""
from .executor import under_transform
from .opcall import compiling, symbolic
from .policies import thread_state

COMPILE = "compile"      # Dynamo traces the call: one autogen::call in its graph (or torch's op, which it fuses)
TRACE = "trace"          # inside an @autogen_loss trace: part of the caller's graph
SYMBOLIC = "symbolic"    # fake or meta tensors: the operator's fake implementation (shapes and dtypes)
TRANSFORM = "transform"  # torch.func or forward-mode AD: torch's own ops, which they see through
RUN = "run"              # an eager call on data: the policy, the size thresholds and the kernels


def route(tensors):
    """The rung of the ladder a call on `tensors` stops at."""
    if compiling():
        return COMPILE
    if thread_state.tracing:
        return TRACE
    if symbolic(*tensors):
        return SYMBOLIC
    if under_transform(tensors):
        return TRANSFORM
    return RUN

"""torch.nn.functional's losses with a `use_autogen` keyword: validate like torch, then dispatch."""
import dataclasses
import functools
import inspect
import itertools
import math
import os
import threading
import warnings

import torch
import torch.nn.functional as TF
from torch.nn import _reduction as _Reduction

from . import decompositions as D
from . import isa
from . import inline
from . import opcall as _ops
from .codegen import TEMPLATES
from .checks import (broadcast_shapes, check_margin_targets, check_nonnegative, check_reduction, check_targets,
                     check_unit_interval, int_arg, tname)
from .dispatch import COMPILE, SYMBOLIC, TRACE, TRANSFORM, route
from .executor import aliases, execute, handwritten_for, rerun, under_transform
from .launch import contiguous as _contiguous
from .pool import shaped
from .graphs import Problem
from .linear_loss import linear_cross_entropy  # noqa: F401 - autogen.functional's fused output layer loss
from .policies import thread_state as _state, calm, get_policy, note, recording

LOSSES = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy",
          "binary_cross_entropy_with_logits", "cross_entropy", "nll_loss", "gaussian_nll_loss",
          "hinge_embedding_loss", "kl_div", "margin_ranking_loss", "multilabel_soft_margin_loss",
          "multi_margin_loss", "poisson_nll_loss", "triplet_margin_loss", "triplet_margin_with_distance_loss",
          "cosine_embedding_loss")

_LOW = (torch.float16, torch.bfloat16)


# Below these sizes (elements of the input; with a gradient, and without) torch's own kernel beats any launch
# of ours: measured by benchmarks/bench_crossover.py, kept in loss_thresholds.json (their history:
# docs/performance.md). 'aggressive' ignores them; AUTOGEN_SMALL_ELEMENTS=N sets one value for all losses.
_LIMITS = isa.load_json("loss_thresholds.json")
SMALL_ELEMENTS, SMALL_ELEMENTS_NO_GRAD = _LIMITS["grad"], _LIMITS["no_grad"]
if os.environ.get("AUTOGEN_SMALL_ELEMENTS"):
    SMALL_ELEMENTS = dict.fromkeys(SMALL_ELEMENTS, int(os.environ["AUTOGEN_SMALL_ELEMENTS"]))
    SMALL_ELEMENTS_NO_GRAD = dict(SMALL_ELEMENTS)


# -- small inputs: torch's own ATen kernel, called directly ------------------------------------
# torch.nn.functional's Python wrappers cost microseconds a call (mse_loss's broadcast_tensors the most)
# on top of the ATen op; for plain tensors of equal shapes with no legacy or weight argument
# the small-input path calls the op itself (same kernel, same numbers and gradients), anything else
# goes through torch's function.
_NO_LEGACY = "size_average is None and reduce is None"
_nn = torch._C._nn
# loss -> (when a call is plain, whether input and target must have one shape, the ATen call with the
# reduction enum __r, the ATen ops it names __op and __op2); the front's signature is the loss's own
_ATEN = {
    "mse_loss": (f"{_NO_LEGACY} and weight is None", True, "__op(input, target, __r)", _nn.mse_loss),
    "l1_loss": (f"{_NO_LEGACY} and weight is None", True, "__op(input, target, __r)", _nn.l1_loss),
    "smooth_l1_loss": (f"{_NO_LEGACY} and beta >= 0", True,  # as torch: l1 at beta 0
                       "(__op(input, target, __r, beta) if beta != 0.0 else __op2(input, target, __r))",
                       _nn.smooth_l1_loss, _nn.l1_loss),
    "huber_loss": ("weight is None", True, "__op(input, target, __r, delta)", _nn.huber_loss),
    "binary_cross_entropy": (f"weight is None and {_NO_LEGACY}", True, "__op(input, target, None, __r)",
                             _nn.binary_cross_entropy),
    "binary_cross_entropy_with_logits": (_NO_LEGACY, True, "__op(input, target, weight, pos_weight, __r)",
                                         torch.binary_cross_entropy_with_logits),
    "cross_entropy": (_NO_LEGACY, False, "__op(input, target, weight, __r, ignore_index, label_smoothing)",
                      _nn.cross_entropy_loss),
    "nll_loss": (_NO_LEGACY, False, "__op(input, target, weight, __r, ignore_index)", _nn.nll_loss_nd),
}


def _front(name, fn, full):
    """The public function of a loss, rendered from templates/front.py.j2 with the loss's own signature
    (torch's): a small plain call (_small) goes to torch, anything else to `full`. For the eight torch losses
    of _ATEN that is the ATen op itself, for the others torch's function with every argument passed on as
    given. Rendered, not a closure over *args: docs/performance.md measures what that saves per call."""
    params = list(inspect.signature(fn).parameters.values())[:-1]  # all but use_autogen
    keyword_only = [p.kind == p.KEYWORD_ONLY for p in params]
    decl = [p.name if p.default is p.empty else f"{p.name}={p.default!r}" for p in params]
    if any(keyword_only):
        decl.insert(keyword_only.index(True), "*")
    signature = ", ".join(decl + (["use_autogen=False"] if any(keyword_only) else ["*", "use_autogen=False"]))
    passed = ", ".join(f"{p.name}={p.name}" if k else p.name for p, k in zip(params, keyword_only))
    if name in _ATEN:
        plain, same_shape, call, *ops = _ATEN[name]
    else:
        plain, same_shape, call, ops = "True", False, f"__op({passed})", [getattr(TF, name)]
    source = TEMPLATES.get_template("front.py.j2").render(
        name=name, plain=plain, same_shape=same_shape, call=call, enum=name in _ATEN, signature=signature,
        passed=passed, a=params[0].name, b=params[1].name)
    namespace = {}
    exec(compile(source, f"<autogen front {name}>", "exec"), globals(), namespace)
    return namespace["make"](full, _torch_ran, _state, _small, torch.Tensor, calm, *ops)


def _small(name, input, target):
    """Whether this call goes to torch's own function: below the loss's size, not inside an @autogen_loss trace
    nor while Dynamo traces (its guards do not see a threading.local: a graph traced there would outlive a
    policy() block), policy not 'aggressive'; or an input or target that is no tensor, so that torch raises its
    own error for it (nll_loss's TypeError, mse_loss's AttributeError). The one size gate: the fronts of
    templates/front.py.j2 call it too."""
    if not isinstance(input, torch.Tensor) or not isinstance(target, torch.Tensor):
        return True
    n = input.numel()
    return (n < SMALL_ELEMENTS[name] or n < SMALL_ELEMENTS_NO_GRAD[name] and not _grad_needed(input, target)) \
        and (calm[0] or not _ops.compiling() and not _state.tracing and get_policy() != "aggressive")


def _grad_needed(input, target):
    return torch.is_grad_enabled() and (input.requires_grad or target.requires_grad)


def _torch_ran(name, input, out):
    """`out` from torch's own kernel on the small path, recorded as the fallback (when recording)."""
    n, limit = input.numel(), SMALL_ELEMENTS[name]
    if n >= limit:
        return _torch_fallback(name, out, f"{n} elements < {SMALL_ELEMENTS_NO_GRAD[name]} without gradients: "
                                          "torch's own kernel is faster at this size")
    return _torch_fallback(name, out, f"{n} elements < {limit}: torch's own kernel is faster at this size")


# torch.autocast("cpu"): the losses whose ATen op is on autocast's float32 list compute and return float32,
# their floating arguments (float64 aside) cast first. mse and l1 with a weight are torch's Python arithmetic
# (no cast); gaussian_nll, multilabel_soft_margin and triplet with a distance follow their inputs.
AUTOCAST_FP32 = {"mse_loss", "l1_loss", "huber_loss", "smooth_l1_loss", "binary_cross_entropy",
                 "binary_cross_entropy_with_logits", "cross_entropy", "nll_loss", "hinge_embedding_loss", "kl_div",
                 "margin_ranking_loss", "multi_margin_loss", "poisson_nll_loss", "triplet_margin_loss",
                 "cosine_embedding_loss"}


def _autocast_fp32(name, input, target, args, kwargs):
    """The arguments as autocast hands them to a float32-list op: low-precision floating tensors as float32."""
    if name in ("mse_loss", "l1_loss") and (kwargs.get("weight") is not None or len(args) > 3 and args[3] is not None):
        return input, target, args, kwargs

    def cast(t):
        return t.float() if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64 \
            else t
    return cast(input), cast(target), tuple(cast(a) for a in args), {k: cast(v) for k, v in kwargs.items()}


# -- call plans: what the first plain call of a signature ran, replayed by later ones ------------
# Validating a call, building its problem and picking its kernel depend only on the call's signature (the
# tensors' shapes, dtypes, requires_grad; the other arguments' values; grad mode). The first call of a
# signature runs the loss's function while a _Capture records the one execute() it made, the value checks
# it ran (class targets in range, BCE's [0, 1]) and how its result was finished; when every tensor it
# handed on is one of the call's own (no copy, cast or broadcast), later calls run those checks and that
# execute() alone: tens of us of Python less per call (benchmarks/bench_crossover.py --fixed).
_PLANS = {}
_PLANS_MAX = 4096
_SIMPLE = frozenset((type(None), bool, int, float, str))


class _Capture:
    __slots__ = ("execs", "checks", "finish", "ok", "derived")

    def __init__(self):
        self.execs, self.checks, self.finish, self.ok, self.derived = [], [], None, True, {}


class _Capturing(threading.local):
    cur = None  # the _Capture of the call being planned on this thread (a class default: a missing
    # attribute of a threading.local raises, which is slow)


_capturing = _Capturing()


def _captured():
    return _capturing.cur


def _check(fn, t, *extra):
    """Value check `fn(t, *extra)` (its result returned), also run by every later call of a plan."""
    cap = _captured()
    if cap is not None:
        cap.checks.append((fn, t, extra))
    return fn(t, *extra)


def _plan_key(name, input, target, args, kwargs, use_autogen, legacy):
    """(a plain call's signature, its tensors), or (None, None): each tensor a contiguous CPU torch.Tensor,
    every other argument None, a bool, a number or a string, no legacy size_average/reduce (their warning is
    per call). Most calls pass no other tensor: their key is built without a loop."""
    if not (input.is_contiguous() and target.is_contiguous() and input.is_cpu and target.is_cpu) or \
            input.is_neg() or target.is_neg():  # a negative-bit view is resolved by the call (_canon), not replayed
        return None, None
    if input.dtype is not target.dtype and input.is_floating_point() and target.is_floating_point():
        return None, None  # mixed floating dtypes: the call finds torch's result dtype (_in_torchs_dtype)
    key = (name, use_autogen, torch.is_grad_enabled(), input.shape, input.dtype, input.requires_grad, target.shape,
           target.dtype, target.requires_grad)
    types = tuple(map(type, args))
    if not kwargs and _SIMPLE.issuperset(types):
        for i in legacy:
            if i < len(args) and args[i] is not None:
                return None, None
        return key + (args, types, aliases((input, target))), (input, target)
    tensors, rest = [input, target], []
    for k, v in itertools.chain(enumerate(args), kwargs.items()):  # a position, or a keyword-only name
        if type(v) is torch.Tensor:
            if not v.is_contiguous() or not v.is_cpu or v.is_neg():
                return None, None
            tensors.append(v)
            rest += (k, v.shape, v.dtype, v.requires_grad)
        elif type(v) not in _SIMPLE or v is not None and k in legacy:
            return None, None
        else:
            rest += (k, type(v), v)
    return key + tuple(rest) + (aliases(tensors),), tensors


class _Plan:
    """A signature's replay: the checks (each on a tensor recipe), the execute() on the tensors of `recipes`,
    the finish. A recipe is a call tensor's index, or (fn, recipe, extra): fn(that tensor, *extra), the
    expand or dtype conversion the first call made."""
    __slots__ = ("checks", "prob", "recipes", "use_autogen", "handwritten", "finish", "dtype", "engine", "policy")

    def __init__(self, checks, prob, recipes, use_autogen, handwritten, finish, dtype):
        self.checks, self.prob, self.recipes = checks, prob, recipes
        self.use_autogen, self.handwritten, self.finish, self.dtype = use_autogen, handwritten, finish, dtype
        self.engine = self.policy = None  # the engine execute() ran for the last call (executor.rerun)

    def run(self, tensors):
        for fn, at, extra in self.checks:
            fn(_made(at, tensors), *extra)
        out = rerun(self, self.prob, [_made(r, tensors) for r in self.recipes], self.use_autogen, self.handwritten,
                    dtype=self.dtype)
        finish = self.finish
        if finish is None:  # the first call's result needed no view or conversion; a path taken since may
            return out if out.dtype is self.dtype else out.to(self.dtype)  # (run_torch's, say) need the latter
        return _finish(out, *finish)


def _made(recipe, tensors):
    if type(recipe) is int:
        return tensors[recipe]
    fn, source, extra = recipe
    return fn(_made(source, tensors), *extra)


def _plan_of(cap, tensors, result):
    """The _Plan a captured call makes, or None where it cannot be replayed from its tensors alone."""
    if not cap.ok or len(cap.execs) != 1:
        return None
    prob, handed, use_autogen, handwritten, out, dtype = cap.execs[0]
    where = {id(t): i for i, t in enumerate(tensors)}

    def recipe(t):
        at = where.get(id(t))
        if at is not None:
            return at
        step = cap.derived.get(id(t))
        if step is None:
            return None
        source = recipe(step[2])
        return None if source is None else (step[1], source, step[3])
    recipes = tuple(recipe(t) for t in handed)
    checks = tuple((fn, recipe(t), extra) for fn, t, extra in cap.checks)
    if None in recipes or any(at is None for _, at, _ in checks):
        return None
    finish = None
    if cap.finish is not None:
        source, args, finished = cap.finish
        if source is not out or finished is not result:
            return None
        finish = None if finished is out else args  # a mean or sum already in the call's dtype: nothing to do
    elif result is not out:
        return None
    return _Plan(checks, prob, recipes, use_autogen, handwritten, finish, dtype)


def _small_to_torch(fn):
    """Send inputs below the loss's size threshold to torch's own loss (recorded as fallback), through a
    front function with the loss's signature (_front); `wrapper` takes what the front does not."""
    name = fn.__name__
    torch_fn = getattr(TF, name)
    params = list(inspect.signature(fn).parameters)[:-1]  # all but use_autogen
    legacy = {i - 2 for i, p in enumerate(params) if p in ("size_average", "reduce")}  # positions in *args

    def wrapper(input, target, *args, use_autogen=False, **kwargs):
        plain = type(input) is torch.Tensor and type(target) is torch.Tensor and not _state.tracing \
            and not _ops.compiling()
        if plain:  # the plan lane: a call whose signature an earlier call planned
            key, tensors = _plan_key(name, input, target, args, kwargs, use_autogen, legacy)
            try:
                plan = _PLANS.get(key) if key is not None else None
            except TypeError:  # an unhashable argument value
                key = plan = None
            if plan and not (name in AUTOCAST_FP32 and torch.is_autocast_enabled("cpu")) \
                    and not under_transform(tensors) and not _small(name, input, target):
                return plan.run(tensors)
        if name in AUTOCAST_FP32 and torch.is_autocast_enabled("cpu"):  # before the operator, which runs
            input, target, args, kwargs = _autocast_fp32(name, input, target, args, kwargs)  # outside autocast
            plain = False  # the cast arguments: not the call's own
        rung = route((input, target))
        if rung is COMPILE or rung is SYMBOLIC:  # one autogen::call of the graph, or its fake implementation
            return _ops.loss(name, params, (input, target) + args, kwargs, use_autogen)
        if rung is TRACE:  # inside an @autogen_loss trace: our decomposition, inlined into the caller's graph
            if not inline.active():
                return torch_fn(input, target, *args, **kwargs)
            inline.begin()
            return fn(input, target, *args, use_autogen=True, **kwargs)
        if rung is TRANSFORM:  # torch.func / forward-mode AD: torch's own loss, recorded
            return _torch_fallback(name, torch_fn(input, target, *args, **kwargs), "torch.func or forward-mode AD")
        if not _small(name, input, target):
            outer = _captured()
            if outer is not None:  # a loss inside a loss's own call: the outer call is not replayed
                outer.ok = False
            if not plain or key is None or plan is False or len(_PLANS) >= _PLANS_MAX:
                out = fn(input, target, *args, use_autogen=use_autogen, **kwargs)
                if input.dtype is not target.dtype and input.is_floating_point() and target.is_floating_point():
                    return _in_torchs_dtype(out, torch_fn, input, target, args, kwargs)
                return out
            cap = _capturing.cur = _Capture()
            try:
                out = fn(input, target, *args, use_autogen=use_autogen, **kwargs)
            finally:
                _capturing.cur = outer
            plan = _plan_of(cap, tensors, out)
            if plan is not None or cap.ok:  # False: a signature no plan serves, not captured again
                _PLANS[key] = plan or False
            return out
        out = torch_fn(input, target, *args, **kwargs)
        return _torch_ran(name, input, out) if _state.recorders else out

    return functools.wraps(fn)(_front(name, fn, wrapper))


def _in_torchs_dtype(out, torch_fn, input, target, args, kwargs):
    """`out` in the dtype torch's loss returns for mixed floating dtypes, which is not always the promoted one
    (binary_cross_entropy_with_logits returns the target's, hinge_embedding_loss the input's): found by
    torch's function on meta tensors."""
    def meta(v):
        return v.detach().to("meta") if isinstance(v, torch.Tensor) else v
    try:
        want = torch_fn(meta(input), meta(target), *map(meta, args), **{k: meta(v) for k, v in kwargs.items()}).dtype
    except Exception:  # noqa: BLE001 - no meta kernel: our promoted dtype
        return out
    return out if out.dtype is want else out.to(want)


def _torch_fallback(name, out, reason):
    """`out`, computed by torch, recorded as the fallback path (forward, and backward when it runs)."""
    if recording() and not _state.tracing:  # in a trace: torch's ops, lowered with the caller's graph
        note(name, "fallback", False, "forward", reason)
        if out.requires_grad:
            out.register_hook(lambda g: note(name, "fallback", False, "backward", reason))
    return out


def _reduction(size_average, reduce, reduction):
    if size_average is not None or reduce is not None:
        reduction = _Reduction.legacy_get_string(size_average, reduce)
    _Reduction.get_enum(reduction)  # torch's ValueError for an unknown reduction
    return reduction


def _floating(op, *tensors):
    for t in tensors:
        if t is not None and not (t.is_floating_point() or t.is_complex()):
            raise NotImplementedError(f'"{op}" not implemented for \'{tname(t.dtype)}\'')
        if t is not None and t.is_complex():
            raise RuntimeError(f"{op}: complex inputs are not supported")


def compute_dtype(dtype):
    return torch.float32 if dtype in _LOW else dtype


def _canon(t, dtype):
    """`t` contiguous in `dtype`, any shape (autograd-tracked; no op at all when already so). A copy
    remembers its source, whose in-place changes torch's loss would see (executor's _LossFunction)."""
    if dtype == torch.float32 and t.dtype in _LOW:
        dtype = t.dtype  # 16-bit data as it is: the fused kernels read it (the executor widens it for the others)
    if t.dtype == dtype and t.is_contiguous() and not t.is_neg():
        return t
    out = t.to(dtype) if t.dtype != dtype else t
    out = out.resolve_neg()  # a negative-bit view: its memory holds the values negated
    out = _contiguous(out)
    out._autogen_src = t
    return _derived(out, _canon, t, dtype)


def _expand(t, shape):
    """t.expand(shape); t itself where it has that shape."""
    return t if t.shape == shape else _derived(t.expand(shape), _expand, t, shape)


def _derived(out, fn, t, *extra):
    """`out` = fn(t, *extra), which a plan replays (see _Capture)."""
    cap = _captured()
    if cap is not None:
        cap.derived[id(out)] = (out, fn, t, extra)
    return out


def _scale(count):
    return 1.0 / count if count else float("nan")


def _execute(prob, tensors, use_autogen, handwritten, shape, dtype):
    """execute(), or inside an @autogen_loss trace the loss as one op of the caller's graph (`shape`: the
    output's shape for reduction='none')."""
    if _state.tracing and inline.active():
        return inline.emit(prob, tensors, shape)
    out = execute(prob, tensors, use_autogen, handwritten, dtype=dtype)
    cap = _captured()
    if cap is not None:
        cap.execs.append((prob, tensors, use_autogen, handwritten, out, dtype))
    return out


def _finish(out, reduction, shape, dtype):
    done = out if reduction != "none" else shaped(out, shape)
    done = done if done.dtype == dtype else done.to(dtype)
    cap = _captured()
    if cap is not None:
        cap.finish = (out, (reduction, shape, dtype), done)
    return done


def _no_grad_weights(op, **tensors):
    for name, t in tensors.items():
        if t is not None and t.requires_grad and torch.is_grad_enabled():
            raise RuntimeError(f"The function '{op}' is not differentiable with respect to argument "
                               f"'{name}'. This input cannot have requires_grad True.")


def _size_warning(input, target):
    if target.size() != input.size():
        warnings.warn(
            f"Using a target size ({target.size()}) that is different to the input size ({input.size()}). "
            "This will likely lead to incorrect results due to broadcasting. "
            "Please ensure they have the same size.", stacklevel=3)


_SIGNATURES = {}  # a plain call's (loss, reduction, shape, dtypes, options) -> what validating it found
_SIGNATURES_MAX = 4096


def _pointwise(name, input, target, reduction, weight, use_autogen, **params):
    """Shared path of mse, l1, smooth_l1 and huber: broadcast, promote, flatten, run. A call without weight or
    broadcasting is validated once per signature (its dtypes, problem and kernel choice depend on nothing else;
    not in a trace, whose shapes may be symbolic)."""
    key = None
    if weight is None and not _state.tracing and input.shape == target.shape:
        key = (name, reduction, input.shape, input.dtype, target.dtype, *params.values())
        hit = _SIGNATURES.get(key)
        if hit is not None:
            dtype, cdt, prob, hw = hit
            out = _execute(prob, [_canon(input, cdt), _canon(target, cdt)], use_autogen, hw, input.shape, dtype)
            return _finish(out, reduction, input.shape, dtype)
    _floating(name, input, target, weight)
    xb, tb = (input, target) if input.shape == target.shape else torch.broadcast_tensors(input, target)
    if weight is not None and weight.size() != input.size():
        raise ValueError("Weights and input must have the same size.")
    dtype = torch.result_type(input, target) if weight is None else torch.promote_types(
        torch.result_type(input, target), weight.dtype)
    cdt = compute_dtype(dtype)
    tensors = [_canon(xb, cdt), _canon(tb, cdt)]
    if weight is not None:
        tensors.append(_canon(_expand(weight, xb.shape), cdt))
    n = xb.numel()
    graph = D.pointwise(name, "none" if reduction == "none" else ("mean" if reduction == "mean" else "sum"),
                        weight is not None)
    prob = Problem(graph, n, 0, 0, cdt, dict(params, scale=_scale(n) if reduction == "mean" else 1.0))
    hw = handwritten_for("FUSED", name, prob)
    if key is not None and len(_SIGNATURES) < _SIGNATURES_MAX:
        _SIGNATURES[key] = (dtype, cdt, prob, hw)
    out = _execute(prob, tensors, use_autogen, hw, xb.shape, dtype)
    return _finish(out, reduction, xb.shape, dtype)


@_small_to_torch
def mse_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None, *, use_autogen=False):
    _size_warning(input, target)
    reduction = _reduction(size_average, reduce, reduction)
    return _pointwise("mse_loss", input, target, reduction, weight, use_autogen)


@_small_to_torch
def l1_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None, *, use_autogen=False):
    _size_warning(input, target)
    reduction = _reduction(size_average, reduce, reduction)
    return _pointwise("l1_loss", input, target, reduction, weight, use_autogen)


@_small_to_torch
def smooth_l1_loss(input, target, size_average=None, reduce=None, reduction="mean", beta=1.0, *,
                   use_autogen=False):
    _size_warning(input, target)
    reduction = _reduction(size_average, reduce, reduction)
    if beta < 0:
        raise RuntimeError("smooth_l1_loss does not support negative values for beta.")
    if beta == 0.0:  # torch computes l1 here; so do we (and share its kernel)
        return _pointwise("l1_loss", input, target, reduction, None, use_autogen)
    return _pointwise("smooth_l1_loss", input, target, reduction, None, use_autogen, beta=float(beta))


@_small_to_torch
def huber_loss(input, target, reduction="mean", delta=1.0, weight=None, *, use_autogen=False):
    _size_warning(input, target)
    reduction = _reduction(None, None, reduction)
    if delta <= 0:
        raise RuntimeError("huber_loss does not support non-positive values for delta.")
    return _pointwise("huber_loss", input, target, reduction, weight, use_autogen, delta=float(delta))


@_small_to_torch
def binary_cross_entropy(input, target, weight=None, size_average=None, reduce=None, reduction="mean", *,
                         use_autogen=False):
    reduction = _reduction(size_average, reduce, reduction)
    if target.size() != input.size():
        raise ValueError(
            f"Using a target size ({target.size()}) that is different to the input size ({input.size()}) is "
            "deprecated. Please ensure they have the same size.")
    _floating("binary_cross_entropy", input, target, weight)
    for other in (target, weight):
        if other is not None and other.dtype != input.dtype:
            raise RuntimeError(f"Found dtype {tname(other.dtype)} but expected {tname(input.dtype)}")
    _no_grad_weights("binary_cross_entropy", weight=weight)
    if weight is not None:
        weight = _expand(weight, broadcast_shapes(target.size(), weight.size()))
        if weight.shape != input.shape:
            raise RuntimeError(f"The size of tensor weight {tuple(weight.shape)} must match input "
                               f"{tuple(input.shape)}")
    _check(check_unit_interval, input, "input")
    _check(check_unit_interval, target, "target")
    dtype, cdt = input.dtype, compute_dtype(input.dtype)
    tensors = [_canon(t, cdt) for t in (input, target, weight) if t is not None]
    n = input.numel()
    graph = D.binary_cross_entropy(reduction, weight is not None)
    prob = Problem(graph, n, 0, 0, cdt, {"scale": _scale(n) if reduction == "mean" else 1.0})
    out = _execute(prob, tensors, use_autogen, handwritten_for("FUSED", "binary_cross_entropy", prob), input.shape,
                   dtype)
    return _finish(out, reduction, input.shape, dtype)


@_small_to_torch
def binary_cross_entropy_with_logits(input, target, weight=None, size_average=None, reduce=None,
                                     reduction="mean", pos_weight=None, *, use_autogen=False):
    reduction = _reduction(size_average, reduce, reduction)
    if not (target.size() == input.size()):
        raise ValueError(f"Target size ({target.size()}) must be the same as input size ({input.size()})")
    op = "binary_cross_entropy_with_logits"
    _floating(op, input, target, weight, pos_weight)
    _no_grad_weights(op, weight=weight, pos_weight=pos_weight)
    shape = input.shape
    dtype = torch.result_type(input, target)
    extra = [t for t in (pos_weight, weight) if t is not None]
    for t in extra:
        broadcast_shapes(t.shape, shape)  # torch's RuntimeError for a size mismatch
        dtype = torch.promote_types(dtype, t.dtype)
    if broadcast_shapes(shape, *[t.shape for t in extra]) != shape:
        raise RuntimeError(f"output with shape {list(shape)} doesn't match the broadcast shape")
    cdt = compute_dtype(dtype)
    tensors = [_canon(input, cdt), _canon(target, cdt)]
    tensors += [_canon(_expand(t, shape), cdt) for t in extra]
    n = input.numel()
    graph = D.binary_cross_entropy_with_logits(reduction, weight is not None, pos_weight is not None)
    prob = Problem(graph, n, 0, 0, cdt, {"scale": _scale(n) if reduction == "mean" else 1.0})
    out = _execute(prob, tensors, use_autogen, handwritten_for("FUSED", op, prob), shape, dtype)
    return _finish(out, reduction, shape, dtype)


# channel-first classes are read in place from this inner size on (a block's lanes); below it a transposed
# copy into rows of C measured as fast or faster (blocks of one or two lanes do not vectorize)
_CF_INNER = 3


def _class_rows(op, input, target, weight, probs, channel_first=False):
    """Validate a (N, C, d1..dK) input and its target; return rows-of-C layout (`channel_first`: the input
    as it is) and output shape."""
    if input.dim() == 0:
        raise RuntimeError(f"{op}: input tensor should be 1D or more, got 0D")
    _floating(op, input)
    class_dim = 0 if input.dim() == 1 else 1
    C = input.size(class_dim)
    if weight is not None:
        if weight.dim() != 1 or weight.numel() != C:
            prefix = "cross_entropy: " if probs else ""
            raise RuntimeError(f"{prefix}weight tensor should be defined either for all {C} classes or no classes"
                               f" but got weight tensor of shape: {list(weight.shape)}")
        if weight.dtype != input.dtype:
            raise RuntimeError(f"expected scalar type {tname(input.dtype)} but found {tname(weight.dtype)}")
    if probs:
        if target.shape != input.shape:
            raise RuntimeError("0D or 1D target tensor expected, multi-target not supported")
        out_shape = input.shape[:class_dim] + input.shape[class_dim + 1:]
    else:
        if target.dtype not in (torch.int64, torch.uint8):
            raise RuntimeError(f"expected target dtype to be Long or Byte, but got {tname(target.dtype)}")
        if input.dim() <= 2:
            if target.dim() != max(input.dim() - 1, 0) or (input.dim() == 2 and target.dim() != 1):
                raise RuntimeError("0D or 1D target tensor expected, multi-target not supported")
            if input.dim() == 2 and input.size(0) != target.size(0):
                raise ValueError(f"Expected input batch_size ({input.size(0)}) to match target batch_size "
                                 f"({target.size(0)}).")
        else:
            expected = input.shape[:1] + input.shape[2:]
            if target.shape != expected:
                if input.size(0) != target.size(0):
                    raise ValueError(f"Expected input batch_size ({input.size(0)}) to match target batch_size "
                                     f"({target.size(0)}).")
                raise RuntimeError(f"Expected target size {list(expected)}, got {list(target.shape)}")
        out_shape = target.shape
    rows = input.movedim(class_dim, -1) if class_dim != input.dim() - 1 and not channel_first else input
    return rows, C, out_shape


def _class_loss(op, input, target, weight, ignore_index, reduction, label_smoothing, use_autogen):
    probs = target.is_floating_point()
    if op == "nll_loss" and probs:
        raise RuntimeError(f"expected target dtype to be Long or Byte, but got {tname(target.dtype)}")
    if op == "cross_entropy" and label_smoothing > 1.0:
        raise RuntimeError(f"label_smoothing must be between 0.0 and 1.0. Got: {label_smoothing}")
    if input.dim() == 0 and op == "cross_entropy" and not probs:
        raise RuntimeError(f"Expected floating point type for target with class probabilities, got "
                           f"{tname(target.dtype)}")
    ignore_index = int_arg("cross_entropy_loss" if op == "cross_entropy" else "nll_loss_nd", "ignore_index", 5,
                            ignore_index)
    inner = math.prod(input.shape[2:])
    # (N, C, d1..dK): kernels read the classes in place, `inner` apart (no transposed copy; inside a trace
    # the caller's graph takes rows)
    cf = inner >= _CF_INNER and not (_state.tracing and inline.active())
    rows, C, out_shape = _class_rows(op, input, target, weight, probs, cf)
    if not probs:  # torch differentiates the weight of class-probability targets only
        _no_grad_weights("nll_loss_forward", weight=weight)
    dtype = torch.result_type(input, target) if probs else input.dtype
    cdt = compute_dtype(dtype)
    x = _canon(rows, cdt)
    R = x.numel() // C if C else 0
    smoothing = label_smoothing > 0.0
    params = {"scale": 1.0, "eps": float(label_smoothing), "eps_over_c": float(label_smoothing) / C if C else 0.0}
    w = [_canon(weight, cdt)] if weight is not None else []
    if probs:
        t = target.movedim(1, -1) if target.dim() > 2 and not cf else target
        tensors = [x, _canon(t, cdt)] + w
        graph = D.cross_entropy_probs(reduction, weight is not None, smoothing)
        params["scale"] = _scale(R) if reduction == "mean" else 1.0
    else:
        if C == 0 and target.numel():
            raise IndexError(f"Target {int(target.reshape(-1)[0])} is out of bounds.")
        R = target.numel()
        tensors = [x, _check(check_targets, target, C, ignore_index)] + w
        params["ignore_index"] = ignore_index
        if op == "nll_loss":
            graph = D.nll_loss(reduction, weight is not None)
        else:
            graph = D.cross_entropy(reduction, weight is not None, smoothing)
    if cf:
        graph, params["__inner"] = _channel_first(graph), inner
    prob = Problem(graph, R * C, C, R, cdt, params)
    out = _execute(prob, tensors, use_autogen, handwritten_for("FUSED", op, prob), out_shape, dtype)
    return _finish(out, reduction, out_shape, dtype)


@functools.lru_cache(maxsize=None)
def _channel_first(graph):
    """A rows-of-C decomposition over a channel-first (N, C, d1..dK) tensor, read in place."""
    return dataclasses.replace(graph, mode="cf")


@_small_to_torch
def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean",
                  label_smoothing=0.0, *, use_autogen=False):
    reduction = _reduction(size_average, reduce, reduction)
    return _class_loss("cross_entropy", input, target, weight, ignore_index, reduction, label_smoothing,
                       use_autogen)


@_small_to_torch
def nll_loss(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean", *,
             use_autogen=False):
    reduction = _reduction(size_average, reduce, reduction)
    return _class_loss("nll_loss", input, target, weight, ignore_index, reduction, 0.0, use_autogen)


# -- the other ten --------------------------------------------------------------------------
def _run(graph, tensors, sizes, cdt, params, use_autogen, reduction, out_shape, dtype):
    """Launch a decomposition on canonical tensors; sizes = (n, C, R) as Problem takes them."""
    n, C, R = sizes
    prob = Problem(graph, n, C, R, cdt, params)
    out = _execute(prob, tensors, use_autogen, handwritten_for("FUSED", graph.name, prob), out_shape, dtype)
    return _finish(out, reduction, out_shape, dtype)


def _broadcast(op, tensors):
    """The broadcast shape and promoted dtype of a loss's floating inputs (torch's errors otherwise)."""
    _floating(op, *tensors)
    shape = broadcast_shapes(*[t.shape for t in tensors])
    return shape, functools.reduce(torch.promote_types, [t.dtype for t in tensors])


def _flat(op, tensors, use_autogen, reduction, graph, params, scale_count=None):
    """Elementwise losses: broadcast all tensors (torch's result dtype), flatten, run."""
    shape, dtype = _broadcast(op, tensors)
    cdt = compute_dtype(dtype)
    flat = [_canon(_expand(t, shape), cdt) for t in tensors]
    n = flat[0].numel()
    count = n if scale_count is None else scale_count
    params = dict(params, scale=_scale(count) if reduction in ("mean", "batchmean") else 1.0)
    return _run(graph, flat, (n, 0, 0), cdt, params, use_autogen, reduction, shape, dtype)


_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


@_small_to_torch
def gaussian_nll_loss(input, target, var, full=False, eps=1e-6, reduction="mean", *, use_autogen=False):
    if isinstance(var, float):
        if var < 0:
            raise ValueError("var has negative entry/entries")
        var = var * torch.ones_like(input)
    elif _state.tracing and inline.active():
        inline.defer("nonnegative", var)
    else:
        _check(check_nonnegative, var)
    if var.size() != input.size():
        if input.size()[:-1] == var.size():
            var = var.unsqueeze(-1)
        elif not (input.ndim == var.ndim and sum(b for a, b in zip(input.size(), var.size()) if a != b) == 1):
            raise ValueError("var is of incorrect size")
    check_reduction(reduction, "{} is not valid")
    return _flat("gaussian_nll_loss", [input, target, var], use_autogen, reduction,
                 D.gaussian_nll_loss(reduction), {"eps": float(eps), "const": _HALF_LOG_2PI if full else 0.0})


@_small_to_torch
def hinge_embedding_loss(input, target, margin=1.0, size_average=None, reduce=None, reduction="mean", *,
                         use_autogen=False):
    reduction = _reduction(size_average, reduce, reduction)
    if not input.is_floating_point() and not target.is_floating_point():
        _floating("hinge_embedding_loss", input)
    return _flat("hinge_embedding_loss", [input, target.to(input.dtype) if not target.is_floating_point()
                                          else target], use_autogen, reduction,
                 D.hinge_embedding_loss(reduction), {"margin": float(margin)})


@_small_to_torch
def kl_div(input, target, size_average=None, reduce=None, reduction="mean", log_target=False, *,
           use_autogen=False):
    if size_average is not None or reduce is not None:
        reduction = _Reduction.legacy_get_string(size_average, reduce)
    else:
        if reduction == "mean":
            warnings.warn("reduction: 'mean' divides the total loss by both the batch size and the support size."
                          "'batchmean' divides only by the batch size, and aligns with the KL div math definition."
                          "'mean' will be changed to behave the same as 'batchmean' in the next major release.",
                          stacklevel=3)
        if reduction != "batchmean":
            _Reduction.get_enum(reduction)
    if not (input.is_floating_point() or input.is_complex()) or not (
            target.is_floating_point() or target.is_complex()):
        raise RuntimeError("kl_div: Integral inputs not supported.")
    count = None
    if reduction == "batchmean":
        count = input.size(0) if input.dim() else 1
    graph = D.kl_div("sum" if reduction == "batchmean" else reduction, bool(log_target))
    return _flat("kl_div", [input, target], use_autogen, reduction, graph, {}, count)


@_small_to_torch
def margin_ranking_loss(input1, input2, target, margin=0, size_average=None, reduce=None, reduction="mean", *,
                        use_autogen=False):
    reduction = _reduction(size_average, reduce, reduction)
    if input1.dim() != input2.dim() or input1.dim() != target.dim():
        raise RuntimeError(
            f"margin_ranking_loss : All input tensors should have same dimension but got sizes: "
            f"input1: {input1.size()}, input2: {input2.size()}, target: {target.size()} ")
    tensors = [input1, input2, target]
    dtype = functools.reduce(torch.promote_types, [t.dtype for t in tensors])
    tensors = _as_float([t if t.is_floating_point() else t.to(dtype) for t in tensors])
    return _flat("margin_ranking_loss", tensors, use_autogen, reduction, D.margin_ranking_loss(reduction),
                 {"margin": float(margin)})


@_small_to_torch
def poisson_nll_loss(input, target, log_input=True, full=False, size_average=None, eps=1e-8, reduce=None,
                     reduction="mean", *, use_autogen=False):
    if size_average is not None or reduce is not None:
        reduction = _Reduction.legacy_get_string(size_average, reduce)
    check_reduction(reduction)
    graph = D.poisson_nll_loss(reduction, bool(log_input), bool(full))
    return _flat("poisson_nll_loss", [input, target], use_autogen, reduction, graph, {"eps": float(eps)})


@_small_to_torch
def multilabel_soft_margin_loss(input, target, weight=None, size_average=None, reduce=None, reduction="mean", *,
                                use_autogen=False):
    if size_average is not None or reduce is not None:
        reduction = _Reduction.legacy_get_string(size_average, reduce)
    C = input.size(input.dim() - 1)  # torch's IndexError for a 0-dim input
    check_reduction(reduction, "{} is not valid")
    shape, dtype = _broadcast("multilabel_soft_margin_loss", [input, target] + ([weight] if weight is not None else []))
    if shape[-1] != C or len(shape) != input.dim():  # torch then sums over a dimension that is not the last
        return _torch_fallback("multilabel_soft_margin_loss", TF.multilabel_soft_margin_loss(
            input, target, weight, reduction=reduction), "inputs broadcast beyond the input's dimensions")
    cdt = compute_dtype(dtype)
    R = math.prod(shape[:-1])
    flat = [_canon(_expand(input, shape), cdt), _canon(_expand(target, shape), cdt)]
    kind = None
    if weight is not None:
        kind = "col" if all(s == 1 for s in weight.shape[:-1]) and weight.dim() and weight.size(-1) == C else "elem"
        flat.append(_canon(weight.reshape(C) if kind == "col" else _expand(weight, shape), cdt))
    params = {"inv_c": 1.0 / C if C else float("nan"), "scale": _scale(R) if reduction == "mean" else 1.0}
    return _run(D.multilabel_soft_margin_loss(reduction, kind), flat, (R * C, C, R), cdt, params, use_autogen,
                reduction, shape[:-1], dtype)


def _flat_targets(t):
    """t as a contiguous 1-D tensor (a call plan replays it)."""
    if t.dim() == 1 and t.is_contiguous():
        return t
    return _derived(t.reshape(-1).contiguous(), _flat_targets, t)


def _row_targets(target, cdt, R):
    """cosine_embedding_loss's targets: one per row, in the compute dtype (a call plan replays it)."""
    if target.dtype == cdt and target.dim() == 1 and target.shape[0] == R and target.is_contiguous() \
            and not target.requires_grad:
        return target  # already so: the plan hands it on as it is
    tgt = target.detach().to(cdt).reshape(-1)
    tgt = (tgt if tgt.shape[0] == R else tgt.expand(R)).contiguous()  # in a trace: no expand of per-row values
    return _derived(tgt, _row_targets, target, cdt, R)


@_small_to_torch
def multi_margin_loss(input, target, p=1, margin=1.0, weight=None, size_average=None, reduce=None,
                      reduction="mean", *, use_autogen=False):
    reduction = _reduction(size_average, reduce, reduction)
    if p != 1 and p != 2:
        raise ValueError("only p == 1 and p == 2 supported")
    if weight is not None and weight.dim() != 1:
        raise ValueError("weight must be one-dimensional")
    if input.dim() > 2 or (input.dim() == 2 and input.size(1) == 0):
        raise RuntimeError(f"Expected non-empty vector or matrix with optional 0-dim batch size, but got: "
                           f"{list(input.shape)}")
    R = input.size(0) if input.dim() == 2 else 1
    C = input.size(-1) if input.dim() else 1
    if input.dim() == 2 and (target.dim() > 1 or target.numel() != R):
        raise RuntimeError(f"multi_margin_loss: target tensor should be 1-D with size equal to the number of "
                           f"input samples (batch size). Expected target size [{R}], but got {list(target.shape)}. "
                           f"Input has shape {list(input.shape)}.")
    if input.dim() < 2 and target.numel() != 1:
        raise RuntimeError(f"inconsistent target size, expected 1 but got {list(target.shape)}")
    if target.dtype != torch.int64:
        raise RuntimeError(f"expected scalar type Long but found {tname(target.dtype)}")
    if not input.is_floating_point() or input.dtype in _LOW:
        raise NotImplementedError(f'"multi_margin_loss_cpu_kernel" not implemented for \'{tname(input.dtype)}\'')
    if weight is not None:
        if weight.numel() != C:
            raise RuntimeError(f"inconsistent weight size, expected {C} but got {list(weight.shape)}")
        if weight.dtype != input.dtype:
            raise RuntimeError(f"expected scalar type {tname(input.dtype)} but found {tname(weight.dtype)}")
        _no_grad_weights("multi_margin_loss", weight=weight)
    if _state.tracing and inline.active():
        inline.defer("margin_targets", target, C)
    else:
        _check(check_margin_targets, target, C)
    dtype = input.dtype
    tensors = [_canon(input, dtype), _flat_targets(target)]
    if weight is not None:
        tensors.append(_canon(weight, dtype))
    params = {"margin": float(margin), "inv_c": 1.0 / C, "scale": _scale(R) if reduction == "mean" else 1.0}
    return _run(D.multi_margin_loss(reduction, int(p), weight is not None), tensors, (R * C, C, R), dtype, params,
                use_autogen, reduction, target.shape if input.dim() == 2 else torch.Size(), dtype)


def _as_float(tensors):
    """Integer inputs as torch's default float dtype: triplet, cosine and ranking losses take them."""
    return [t if t.is_floating_point() or t.is_complex() else t.to(torch.get_default_dtype()) for t in tensors]


def _triplet(op, anchor, positive, negative, margin, p, eps, swap, reduction, use_autogen):
    anchor, positive, negative = _as_float([anchor, positive, negative])
    shape, dtype = _broadcast(op, [anchor, positive, negative])
    cdt = compute_dtype(dtype)
    if len(shape) == 0:
        shape = torch.Size([1])
        out_shape = torch.Size()
    else:
        out_shape = shape[:-1]
    C = shape[-1]
    R = math.prod(out_shape)
    flat = [_canon(_expand(t, shape), cdt) for t in (anchor, positive, negative)]
    kind = p if p in (1, 2) else "p"
    params = {"margin": float(margin), "eps": float(eps), "p": float(p), "scale": _scale(R) if reduction == "mean"
              else 1.0}
    return _run(D.triplet_margin_loss(reduction, kind, bool(swap)), flat, (R * C, C, R), cdt, params, use_autogen,
                reduction, out_shape, dtype)


def _triplet_dims(anchor, positive, negative):
    a, p, n = anchor.ndim, positive.ndim, negative.ndim
    if not (a == p and p == n):
        raise RuntimeError(f"The anchor, positive, and negative tensors are expected to have the same number of "
                           f"dimensions, but got: anchor {a}D, positive {p}D, and negative {n}D inputs")


@_small_to_torch
def triplet_margin_loss(anchor, positive, negative, margin=1.0, p=2, eps=1e-6, swap=False, size_average=None,
                        reduce=None, reduction="mean", *, use_autogen=False):
    reduction = _reduction(size_average, reduce, reduction)
    if margin <= 0:
        raise ValueError(f"margin must be greater than 0, got {margin}")
    _triplet_dims(anchor, positive, negative)
    if not 0 < p < math.inf:
        # p = 0 (a count of non-zeros) and p = inf (a max) are not sums of powers: torch's own kernel
        return _torch_fallback("triplet_margin_loss", TF.triplet_margin_loss(
            anchor, positive, negative, margin, p, eps, swap, reduction=reduction), "p outside (0, inf)")
    return _triplet("triplet_margin_loss", anchor, positive, negative, margin, p, eps, swap, reduction, use_autogen)


@_small_to_torch
def triplet_margin_with_distance_loss(anchor, positive, negative, *, distance_function=None, margin=1.0, swap=False,
                                      reduction="mean", use_autogen=False):
    if reduction not in ("mean", "sum", "none"):
        raise ValueError(f"{reduction} is not a valid value for reduction")
    if margin <= 0:
        raise ValueError(f"margin must be greater than 0, got {margin}")
    _triplet_dims(anchor, positive, negative)
    p, eps = 2.0, 1e-6  # torch.pairwise_distance's defaults, and the module's PairwiseDistance()
    if isinstance(distance_function, torch.nn.PairwiseDistance) and not distance_function.keepdim:
        p, eps, distance_function = distance_function.norm, distance_function.eps, None
    if distance_function in (None, TF.pairwise_distance, torch.pairwise_distance) and 0 < p < math.inf:
        return _triplet("triplet_margin_with_distance_loss", anchor, positive, negative, margin, p, eps, swap,
                        reduction, use_autogen)
    reason = "a distance_function callable runs in torch"
    if distance_function is None:
        reason = "p outside (0, inf)"
        distance_function = functools.partial(TF.pairwise_distance, p=p, eps=eps)
    # a user's distance callable runs through torch; the rest is torch's few cheap ops on distances
    out = TF.triplet_margin_with_distance_loss(anchor, positive, negative, distance_function=distance_function,
                                               margin=margin, swap=swap, reduction=reduction)
    return _torch_fallback("triplet_margin_with_distance_loss", out, reason)


@_small_to_torch
def cosine_embedding_loss(input1, input2, target, margin=0, size_average=None, reduce=None, reduction="mean", *,
                          use_autogen=False):
    reduction = _reduction(size_average, reduce, reduction)
    td = target.dim()
    if td not in (0, 1):
        raise RuntimeError("0D or 1D target tensor expected, multi-target not supported")
    if input1.dim() != (2 if td == 1 else 1):
        raise RuntimeError(f"{td}D target tensor expects {td + 1}D input tensors, but found inputs with sizes "
                           f"{list(input1.shape)} and {list(input2.shape)}.")
    input1, input2 = _as_float([input1, input2])
    shape, dtype = _broadcast("cosine_embedding_loss", [input1, input2])
    if td == 1:
        R = broadcast_shapes(shape[:-1], target.shape)[0]  # torch's error when rows and targets differ
        shape = torch.Size([R, shape[-1]])
    else:
        R = 1
    cdt = compute_dtype(dtype)
    C = shape[-1]
    tgt = _row_targets(target, cdt, R)
    flat = [_canon(_expand(input1, shape), cdt), _canon(_expand(input2, shape), cdt), tgt]
    params = {"margin": float(margin), "scale": _scale(R) if reduction == "mean" else 1.0}
    return _run(D.cosine_embedding_loss(reduction), flat, (R * C, C, R), cdt, params, use_autogen, reduction,
                shape[:-1] if td == 1 else torch.Size(), dtype)


# -- nonlinearities: torch.nn.functional's signatures; the policy alone picks the path ----------
from . import activations as _act  # noqa: E402


def relu(input, inplace=False):
    return _act.run("relu", input, inplace)


def relu6(input, inplace=False):
    return _act.run("relu6", input, inplace)


def leaky_relu(input, negative_slope=0.01, inplace=False):
    return _act.run("leaky_relu", input, inplace, negative_slope=negative_slope)


def elu(input, alpha=1.0, inplace=False):
    return _act.run("elu", input, inplace, alpha=alpha)


def selu(input, inplace=False):
    return _act.run("selu", input, inplace)


def celu(input, alpha=1.0, inplace=False):
    return _act.run("celu", input, inplace, alpha=alpha)


def gelu(input, approximate="none"):
    if approximate not in ("none", "tanh"):
        raise RuntimeError("approximate argument must be either none or tanh.")
    return _act.run("gelu", input, variant=approximate)


def silu(input, inplace=False):
    return _act.run("silu", input, inplace)


def mish(input, inplace=False):
    return _act.run("mish", input, inplace)


def sigmoid(input):
    return _act.run("sigmoid", input)


def tanh(input):
    return _act.run("tanh", input)


def softplus(input, beta=1.0, threshold=20.0):
    return _act.run("softplus", input, beta=beta, threshold=threshold)


def softsign(input):
    return _act.run("softsign", input)


def logsigmoid(input):
    return _act.run("logsigmoid", input)


def hardtanh(input, min_val=-1.0, max_val=1.0, inplace=False):
    if min_val > max_val:
        raise ValueError("min_val cannot be greater than max_val")
    return _act.run("hardtanh", input, inplace, min_val=min_val, max_val=max_val)


def hardsigmoid(input, inplace=False):
    return _act.run("hardsigmoid", input, inplace)


def hardswish(input, inplace=False):
    return _act.run("hardswish", input, inplace)


def hardshrink(input, lambd=0.5):
    return _act.run("hardshrink", input, lambd=lambd)


def softshrink(input, lambd=0.5):
    if lambd < 0:
        raise RuntimeError(f"lambda must be greater or equal to 0, but found to be {lambd}.")
    return _act.run("softshrink", input, lambd=lambd)


def tanhshrink(input):
    return _act.run("tanhshrink", input)


def threshold(input, threshold, value, inplace=False):
    return _act.run("threshold", input, inplace, threshold=threshold, value=value)


prelu = _act.prelu
glu = _act.glu

NONLINEARITIES = tuple(_act.NONLINEARITIES)
__all__ = list(LOSSES) + list(NONLINEARITIES)

# an @autogen_loss trace runs torch.nn.functional's losses and nonlinearities as ours (prelu and glu lower as ops)
inline.ROUTES.update({getattr(TF, n): globals()[n] for n in __all__ if n not in ("prelu", "glu")})


__all__.append("linear_cross_entropy")

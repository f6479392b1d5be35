"""Each loss written once in primitives, faithful to torch's formulas and numerically stable.

A builder takes the loss's structural options (those that change the graph: reduction kind,
which optional tensors are present) and returns a LossGraph. Option values (delta, beta,
ignore_index, label_smoothing, 1/n) are runtime params, so changing them never recompiles.
"""
import functools

from .graphs import ALL, LossGraph
from . import primitives  # noqa: F401 - fills the primitive table that ir.apply reads
from .ir import COL, ELEM, ROW, SCALAR, apply as A, input as inp, iota, param

x_elem = functools.partial(inp, level=ELEM)

# torch's Loss.cpp EPSILON is a C++ float: 1e-12 rounded to float32, also in float64 arithmetic
TORCH_EPSILON = 9.999999960041972e-13


def reduce_loss(name, mode, inputs, per_item, level, reduction, weight_sum=None, saves=ALL):
    """Apply torch's reduction: 'none' keeps per-item losses; 'sum'/'mean' reduce to a scalar.

    Unweighted mean and sum share one graph: mean is the sum times the param `scale` (1/n).
    A weighted mean divides by the summed weights instead, as torch does.
    `saves`: the inputs torch's autograd keeps for this loss (ALL, or names), whatever the reduction:
    an in-place change to one of them between forward and backward raises in torch, to any other
    is legal (tests/test_autograd.py checks each case against torch).
    """
    if reduction == "none":
        return LossGraph(name, mode, tuple(inputs), per_item, level, saves=saves)
    total = A("sum_all", per_item)
    if reduction == "mean" and weight_sum is not None:
        loss = total / A("sum_all", weight_sum)
    else:
        loss = total * param("scale")
    return LossGraph(name, mode, tuple(inputs), loss, SCALAR, saves=saves)


@functools.lru_cache(maxsize=None)
def pointwise(name, reduction, weighted):
    """mse, l1, smooth_l1, huber: elementwise in input - target, optional elementwise weight."""
    x, t = x_elem("input"), x_elem("target")
    d = x - t
    if name == "mse_loss":
        item = d * d
    elif name == "l1_loss":
        item = A("abs", d)
    elif name in ("smooth_l1_loss", "huber_loss"):
        # torch's explicit backward (clip of d), not the derivative of the unselected branch,
        # which is 0 * inf = nan at infinite inputs
        ad = A("abs", d)
        if name == "smooth_l1_loss":  # beta == 0 is routed to l1_loss, as torch does
            beta = param("beta")
            value = A("where", A("lt", ad, beta), 0.5 * ad * ad / beta, ad - 0.5 * beta)
            slope = A("where", A("lt", d, -beta), -1.0, A("where", A("gt", d, beta), 1.0, d / beta))
        else:
            delta = param("delta")
            value = A("where", A("lt", ad, delta), 0.5 * ad * ad, delta * (ad - 0.5 * delta))
            slope = A("where", A("lt", d, -delta), -delta, A("where", A("gt", d, delta), delta, d))
        item = A("gradfix", A("gradfix", A("detach", value), x, slope), t, -slope)
    else:
        raise KeyError(name)
    inputs = [x, t]
    wsum = None
    if weighted:
        w = x_elem("weight")
        inputs.append(w)
        item = item * w
        # torch: weighted mse/l1 means divide by sum(weight); weighted huber means divide by n
        wsum = w if name in ("mse_loss", "l1_loss") else None
    # torch's mse and l1 with a weight are compositions keeping only the weight; l1 keeps nothing
    saves = ("weight",) if weighted and name in ("mse_loss", "l1_loss") else () if name == "l1_loss" else ALL
    return reduce_loss(name, "flat", inputs, item, ELEM, reduction, wsum, saves)


@functools.lru_cache(maxsize=None)
def binary_cross_entropy(reduction, weighted):
    x, t = x_elem("input"), x_elem("target")
    logx = A("maximum", A("log", x), -100.0)         # torch clamps both logs at -100
    log1mx = A("maximum", A("log1p", -x), -100.0)
    item = (t - 1.0) * log1mx - t * logx
    # torch's gradients: (x - t) / max(x(1 - x), 1e-12) for the input, log(1 - x) - log(x) for the target
    item = A("gradfix", A("detach", item), x, (x - t) / A("maximum", (1.0 - x) * x, TORCH_EPSILON))
    item = A("gradfix", item, t, A("log1p", -x) - A("log", x))
    inputs = [x, t]
    if weighted:
        w = x_elem("weight")
        inputs.append(w)
        item = item * w
    return reduce_loss("binary_cross_entropy", "flat", inputs, item, ELEM, reduction)


@functools.lru_cache(maxsize=None)
def binary_cross_entropy_with_logits(reduction, weighted, pos_weighted):
    x, t = x_elem("input"), x_elem("target")
    # log_sigmoid(x) = min(x, 0) - log1p(exp(-|x|)) (log1pexp: one primitive): no overflow for any x
    log_sig = A("minimum", x, 0.0) - A("log1pexp", -A("abs", x))
    inputs = [x, t]
    if pos_weighted:
        pw = x_elem("pos_weight")
        inputs.append(pw)
        item = (1.0 - t) * x - log_sig * ((pw - 1.0) * t + 1.0)
        # torch's explicit derivatives (finite where the composed ones give inf - inf)
        dx = (pw * t + 1.0 - t) * A("sigmoid", x) - pw * t
        dt = (A("minimum", -x, 0.0) - A("log1pexp", -A("abs", x))) - pw * log_sig
    else:
        item = (1.0 - t) * x - log_sig
        dx, dt = A("sigmoid", x) - t, -x
    item = A("gradfix", A("gradfix", A("detach", item), x, dx), t, dt)
    if weighted:
        w = x_elem("weight")
        inputs.append(w)
        item = item * w
    return reduce_loss("binary_cross_entropy_with_logits", "flat", inputs, item, ELEM, reduction)


def class_terms(weighted):
    """Per-row target pieces shared by nll and cross-entropy: (inputs, valid, safe target, weight)."""
    t = inp("target", ROW, "i")
    valid = A("ne", t, param("ignore_index", "i"))
    safe = A("where", valid, t, 0)  # never index with ignore_index
    inputs = [t]
    if weighted:
        w = inp("weight", COL)
        inputs.append(w)
        wt = A("where", valid, A("gather", w, safe), 0.0)
    else:
        w, wt = None, A("where", valid, 1.0, 0.0)
    return inputs, valid, safe, w, wt


@functools.lru_cache(maxsize=None)
def nll_loss(reduction, weighted):
    x = x_elem("input")
    inputs, valid, safe, w, wt = class_terms(weighted)
    picked = A("gather", x, safe)
    item = A("where", valid, -(picked * wt), 0.0)
    return reduce_loss("nll_loss", "row", [x] + inputs, item, ROW, reduction, wt)


def log_softmax_parts(x):
    """lse per row; the max is a constant shift (detached), so the gradient is softmax exactly."""
    m = A("detach", A("shift_row", x))
    return m + A("log", A("sum_row", A("exp", x - m)))


@functools.lru_cache(maxsize=None)
def cross_entropy(reduction, weighted, smoothing):
    x = x_elem("input")
    inputs, valid, safe, w, wt = class_terms(weighted)
    lse = log_softmax_parts(x)
    item = A("where", valid, -(wt * (A("gather", x, safe) - lse)), 0.0)
    if smoothing:
        logp = x - lse
        smooth = -A("sum_row", logp * w if weighted else logp)
        # torch: (1 - eps) * nll + eps / C * smooth, both over the same denominator for 'mean'
        item = (1.0 - param("eps")) * item + param("eps_over_c") * A("where", valid, smooth, 0.0)
    return reduce_loss("cross_entropy", "row", [x] + inputs, item, ROW, reduction, wt, ("target", "weight"))


@functools.lru_cache(maxsize=None)
def cross_entropy_probs(reduction, weighted, smoothing):
    """Class-probability targets: -sum_c w_c t_c log_softmax(x)_c per row; 'mean' divides by rows."""
    x, t = x_elem("input"), x_elem("target")
    logp = x - log_softmax_parts(x)
    if smoothing:
        t_eff = t * (1.0 - param("eps")) + param("eps_over_c")
    else:
        t_eff = t
    inputs = [x, t]
    prod = logp * t_eff
    if weighted:
        w = inp("weight", COL)
        inputs.append(w)
        prod = prod * w
    item = -A("sum_row", prod)
    saves = ("weight",) if smoothing else ("target", "weight")  # log_softmax keeps its result, not x
    return reduce_loss("cross_entropy", "row", inputs, item, ROW, reduction, saves=saves)


# -- the other ten ---------------------------------------------------------------------------
def clamp_below(z, lo=0.0):
    """torch.clamp_min: NaN stays NaN; the gradient passes where z >= lo (ties included)."""
    return A("gradfix", A("detach", A("maximum", z, lo)), z, A("where", A("ge", z, lo), 1.0, 0.0))


@functools.lru_cache(maxsize=None)
def gaussian_nll_loss(reduction):
    x, t, v = x_elem("input"), x_elem("target"), x_elem("var")
    # torch clamps a clone of var at eps under no_grad: the gradient flows as if var were the clamped value
    vc = A("gradfix", A("detach", A("maximum", v, param("eps"))), v, 1.0)
    d = x - t
    item = 0.5 * (A("log", vc) + d * d / vc) + param("const")  # const: 0.5 log(2 pi) when full, else 0
    return reduce_loss("gaussian_nll_loss", "flat", [x, t, v], item, ELEM, reduction, saves=())


@functools.lru_cache(maxsize=None)
def hinge_embedding_loss(reduction):
    x, t = x_elem("input"), x_elem("target")
    item = (A("where", A("ne", t, 1.0), clamp_below(param("margin") - x), 0.0)
            + A("where", A("ne", t, -1.0), x, 0.0))
    return reduce_loss("hinge_embedding_loss", "flat", [x, t], item, ELEM, reduction, saves=())


@functools.lru_cache(maxsize=None)
def kl_div(reduction, log_target):
    """'mean' and 'batchmean' are both the sum times `scale` (1/numel or 1/batch)."""
    x, t = x_elem("input"), x_elem("target")
    if log_target:
        item = A("exp", t) * (t - x)
    else:
        # torch: xlogy(t, t) - t * x; xlogy's derivative in its second argument is t/t (NaN at t = 0)
        tlogt = A("where", A("eq", t, 0.0), 0.0, t * A("log", t))
        dt = A("where", A("eq", t, 0.0), 0.0, A("log", t)) + t / t - x
        item = A("gradfix", A("gradfix", A("detach", tlogt - t * x), x, -t), t, dt)
    return reduce_loss("kl_div", "flat", [x, t], item, ELEM, reduction, saves=() if log_target else ALL)


@functools.lru_cache(maxsize=None)
def margin_ranking_loss(reduction):
    a, b, y = x_elem("input1"), x_elem("input2"), x_elem("target")
    item = clamp_below(-y * (a - b) + param("margin"))
    return reduce_loss("margin_ranking_loss", "flat", [a, b, y], item, ELEM, reduction, saves=())


@functools.lru_cache(maxsize=None)
def poisson_nll_loss(reduction, log_input, full):
    x, t = x_elem("input"), x_elem("target")
    if log_input:
        item = A("exp", x) - t * x
    else:
        item = x - t * A("log", x + param("eps"))
    if full:
        stirling = t * A("log", t) - t + 0.5 * A("log", 6.283185307179586 * t)
        item = item + A("where", A("le", t, 1.0), 0.0, stirling)
    return reduce_loss("poisson_nll_loss", "flat", [x, t], item, ELEM, reduction,
                   saves=ALL if log_input else ("target",))


def _log_sigmoid(x):
    return A("minimum", x, 0.0) - A("log1pexp", -A("abs", x))


@functools.lru_cache(maxsize=None)
def multilabel_soft_margin_loss(reduction, weight):
    """weight: None, 'col' (one per class) or 'elem' (broadcast to the input's shape)."""
    x, t = x_elem("input"), x_elem("target")
    # -(t log_sigmoid(x) + (1 - t) log_sigmoid(-x)) = (1 - t) x - log_sigmoid(x) for finite x. At x = +-inf
    # torch's form is a * inf with a the weight of the infinite term: NaN when a = 0 (0 * inf), which
    # the kernel's reassociated arithmetic would not reproduce, so that case is spelled out.
    a = A("where", A("lt", x, 0.0), t, 1.0 - t)
    value = A("where", A("eq", A("abs", x), float("inf")), a * float("inf"), (1.0 - t) * x - _log_sigmoid(x))
    # the exact derivatives: sigmoid(x) - t and -x
    item = A("gradfix", A("gradfix", A("detach", value), x, A("sigmoid", x) - t), t, -x)
    inputs = [x, t]
    if weight:
        w = inp("weight", COL if weight == "col" else ELEM)
        inputs.append(w)
        item = item * w
    per_row = A("sum_row", item) * param("inv_c")
    return reduce_loss("multilabel_soft_margin_loss", "row", inputs, per_row, ROW, reduction)


@functools.lru_cache(maxsize=None)
def multi_margin_loss(reduction, p, weighted):
    x, y = x_elem("input"), inp("target", ROW, "i")
    z = param("margin") - A("gather", x, y) + x
    on = A("gt", z, 0.0)
    # torch's backward: slope 1 (p=1) or 2z (p=2) where z > 0, else exactly 0 (also for a NaN z)
    hinge = A("gradfix", A("detach", A("where", on, z if p == 1 else z * z, 0.0)), z,
              A("where", on, 1.0 if p == 1 else 2.0 * z, 0.0))
    per_row = A("sum_row", A("where", A("ne", iota(), y), hinge, 0.0)) * param("inv_c")
    inputs = [x, y]
    if weighted:
        w = inp("weight", COL)
        inputs.append(w)
        per_row = per_row * A("gather", w, y)
    return reduce_loss("multi_margin_loss", "row", inputs, per_row, ROW, reduction)


def _pnorm(d, p):
    """||d||_p along the row with torch's norm backward (0 where the norm is 0)."""
    if p == 1:
        return A("sum_row", A("abs", d))
    if p == 2:
        n = A("sqrt", A("sum_row", d * d))
        slope = d / n
    else:
        pp = param("p")
        n = A("pow", A("sum_row", A("pow", A("abs", d), pp)), 1.0 / pp)
        slope = d * A("pow", A("abs", d), pp - 2.0) / A("pow", n, pp - 1.0)
    return A("gradfix", A("detach", n), d, A("where", A("eq", n, 0.0), 0.0, slope))


@functools.lru_cache(maxsize=None)
def triplet_margin_loss(reduction, p, swap):
    """p: 1, 2 or 'p' (any other positive p, a runtime param). Distances are torch's
    pairwise_distance: ||u - v + eps||_p over the last dimension."""
    a, pos, neg = x_elem("anchor"), x_elem("positive"), x_elem("negative")
    eps = param("eps")
    d_pos = _pnorm(A("add_strict", a - pos, eps), p)
    d_neg = _pnorm(A("add_strict", a - neg, eps), p)
    if swap:
        d_neg = A("minimum", d_neg, _pnorm(A("add_strict", pos - neg, eps), p))
    per_row = clamp_below(param("margin") + d_pos - d_neg)
    return reduce_loss("triplet_margin_loss", "row", [a, pos, neg], per_row, ROW, reduction, saves=())


@functools.lru_cache(maxsize=None)
def cosine_embedding_loss(reduction):
    a, b, y = x_elem("input1"), x_elem("input2"), inp("target", ROW)
    eps = TORCH_EPSILON
    cos = A("sum_row", a * b) / A("sqrt", (A("sum_row", a * a) + eps) * (A("sum_row", b * b) + eps))
    per_row = (A("where", A("eq", y, 1.0), 1.0 - cos, 0.0)
               + A("where", A("eq", y, -1.0), clamp_below(cos - param("margin")), 0.0))
    return reduce_loss("cosine_embedding_loss", "row", [a, b, y], per_row, ROW, reduction,
                   saves=("input1", "input2"))

"""Forward+backward time of the losses (fused autogen vs primitive vs torch eager) and of the
nonlinearities (autogen vs handwritten vs torch eager).

Run: `make bench` (or `autogen bench [--quick]`, `python benchmarks/bench_losses.py`). Prints one table and
writes benchmarks/results/losses.csv and .json. Ratios are measured in one run, per loss.
"""
import argparse
import csv
import functools
import json
import math
import os
import statistics
import time

import torch
import torch.nn.functional as TF

import autogen
from autogen import functional as AF


ROWS = ("multilabel_soft_margin_loss", "multi_margin_loss", "triplet_margin_loss",
        "triplet_margin_with_distance_loss", "cosine_embedding_loss")
OPTIONS = {"kl_div": {"reduction": "batchmean"}}


def inputs(name, n_elems):
    """Inputs of about n_elems elements (row losses as rows of 512 classes or features)."""
    if name in ROWS:
        c = 512 if n_elems >= 512 * 8 else 32
        r = max(n_elems // c, 1)
        x = torch.randn(r, c).requires_grad_()
        if name == "multilabel_soft_margin_loss":
            return [x, torch.randint(0, 2, (r, c)).float()]
        if name == "multi_margin_loss":
            return [x, torch.randint(0, c, (r,))]
        if name == "cosine_embedding_loss":
            return [x, torch.randn(r, c), torch.randint(0, 2, (r,)).float() * 2 - 1]
        return [x, torch.randn(r, c), torch.randn(r, c)]
    side = int(math.sqrt(n_elems))
    if name == "gaussian_nll_loss":
        return [torch.randn(side, side).requires_grad_(), torch.randn(side, side), torch.rand(side, side) + 0.1]
    if name == "hinge_embedding_loss":
        return [torch.randn(side, side).requires_grad_(), torch.randint(0, 2, (side, side)).float() * 2 - 1]
    if name == "kl_div":
        return [torch.randn(side, side).log_softmax(-1).requires_grad_(), torch.randn(side, side).softmax(-1)]
    if name == "margin_ranking_loss":
        return [torch.randn(side * side).requires_grad_(), torch.randn(side * side),
                torch.randint(0, 2, (side * side,)).float() * 2 - 1]
    if name == "poisson_nll_loss":
        return [torch.randn(side, side).requires_grad_(), torch.rand(side, side) * 4]
    if name in ("cross_entropy", "nll_loss"):
        c = 512 if n_elems >= 512 * 8 else 32
        r = max(n_elems // c, 1)
        x = torch.randn(r, c)
        if name == "nll_loss":
            x = torch.log_softmax(x, -1)
        return [x.requires_grad_(), torch.randint(0, c, (r,))]
    side = int(math.sqrt(n_elems))
    x, t = torch.randn(side, side), torch.randn(side, side)
    if name == "binary_cross_entropy":
        x, t = x.sigmoid(), t.sigmoid()
    elif name == "binary_cross_entropy_with_logits":
        t = t.sigmoid()
    return [x.requires_grad_(), t]


def timed(fn, reps):
    fn()  # compile / warm up
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return {"median": statistics.median(times), "p20": times[len(times) // 5], "p80": times[(4 * len(times)) // 5]}


def fwd_bwd(fn, args):
    grad_out = []

    def run():
        out = fn(*args)
        if not grad_out:
            grad_out.append(torch.ones_like(out))
        torch.autograd.grad(out, [args[0]], grad_out[0])
    return run


VARIANTS = {
    "eager": lambda name: lambda *a: getattr(TF, name)(*a, **OPTIONS.get(name, {})),
    "fused": lambda name: lambda *a: _under("aggressive", getattr(AF, name), a, True, name),
    "default": lambda name: lambda *a: _under("medium", getattr(AF, name), a, True, name),
    "primitive": lambda name: lambda *a: _under("medium", getattr(AF, name), a, False, name),
}


def _under(pol, fn, args, use_autogen, name):
    if autogen.get_policy() == pol:  # as users call it: no per-call policy context (it costs ~2 us)
        return fn(*args, use_autogen=use_autogen, **OPTIONS.get(name, {}))
    with autogen.policy(pol):
        return fn(*args, use_autogen=use_autogen, **OPTIONS.get(name, {}))


def triad_bandwidth(n=1 << 24, reps=10):
    """The machine's memory bandwidth in bytes/s: a = b + s * c over float32 (torch's threads)."""
    a, b, c = torch.empty(n), torch.rand(n), torch.rand(n)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.add(b, c, alpha=1.5, out=a)
        best = min(best, time.perf_counter() - t0)
    return 3 * 4 * n / best


# elementwise losses: bytes a fused forward+backward moves (every input read once, input 0's
# gradient written once; float32)
ELEMENTWISE = ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy",
               "binary_cross_entropy_with_logits", "gaussian_nll_loss", "hinge_embedding_loss", "kl_div",
               "margin_ranking_loss", "poisson_nll_loss")


def _bytes_moved(args):
    return sum(a.numel() * a.element_size() for a in args) + args[0].numel() * args[0].element_size()


_COMPILED = {}


def compiled(name):
    """torch.compile (Inductor) of torch's loss with the benchmark's options; compiled at first call."""
    fn = _COMPILED.get(name)
    if fn is None:
        # torch's function itself (a partial for options): dynamo keys its cache by code object, and
        # one shared lambda would hit its recompile limit after eight losses and run eagerly
        fn = _COMPILED[name] = torch.compile(functools.partial(getattr(TF, name), **OPTIONS.get(name, {})),
                                             dynamic=False)
    return fn


def main(argv=None):
    ap = argparse.ArgumentParser(prog="autogen bench", description="forward+backward time: fused vs primitive vs eager")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--elems", type=int, default=1 << 22)
    ap.add_argument("--losses", nargs="*", default=list(AF.LOSSES), help="losses to time (default: all)")
    ap.add_argument("--no-nonlinearities", action="store_true", help="skip the nonlinearity table")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile (Inductor) column")
    ap.add_argument("--out", default=os.path.join("benchmarks", "results"),
                    help="directory for losses.csv/.json and nonlinearities.csv (default: benchmarks/results)")
    args = ap.parse_args(argv)
    reps = 5 if args.quick else 15
    names = args.losses
    rows = []
    bandwidth = triad_bandwidth()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, ~{args.elems:,} elements "
          f"(class and row losses: {args.elems // 512}x512), forward+backward, median of {reps}; "
          f"triad bandwidth {bandwidth / 1e9:.1f} GB/s")
    head = (f"{'loss':34s} {'eager ms':>9s} {'fused ms':>9s} {'default':>9s} {'prim ms':>9s} "
            f"{'eager/fused':>11s} {'prim/fused':>10s} {'eager/fused@1K':>14s}"
            + ("" if args.no_compile else f" {'compile ms':>10s} {'compile/fused':>13s} {'compile s':>9s}")
            + f" {'BW %':>5s}")
    print(head)
    print("-" * len(head))
    for name in names:
        big = inputs(name, args.elems)
        small = inputs(name, 1024)
        res = {v: timed(fwd_bwd(VARIANTS[v](name), big), reps) for v in VARIANTS}
        extra = {}
        if not args.no_compile:
            t0 = time.perf_counter()
            fwd_bwd(compiled(name), big)()  # compile (Inductor), timed apart
            extra["compile_seconds"] = time.perf_counter() - t0
            res["compile"] = timed(fwd_bwd(compiled(name), big), reps)
            extra["compile_over_fused"] = res["compile"]["median"] / res["fused"]["median"]
        if name in ELEMENTWISE:
            extra["fused_bandwidth_fraction"] = _bytes_moved(big) / res["fused"]["median"] / bandwidth
        small_res = {v: timed(fwd_bwd(VARIANTS[v](name), small), reps * 20) for v in ("eager", "default")}
        row = {"loss": name, **{f"{v}_ms": res[v]["median"] * 1e3 for v in res},
               **{f"{v}_p20_ms": res[v]["p20"] * 1e3 for v in res},
               **{f"{v}_p80_ms": res[v]["p80"] * 1e3 for v in res},
               "eager_over_fused": res["eager"]["median"] / res["fused"]["median"],
               "eager_over_default": res["eager"]["median"] / res["default"]["median"],
               "primitive_over_fused": res["primitive"]["median"] / res["fused"]["median"],
               "eager_over_default_1k": small_res["eager"]["median"] / small_res["default"]["median"], **extra}
        rows.append(row)
        print(f"{name:34s} {row['eager_ms']:9.2f} {row['fused_ms']:9.2f} {row['default_ms']:9.2f} "
              f"{row['primitive_ms']:9.2f} {row['eager_over_fused']:10.2f}x {row['primitive_over_fused']:9.2f}x "
              f"{row['eager_over_default_1k']:13.2f}x"
              + ("" if args.no_compile else f" {row['compile_ms']:10.2f} {row['compile_over_fused']:12.2f}x "
                                            f"{row['compile_seconds']:9.1f}")
              + (f" {100 * row['fused_bandwidth_fraction']:4.0f}%" if "fused_bandwidth_fraction" in row else ""))
    geo = math.exp(statistics.mean(math.log(r["eager_over_fused"]) for r in rows))
    geo_default = math.exp(statistics.mean(math.log(r["eager_over_default"]) for r in rows))
    geo_prim = math.exp(statistics.mean(math.log(r["primitive_over_fused"]) for r in rows))
    print("-" * len(head))
    print(f"geometric mean: eager/fused {geo:.2f}x, eager/default {geo_default:.2f}x, primitive/fused {geo_prim:.2f}x"
          + ("" if args.no_compile else ", torch.compile/fused "
             f"{math.exp(statistics.mean(math.log(r['compile_over_fused']) for r in rows)):.2f}x"))
    print("BW % = bytes a fused forward+backward must move (inputs read, gradient written) per second, as a "
          "fraction of the triad bandwidth; compile s = Inductor's first call (compile + run)")
    print("fused = autogen fused kernel (policy aggressive); default = policy medium with use_autogen=True "
          "(handwritten kernel where one exists); prim = use_autogen=False (op by op)")
    out = args.out
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "losses.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
        w.writeheader()
        w.writerows(rows)
    nl_rows, nl_geo = bench_nonlinearities(args.elems, reps) if not args.no_nonlinearities else ([], None)
    if nl_rows:
        with open(os.path.join(out, "nonlinearities.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(nl_rows[0]))
            w.writeheader()
            w.writerows(nl_rows)
    custom_rows = bench_custom(args.elems, reps)
    with open(os.path.join(out, "losses.json"), "w") as f:
        json.dump({"rows": rows, "geomean_eager_over_fused": geo, "geomean_eager_over_default": geo_default,
                   "geomean_primitive_over_fused": geo_prim, "threads": torch.get_num_threads(),
                   "nonlinearities": nl_rows, "geomean_eager_over_autogen_nonlinearities": nl_geo,
                   "custom": custom_rows, "triad_bandwidth_bytes_per_s": bandwidth}, f, indent=1)


# -- custom losses (@autogen_loss): the fused kernel against the same module run eagerly ---------
@autogen.autogen_loss
class RobustLoss(torch.nn.Module):
    """Pseudo-Huber (Charbonnier) regression loss."""
    def __init__(self, c=0.5):
        super().__init__()
        self.c = c

    def forward(self, pred, target):
        d = (pred - target) / self.c
        return (self.c ** 2 * (torch.sqrt(d * d + 1) - 1)).mean()


@autogen.autogen_loss
class SmoothedClassification(torch.nn.Module):
    """Label-smoothed classification written out by hand."""
    def __init__(self, eps=0.1):
        super().__init__()
        self.eps = eps

    def forward(self, logits, target):
        logp = logits.log_softmax(-1)
        nll = -logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        return ((1 - self.eps) * nll - self.eps * logp.mean(dim=-1)).mean()


@autogen.autogen_loss
class FocalLoss(torch.nn.Module):
    def __init__(self, gamma=2.0):
        super().__init__()
        self.gamma = gamma

    def forward(self, logits, target):
        logpt = TF.log_softmax(logits, dim=-1).gather(1, target.unsqueeze(1)).squeeze(1)
        return (-(1 - logpt.exp()) ** self.gamma * logpt).mean()


def bench_custom(n_elems, reps):
    r = max(n_elems // 512, 1)
    x = torch.randn(r, 512, requires_grad=True)
    cases = [(RobustLoss, [x, torch.randn(r, 512)]), (SmoothedClassification, [x, torch.randint(0, 512, (r,))]),
             (FocalLoss, [x, torch.randint(0, 512, (r,))])]
    print()
    print(f"custom losses (@autogen_loss), {r}x512, forward+backward, median of {reps}")
    head = f"{'loss':24s} {'eager ms':>9s} {'fused ms':>9s} {'eager/fused':>11s}"
    print(head)
    print("-" * len(head))
    rows = []
    for cls, args in cases:
        eager = timed(fwd_bwd(cls(), args), reps)["median"]
        fused = timed(fwd_bwd(lambda *a, m=cls(use_autogen=True): _under_policy("medium", lambda: m(*a)), args),
                      reps)["median"]
        rows.append({"loss": cls.__name__, "eager_ms": eager * 1e3, "fused_ms": fused * 1e3,
                     "eager_over_fused": eager / fused})
        print(f"{cls.__name__:24s} {eager * 1e3:9.2f} {fused * 1e3:9.2f} {eager / fused:10.2f}x")
    return rows


def nonlinearity_args(name, n_elems):
    x = torch.randn(n_elems // 512, 512, requires_grad=True)
    if name == "prelu":
        return [x, torch.rand(512, requires_grad=True)]
    return [x]


NL_OPTIONS = {"threshold": {"threshold": 0.1, "value": 0.0}}


def bench_nonlinearities(n_elems, reps):
    def make(fn, name, pol):
        opts = NL_OPTIONS.get(name, {})
        if pol is None:
            return lambda *a: fn(*a, **opts)
        return lambda *a: _under_policy(pol, lambda: fn(*a, **opts))

    print()
    print(f"nonlinearities, ~{n_elems:,} elements, forward+backward, median of {reps}")
    head = f"{'nonlinearity':14s} {'eager ms':>9s} {'autogen ms':>10s} {'default ms':>10s} {'eager/autogen':>13s}"
    print(head)
    print("-" * len(head))
    rows = []
    for name in AF.NONLINEARITIES:
        args = nonlinearity_args(name, n_elems)
        eager = timed(fwd_bwd(make(getattr(TF, name), name, None), args), reps)["median"]
        auto = timed(fwd_bwd(make(getattr(AF, name), name, "aggressive"), args), reps)["median"]
        default = timed(fwd_bwd(make(getattr(AF, name), name, "medium"), args), reps)["median"]
        rows.append({"nonlinearity": name, "eager_ms": eager * 1e3, "autogen_ms": auto * 1e3,
                     "default_ms": default * 1e3, "eager_over_autogen": eager / auto})
        print(f"{name:14s} {eager * 1e3:9.2f} {auto * 1e3:10.2f} {default * 1e3:10.2f} {eager / auto:12.2f}x")
    geo = math.exp(statistics.mean(math.log(r["eager_over_autogen"]) for r in rows))
    print("-" * len(head))
    print(f"geometric mean eager/autogen {geo:.2f}x (default = policy medium: handwritten relu, gelu, silu)")
    return rows, geo


def _under_policy(pol, fn):
    with autogen.policy(pol):
        return fn()


if __name__ == "__main__":
    main()

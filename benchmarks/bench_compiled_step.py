"""A compiled model step with our loss against the same compiled model with torch's loss.

The models (--model), each feeding the eighteen built-in losses (autogen.functional.LOSSES, inputs from
autogen.bench.inputs at about 4M loss elements, options from autogen.bench.OPTIONS):

    affine   pred = x * scale + shift, scale and shift learnable scalars (the default): a pointwise tail,
             which Inductor fuses into torch's loss and our pass (autogen/inductor_pass.py) into ours
    linear   pred = nn.Linear(--features -> the input's last dimension, 512 for a 1-D input)(h), reshaped
             as the loss input (then a sigmoid for binary_cross_entropy, whose input must be probabilities):
             a GEMM neither side fuses into the loss
    none     the loss alone on a learnable input (the graph Inductor compiles is the loss itself)

Both steps are torch.compile(dynamic=False) on Inductor (ours with fullgraph=True), forward+backward
(loss.backward()):

    torch    torch.nn.functional's loss: Inductor compiles the loss itself, fused with the model's tail
    ours     autogen.functional's loss with use_autogen=True: the compiled graph calls our operator
             (autogen::call), with the model's pointwise tail absorbed by our Inductor pass
    no pass  (--without-pass) ours compiled with autogen.inductor_pass.ENABLED = False: Inductor compiles
             the tail and our kernel reads its output

Run: `python benchmarks/bench_compiled_step.py` (all losses, 5 repetitions, both process states;
Inductor compiles 36 graphs the first time, minutes on 2 cores; its cache makes later runs faster).
`--losses NAME ...`, `--reps N`, `--states default`, `--elems N`, `--json FILE`, `--model`, `--features`,
`--without-pass`.
Each state runs in a child process: `default` (glibc as it comes) and `no page faults`
(MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_ at 4 GiB, autogen.bench.NO_PAGE_FAULTS: freed
memory stays in the heap, so fresh tensors cost no page faults and the kernels are compared).
Time: repetitions interleaved in a seeded random order (autogen.bench.measure), medians; torch/ours is
the ratio of the medians; the geometric mean is over the losses.
"""
import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
import types


MODELS = {"affine": "an elementwise affine layer, then the loss",
          "linear": "nn.Linear({} features -> the loss input's last dimension), then the loss",
          "none": "the loss alone"}


def measure(fns, reps):
    """Wall and process CPU seconds of each call, repetitions interleaved in a seeded random order (CPU
    time: the steadier figure on a machine other jobs share)."""
    for fn in fns.values():  # compile and warm up
        fn()
        fn()
    wall, cpu = {k: [] for k in fns}, {k: [] for k in fns}
    rng = random.Random(0)
    for _ in range(reps):
        order = list(fns)
        rng.shuffle(order)
        for k in order:
            c0, t0 = time.process_time(), time.perf_counter()
            fns[k]()
            wall[k].append(time.perf_counter() - t0)
            cpu[k].append(time.process_time() - c0)
    return wall, cpu


def child(a):
    import functools

    import torch
    import torch.nn.functional as TF

    import autogen
    from autogen import bench, inductor_pass
    from autogen import functional as AF

    bench._raise_recompile_limit()
    torch.manual_seed(0)
    rows = {}
    for name in a.losses:
        args = bench.inputs(name, a.elems)
        x, rest = args[0].detach(), args[1:]
        opts = bench.OPTIONS.get(name, {})
        if a.model == "none":  # the loss alone, its first input the learnable tensor
            params = [x.requires_grad_()]

            def model(loss, x, params, rest):
                return loss(params[0], *rest)
        elif a.model == "affine":
            params = [torch.ones((), requires_grad=True), torch.zeros((), requires_grad=True)]

            def model(loss, x, params, rest):
                return loss(x * params[0] + params[1], *rest)
        else:  # nn.Linear(features -> the input's last dimension, or 512 for a 1-D input), reshaped as the input
            c = x.shape[-1] if x.dim() > 1 else 512
            lin = torch.nn.Linear(a.features, c)
            params, shape = list(lin.parameters()), x.shape
            x = torch.randn(x.numel() // c, a.features)

            probs = name == "binary_cross_entropy"  # its input must lie in [0, 1]: a sigmoid after the layer

            def model(loss, x, params, rest):
                pred = TF.linear(x, *params).reshape(shape)
                return loss(torch.sigmoid(pred) if probs else pred, *rest)

        theirs = functools.partial(getattr(TF, name), **opts)
        ours = functools.partial(getattr(AF, name), **opts, use_autogen=True)
        # torch's side may break the graph (gaussian_nll_loss checks var's values in Python); ours may not
        fns = {"torch": torch.compile(functools.partial(model, theirs), dynamic=False),
               "ours": torch.compile(functools.partial(model, ours), fullgraph=True, dynamic=False)}
        if a.without_pass:  # a copy of model's code: Dynamo keeps compiled graphs per code object
            copy = types.FunctionType(model.__code__.replace(), model.__globals__, "model", None, model.__closure__)
            fns["no pass"] = torch.compile(functools.partial(copy, ours), fullgraph=True, dynamic=False)

        def step(fn):
            def run():
                for p in params:
                    p.grad = None
                fn(x, params, rest).backward()
            return run

        values, paths = {}, {}
        for k, fn in fns.items():
            for p in params:
                p.grad = None
            inductor_pass.ENABLED = k != "no pass"  # read when Inductor compiles: at this first call
            with autogen.record() as rec:
                out = fn(x, params, rest)
                out.backward()
            inductor_pass.ENABLED = True
            values[k] = (float(out.detach()),) + tuple(float(p.grad.double().sum()) for p in params)
            paths[k] = sorted({f"{c.op}: {c.path}{'' if c.fused else ' (not fused)'}" for c in rec.calls})
        times, cpu = measure({k: step(fn) for k, fn in fns.items()}, a.reps)
        close = all(math.isclose(p, q, rel_tol=1e-3, abs_tol=1e-3 * max(1.0, abs(p)))
                    for k in fns for p, q in zip(values["torch"], values[k]))
        med = statistics.median
        rows[name] = {"torch": med(times["torch"]), "ours": med(times["ours"]), "cpu_torch": med(cpu["torch"]),
                      "cpu_ours": med(cpu["ours"]), "times": times, "cpu": cpu, "elements": args[0].numel(),
                      "paths": paths["ours"], "same": close, "values": values}
        if a.without_pass:
            rows[name].update({"no pass": med(times["no pass"]), "cpu_no pass": med(cpu["no pass"]),
                               "paths_no_pass": paths["no pass"]})
        print(json.dumps({name: rows[name]}), file=sys.stderr, flush=True)
    print(json.dumps({"rows": rows, "load": os.getloadavg()[0], "threads": torch.get_num_threads()}))


def main():
    from autogen.bench import NO_PAGE_FAULTS
    from autogen.functional import LOSSES
    states = {"default": {}, "no page faults": NO_PAGE_FAULTS}
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--losses", nargs="+", default=list(LOSSES), choices=list(LOSSES))
    p.add_argument("--elems", type=int, default=1 << 22)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--states", nargs="+", default=list(states), choices=list(states))
    p.add_argument("--model", default="affine", choices=list(MODELS), help="the model before the loss")
    p.add_argument("--features", type=int, default=32, help="--model linear: its input features")
    p.add_argument("--without-pass", action="store_true",
                   help="also ours without autogen.inductor_pass (the loss a fusion boundary)")
    p.add_argument("--json", help="write every measurement here")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        return child(a)
    out = {}
    print(f"compiled model step ({MODELS[a.model].format(a.features)}), forward+backward, ~{a.elems} loss "
          f"elements, median of {a.reps} interleaved repetitions; torch/ours > 1: ours faster")
    geo = lambda v: math.exp(sum(map(math.log, v)) / len(v))  # noqa: E731
    for state in a.states:
        argv = [sys.executable, __file__, "--child", "--elems", str(a.elems), "--reps", str(a.reps), "--model",
                a.model, "--features", str(a.features), "--losses", *a.losses] + ["--without-pass"] * a.without_pass
        proc = subprocess.run(argv, stdout=subprocess.PIPE, text=True, env=dict(os.environ, **states[state]))
        if proc.returncode:
            sys.exit(f"child failed ({state})")
        res = out[state] = json.loads(proc.stdout.strip().splitlines()[-1])
        rows = res["rows"].values()
        extra = a.without_pass
        print(f"\n{state}: threads {res['threads']}, load average {res['load']:.1f} at the end")
        print(f"{'loss':34s} {'elements':>9s} {'torch ms':>9s} {'ours ms':>8s} {'torch/ours':>10s} "
              f"{'cpu torch/ours':>14s}" + (f" {'no pass ms':>10s} {'torch/no pass':>13s}" if extra else "")
              + "  ours' kernel")
        for name, r in res["rows"].items():
            print(f"{name:34s} {r['elements']:9d} {r['torch'] * 1e3:9.2f} {r['ours'] * 1e3:8.2f} "
                  f"{r['torch'] / r['ours']:10.2f} {r['cpu_torch'] / r['cpu_ours']:14.2f}"
                  + (f" {r['no pass'] * 1e3:10.2f} {r['torch'] / r['no pass']:13.2f}" if extra else "")
                  + f"  {', '.join(r['paths'])}{'' if r['same'] else '  VALUES DIFFER'}")
        res["geomean"] = geo([r["torch"] / r["ours"] for r in rows])
        res["cpu_geomean"] = geo([r["cpu_torch"] / r["cpu_ours"] for r in rows])
        line = f"{'geometric mean':34s} {'':9s} {'':9s} {'':8s} {res['geomean']:10.2f} {res['cpu_geomean']:14.2f}"
        if extra:
            res["no_pass_geomean"] = geo([r["torch"] / r["no pass"] for r in rows])
            line += f" {'':10s} {res['no_pass_geomean']:13.2f}"
        print(line)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()

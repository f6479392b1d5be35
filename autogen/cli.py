"""The `autogen` command line (also `python -m autogen`)."""
import argparse
import os
import sys

import torch

_DTYPES = {"float32": torch.float32, "float64": torch.float64}


class CLIError(Exception):
    """A one-line error for stderr."""


def _paths(kind, name):
    from . import kernels
    registry = kernels.FUSED if kind == "loss" else kernels.NONLINEAR
    return ["handwritten", "autogen", "fallback"] if name in registry else ["autogen", "fallback"]


def cmd_list(args):
    from . import activations
    from . import functional as F
    from . import nn as agnn
    from .policies import POLICIES, TABLE
    classes = {name: cls.__name__ for name, cls in agnn.BY_FUNCTIONAL.items()}
    classes.update({rec.name: rec.module for rec in activations.NONLINEARITIES.values()})
    print(f"{'name':34s} {'torch.nn class':26s} {'kind':13s} {'paths':31s} " + " ".join(f"{p:11s}" for p in POLICIES))
    rows = [("loss", n) for n in F.LOSSES] + [("nonlinearity", n) for n in F.NONLINEARITIES]
    for kind, name in rows:
        paths = _paths(kind, name)
        picks = [TABLE[(p, "handwritten" in paths)][0] for p in POLICIES]
        print(f"{name:34s} {classes.get(name, '-'):26s} {kind:13s} {', '.join(paths):31s} "
              + " ".join(f"{p:11s}" for p in picks))
    print("\nlosses pick with use_autogen=True; use_autogen=False runs them op by op (primitive path)")


def _sample(name, reduction, dtype):
    """Our functional loss, small sample inputs (the first one requiring grad) and its options."""
    from . import functional as F
    from .bench import OPTIONS, inputs
    fn = getattr(F, name)
    args = inputs(name, 4096)
    args = [a.detach().to(dtype).requires_grad_(i == 0) if a.is_floating_point() else a for i, a in enumerate(args)]
    opts = dict(OPTIONS.get(name, {}))
    if reduction:
        opts["reduction"] = reduction
    return fn, args, opts


def _loss_name(name):
    from . import functional as F
    from . import nn as agnn
    if name in F.LOSSES:
        return name
    cls = getattr(agnn, name, None)
    if name in agnn.LOSSES and cls is not None:
        return cls._functional
    return None


def cmd_show(args):
    from . import functional as F
    from .codegen import render
    from .plans import fused_plan
    from .explain import explain
    from .policies import policy
    dtype = _DTYPES[args.dtype]
    loss = _loss_name(args.name)
    if loss is not None:
        _, inputs, opts = _sample(loss, args.reduction, dtype)
        with policy("aggressive"):
            ex = explain(loss, *inputs, **opts)
        print(f"{loss} ({args.dtype}, reduction={opts.get('reduction', 'mean')})\n\nprimitive graph:\n{ex.graph}")
        sources = ex.sources
        if args.backward:
            back = {k: v for k, v in sources.items() if "backward" in k or "+grad" in k}
            sources = back
        for label, src in sources.items():
            print(f"\ngenerated source ({label}):\n{src}")
        return
    if args.name in F.NONLINEARITIES:
        from . import activations
        if args.name in ("prelu", "glu"):
            raise CLIError(f"show: {args.name} takes a weight or a split; see autogen.explain in Python")
        graph = activations.graph(args.name, "none" if args.name == "gelu" else None)
        plan = fused_plan(graph, (True,), dtype)
        print(f"{args.name} ({args.dtype})\n\nprimitive graph:\n{plan.forward.graph_text()}")
        specs = [plan.backward] if args.backward and plan.backward is not None else [plan.forward] + (
            [plan.backward] if plan.backward is not None else [])
        for spec in specs:
            print(f"\ngenerated source ({spec.label}):\n{render(spec)}")
        return
    raise CLIError(f"unknown loss or nonlinearity {args.name!r}; see `autogen list`")


def cmd_explain(args):
    from . import nn as agnn
    from .config import load_config
    from .policies import choose, get_policy, policy_source
    try:
        params = load_config(args.params)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    model = params.get("model") or {}
    print(f"policy: {get_policy()} (from {policy_source()})")
    nl = model.get("nonlinearity")
    if nl:
        if nl not in agnn.BY_NAME:
            raise CLIError(f"unknown model.nonlinearity {nl!r}; known: {', '.join(sorted(agnn.BY_NAME))}")
        path, reason = choose("handwritten" in _paths("nonlinearity", nl))
        print(f"nonlinearity {nl}: {path} ({reason})")
    loss = model.get("loss")
    if loss:
        name = _loss_name(loss)
        use = bool(model.get("use_autogen", True))
        if name is None:
            print(f"loss {loss}: a custom loss; with @autogen_loss and use_autogen={use} it is traced and "
                  f"fused ({'unless the policy is disabled' if use else 'no: it runs as written'})")
        elif not use:
            print(f"loss {loss}: use_autogen false: op by op (primitive path), each primitive by the policy")
        else:
            path, reason = choose("handwritten" in _paths("loss", name))
            print(f"loss {loss}: {path} ({reason})")


def cmd_bench(args):
    from .bench import main
    main(args.rest)


def cmd_precompile(args):
    from . import functional as F
    from .policies import policy
    names = args.losses or list(F.LOSSES)
    for name in names:
        if name not in F.LOSSES:
            raise CLIError(f"unknown loss {name!r}; see `autogen list`")
    count = 0
    for dtype_name in args.dtypes:
        if dtype_name not in _DTYPES:
            raise CLIError(f"unknown dtype {dtype_name!r}; choose from {', '.join(_DTYPES)}")
        for name in names:
            for reduction in ("mean", "none"):
                fn, inputs, opts = _sample(name, reduction, _DTYPES[dtype_name])
                with policy("aggressive"):
                    out = fn(*inputs, **opts, use_autogen=True)
                    if out.requires_grad:
                        out.sum().backward()
                count += 1
    from .config import cache_dir
    print(f"compiled {count} loss variants into {cache_dir()}")


def cmd_cache(args):
    from .compiler import remove, scan
    from .config import cache_dir
    d = cache_dir()
    files = []
    if os.path.isdir(d):
        for root, _, names in os.walk(d):
            files += [os.path.join(root, n) for n in names]
    damaged = scan(d) if os.path.isdir(d) and (args.action == "info" or args.damaged) else []
    if args.action == "info":
        size = sum(os.path.getsize(f) for f in files if os.path.exists(f))
        kernels = sum(1 for f in files if os.path.basename(f).startswith("k_") and f.endswith(".py"))
        print(f"cache dir: {d}\nkernel sources: {kernels}\nfiles: {len(files)}\nsize: {size / 1e6:.2f} MB\n"
              f"damaged: {len(damaged)}" + "".join(f"\n  {p}: {why}" for p, why in damaged))
        if damaged:
            print("`autogen cache clear --damaged` removes them (the engine removes each one it meets)")
    elif args.damaged:
        for path, _ in damaged:
            remove(path)
        print(f"removed {len(damaged)} damaged files from {d}")
    else:
        if os.path.isdir(d):
            for entry in os.listdir(d):
                remove(os.path.join(d, entry))
        print(f"cleared {len(files)} files from {d}")


def cmd_run(args):
    from .runner import Runner
    try:
        runner = Runner.from_file(args.params, progress=not args.quiet)
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    if args.steps is not None:
        runner.num_steps = args.steps
    runner.fit()
    print(runner.summary())


def build_parser():
    ap = argparse.ArgumentParser(prog="autogen", description="fused-kernel autogeneration for PyTorch losses")
    sub = ap.add_subparsers(dest="command", metavar="command")
    sub.required = True
    sub.add_parser("list", help="every loss and nonlinearity, its paths, and each policy's pick").set_defaults(
        fn=cmd_list)
    p = sub.add_parser("show", help="primitive graph and generated source of a loss or nonlinearity")
    p.add_argument("name")
    p.add_argument("--dtype", default="float32", choices=list(_DTYPES))
    p.add_argument("--reduction", default=None, choices=["none", "mean", "sum"])
    p.add_argument("--backward", action="store_true", help="only the kernel(s) that write the gradient")
    p.set_defaults(fn=cmd_show)
    p = sub.add_parser("explain", help="what the engine does for a params file's model")
    p.add_argument("params")
    p.set_defaults(fn=cmd_explain)
    p = sub.add_parser("bench", help="the benchmark (arguments after it go to the benchmark)")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(fn=cmd_bench)
    p = sub.add_parser("precompile", help="fill the kernel cache ahead of time")
    p.add_argument("--losses", nargs="*", default=None)
    p.add_argument("--dtypes", nargs="*", default=["float32"])
    p.set_defaults(fn=cmd_precompile)
    p = sub.add_parser("cache", help="show or empty the kernel cache")
    p.add_argument("action", choices=["info", "clear"])
    p.add_argument("--damaged", action="store_true", help="clear: only the damaged files (`info` lists them)")
    p.set_defaults(fn=cmd_cache)
    p = sub.add_parser("run", help="train a small model from a params file")
    p.add_argument("--params", required=True)
    p.add_argument("--steps", type=int, default=None, help="override runconfig.num_steps")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(fn=cmd_run)
    return ap


def main(argv=None):
    parser = build_parser()

    def error(message):  # argparse's errors as one line, exit 2
        sys.stderr.write(f"autogen: error: {message}\n")
        sys.exit(2)
    parser.error = error
    for action in parser._subparsers._group_actions:
        for sub in action.choices.values():
            sub.error = error
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:  # the benchmark parses its own options
        argv = ["bench", "--"] + argv[1:]
    args = parser.parse_args(argv)
    if args.command == "bench" and args.rest[:1] == ["--"]:
        args.rest = args.rest[1:]
    try:
        args.fn(args)
    except (CLIError, ValueError) as exc:
        sys.stderr.write(f"autogen: error: {exc}\n")
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `autogen list | head`
        sys.stderr.close()
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())

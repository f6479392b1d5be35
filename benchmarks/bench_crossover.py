"""Where our kernels start to beat torch eager: time ratio by input size, losses and @autogen_loss losses.

Run: `python benchmarks/bench_crossover.py [--fwd | --fixed] [--custom | --no-custom] [--states default,nopf]
[--sizes 1K,16K,...] [--threads N] [--write autogen/loss_thresholds.json] [loss or corpus class ...]`. --fixed: the fixed cost of a call instead, at 1K
elements: forward+backward minus an empty torch.autograd.Function's forward+backward, in us (eager's and ours;
on one thread, --threads 1, the thread's CPU time), each call interleaved with the others and in a loop of its
own. The size thresholds below which autogen.functional hands
a loss to torch's own kernel come from this table: forward+backward for functional.SMALL_ELEMENTS, forward
only (--fwd, under torch.no_grad) for functional.SMALL_ELEMENTS_NO_GRAD; --write stores each loss's first win
(the larger over the allocator states) in autogen/loss_thresholds.json, which they read. Each allocator state runs in a
child process: `default` (glibc as it comes: a large tensor freed is handed back to the OS and the next one
page-faults) and `nopf` (MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_ at 4 GiB: freed memory is reused,
so kernel meets kernel). --threads 1 times torch and ours on one thread: on a machine shared with other
work torch's parallel regions wait on descheduled threads (ms each), which no quiet machine shows; below
32K elements torch runs its ops on one thread anyway. Eager and ours run interleaved in one process (median of each); `first win` is
the smallest size from which ours is at least as fast at every larger size.
"""
import json
import os
import subprocess
import sys

SIZES = [1 << 10, 1 << 13, 1 << 14, 1 << 15, 1 << 16, 1 << 17, 1 << 19, 1 << 22]
STATES = {"default": {}, "nopf": {"MALLOC_MMAP_THRESHOLD_": "4294967296", "MALLOC_TRIM_THRESHOLD_": "4294967296"}}


def _sizes(text):
    from autogen.bench import _sizes as parse  # "1K,16K,4M" as `autogen bench --sizes` reads it
    return parse(text)


def _custom_cells(name, n, fwd):
    """(eager, ours) callables of corpus loss `name` at about n elements (rows of 512, 32 below 4K)."""
    import torch
    from autogen.bench import fwd_bwd, fwd_only
    from autogen.corpus import CORPUS, make
    entry = next(e for e in CORPUS if e.cls.__name__ == name)
    cols = 512 if n >= 4096 else 32
    torch.manual_seed(0)
    args = [a.requires_grad_(i in entry.diff) for i, a in enumerate(make(entry.kind, torch.float32, max(n // cols, 1),
                                                                         cols))]
    mode = fwd_only if fwd else fwd_bwd
    return mode(entry.cls(), args), mode(entry.cls(use_autogen=True), args)


def _empty_step():
    """Forward+backward of an empty torch.autograd.Function: what any autograd-tracked call costs."""
    import torch
    from autogen.bench import fwd_bwd

    class Empty(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.new_empty(())

        @staticmethod
        def backward(ctx, g):
            return None
    return fwd_bwd(Empty.apply, [torch.randn(32, 32, requires_grad=True)])


def child(argv):
    """One allocator state: a line per loss, eager time / ours at each size (--fixed: eager's and our fixed
    cost at 1K elements, and the empty Function's time, in us)."""
    from autogen.bench import VARIANTS, fwd_bwd, fwd_only, inputs, measure
    from autogen import functional as AF
    from autogen.corpus import CORPUS
    import statistics
    import time
    import timeit
    import torch
    fwd, fixed = "--fwd" in argv, "--fixed" in argv
    sizes = _sizes(argv[argv.index("--sizes") + 1]) if "--sizes" in argv else SIZES
    if "--threads" in argv:
        torch.set_num_threads(int(argv[argv.index("--threads") + 1]))
    if fixed:
        sizes, empty = [1 << 10], _empty_step()
        clock = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
    values = {argv[i + 1] for i, a in enumerate(argv[:-1]) if a in ("--sizes", "--threads", "--write")}
    names = [a for a in argv if not a.startswith("--") and a not in values]
    custom = {e.cls.__name__ for e in CORPUS}
    if not names:
        names = list(AF.LOSSES) * ("--custom" not in argv) + sorted(custom) * ("--no-custom" not in argv)
    mode = fwd_only if fwd else fwd_bwd
    AF.SMALL_ELEMENTS = AF.SMALL_ELEMENTS_NO_GRAD = dict.fromkeys(AF.SMALL_ELEMENTS, 0)  # ours at every size
    for name in names:
        ratios = []
        for n in sizes:
            if name in custom:
                eager, ours = _custom_cells(name, n, fwd)
            else:
                args = inputs(name, n)
                eager, ours = mode(VARIANTS["eager"](name), args), mode(VARIANTS["default"](name), args)
            if fixed:  # interleaved with the empty Function, medians of many calls
                st = measure({"eager": eager, "ours": ours, "empty": empty}, 3000, clock)
                e = st["empty"]["median"]
                ratios = [(st["eager"]["median"] - e) * 1e6, (st["ours"]["median"] - e) * 1e6, e * 1e6]
                # and in a steady loop of each (timeit's way: the best of 3 runs of 500 calls, 3 rounds)
                best = {k: [] for k in ("eager", "ours", "empty")}
                for _ in range(3):
                    for k, fn in (("eager", eager), ("ours", ours), ("empty", empty)):
                        best[k].append(min(timeit.repeat(fn, number=500, repeat=3, timer=clock)) / 500)
                e = statistics.median(best["empty"])
                ratios += [(statistics.median(best[k]) - e) * 1e6 for k in ("eager", "ours")] + [e * 1e6]
                continue
            reps = max(15, min(300, (1 << 23) // n))
            st = measure({"eager": eager, "ours": ours}, reps)  # interleaved
            ratios.append(st["eager"]["median"] / st["ours"]["median"])
        print(name, " ".join(f"{r:.3f}" for r in ratios), flush=True)


def first_win(ratios, sizes):
    """The smallest size from which every ratio is >= 1 (None: ours loses at the largest)."""
    win = None
    for n, r in reversed(list(zip(sizes, ratios))):
        if r < 1:
            break
        win = n
    return win


def main():
    argv = sys.argv[1:]
    if "--child" in argv:
        return child(argv)
    states = argv[argv.index("--states") + 1].split(",") if "--states" in argv else list(STATES)
    sizes = _sizes(argv[argv.index("--sizes") + 1]) if "--sizes" in argv else SIZES
    rest = [a for i, a in enumerate(argv) if a != "--states" and (i == 0 or argv[i - 1] != "--states")]
    results = {}
    for state in states:
        proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child"] + rest, stdout=subprocess.PIPE,
                                text=True, env=dict(os.environ, **STATES[state]))
        print(f"[{state}] running", file=sys.stderr, flush=True)
        for line in proc.stdout:
            name, *vals = line.split()
            results.setdefault(name, {})[state] = [float(v) for v in vals]
            print(f"[{state}] {line.rstrip()}", file=sys.stderr, flush=True)
        if proc.wait():
            sys.exit(proc.returncode)
    fwd = "--fwd" in argv
    if "--fixed" in argv:
        print(f"fixed cost at 1K elements, forward+backward minus an empty autograd.Function's (us); per loss a line "
              f"per allocator state ({', '.join(states)}); interleaved: each call after the others' (medians of "
              f"3000), steady: each in a loop of its own (timeit's best of 3 x 500 calls, median of 3)")
        print(f"{'':42s} {'interleaved':^23s} {'steady':^23s}")
        print(f"{'loss':34s} {'state':7s} " + f"{'eager':>7s} {'ours':>7s} {'empty':>7s} " * 2)
        for name, per in results.items():
            for state in states:
                if state in per:
                    print(f"{name:34s} {state:7s} " + " ".join(f"{v:7.1f}" for v in per[state]))
        return
    print(f"eager time / our default-path time, {'forward only' if fwd else 'forward+backward'} (>1: ours is "
          f"faster); per loss a line per allocator state ({', '.join(states)})")
    k = lambda n: f"{n >> 20}M" if n >= 1 << 20 else f"{n >> 10}K"  # noqa: E731
    print(f"{'loss':34s} {'state':7s} " + " ".join(f"{k(n):>6s}" for n in sizes) + f" {'first win':>9s}")
    for name, per in results.items():
        for state in states:
            ratios = per.get(state)
            if ratios is None:
                continue
            win = first_win(ratios, sizes)
            print(f"{name:34s} {state:7s} " + " ".join(f"{r:6.2f}" for r in ratios)
                  + f" {k(win) if win else '-':>9s}")
    if "--write" in argv:
        write(argv[argv.index("--write") + 1], "no_grad" if fwd else "grad", results, states, sizes)


NEVER = 1 << 62  # a threshold past any size: torch's own kernel at every size measured


def write(path, key, results, states, sizes):
    """Store each loss's first win over every allocator state (the larger) as its threshold in `path`
    (autogen/loss_thresholds.json: "grad" from forward+backward, "no_grad" from --fwd), one line per loss."""
    with open(path) as f:
        table = json.load(f)
    for name, per in results.items():
        if name in table[key]:
            table[key][name] = max(first_win(per[s], sizes) or NEVER for s in states if s in per)
    rows = [f' "{k}": {{\n' + ",\n".join(f"  {json.dumps(n)}: {v}" for n, v in t.items()) + "\n }"
            for k, t in table.items()]
    with open(path, "w") as f:
        f.write("{\n" + ",\n".join(rows) + "\n}\n")
    print(f"wrote {key} to {path}")


if __name__ == "__main__":
    main()

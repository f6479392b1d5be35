"""Linear + loss: forward+backward of a loss over a linear layer's logits.

    eager    F.cross_entropy(F.linear(h, W), t)              the (tokens, vocab) logits, their softmax
                                                               and their gradient, each whole
    compile  torch.compile of the same function               (inductor, CPU)
    ours     autogen.functional.linear_cross_entropy          row chunks: BLAS logits, the fused kernel
                                                               writes loss and dlogits, BLAS gradients

`--loss kd`: the distillation-KL custom form instead, an @autogen_loss module
    KL(softmax(teacher / T) || softmax(F.linear(h, W) / T)) * T**2, 'batchmean', T = 2
against a teacher's (tokens, vocab) logits: eager is the module as written, compile its
torch.compile, ours the module with use_autogen=True (its graph is each chunk's generated kernel).

Run: `python benchmarks/bench_linear_ce.py` (2048 tokens x 32768 vocab x 512 hidden, float32, 3
repetitions; a few minutes on 2 cores). `--tokens 2048 4096`, `--dtype float32 bfloat16`, `--loss ce kd`
(each combination in turn, a summary table at the end), `--reps N`, `--chunks 256 1024` (extra variants
of ours at those chunk sizes), `--no-compile`, `--json FILE`.

Each size runs in two child processes, one per process state:
  default    glibc as it comes: a 256 MB tensor is mmapped fresh and page-faulted on every call
  nopf       MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_ at 4 GiB (autogen.bench.NO_PAGE_FAULTS):
             freed memory stays with the process and is reused, kernel against kernel
Time: repetitions interleaved (the order of the variants rotates each time), medians; the ratios
eager/ours and compile/ours are taken per repetition and their median reported. Wall seconds, and the
process's CPU seconds (all its threads), the steadier figure on a machine other jobs share.
Memory: peak RSS during one call minus the RSS before it (VmHWM reset through /proc/self/clear_refs),
after gc, autogen.empty_cache() and malloc_trim(0), so that memory earlier calls freed is back with
the OS and the call's own peak shows. It includes the gradients themselves (.grad of W and h), the
same for every variant: the `grads` column. Page faults: minor faults of one timed call (getrusage),
median over the repetitions.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

STATES = {"default": {}, "nopf": {"MALLOC_MMAP_THRESHOLD_": "4294967296", "MALLOC_TRIM_THRESHOLD_": "4294967296"}}


def child(a):
    import ctypes
    import gc
    import resource
    import time

    import torch
    import torch.nn.functional as TF

    import autogen
    from autogen.functional import linear_cross_entropy

    dtype = getattr(torch, a.dtype)
    torch.manual_seed(0)
    h = torch.randn(a.tokens, a.hidden).to(dtype).requires_grad_()
    W = (torch.randn(a.vocab, a.hidden) * 0.02).to(dtype).requires_grad_()
    t = torch.randint(0, a.vocab, (a.tokens,))

    if a.loss == "kd":
        teacher = (torch.randn(a.tokens, a.vocab) * 2).to(dtype)

        @autogen.autogen_loss
        class Distill(torch.nn.Module):
            def __init__(self, T=2.0):
                super().__init__()
                self.T = T

            def forward(self, h, W, teacher):
                z = TF.linear(h, W)
                return TF.kl_div(TF.log_softmax(z / self.T, -1), TF.log_softmax(teacher / self.T, -1),
                                 reduction="batchmean", log_target=True) * self.T ** 2

        as_written, fused = Distill(), Distill(use_autogen=True)

        def eager(h, W, t):
            return as_written(h, W, teacher)

        def ours(h, W, t):
            return fused(h, W, teacher)
    else:
        def eager(h, W, t):
            return TF.cross_entropy(TF.linear(h, W), t)
        ours = linear_cross_entropy

    variants = {"eager": eager}
    if a.compile:
        variants["compile"] = torch.compile(eager)
    variants["ours"] = ours
    for c in a.chunks:
        variants[f"ours[c={c}]"] = (lambda h, W, t, c=c: linear_cross_entropy(h, W, t, chunk_size=c)) \
            if a.loss == "ce" else (lambda h, W, t, c=c: _rows_per_chunk(c, ours, h, W, t))

    def step(fn):
        h.grad = W.grad = None
        loss = fn(h, W, t)
        loss.backward()
        return loss.detach().float().item()

    # warm-up: compiles; a kernel runs serially until timed, then compiles its threaded variant
    values = {name: step(fn) for name, fn in variants.items()}
    for _ in range(2):
        for fn in variants.values():
            step(fn)
    names = list(variants)
    times, cpu, faults = {n: [] for n in names}, {n: [] for n in names}, {n: [] for n in names}
    for r in range(a.reps):
        for n in names[r % len(names):] + names[:r % len(names)]:
            f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            c0, t0 = time.process_time(), time.perf_counter()
            step(variants[n])
            times[n].append(time.perf_counter() - t0)
            cpu[n].append(time.process_time() - c0)
            faults[n].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)

    libc = ctypes.CDLL("libc.so.6")

    def status(key):
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key))

    mem = {}
    for n in names:
        h.grad = W.grad = None
        gc.collect()
        autogen.empty_cache()
        libc.malloc_trim(0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        base = status("VmRSS:")
        step(variants[n])
        mem[n] = status("VmHWM:") - base
    grads = (h.numel() + W.numel()) * h.element_size()
    ratios = {n: statistics.median(e / o for e, o in zip(times[n], times["ours"])) for n in names}
    cpu_ratios = {n: statistics.median(e / o for e, o in zip(cpu[n], cpu["ours"])) for n in names}
    med = lambda d: {n: statistics.median(v) for n, v in d.items()}  # noqa: E731
    print(json.dumps({"times": times, "median": med(times), "per_ours": ratios, "cpu": cpu, "cpu_median": med(cpu),
                      "cpu_per_ours": cpu_ratios, "load": os.getloadavg()[0], "mem": mem, "faults": med(faults),
                      "grads": grads, "loss": values, "threads": torch.get_num_threads()}))


def _rows_per_chunk(rows, fn, *args):
    """fn(*args) with @autogen_loss chunks of `rows` rows (a scalar loss's gradients come in its forward)."""
    from autogen import chunked
    saved, chunked.TRACED_CHUNK_ROWS = chunked.TRACED_CHUNK_ROWS, rows
    try:
        return fn(*args)
    finally:
        chunked.TRACED_CHUNK_ROWS = saved


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[2048])
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--dtype", nargs="+", default=["float32"], choices=["float32", "bfloat16", "float16", "float64"])
    p.add_argument("--loss", nargs="+", default=["ce"], choices=["ce", "kd"],
                   help="cross-entropy, or the distillation-KL form")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--chunks", type=int, nargs="*", default=[])
    p.add_argument("--no-compile", dest="compile", action="store_false")
    p.add_argument("--states", nargs="+", default=list(STATES), choices=list(STATES))
    p.add_argument("--json", help="write every measurement here")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        a.tokens, a.dtype, a.loss = a.tokens[0], a.dtype[0], a.loss[0]
        return child(a)
    rows = [run(a, loss, dtype, n, state) for loss in a.loss for dtype in a.dtype for n in a.tokens
            for state in a.states]
    print("\nsummary: ratio = variant's time / ours (wall, CPU), memory = ours' peak / eager's")
    print(f"{'loss':4s} {'dtype':8s} {'tokens':>6s} {'state':8s} {'eager/ours':>11s} {'cpu':>5s} "
          f"{'compile/ours':>12s} {'cpu':>5s} {'memory':>7s}")
    for r in rows:
        comp = f"{r['per_ours']['compile']:12.2f} {r['cpu_per_ours']['compile']:5.2f}" if "compile" in r["median"] \
            else f"{'-':>12s} {'-':>5s}"
        print(f"{r['form']:4s} {r['dtype']:8s} {r['tokens']:6d} {r['state']:8s} {r['per_ours']['eager']:11.2f} "
              f"{r['cpu_per_ours']['eager']:5.2f} {comp} {r['mem']['ours'] / r['mem']['eager']:7.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


def run(a, loss, dtype, n, state):
    """One child process (one allocator state): its table, and its measurements."""
    MB = 1 << 20
    what = "cross-entropy" if loss == "ce" else "distillation KL (@autogen_loss)"
    print(f"\nlinear + {what}, forward+backward, {dtype}, {n} tokens, hidden {a.hidden}, vocab {a.vocab}, {state}; "
          f"median of {a.reps} interleaved repetitions; ratio = variant's time / ours (per repetition, median)")
    print(f"{'variant':12s} {'seconds':>8s} {'/ours':>6s} {'cpu s':>7s} {'/ours':>6s} "
          f"{'peak MB':>8s} {'/eager':>7s} {'faults':>8s} {'loss':>10s}")
    argv = [sys.executable, __file__, "--child", "--tokens", str(n), "--vocab", str(a.vocab), "--hidden",
            str(a.hidden), "--dtype", dtype, "--loss", loss, "--reps", str(a.reps), "--chunks", *map(str, a.chunks)]
    if not a.compile:
        argv.append("--no-compile")
    proc = subprocess.run(argv, capture_output=True, text=True, env=dict(os.environ, **STATES[state]))
    if proc.returncode:
        sys.exit(proc.stderr)
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    res.update(tokens=n, state=state, vocab=a.vocab, hidden=a.hidden, dtype=dtype, form=loss)
    for v in res["median"]:
        print(f"{v:12s} {res['median'][v]:8.3f} {res['per_ours'][v]:6.2f} {res['cpu_median'][v]:7.2f} "
              f"{res['cpu_per_ours'][v]:6.2f} {res['mem'][v] / MB:8.0f} {res['mem'][v] / res['mem']['eager']:7.2f} "
              f"{res['faults'][v]:8.0f} {res['loss'][v]:10.6f}")
    print(f"{'(grads)':12s} {'':30s} {res['grads'] / MB:8.0f}   threads {res['threads']}, "
          f"load average {res['load']:.1f} at the end", flush=True)
    return res


if __name__ == "__main__":
    main()

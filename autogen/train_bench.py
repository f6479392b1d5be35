"""The training-step benchmark (`autogen bench --train`): whole steps (forward, backward, AdamW) of three small
models in four variants, timed interleaved in one process:

    lm    a GPT-style LM (one block: attention, a GELU MLP), then its head and cross-entropy over the vocabulary;
          autogen's variant runs head and loss as autogen.functional.linear_cross_entropy (no logits tensor)
    seg   a conv segmentation head (conv, batch norm, ReLU) to per-pixel logits, cross-entropy plus a soft
          Dice term written as an @autogen_loss module
    mlp   an MLP classifier (Linear, GELU, Linear), cross-entropy with label smoothing

Variants: eager (torch's modules and losses), autogen (autogen.nn's nonlinearities and losses, policy medium),
compile and compile+autogen (torch.compile of the same two, Inductor). Reported per model and variant: the
median step time with its p20-p80 spread, peak memory, the loss after N steps against eager's (all variants
from the same initial weights and batches), and for eager the share of its step spent in the loss and in the
nonlinearities (each timed alone, forward and backward, on the step's own shapes). `--load` also times every
variant with one busy process beside it (a spinning Python loop) and reports the ratio to the quiet median.
"""
import multiprocessing
import os
import time

import torch
import torch.nn.functional as TF

import autogen
from autogen import functional as AF
from autogen import nn as ANN

from .timing import measure, peak_mb

VARIANTS = ("eager", "autogen", "compile", "compile+autogen")
# (full size, --quick size) per model: the sizes, and ones small enough for a smoke run
SIZES = {"lm": ({"vocab": 16384, "hidden": 256, "seq": 128, "batch": 8}, {"vocab": 512, "hidden": 32, "seq": 16, "batch": 2}),
         "seg": ({"batch": 8, "classes": 19, "side": 96, "width": 32}, {"batch": 2, "classes": 5, "side": 16, "width": 8}),
         "mlp": ({"batch": 256, "inp": 1024, "hidden": 4096, "classes": 1000}, {"batch": 16, "inp": 32, "hidden": 64, "classes": 10})}


class SoftDiceTerm(torch.nn.Module):
    """Soft Dice of per-pixel class probabilities against one-hot targets, over the whole batch."""
    def forward(self, logits, onehot):
        p = torch.softmax(logits, dim=1)
        inter = (p * onehot).sum()
        return 1 - (2 * inter + 1) / (p.sum() + onehot.sum() + 1)


FusedDice = autogen.autogen_loss(type("FusedDice", (SoftDiceTerm,), {}))


class LM(torch.nn.Module):
    def __init__(self, vocab, hidden, seq, ours):
        super().__init__()
        self.ours = ours
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.pos = torch.nn.Parameter(torch.randn(seq, hidden) * 0.02)
        self.norm1, self.norm2, self.norm3 = (torch.nn.LayerNorm(hidden) for _ in range(3))
        self.qkv = torch.nn.Linear(hidden, 3 * hidden)
        self.proj = torch.nn.Linear(hidden, hidden)
        self.up, self.down = torch.nn.Linear(hidden, 4 * hidden), torch.nn.Linear(4 * hidden, hidden)
        self.act = ANN.GELU() if ours else torch.nn.GELU()
        self.head = torch.nn.Linear(hidden, vocab, bias=False)
        self.heads = 4

    def forward(self, tokens, target):
        B, T = tokens.shape
        x = self.embed(tokens) + self.pos[:T]
        q, k, v = self.qkv(self.norm1(x)).view(B, T, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        a = TF.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, -1)
        x = x + self.proj(a)
        x = x + self.down(self.act(self.up(self.norm2(x))))
        h = self.norm3(x).reshape(B * T, -1)
        if self.ours:
            return AF.linear_cross_entropy(h, self.head.weight, target.reshape(-1))
        return TF.cross_entropy(self.head(h), target.reshape(-1))


class Seg(torch.nn.Module):
    def __init__(self, classes, width, ours):
        super().__init__()
        self.ours = ours
        act = (lambda: ANN.ReLU()) if ours else (lambda: torch.nn.ReLU())
        self.body = torch.nn.Sequential(torch.nn.Conv2d(3, width, 3, padding=1), torch.nn.BatchNorm2d(width), act(),
                                        torch.nn.Conv2d(width, width, 3, padding=1), torch.nn.BatchNorm2d(width), act(),
                                        torch.nn.Conv2d(width, classes, 1))
        self.ce = ANN.CrossEntropyLoss(use_autogen=True) if ours else torch.nn.CrossEntropyLoss()
        self.dice = FusedDice(use_autogen=True) if ours else SoftDiceTerm()

    def forward(self, image, target):
        logits = self.body(image)
        onehot = TF.one_hot(target, logits.shape[1]).permute(0, 3, 1, 2).to(logits.dtype)
        return self.ce(logits, target) + self.dice(logits, onehot)


class MLP(torch.nn.Module):
    def __init__(self, inp, hidden, classes, ours):
        super().__init__()
        self.ours = ours
        self.l1, self.l2 = torch.nn.Linear(inp, hidden), torch.nn.Linear(hidden, classes)
        self.act = ANN.GELU() if ours else torch.nn.GELU()
        self.ce = ANN.CrossEntropyLoss(label_smoothing=0.1, use_autogen=True) if ours else \
            torch.nn.CrossEntropyLoss(label_smoothing=0.1)

    def forward(self, x, target):
        return self.ce(self.l2(self.act(self.l1(x))), target)


def model(name, size, ours):
    torch.manual_seed(0)  # every variant starts from the same weights
    if name == "lm":
        return LM(size["vocab"], size["hidden"], size["seq"], ours)
    if name == "seg":
        return Seg(size["classes"], size["width"], ours)
    return MLP(size["inp"], size["hidden"], size["classes"], ours)


def batches(name, size, count):
    """`count` batches (inputs, target), the same for every variant."""
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(count):
        if name == "lm":
            tokens = torch.randint(0, size["vocab"], (size["batch"], size["seq"]), generator=g)
            out.append((tokens, torch.roll(tokens, -1, 1)))
        elif name == "seg":
            s = size["side"]
            out.append((torch.randn(size["batch"], 3, s, s, generator=g),
                        torch.randint(0, size["classes"], (size["batch"], s, s), generator=g)))
        else:
            out.append((torch.randn(size["batch"], size["inp"], generator=g),
                        torch.randint(0, size["classes"], (size["batch"],), generator=g)))
    return out


def stepper(name, size, variant):
    """(step(batch) -> loss, the module): forward, backward and an AdamW step of one variant."""
    m = model(name, size, ours="autogen" in variant)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    fwd = torch.compile(m) if variant.startswith("compile") else m

    def step(batch):
        opt.zero_grad(set_to_none=True)
        loss = fwd(*batch)
        loss.backward()
        opt.step()
        return loss.detach()
    return step, m


def _shares(name, size, batch, step_s):
    """Eager's loss and nonlinearity time, forward and backward, each on the shapes one step gives them, as
    fractions of the eager step."""
    m = model(name, size, ours=False)
    acts, logits = [], {}
    hooks = [mod.register_forward_hook(lambda mod, i, o: acts.append((mod, i[0].detach())))
             for mod in m.modules() if isinstance(mod, (torch.nn.GELU, torch.nn.ReLU))]
    if name == "lm":
        hooks.append(m.head.register_forward_hook(lambda mod, i, o: logits.update(x=o.detach())))
    elif name == "seg":
        hooks.append(m.body.register_forward_hook(lambda mod, i, o: logits.update(x=o.detach())))
    else:
        hooks.append(m.l2.register_forward_hook(lambda mod, i, o: logits.update(x=o.detach())))
    m(*batch)
    for h in hooks:
        h.remove()
    x = logits["x"].requires_grad_()
    t = batch[1].reshape(-1) if name == "lm" else batch[1]

    def loss_call():
        if name == "seg":
            onehot = TF.one_hot(t, x.shape[1]).permute(0, 3, 1, 2).to(x.dtype)
            out = TF.cross_entropy(x, t) + SoftDiceTerm()(x, onehot)
        else:
            out = TF.cross_entropy(x, t, label_smoothing=0.1 if name == "mlp" else 0.0)
        out.backward()

    def act_call():
        for mod, a in acts:
            a = a.requires_grad_()
            mod(a).sum().backward()
    times = measure({"loss": loss_call, "act": act_call}, 5)
    return {k: times[k]["median"] / step_s for k in ("loss", "act")}


def _spin(stop):
    while not stop.is_set():
        sum(i * i for i in range(10000))


def run_model(name, quick, reps, steps, load):
    size = SIZES[name][1 if quick else 0]
    data = batches(name, size, max(steps, 1))
    result = {"model": name, "size": size, "variants": {}}
    steppers = {v: stepper(name, size, v) for v in VARIANTS}
    finals = {}
    for v in VARIANTS:  # the loss after `steps` steps from the same start (fresh weights per variant)
        step, _ = stepper(name, size, v)
        t0 = time.perf_counter()
        for b in data[:steps]:
            loss = step(b)
        finals[v] = (float(loss), time.perf_counter() - t0)
    batch = data[0]
    fns = {v: (lambda s=steppers[v][0]: s(batch)) for v in VARIANTS}
    quiet = measure(fns, reps)
    loaded = None
    if load:
        stop = multiprocessing.get_context("fork").Event()
        proc = multiprocessing.get_context("fork").Process(target=_spin, args=(stop,), daemon=True)
        proc.start()
        try:
            loaded = measure(fns, reps)
        finally:
            stop.set()
            proc.join(5)
    for v in VARIANTS:
        st = quiet[v]
        result["variants"][v] = {
            "median_ms": st["median"] * 1e3, "p20_ms": st["p20"] * 1e3, "p80_ms": st["p80"] * 1e3,
            "peak_mb": peak_mb(fns[v]), "loss_after": finals[v][0], "first_steps_s": finals[v][1],
            "loaded_over_quiet": loaded[v]["median"] / st["median"] if loaded else None}
    result["steps"] = steps
    result["shares"] = _shares(name, size, batch, quiet["eager"]["median"])
    return result


def report(results):
    print(f"\ntraining steps (forward, backward, AdamW), median ms [p20-p80]; speedups > 1: the autogen variant is "
          f"faster; loss after N steps relative to eager's")
    head = f"{'model':6s} " + " ".join(f"{v:>22s}" for v in VARIANTS)
    print(head + f" {'ag/eager':>9s} {'c+ag/c':>7s} {'loss%':>6s} {'act%':>6s}")
    for r in results:
        vs = r["variants"]
        cells = " ".join(f"{vs[v]['median_ms']:9.1f} [{vs[v]['p20_ms']:.1f}-{vs[v]['p80_ms']:.1f}]".rjust(22)
                         for v in VARIANTS)
        print(f"{r['model']:6s} {cells} {vs['eager']['median_ms'] / vs['autogen']['median_ms']:9.2f} "
              f"{vs['compile']['median_ms'] / vs['compile+autogen']['median_ms']:7.2f} "
              f"{100 * r['shares']['loss']:6.1f} {100 * r['shares']['act']:6.1f}")
    print(f"\n{'model':6s} " + " ".join(f"{v + ' MB':>16s}" for v in VARIANTS) + "   loss after N steps, rel. to eager")
    for r in results:
        vs = r["variants"]
        ref = vs["eager"]["loss_after"]
        rel = " ".join(f"{v}: {(vs[v]['loss_after'] - ref) / abs(ref) if ref else 0.0:+.1e}" for v in VARIANTS[1:])
        mem = " ".join(f"{vs[v]['peak_mb'] or 0:16.1f}" for v in VARIANTS)
        print(f"{r['model']:6s} {mem}   N={r['steps']}: {rel}")
    if any(r["variants"]["eager"]["loaded_over_quiet"] for r in results):
        print("\nwith one busy process beside it: median step time loaded / quiet")
        for r in results:
            print(f"{r['model']:6s} " + " ".join(f"{v}: {r['variants'][v]['loaded_over_quiet']:.2f}"
                                                 for v in VARIANTS))


def main(models, quick=False, reps=None, steps=14, load=False):
    reps = reps or (3 if quick else 7)
    results = [run_model(name, quick, reps, steps, load) for name in models]
    report(results)
    return results


if __name__ == "__main__":
    main(list(SIZES), quick=bool(os.environ.get("QUICK")))

"""A small training runner driven by a params file: `autogen run --params params.yaml`.

The model comes from the file's `model:` section (an MLP on synthetic data, or a tiny GPT-style
model when `model.name: gpt`; with `model.fused_output: true` its vocabulary head runs inside
linear_cross_entropy) with its `nonlinearity` and `loss`; `runconfig` carries
`num_steps`, `batch_size`, `learning_rate`, `seed` and the autogen_* settings. Subclass Runner
and override its hooks to add logging or profiling.
"""
import importlib
import os
import sys
import time

import torch

from . import nn as agnn
from .linear_loss import LinearCrossEntropyLoss
from .config import load_config
from .policies import get_policy, policy_source, record

CLASS_LOSSES = {"CrossEntropyLoss", "NLLLoss", "MultiMarginLoss"}


def _loss_class(name):
    """A loss module class: autogen.nn's by class or functional name, or 'module:Class' / 'module.Class'
    (a user's @autogen_loss class, importable from the params file's directory)."""
    if name in agnn.LOSSES:
        return getattr(agnn, name)
    if name in agnn.BY_FUNCTIONAL:
        return agnn.BY_FUNCTIONAL[name]
    mod_name, sep, cls_name = name.replace(":", ".").rpartition(".")
    if sep:
        try:
            return getattr(importlib.import_module(mod_name), cls_name)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"model.loss {name!r}: cannot import it ({exc})") from None
    raise ValueError(f"unknown model.loss {name!r}; known: {', '.join(agnn.LOSSES)} or 'module.Class'")


def _number(section, name, key, default, kind=int):
    """section[key] as a number; a bad value is a ValueError naming the key and the value."""
    value = section.get(key, default)
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}.{key}: expected {'an integer' if kind is int else 'a number'}, "
                         f"got {value!r}") from None


class MLP(torch.nn.Module):
    def __init__(self, input_size, hidden_size, output_size, num_layers, nonlinearity, **nl_options):
        super().__init__()
        layers, width = [], input_size
        for _ in range(num_layers):
            layers += [torch.nn.Linear(width, hidden_size), agnn.get_nonlinearity(nonlinearity, **nl_options)]
            width = hidden_size
        layers.append(torch.nn.Linear(width, output_size))
        self.net = torch.nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


class TinyGPT(torch.nn.Module):
    """Token and position embeddings, causal self-attention blocks with the configured
    nonlinearity in their MLPs, and a vocabulary head."""
    def __init__(self, vocab_size, seq_len, hidden_size, num_layers, num_heads, nonlinearity, **nl_options):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab_size, hidden_size)
        self.pos = torch.nn.Embedding(seq_len, hidden_size)
        self.blocks = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(hidden_size, num_heads, 4 * hidden_size, dropout=0.0,
                                             activation=agnn.get_nonlinearity(nonlinearity, **nl_options),
                                             batch_first=True, norm_first=True)
            for _ in range(num_layers))
        self.head = torch.nn.Linear(hidden_size, vocab_size)
        self.register_buffer("mask", torch.nn.Transformer.generate_square_subsequent_mask(seq_len), persistent=False)

    def features(self, idx):
        """The hidden states the vocabulary head reads, (B, T, hidden)."""
        t = idx.shape[1]
        h = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for block in self.blocks:
            h = block(h, src_mask=self.mask[:t, :t], is_causal=True)
        return h

    def forward(self, idx):
        return self.head(self.features(idx))


class Runner:
    """Train for runconfig.num_steps. Hooks: on_train_start/end, on_train_epoch_start/end(epoch),
    on_train_batch_start(step, batch), on_train_batch_end(step, loss)."""

    def __init__(self, params, progress=True):
        self.params = params
        self.model_cfg = dict(params.get("model") or {})
        run = dict(params.get("runconfig") or {})
        self.num_steps = _number(run, "runconfig", "num_steps", 100)
        self.steps_per_epoch = _number(run, "runconfig", "steps_per_epoch", max(self.num_steps, 1))
        self.batch_size = _number(run, "runconfig", "batch_size", 64)
        self.lr = _number(run, "runconfig", "learning_rate", 1e-2, float)
        self.progress = progress
        torch.manual_seed(_number(run, "runconfig", "seed", 0))
        self.model, self.loss_fn, self.make_batch = self._build()
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=self.lr)
        self.losses, self.step_times, self.calls = [], [], []

    @classmethod
    def from_file(cls, path, **kwargs):
        directory = os.path.dirname(os.path.abspath(path))
        if directory not in sys.path:
            sys.path.insert(0, directory)  # a custom loss module beside the params file
        return cls(load_config(path), **kwargs)

    def _build(self):
        cfg = self.model_cfg
        name = cfg.get("name", "mlp")
        nl = cfg.get("nonlinearity", "relu")
        nl_options = dict(cfg.get("nonlinearity_options") or {})
        loss_name = cfg.get("loss", "CrossEntropyLoss")
        loss_cls = _loss_class(loss_name)
        loss_options = dict(cfg.get("loss_options") or {})
        loss_fn = loss_cls(**loss_options, use_autogen=bool(cfg.get("use_autogen", True)))
        hidden = _number(cfg, "model", "hidden_size", 64)
        layers = _number(cfg, "model", "num_layers", 2)
        if name == "gpt":
            vocab, seq = _number(cfg, "model", "vocab_size", 32), _number(cfg, "model", "seq_len", 16)
            model = TinyGPT(vocab, seq, hidden, layers, _number(cfg, "model", "num_heads", 2), nl, **nl_options)

            def make_batch():  # next token = (token + 1) mod vocab: learnable in a few steps
                start = torch.randint(0, vocab, (self.batch_size, 1))
                seqs = (start + torch.arange(seq + 1)) % vocab
                return seqs[:, :-1], seqs[:, 1:].reshape(-1)
            if cfg.get("fused_output", False):  # the head inside the loss: the logits never exist whole
                return _Hidden(model), _FusedHead(loss_name, loss_options, model.head, cfg), make_batch
            return _FlatLogits(model, vocab), loss_fn, make_batch
        if cfg.get("fused_output", False):
            raise ValueError("model.fused_output: only for model.name gpt (its vocabulary head)")
        if name != "mlp":
            raise ValueError(f"unknown model.name {name!r}; known: mlp, gpt")
        inputs, classes = _number(cfg, "model", "input_size", 32), _number(cfg, "model", "num_classes", 10)
        model = MLP(inputs, hidden, classes, layers, nl, **nl_options)
        teacher = torch.nn.Linear(inputs, classes)
        classify = getattr(loss_cls, "__name__", "") in CLASS_LOSSES or bool(cfg.get("classification", False))

        def make_batch():
            x = torch.randn(self.batch_size, inputs)
            with torch.no_grad():
                y = teacher(x)
            return x, (y.argmax(-1) if classify else y)
        return model, loss_fn, make_batch

    # hooks
    def on_train_start(self):
        pass

    def on_train_end(self):
        pass

    def on_train_epoch_start(self, epoch):
        pass

    def on_train_epoch_end(self, epoch):
        pass

    def on_train_batch_start(self, step, batch):
        pass

    def on_train_batch_end(self, step, loss):
        if self.progress:
            done = (step + 1) / self.num_steps
            bar = "#" * int(30 * done)
            sys.stderr.write(f"\r[{bar:30s}] step {step + 1}/{self.num_steps} loss {loss:.4f}")
            if step + 1 == self.num_steps:
                sys.stderr.write("\n")
            sys.stderr.flush()

    def fit(self):
        self.on_train_start()
        with record() as rec:
            step, epoch = 0, 0
            while step < self.num_steps:
                self.on_train_epoch_start(epoch)
                for _ in range(min(self.steps_per_epoch, self.num_steps - step)):
                    batch = self.make_batch()
                    self.on_train_batch_start(step, batch)
                    t0 = time.perf_counter()
                    self.optimizer.zero_grad(set_to_none=True)
                    loss = self.loss_fn(self.model(batch[0]), batch[1])
                    loss.backward()
                    self.optimizer.step()
                    self.step_times.append(time.perf_counter() - t0)
                    self.losses.append(float(loss.detach()))
                    self.on_train_batch_end(step, self.losses[-1])
                    step += 1
                self.on_train_epoch_end(epoch)
                epoch += 1
        self.calls = rec.calls
        self.on_train_end()
        return self

    def summary(self):
        paths = {}
        for c in self.calls:
            key = (c.op, c.path, c.fused, c.phase)
            paths[key] = paths.get(key, 0) + 1
        per_step = sorted(self.step_times)[len(self.step_times) // 2] if self.step_times else 0.0
        lines = [f"policy {get_policy()} (from {policy_source()}), {self.num_steps} steps, "
                 f"median {per_step * 1e3:.2f} ms per step, loss {self.losses[0]:.4f} -> {self.losses[-1]:.4f}",
                 "kernels:"]
        lines += [f"  {op:34s} {path:11s} fused={fused!s:5s} {phase:8s} x{n}"
                  for (op, path, fused, phase), n in sorted(paths.items())]
        return "\n".join(lines)


class _FlatLogits(torch.nn.Module):
    """(B, T, V) logits as (B*T, V) rows for a class loss."""
    def __init__(self, model, vocab):
        super().__init__()
        self.model, self.vocab = model, vocab

    def forward(self, idx):
        return self.model(idx).reshape(-1, self.vocab)


class _Hidden(torch.nn.Module):
    """The GPT's hidden states as (B*T, hidden) rows, for a loss that applies the head itself."""
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, idx):
        h = self.model.features(idx)
        return h.reshape(-1, h.shape[-1])


class _FusedHead:
    """model.fused_output: linear_cross_entropy(hidden, head.weight, target, head.bias, **loss_options), the
    head's matmul and the cross-entropy in row chunks (autogen.linear_loss)."""
    def __init__(self, loss_name, options, head, cfg):
        if loss_name not in ("CrossEntropyLoss", "cross_entropy"):
            raise ValueError(f"model.fused_output: needs model.loss CrossEntropyLoss, got {loss_name!r}")
        try:
            self.loss = LinearCrossEntropyLoss(**options, use_autogen=bool(cfg.get("use_autogen", True)))
        except TypeError as exc:
            raise ValueError(f"model.loss_options with fused_output: {exc}") from None
        self.head = head

    def __call__(self, hidden, target):
        return self.loss(hidden, self.head.weight, target, self.head.bias)

"""The pieces of scripts/train.py that do not touch the loader or the command line:
settings, -100 targets, the LR schedule, checkpoints and the training loop. Plain
PyTorch plus sftdata's error types, ``Batch`` and ``apply_ignore_index``; every
function here is unit-tested with synthetic batches (tests/scripts/test_train.py).

One step, whatever the dataset (the same code for every one)::

    batch = loader.get_batch("train")          a Batch: x, y, mask, position_ids, seq_ids
    targets = y, with -100 wherever the target is not trained (mask == 0; padding;
              in packed rows also every target across a segment boundary)
    logits = model(x, position_ids, block-diagonal mask of seq_ids)   (None, None: causal)
    loss = mean cross-entropy over targets != -100

With ``grad_accum_steps = A`` an optimizer step is A micro-batches, and the loss is the
mean over the trained targets of the whole step, however it is split: the loader says
how many there are before the first micro-batch (``loader.step_trained_tokens(A)``, over
every rank), and each micro-batch adds ``sum of its token losses / that count``::

    N = loader.step_trained_tokens(A)
    for each of the A micro-batches:  (sum of cross-entropy over targets != -100) / N  -> backward
"""

from __future__ import annotations

import math
import os
import random
import time
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

import numpy as np
import torch
from gpt import GPT, GPTConfig, block_causal_mask

from sftdata.errors import ConfigError
from sftdata.loader import IGNORE_INDEX, Batch, apply_ignore_index
from sftdata.order.batches import DEFAULT_SEED

CKPT_FORMAT = "sftdata-train-checkpoint"
CKPT_VERSION = 1


# ------------------------------------------------------------------------- settings
@dataclass
class TrainSettings:
    """Training keys a config file may hold next to the loader's (they land in ``cfg.extra``).

    The defaults are the tiny CPU preset (configs/sft/tiny.json). An XML ``<training>``
    file may hold these keys as tags next to the loader's (see ``training_keys``)."""

    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 64
    dropout: float = 0.0
    tie_weights: bool = True
    vocab_size: int = 0  # 0: the dataset's tokenizer vocab size
    learning_rate: float = 3e-3
    min_lr: float = 3e-4
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    max_iters: int = 200  # optimizer steps
    grad_accum_steps: int = 1  # micro-batches per optimizer step (the loss is normalised over all of them)
    warmup_pct: float = 0.05
    post_training: bool = False  # set from the loader's use_loss_mask, or POST_TRAINING
    log_interval: int = 10
    eval_interval: int = 50  # 0: no evaluation
    eval_iters: int = 4
    checkpoint_interval: int = 50  # 0: only at the end
    seed: int = DEFAULT_SEED  # of the model's initial weights and dropout

    def model_config(self, vocab_size: int) -> GPTConfig:
        return GPTConfig(vocab_size=vocab_size, n_layer=self.n_layer, n_head=self.n_head, n_embd=self.n_embd,
                         dropout=self.dropout, tie_weights=self.tie_weights)

    def validate(self, where: str = "the training settings") -> TrainSettings:
        checks = [
            ("n_layer", self.n_layer >= 1, "at least 1"),
            ("n_head", self.n_head >= 1, "at least 1"),
            ("vocab_size", self.vocab_size >= 0, "0 (the dataset's tokenizer) or more"),
            ("max_iters", self.max_iters >= 1, "at least 1"),
            ("grad_accum_steps", self.grad_accum_steps >= 1, "at least 1"),
            ("warmup_pct", 0.0 <= self.warmup_pct < 1.0, "a fraction in [0, 1)"),
            ("learning_rate", self.learning_rate > 0, "positive"),
            ("min_lr", 0 <= self.min_lr <= self.learning_rate, "between 0 and learning_rate"),
            ("log_interval", self.log_interval >= 1, "at least 1"),
            ("eval_interval", self.eval_interval >= 0, "0 (off) or more"),
            ("eval_iters", self.eval_iters >= 1, "at least 1"),
            ("checkpoint_interval", self.checkpoint_interval >= 0, "0 (only at the end) or more"),
            ("dropout", 0.0 <= self.dropout < 1.0, "a fraction in [0, 1)"),
        ]
        for name, ok, want in checks:
            if not ok:
                raise ConfigError(f"{where}: {name} = {getattr(self, name)!r} must be {want}")
        if self.n_embd % self.n_head or (self.n_embd // self.n_head) % 2:
            raise ConfigError(f"{where}: n_embd ({self.n_embd}) must split into n_head ({self.n_head}) heads "
                              f"of an even size (RoPE rotates pairs); e.g. n_embd = n_head * 32")
        return self


def _typed(name: str, value, kind, where: str):
    if kind is bool and isinstance(value, bool):
        return value
    if kind is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise ConfigError(f"{where}: {name} must be {kind.__name__}, got {value!r}")


def training_keys() -> dict[str, type]:
    """The config keys this script reads next to the loader's, with their types (an XML
    ``<training>`` file may hold them as tags; ``LoaderConfig.from_file(extra_keys=...)``)."""
    return {f.name: {"int": int, "float": float, "bool": bool}[f.type] for f in fields(TrainSettings)
            if f.name != "post_training"}  # that one is the loader's use_loss_mask


def settings_from_extra(extra: dict, where: str) -> TrainSettings:
    """Typed ``TrainSettings`` from the config keys the loader did not use. A key neither
    the loader nor this script knows is an error (a typo must not train with a default)."""
    kinds = training_keys()
    unknown = sorted(set(extra) - set(kinds))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; the training keys are "
                          f"{', '.join(kinds)} (the loader's keys are in docs/LOADER.md)")
    return TrainSettings(**{k: _typed(k, v, kinds[k], where) for k, v in extra.items()})


def apply_env(s: TrainSettings, env: dict) -> TrainSettings:
    """``POST_TRAINING=1|0`` and ``WARMUP_PCT=<fraction>`` override the config file."""
    changes = {}
    if env.get("POST_TRAINING", "") != "":
        v = env["POST_TRAINING"].strip().lower()
        if v not in ("0", "1", "true", "false"):
            raise ConfigError(f"POST_TRAINING={env['POST_TRAINING']!r}: use 1 (assistant-only loss) or 0")
        changes["post_training"] = v in ("1", "true")
    if env.get("WARMUP_PCT", "") != "":
        try:
            changes["warmup_pct"] = float(env["WARMUP_PCT"])
        except ValueError:
            raise ConfigError(f"WARMUP_PCT={env['WARMUP_PCT']!r} is not a number; use a fraction such "
                              f"as 0.05 (5% of the steps warm up)") from None
    return replace(s, **changes).validate("the environment")


# ------------------------------------------------------------------ targets and LR
def episode_end_targets(x: torch.Tensor, y: torch.Tensor, eos_id: int) -> torch.Tensor:
    """For padded episodes without a loss mask: every target after the episode's EOS is
    padding, so it becomes -100; the EOS itself stays a target (the model learns to stop).

    ::

        x:       A  b  c  EOS pad pad
        y:       b  c  EOS pad pad pad
        result:  b  c  EOS -100 -100 -100
    """
    after_end = torch.cumsum((x == eos_id).to(torch.int32), dim=1) > 0
    return torch.where(after_end, torch.full_like(y, IGNORE_INDEX), y)


def lr_at(step: int, s: TrainSettings) -> float:
    """Linear warmup over ``round(warmup_pct * max_iters)`` steps, then cosine decay to
    ``min_lr`` at ``max_iters``. ``step`` counts from 0."""
    warmup = int(round(s.warmup_pct * s.max_iters))
    if step < warmup:
        return s.learning_rate * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, s.max_iters - warmup))
    return s.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (s.learning_rate - s.min_lr)


@dataclass
class StepInputs:
    x: torch.Tensor
    targets: torch.Tensor
    position_ids: torch.Tensor | None = None
    attn_mask: torch.Tensor | None = None


def step_inputs(batch: Batch, *, post_training: bool, end_id: int | None = None, mask_fn=None) -> StepInputs:
    """Model inputs and -100 targets from a loader's ``Batch``, whatever the dataset.

    - A batch with a mask: -100 where it is 0. That is the assistant tokens with
      POST_TRAINING=1; a packed row always has a mask (without POST_TRAINING every
      target inside a segment: never one across a segment boundary or into padding).
    - Without a mask: every target after ``end_id`` (``loader.end_id``: the EOS that
      ends a padded episode) is -100; with ``end_id`` None (token windows) every
      target is trained.
    - ``seq_ids`` (packed rows) give the block-diagonal attention mask (``mask_fn``,
      default gpt.py's) and ``position_ids`` restart in each segment; both are None
      for other rows (plain causal attention).
    """
    if post_training and batch.mask is None:
        raise ConfigError("POST_TRAINING=1 (assistant-only loss) needs a dataset with loss masks, "
                          "but the loader returned none (no mask.bin). Prepare the dataset with "
                          "`sftdata prepare-chat`, or train with POST_TRAINING=0")
    if batch.mask is not None:
        targets = apply_ignore_index(batch.y, batch.mask)
    elif end_id is not None:
        targets = episode_end_targets(batch.x, batch.y, end_id)
    else:
        targets = batch.y
    attn = None if batch.seq_ids is None else (mask_fn or block_causal_mask)(batch.seq_ids)
    return StepInputs(batch.x, targets, batch.position_ids, attn)


# ----------------------------------------------------------------------- checkpoints
def _plain(v):
    """numpy values -> Python values, so a checkpoint loads with ``weights_only=True``."""
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return type(v)(_plain(x) for x in v)
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, np.generic):
        return v.item()
    return v


def rng_state() -> dict:
    np_state = np.random.get_state()
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
            "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
            "python": _plain(random.getstate())}


def set_rng_state(st: dict) -> None:
    torch.set_rng_state(st["torch"])
    if st["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])
    name, keys, *rest = st["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), *rest))
    version, internal, gauss = st["python"]
    random.setstate((version, tuple(internal), gauss))


def save_checkpoint(path: Path, *, model, optimizer, loader, step: int, settings: TrainSettings,
                    dataset: str) -> None:
    """Model, optimiser, loader position, step and RNG states; written atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    ckpt = {"format": CKPT_FORMAT, "version": CKPT_VERSION, "step": step,
            "model_config": model.cfg.as_dict(), "model": model.state_dict(),
            "optimizer": optimizer.state_dict(), "loader": _plain(loader.state_dict()),
            "rng": rng_state(), "settings": asdict(settings), "dataset": dataset}
    tmp = path.with_name(path.name + ".tmp")
    torch.save(ckpt, tmp)
    os.replace(tmp, path)


def load_checkpoint(path: Path) -> dict:
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ConfigError(f"checkpoint {path} does not exist; give the ckpt.pt a run wrote "
                          f"(in its --out-dir)") from None
    except IsADirectoryError:
        raise ConfigError(f"{path} is a folder; give the ckpt.pt file a run wrote (in its --out-dir)") from None
    except Exception as e:  # torch raises several types for a damaged or foreign file; its text is long
        raise ConfigError(f"{path} is not a readable training checkpoint: torch cannot load it ({type(e).__name__}); "
                          f"give the ckpt.pt a run wrote (in its --out-dir)") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != CKPT_FORMAT:
        raise ConfigError(f"{path} is not a checkpoint written by scripts/train.py")
    if ckpt.get("version") != CKPT_VERSION:
        raise ConfigError(f"{path}: checkpoint version {ckpt.get('version')!r} is not supported "
                          f"(this script writes {CKPT_VERSION})")
    return ckpt


# ----------------------------------------------------------------------- the loop
@dataclass
class TrainResult:
    steps: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    val_losses: dict[int, float] = field(default_factory=dict)
    tokens: int = 0  # x tokens seen
    trained_tokens: int = 0  # targets != -100
    seconds: float = 0.0  # training steps only (loader included; evaluation and checkpoints not)
    stopped_by: str = ""  # "max_iters" | "loader_end" | "stop_at"

    @property
    def trained_tokens_per_s(self) -> float:
        return self.trained_tokens / self.seconds if self.seconds else 0.0


def make_optimizer(model: GPT, s: TrainSettings) -> torch.optim.Optimizer:
    """AdamW; weight decay on matrices only (not on norms and biases)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": s.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=s.learning_rate, betas=(s.beta1, s.beta2))


@torch.no_grad()
def evaluate(model, val_inputs: list[StepInputs]) -> float:
    """Mean loss over fixed val batches (the same ones at every evaluation, so the
    numbers compare across a run and a resumed run)."""
    model.eval()
    losses = [model(v.x, v.position_ids, v.attn_mask, v.targets)[1].item() for v in val_inputs]
    model.train()
    return sum(losses) / len(losses)


def micro_loss(model, inp: StepInputs, step_trained: int) -> torch.Tensor:
    """One micro-batch's share of its optimizer step's loss: the sum of its token losses
    (targets != -100) divided by the trained targets of the whole step (``step_trained``,
    from ``loader.step_trained_tokens``). The shares of a step add up to the mean over
    all its trained targets, whatever the micro-batches hold; with one micro-batch this is
    the model's own mean loss. The token losses are summed in float64: a float32 sum of
    thousands of them would differ with the grouping by ~1e-6."""
    logits, _ = model(inp.x, inp.position_ids, inp.attn_mask)
    per_token = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), inp.targets.reshape(-1),
                                                  ignore_index=IGNORE_INDEX, reduction="none")
    return per_token.double().sum() / max(int(step_trained), 1)


def train_loop(model, optimizer, loader, s: TrainSettings, to_inputs, *, start_step: int = 0,
               stop_at: int | None = None, checkpoint=None, log=print,
               val_inputs: list[StepInputs] | None = None) -> TrainResult:
    """Steps ``start_step`` .. ``max_iters - 1``; ends early when the loader ends (packed
    datasets: one pass) or after step ``stop_at``. ``checkpoint(step)`` is called every
    ``checkpoint_interval`` steps and at the end; ``step`` there counts completed steps."""
    res = TrainResult()
    model.train()
    accum = s.grad_accum_steps
    end = s.max_iters if stop_at is None else min(s.max_iters, stop_at)
    t_start = t_log = time.perf_counter()
    tok_log = trained_log = 0
    step = start_step
    res.stopped_by = "max_iters" if end == s.max_iters else "stop_at"
    while step < end:
        total = loader.step_trained_tokens(accum)  # the whole step's, known before its micro-batches
        optimizer.zero_grad(set_to_none=True)
        loss_value, n_tok, n_trained, micro = 0.0, 0, 0, 0
        for _ in range(accum):
            try:
                batch = loader.get_batch("train")
            except StopIteration:
                break
            inp = to_inputs(batch)
            loss = micro_loss(model, inp, total)
            loss.backward()
            loss_value += loss.item()
            n_tok += inp.x.numel()
            n_trained += int((inp.targets != IGNORE_INDEX).sum())
            micro += 1
        if micro == 0:
            res.stopped_by = "loader_end"
            break
        lr = lr_at(step, s)
        for g in optimizer.param_groups:
            g["lr"] = lr
        if s.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
        optimizer.step()
        step += 1
        res.steps.append(step)
        res.losses.append(loss_value)
        res.tokens += n_tok
        res.trained_tokens += n_trained
        tok_log += n_tok
        trained_log += n_trained
        if step % s.log_interval == 0 or step == end:
            now = time.perf_counter()
            dt = max(now - t_log, 1e-9)
            # the printed step is the 0-based index of the batch just trained: the number
            # `sftdata replay-order --step` takes (so "step 12000" in a log is --step 12000)
            log(f"step {step - 1:>6}/{s.max_iters} | loss {res.losses[-1]:.4f} | lr {lr:.2e} | "
                f"{tok_log / dt:,.0f} tok/s | {trained_log / dt:,.0f} trained tok/s")
            t_log, tok_log, trained_log = now, 0, 0
        t_pause = time.perf_counter()  # evaluation and checkpoints do not count as training time
        if val_inputs and s.eval_interval and step % s.eval_interval == 0:
            res.val_losses[step] = evaluate(model, val_inputs)
            log(f"step {step - 1:>6}/{s.max_iters} | val loss {res.val_losses[step]:.4f}")
        if checkpoint and s.checkpoint_interval and step % s.checkpoint_interval == 0:
            checkpoint(step)
        paused = time.perf_counter() - t_pause
        t_start += paused
        t_log += paused
    res.seconds = time.perf_counter() - t_start
    if val_inputs and res.steps and step not in res.val_losses:  # always end with a val loss
        res.val_losses[step] = evaluate(model, val_inputs)
        log(f"step {step - 1:>6}/{s.max_iters} | val loss {res.val_losses[step]:.4f}")
    if checkpoint and res.steps and not (s.checkpoint_interval and step % s.checkpoint_interval == 0):
        checkpoint(step)
    return res



#!/usr/bin/env python
"""Train a small GPT on an sftdata dataset: the example client of ``sftdata.loader``.

::

    pip install -e ".[train]"
    python scripts/train.py --dataset data/chat_sft --config configs/sft/tiny.json --max-iters 200
    POST_TRAINING=1 WARMUP_PCT=0.05 python scripts/train.py --dataset data/chat_sft_packed ...

Settings come, strongest first, from the command line, the environment
(``POST_TRAINING``, ``WARMUP_PCT``), the config file (the loader's keys, plus the
training keys of ``trainer.TrainSettings``, which the loader keeps in ``cfg.extra``),
and the defaults. The model is scripts/gpt.py; the loop, targets, schedule and
checkpoints are scripts/trainer.py.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import asdict, replace
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # gpt.py and trainer.py sit beside this file
sys.path.insert(1, str(HERE.parent))  # the checkout's sftdata, also without `pip install -e .`
from gpt import GPT, GPTConfig  # noqa: E402
from trainer import (  # noqa: E402
    StepInputs,
    TrainResult,
    TrainSettings,
    apply_env,
    load_checkpoint,
    make_optimizer,
    save_checkpoint,
    set_rng_state,
    settings_from_extra,
    step_inputs,
    train_loop,
    training_keys,
)

from sftdata.errors import ConfigError, SftDataError  # noqa: E402
from sftdata.loader import LoaderConfig, make_loader  # noqa: E402
from sftdata.packing.attention import block_causal_mask  # noqa: E402


# ----------------------------------------------------------------------- the CLI
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="scripts/train.py",
        description="Train a small GPT on an sftdata dataset (token_stream, sft_episode or packed). "
                    "Environment: POST_TRAINING=1 (assistant-only loss), WARMUP_PCT=0.05 (warmup share "
                    "of the cosine schedule).")
    p.add_argument("--dataset", required=True, help="dataset folder (the --output-dir of prepare or pack)")
    p.add_argument("--config", required=True, help="JSON (with 'inherits') or XML <training> config")
    p.add_argument("--out-dir", default="out/train", help="checkpoint (ckpt.pt) and logs go here "
                                                          "[default: out/train]")
    p.add_argument("--max-iters", type=int, help="override the config's max_iters")
    p.add_argument("--device", default="cpu", help="torch device [default: cpu]")
    p.add_argument("--resume", metavar="CKPT", help="continue a run from its checkpoint: same model, "
                                                    "optimiser, LR schedule and loader position")
    p.add_argument("--init-from", metavar="CKPT", help="start from a checkpoint's model weights only "
                                                       "(new optimiser, schedule and data order)")
    p.add_argument("--stop-at", type=int, metavar="STEP", help="stop after this step (and checkpoint) "
                                                               "without changing the LR schedule")
    p.add_argument("--tokenizer", metavar="TOKENIZER", help="the model's tokenizer (a folder, a tokenizer.json, a "
                                                           "tiktoken name or a Hub id): refuse a dataset made with "
                                                           "another, naming both tokenizers' sha256 [default: no check]")
    p.add_argument("--audit-dir", help="audit log folder [default: OUT_DIR/logs/audit]")
    p.add_argument("--no-audit", action="store_true", help="write no audit log")
    p.add_argument("--quiet", action="store_true", help="print only the final line")
    return p.parse_args(argv)


def val_batches(cfg: LoaderConfig, s: TrainSettings, dataset: Path, device: str, log=print) -> list:
    """The first ``eval_iters`` val batches in file order, fixed for the whole run. A
    loader of their own (no shuffle, no drop_last, no audit) so a val split smaller than
    a batch still evaluates and the training loader's state is untouched. An empty val
    split (a --val-split that rounded to 0 episodes) means no evaluation, with a note."""
    if not s.eval_interval:
        return []
    quiet = logging.getLogger("sftdata.loader")
    level = quiet.level
    quiet.setLevel(logging.WARNING)  # its init and epoch lines would repeat or confuse the training loader's
    try:
        ev = make_loader(cfg.replace(epoch_shuffle=False, epoch_drop_last=False), dataset, backend="torch",
                         device=device)
        if "val" not in ev.splits:
            return []
        if ev.num_items("val") == 0:
            log(f"note: the val split of {dataset} is empty, so there is no evaluation (prepare with a larger "
                f"--val-split to evaluate)")
            return []
        total = ev.steps_total("val")  # a one-pass (packed) val split may hold fewer batches
        return [ev.get_batch("val") for _ in range(s.eval_iters if total is None else min(s.eval_iters, total))]
    finally:
        quiet.setLevel(level)


def resolve_settings(args: argparse.Namespace, env) -> tuple[LoaderConfig, TrainSettings]:
    """Config file < environment < command line. ``use_loss_mask`` and POST_TRAINING are
    one switch: the loader returns masks exactly when the loss uses them."""
    cfg = LoaderConfig.from_file(args.config, extra_keys=training_keys())
    s = settings_from_extra(dict(cfg.extra), args.config).validate(args.config)
    s = apply_env(replace(s, post_training=cfg.use_loss_mask), env)
    if args.max_iters is not None:
        s = replace(s, max_iters=args.max_iters).validate("--max-iters")
    return cfg.replace(use_loss_mask=s.post_training), s


def run(args: argparse.Namespace, env=None, log=print) -> TrainResult:
    """Build the loader, model and optimiser (or resume them), train, return the result."""
    cfg, s = resolve_settings(args, os.environ if env is None else env)
    dataset, out_dir = Path(args.dataset), Path(args.out_dir)
    if args.resume and args.init_from:
        raise ConfigError("give --resume (continue a run) or --init-from (new run from its weights), not both")
    ckpt = load_checkpoint(Path(args.resume)) if args.resume else None
    init = load_checkpoint(Path(args.init_from)) if args.init_from else None
    audit_dir = None if args.no_audit else Path(args.audit_dir or out_dir / "logs" / "audit")
    loader = make_loader(cfg, dataset, backend="torch", device=args.device, audit_dir=audit_dir,
                         tokenizer=args.tokenizer)
    total = loader.steps_total("train")  # None: endless; else one pass, and the LR schedule ends with the data
    if total is not None:  # optimizer steps of grad_accum_steps batches each
        s = replace(s, max_iters=min(s.max_iters, -(-total // s.grad_accum_steps)))

    vocab = loader.vocab_size
    if ckpt or init:
        mcfg = GPTConfig(**(ckpt or init)["model_config"])
    else:
        if not (s.vocab_size or vocab):
            raise ConfigError(f"{dataset} records no tokenizer (no vocab size); set vocab_size in {args.config}")
        if s.vocab_size and vocab and s.vocab_size < vocab:
            raise ConfigError(f"{args.config}: vocab_size {s.vocab_size} is smaller than the vocabulary of "
                              f"{dataset}'s tokenizer ({vocab}); set vocab_size to 0 (use the tokenizer's) "
                              f"or to at least {vocab}")
        mcfg = s.model_config(s.vocab_size or vocab)
    torch.manual_seed(s.seed)
    model = GPT(mcfg).to(args.device)
    optimizer = make_optimizer(model, s)
    start = 0
    if init:
        model.load_state_dict(init["model"])
    if ckpt:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        loader.load_state_dict(ckpt["loader"])
        set_rng_state(ckpt["rng"])
        start = int(ckpt["step"])
        changed = [k for k, v in asdict(s).items() if ckpt["settings"].get(k) != v]
        if changed:
            log(f"note: resuming with other settings than the checkpoint's ({', '.join(changed)}); the run "
                f"will not match an uninterrupted one")

    def to_inputs(batch) -> StepInputs:
        return step_inputs(batch, post_training=s.post_training, end_id=loader.end_id, mask_fn=block_causal_mask)

    ckpt_path = out_dir / "ckpt.pt"

    def checkpoint(step: int) -> None:
        save_checkpoint(ckpt_path, model=model, optimizer=optimizer, loader=loader, step=step, settings=s,
                        dataset=str(dataset))

    say = (lambda *_: None) if args.quiet else log
    say(f"model: {model.num_params():,} parameters ({mcfg.n_layer} layers x {mcfg.n_embd}, vocab "
        f"{mcfg.vocab_size:,}) | {loader.mode} | assistant-only loss {'on' if s.post_training else 'off'} | warmup "
        f"{int(round(s.warmup_pct * s.max_iters))} of {s.max_iters} steps"
        + (f" | resumed after step {start}" if ckpt else ""))
    val = [to_inputs(b) for b in val_batches(cfg, s, dataset, args.device, log=say)]
    res = train_loop(model, optimizer, loader, s, to_inputs, start_step=start, stop_at=args.stop_at,
                     checkpoint=checkpoint, log=say, val_inputs=val)
    if total is not None and loader.step("train") >= total:
        res.stopped_by = "loader_end"
    log(f"done: {len(res.steps)} steps ({res.stopped_by}), {res.trained_tokens:,} trained of {res.tokens:,} "
        f"tokens, {res.trained_tokens_per_s:,.0f} trained tok/s; checkpoint {ckpt_path}")
    return res


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO, format="%(message)s")
    try:
        run(args)
    except SftDataError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        ckpt = Path(args.out_dir) / "ckpt.pt"
        then = (f"the last checkpoint is {ckpt}: continue with --resume {ckpt}" if ckpt.is_file()
                else "no checkpoint was written yet")
        print(f"error: interrupted; {then}", file=sys.stderr)
        return 130
    except OSError as e:  # --out-dir under a file, no permission, a full disk
        print(f"error: {e.filename + ': ' if e.filename else ''}{e.strerror or e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

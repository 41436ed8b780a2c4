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
import os
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpt.py and trainer.py sit beside this file
from gpt import GPT, GPTConfig, block_causal_mask  # noqa: E402
from trainer import (StepInputs, TrainResult, apply_env, load_checkpoint, make_optimizer,  # noqa: E402
                     save_checkpoint, set_rng_state, settings_from_extra, step_inputs, train_loop)

from sftdata.errors import ConfigError, SftDataError  # noqa: E402


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
    p.add_argument("--audit-dir", help="audit log folder [default: OUT_DIR/logs/audit]")
    p.add_argument("--no-audit", action="store_true", help="write no audit log")
    p.add_argument("--quiet", action="store_true", help="print only the final line")
    return p.parse_args(argv)


def dataset_vocab_size(dataset: Path) -> int | None:
    """Vocab size recorded in the dataset's tokenizer state, or None (e.g. a bare token stream)."""
    from sftdata.store import TOKENIZER_FILE, read_json

    path = dataset / TOKENIZER_FILE
    return int(read_json(path)["vocab_size"]) if path.is_file() else None


def attention_mask_fn():
    """sftdata.attention's block mask when installed (the pack issue), else gpt.py's."""
    try:
        from sftdata.attention import block_causal_mask as lib_mask  # noqa: F401
    except ImportError:
        return block_causal_mask
    return lib_mask


def run(args: argparse.Namespace, env: dict | None = None, log=print) -> TrainResult:
    from sftdata.loader import LoaderConfig, make_loader

    env = os.environ if env is None else env
    cfg = LoaderConfig.from_file(args.config)
    s = settings_from_extra(dict(cfg.extra), args.config).validate(args.config)
    s = replace(s, post_training=bool(cfg.use_loss_mask))
    s = apply_env(s, env)
    if args.max_iters is not None:
        s = replace(s, max_iters=args.max_iters).validate("--max-iters")
    cfg = replace(cfg, use_loss_mask=s.post_training)
    dataset, out_dir = Path(args.dataset), Path(args.out_dir)
    audit_dir = None if args.no_audit else Path(args.audit_dir or out_dir / "logs" / "audit")
    loader = make_loader(cfg, dataset, backend="torch", device=args.device, audit_dir=audit_dir)

    ckpt = load_checkpoint(Path(args.resume)) if args.resume else None
    init = load_checkpoint(Path(args.init_from)) if args.init_from else None
    if ckpt is not None and init is not None:
        raise ConfigError("give --resume or --init-from, not both")
    if ckpt is not None or init is not None:
        mcfg = GPTConfig(**(ckpt or init)["model_config"])
    else:
        vocab = s.vocab_size or dataset_vocab_size(dataset)
        if not vocab:
            raise ConfigError(f"{dataset} records no tokenizer vocab size; set vocab_size in {args.config}")
        mcfg = s.model_config(vocab)
    torch.manual_seed(s.seed)
    model = GPT(mcfg).to(args.device)
    optimizer = make_optimizer(model, s)
    start = 0
    if init is not None:
        model.load_state_dict(init["model"])
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        loader.load_state_dict(ckpt["loader"])
        set_rng_state(ckpt["rng"])
        start = int(ckpt["step"])

    eos_id = _eos_id(dataset)
    if eos_id < 0 and cfg.pad_token_id is not None:
        eos_id = int(cfg.pad_token_id)
    mask_fn = attention_mask_fn()
    kind = getattr(loader, "kind", None) or getattr(loader, "dataset_mode", "")
    episodes = kind != "token_stream"

    def to_inputs(batch) -> StepInputs:
        return step_inputs(batch, post_training=s.post_training, episodes=episodes, eos_id=eos_id,
                           pad_seq_id=getattr(loader, "pad_seq_id", None), mask_fn=mask_fn)

    ckpt_path = out_dir / "ckpt.pt"

    def checkpoint(step: int) -> None:
        save_checkpoint(ckpt_path, model=model, optimizer=optimizer, loader=loader, step=step,
                        settings=s, dataset=str(dataset))

    say = (lambda *_: None) if args.quiet else log
    say(f"model: {model.num_params():,} parameters ({mcfg.n_layer} layers, {mcfg.n_embd} wide, vocab "
        f"{mcfg.vocab_size:,}) | mode {kind} | assistant-only loss {'on' if s.post_training else 'off'} | "
        f"warmup {int(round(s.warmup_pct * s.max_iters))} of {s.max_iters} steps"
        + (f" | resumed at step {start}" if ckpt is not None else ""))
    res = train_loop(model, optimizer, loader, s, to_inputs, start_step=start, stop_at=args.stop_at,
                     checkpoint=checkpoint, log=say, evaluate_val=True)
    log(f"done: {len(res.steps)} steps ({res.stopped_by}), {res.trained_tokens:,} trained of "
        f"{res.tokens:,} tokens, {res.trained_tokens_per_s:,.0f} trained tok/s; checkpoint {ckpt_path}")
    return res


def _eos_id(dataset: Path) -> int:
    from sftdata.store import TOKENIZER_FILE, read_json

    path = dataset / TOKENIZER_FILE
    return int(read_json(path)["eos_id"]) if path.is_file() else -1


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        run(args)
    except SftDataError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())

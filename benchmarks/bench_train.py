"""Useful (trained) tokens per second: padded episodes against packed rows.

Same generated chat data, same model (scripts/gpt.py, same seed), same batch shape
(batch_size x block_size), same process: the only difference is the loader's rows.

    python benchmarks/bench_train.py                 # ~1-2 minutes on 2 CPU cores
    python benchmarks/bench_train.py --steps 20 --block-size 1024 --device cuda

A padded row holds one conversation and padding; a packed row holds several
conversations behind a block-diagonal attention mask. Both train only the assistant
tokens (POST_TRAINING=1). Every step costs the same compute, so the speedup is the
trained tokens per row, less whatever the explicit attention mask costs over plain
causal attention (measured here too, as the step-time ratio).
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "scripts"), str(ROOT / "benchmarks"), str(ROOT)]

import torch  # noqa: E402
from corpus import _text  # noqa: E402
from gpt import GPT  # noqa: E402
from trainer import TrainSettings, make_optimizer, step_inputs, train_loop  # noqa: E402

from sftdata.loader import LoaderConfig, make_loader  # noqa: E402
from sftdata.pack import PackOptions, pack  # noqa: E402
from sftdata.packing.attention import block_causal_mask  # noqa: E402
from sftdata.prepare import PrepareOptions, prepare  # noqa: E402


def short_chats(path: Path, n: int, seed: int = 0) -> None:
    """Typical SFT chats: 1-3 exchanges, a system prompt in a third, short replies."""
    rng = random.Random(seed)
    with open(path, "wb") as f:
        for _ in range(n):
            msgs = [{"role": "system", "content": _text(rng, 12)}] if rng.random() < 0.33 else []
            for _ in range(rng.randint(1, 3)):
                msgs.append({"role": "user", "content": _text(rng, 20)})
                msgs.append({"role": "assistant", "content": _text(rng, 45)})
            f.write(orjson.dumps({"messages": msgs}) + b"\n")


def measure(dataset: Path, args, label: str) -> dict:
    cfg = LoaderConfig(batch_size=args.batch_size, block_size=args.block_size, use_loss_mask=True)
    loader = make_loader(cfg, dataset, backend="torch", device=args.device)
    s = TrainSettings(n_layer=args.n_layer, n_head=args.n_head, n_embd=args.n_embd, max_iters=args.steps + 1,
                      warmup_pct=0.0, post_training=True, log_interval=10**9, eval_interval=0)
    torch.manual_seed(0)
    model = GPT(s.model_config(args.vocab)).to(args.device)
    opt = make_optimizer(model, s)

    def to_inputs(b):
        return step_inputs(b, post_training=True, end_id=loader.end_id, mask_fn=block_causal_mask)

    quiet = lambda *_: None  # noqa: E731
    train_loop(model, opt, loader, s, to_inputs, stop_at=1, log=quiet)  # warm-up step, not timed
    res = train_loop(model, opt, loader, s, to_inputs, start_step=1, log=quiet)
    steps = len(res.steps)
    # the trained tokens of a whole pass (epoch 0), from the loader's numpy batches: the
    # timed steps are few, and their rows may be shorter or longer than the average
    ref = make_loader(cfg, dataset, backend="numpy")
    n = ref.order("train").batches_in_epoch(0)  # the whole pass of a packed dataset
    per_step = sum(float(ref.batch_at("train", i).mask.sum()) for i in range(n)) / n
    return {"mode": label, "steps": steps, "s_per_step": res.seconds / steps,
            "trained_per_step": res.trained_tokens / steps, "trained_tok_s": res.trained_tokens_per_s,
            "tok_s": res.tokens / res.seconds, "stopped_by": res.stopped_by, "pass_steps": n,
            "pass_trained_per_step": per_step, "pass_trained_tok_s": per_step / (res.seconds / steps)}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", type=int, default=600)
    p.add_argument("--block-size", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--steps", type=int, default=6, help="timed steps per mode (after one warm-up step)")
    p.add_argument("--n-layer", type=int, default=2)
    p.add_argument("--n-head", type=int, default=2)
    p.add_argument("--n-embd", type=int, default=64)
    p.add_argument("--device", default="cpu")
    p.add_argument("--work", default=str(ROOT / "benchmarks" / "_work" / "train"))
    args = p.parse_args(argv)

    work = Path(args.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    short_chats(work / "chats.jsonl", args.records)
    summary = prepare([work / "chats.jsonl"], work / "episodes", PrepareOptions())
    report = pack(work / "episodes", work / "packed", PackOptions(block_size=args.block_size))
    r = report.splits["train"]
    tok = summary.as_dict()
    args.vocab = 100283  # cl100k + chat markers (sftdata's default tokenizer)
    print(f"data: {tok['episodes']['train']} conversations, {tok['tokens']['train']:,} tokens, "
          f"{tok['trained_tokens']['train']:,} trained; rows of {r.row_len}: padded {r.padding_rows} "
          f"(fill {r.padding_fill:.3f}), packed {r.rows} (fill {r.fill:.3f}, trained tokens lost "
          f"{r.trained_lost})")
    print(f"model: {args.n_layer} layers x {args.n_embd}, vocab {args.vocab:,}; batch {args.batch_size} x "
          f"{args.block_size}; {args.steps} timed steps per mode; torch {torch.__version__} on {args.device} "
          f"({torch.get_num_threads()} threads)")
    t0 = time.perf_counter()
    rows = [measure(work / "episodes", args, "padded episodes"), measure(work / "packed", args, "packed rows")]
    print(f"{'mode':<16} {'s/step':>7} {'tok/s':>7} {'trained/step':>13} {'trained tok/s':>14} "
          f"{'| pass: steps':>13} {'trained/step':>13} {'trained tok/s':>14}")
    for m in rows:
        print(f"{m['mode']:<16} {m['s_per_step']:>7.3f} {m['tok_s']:>7,.0f} {m['trained_per_step']:>13,.0f} "
              f"{m['trained_tok_s']:>14,.0f} {'| ' + str(m['pass_steps']):>13} {m['pass_trained_per_step']:>13,.0f} "
              f"{m['pass_trained_tok_s']:>14,.0f}")
    pad, pk = rows
    print(f"packed / padded: {pk['trained_tok_s'] / pad['trained_tok_s']:.2f}x trained tokens per second over "
          f"the timed steps, {pk['pass_trained_tok_s'] / pad['pass_trained_tok_s']:.2f}x over a whole pass "
          f"({pk['pass_trained_per_step'] / pad['pass_trained_per_step']:.2f}x trained tokens per step; step "
          f"time {pk['s_per_step'] / pad['s_per_step']:.2f}x, the cost of the block mask); "
          f"{time.perf_counter() - t0:.0f} s")
    for m in rows:
        if m["steps"] < args.steps:
            print(f"note: {m['mode']} ran {m['steps']} steps ({m['stopped_by']}); raise --records")


if __name__ == "__main__":
    main()

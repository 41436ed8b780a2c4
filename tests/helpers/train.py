"""For the tests of scripts/train.py: a byte-level tokenizer a tiny model trains on in
milliseconds, the conversations it learns, a tiny config, and the script's arguments."""

from __future__ import annotations

import base64
import json
from pathlib import Path


def byte_tokenizer(path: Path) -> Path:
    """A byte-level ranks file: vocab 256 + 10 chat tokens = 266, so a tiny model trains in
    milliseconds per step (cl100k's 100k-wide output layer would dominate)."""
    path.write_text("".join(f"{base64.b64encode(bytes([i])).decode()} {i}\n" for i in range(256)))
    return path


def conversations(n=24):
    out = []
    for i in range(n):
        a, b = i % 7 + 1, i % 5 + 2
        msgs = [{"role": "user", "content": f"add {a} and {b}"},
                {"role": "assistant", "content": f"{a}+{b}={a + b}"}]
        if i % 3 == 0:
            msgs.insert(0, {"role": "system", "content": "math"})
        out.append({"messages": msgs})
    return out


def train_config(path: Path, **kw) -> Path:
    """A tiny model's training config (2 layers, 30 steps), ``kw`` changing any setting."""
    cfg = {"batch_size": 4, "block_size": 32, "n_layer": 2, "n_head": 2, "n_embd": 32, "learning_rate": 1e-2,
           "min_lr": 1e-3, "max_iters": 30, "warmup_pct": 0.1, "log_interval": 10, "eval_interval": 0,
           "checkpoint_interval": 0, "use_loss_mask": True, **kw}
    path.write_text(json.dumps(cfg))
    return path


def train_args(dataset, config, out, *extra):
    """scripts/train.py's parsed arguments."""
    import train  # lazy: scripts/train.py needs torch, which the modules calling this skip without

    return train.parse_args(["--dataset", str(dataset), "--config", str(config), "--out-dir", str(out), *extra])

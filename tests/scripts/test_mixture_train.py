"""scripts/train.py on a mixture file: an 80/20 mixture trains, its audit log replays, and a
stopped run resumes to exactly the uninterrupted one."""

from __future__ import annotations

import csv
import io
import json
from collections import Counter

import pytest

torch = pytest.importorskip("torch")

import train  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from sftdata.cli import app  # noqa: E402
from sftdata.prepare import PrepareOptions, prepare  # noqa: E402
from sftdata.store.mixture import make_mixture  # noqa: E402
from tests.helpers.train import byte_tokenizer, conversations, train_args, train_config  # noqa: E402


@pytest.fixture(scope="module")
def mix(tmp_path_factory):
    d = tmp_path_factory.mktemp("mix_train")
    tokfile = byte_tokenizer(d / "bytes.tiktoken")
    for name, n in (("a", 10), ("b", 30)):
        src = d / f"{name}.jsonl"
        src.write_text("".join(json.dumps(r) + "\n" for r in conversations(n)))
        prepare([src], d / name, PrepareOptions(val_split=0.2, tokenizer=str(tokfile)))
    make_mixture([(None, str(d / "a"), 0.8), (None, str(d / "b"), 0.2)], d / "mix.json")
    return d / "mix.json"


def test_an_80_20_mixture_trains_replays_and_resumes_exactly(mix, tmp_path):
    cfg = train_config(tmp_path / "c.json", max_iters=8, eval_interval=4, eval_iters=1)
    env = {"POST_TRAINING": "1"}
    quiet = lambda *_: None  # noqa: E731
    full = train.run(train_args(mix, cfg, tmp_path / "a"), env=env, log=quiet)
    part = train.run(train_args(mix, cfg, tmp_path / "b", "--stop-at", "3"), env=env, log=quiet)
    rest = train.run(train_args(mix, cfg, tmp_path / "b", "--resume", str(tmp_path / "b" / "ckpt.pt")), env=env, log=quiet)
    assert part.losses + rest.losses == full.losses and len(full.losses) == 8
    log = next((tmp_path / "a" / "logs" / "audit").glob("audit_*.log"))
    r = CliRunner().invoke(app, ["replay-order", str(mix), "--config", str(cfg), "--check-audit", str(log)])
    assert r.exit_code == 0, r.stderr
    r = CliRunner().invoke(app, ["replay-order", str(mix), "--config", str(cfg), "--csv"])
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    n = len(rows)  # 32 eligible train episodes: 8 + 24
    assert n == 32 and Counter(row["dataset"] for row in rows) == {"a": round(0.8 * n), "b": n - round(0.8 * n)}

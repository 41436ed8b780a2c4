"""Small datasets for the inspect/verify tests, built with prepare from inline chats,
and the tools to damage them one fault at a time."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from sftdata.prepare import PrepareOptions, prepare
from sftdata.store.format import METADATA_CHECKSUM, metadata_sha256

USER_TEXTS = ["What is the capital of France?", "Name three primes.", "Translate 'cat' to German.",
              "How many legs has a spider?", "What is 7 times 8?", "Spell 'banana' backwards.",
              "Which planet is largest?", "What colour is the sky?"]
ASSISTANT_TEXTS = ["Paris.", "2, 3 and 5.", "Katze.", "Eight.", "56.", "ananab.", "Jupiter.", "Blue, on a clear day."]


def chats(n: int = 8, offset: int = 0) -> list[dict]:
    out = []
    for i in range(n):
        j = (i + offset) % len(USER_TEXTS)
        msgs = [{"role": "system", "content": "Be brief."}] if i % 3 == 0 else []
        msgs += [{"role": "user", "content": USER_TEXTS[j]}, {"role": "assistant", "content": ASSISTANT_TEXTS[j]}]
        if i % 2:
            msgs += [{"role": "user", "content": "Thanks! And again?"}, {"role": "assistant", "content": "Sure."}]
        out.append({"messages": msgs})
    return out


def make_dataset(tmp: Path, name: str = "ds", *, records=None, val_split: float = 0.25,
                 shard_tokens: int = 100, bad_lines: int = 0, tokenizer: str | None = None) -> Path:
    """A dataset prepared from ``records`` (default ``chats()``); ``bad_lines`` rejected
    records (invalid JSON) are appended to the input."""
    tmp.mkdir(parents=True, exist_ok=True)
    src = tmp / f"{name}.jsonl"
    lines = [json.dumps(r) for r in (records if records is not None else chats())]
    lines += ["{not json"] * bad_lines
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp / name
    prepare([src], out, PrepareOptions(val_split=val_split, shard_tokens=shard_tokens, workers=1,
                                             tokenizer=tokenizer))
    return out


def shard(ds: Path, split: str = "train", i: int = 0) -> Path:
    return ds / split / f"shard_{i:05d}"


def read_idx(path: Path) -> np.ndarray:
    return np.fromfile(path, dtype="<u8").reshape(-1, 2)


def write_idx(path: Path, idx: np.ndarray) -> None:
    np.ascontiguousarray(idx, dtype="<u8").tofile(path)


def edit_metadata(ds: Path, fn, *, reseal: bool = True) -> None:
    """Apply ``fn`` to the metadata. ``reseal`` records the edited metadata's own sha256,
    as a writer that wrote these values would (the checks of the data are then tested
    alone); without it the edit shows as an edit (metadata_checksum)."""
    p = ds / "dataset_metadata.json"
    meta = json.loads(p.read_text())
    fn(meta)
    if reseal and METADATA_CHECKSUM in meta:
        meta[METADATA_CHECKSUM]["sha256"] = metadata_sha256(meta)
    p.write_text(json.dumps(meta))


def to_flat(ds: Path, out: Path, *, mask_dtype=np.uint8, with_mask: bool = True) -> Path:
    """The older flat layout (train/tokens.bin uint32 + episodes.idx [+ mask.bin], no
    metadata) holding the train split of ``ds``."""
    from sftdata.store import open_dataset

    sp = open_dataset(ds).split("train")
    d = out / "train"
    d.mkdir(parents=True)
    toks = np.concatenate([np.asarray(s.tokens) for s in sp.shards]).astype("<u4")
    mask = np.concatenate([np.asarray(s.mask) for s in sp.shards]).astype(mask_dtype)
    toks.tofile(d / "tokens.bin")
    if with_mask:
        mask.tofile(d / "mask.bin")
    idx = np.stack([np.concatenate([[0], np.cumsum(sp.lengths)[:-1]]), sp.lengths], axis=1)
    write_idx(d / "episodes.idx", idx)
    return out


def copy_shard(src: Path, dst: Path) -> None:
    shutil.rmtree(dst)
    shutil.copytree(src, dst)


def make_packed(tmp: Path, name: str = "packed", *, source: Path | None = None, **opts) -> Path:
    """A packed dataset of ``source`` (default: a fresh ``make_dataset`` without val)."""
    from sftdata.pack import PackOptions, pack

    src = source if source is not None else make_dataset(tmp, f"{name}_src", val_split=0.0)
    pack(src, tmp / name, PackOptions(**opts))
    return tmp / name


def read_segments(path: Path) -> np.ndarray:
    return np.fromfile(path, dtype="<u8").reshape(-1, 7)


def write_segments(path: Path, seg: np.ndarray) -> None:
    np.ascontiguousarray(seg, dtype="<u8").tofile(path)

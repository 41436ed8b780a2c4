"""Pair, KTO and prompts datasets written exactly as the shared design says (issue 33),
for the tests of everything that reads them. Every token says which row and part it is,
so a test can state exactly which tokens a batch must hold:

    prompt of row r:     r * 1000 + 1 + j
    chosen / completion: r * 1000 + 300 + j     (mask 1, its last token 0)
    rejected:            r * 1000 + 600 + j     (mask 1, its last token 0)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson

from sftdata.prepare.rerender import rerender_records
from sftdata.store import TOKENIZER_FILE
from sftdata.store.format import (
    COLUMNS_FILE,
    ENTRIES_PER_ROW,
    EPISODES_FILE,
    LABELS_FILE,
    MASK_FILE,
    SOURCES_FILE,
    TOKENS_FILE,
    shard_name,
)
from sftdata.store.writer import DatasetWriter
from sftdata.util.hashing import sha256_file
from sftdata.verify import VerifyReport, verify

PAD = 7
OFFSETS = (1, 300, 600)  # prompt, chosen (completion), rejected


def part_tokens(row: int, part: int, n: int) -> np.ndarray:
    return row * 1000 + OFFSETS[part] + np.arange(n, dtype=np.int64)


def part_mask(part: int, n: int) -> np.ndarray:
    m = np.zeros(n, np.uint8) if part == 0 else np.ones(n, np.uint8)
    if part and n > 1:
        m[-1] = 0  # a token after the end of turn that is not trained
    return m


def sequence(row: int, side: int, lengths) -> tuple[np.ndarray, np.ndarray]:
    """``prompt + completion side`` of a row with part lengths ``lengths``: tokens, mask."""
    p = lengths[0]
    if len(lengths) == 1:
        return part_tokens(row, 0, p), part_mask(0, p)
    c = lengths[1 + side]
    return (np.concatenate([part_tokens(row, 0, p), part_tokens(row, 1 + side, c)]),
            np.concatenate([part_mask(0, p), part_mask(1 + side, c)]))


def write_rows(path: Path, kind: str, lengths, *, rows_per_shard: int = 1 << 30, val_lengths=None, records=None,
               labels=None, columns=None, vocab: int = 1 << 20, tokens=part_tokens) -> Path:
    """A ``kind`` dataset (pairs, kto, prompts) whose train row ``r`` has parts of
    ``lengths[r]`` tokens (a tuple of ENTRIES_PER_ROW[kind] lengths), ``rows_per_shard`` rows
    per shard. ``records``: each train row's input record (default 10 + 2r); ``labels``
    (kto): default r % 2; ``columns`` (prompts): default {"answer": "\\"<r>\\""}; ``tokens(row, part,
    n)``: the ids of a part (default ``part_tokens``)."""
    k = ENTRIES_PER_ROW[kind]
    with DatasetWriter(path) as w:
        splits, pairs = {}, {}
        for split, lens in (("train", lengths), ("val", val_lengths)):
            if lens is None:
                continue
            lens = [tuple(int(v) for v in x) for x in lens]
            if any(len(x) != k for x in lens):
                raise ValueError(f"a {kind} row has {k} parts")
            recs = list(records) if records is not None and split == "train" else [10 + 2 * r for r in range(len(lens))]
            shards, first = [], 0
            for s0 in range(0, max(len(lens), 1), rows_per_shard):
                rows = range(s0, min(s0 + rows_per_shard, len(lens)))
                shards.append(_write_shard(w.path / split / shard_name(len(shards)), kind, rows, lens, recs,
                                           labels, columns, tokens))
                first += len(rows)
            splits[split] = {"episodes": sum(s["episodes"] for s in shards), "tokens": sum(s["tokens"] for s in shards),
                             "trained_tokens": sum(s["trained_tokens"] for s in shards), "shards": shards}
            pairs[split] = len(lens)
        w.write_json(TOKENIZER_FILE, {"eos_id": PAD, "vocab_size": vocab, "special_tokens": {"<|EOS|>": PAD}})
        w.commit({"kind": kind, "token_dtype": "uint32", "splits": splits, "pairs": pairs,
                  "truncation": {"max_length": None, "max_prompt_length": None, "mode": "keep-end"}})
    return Path(path)


def _write_shard(d: Path, kind: str, rows, lens, recs, labels, columns, tokens) -> dict:
    d.mkdir(parents=True)
    toks, masks, idx = [], [], []
    pos = 0
    for r in rows:
        for part, n in enumerate(lens[r]):
            toks.append(tokens(r, part, n))
            masks.append(part_mask(part, n))
            idx.append((pos, n))
            pos += n
    t = np.concatenate(toks).astype("<u4") if toks else np.empty(0, "<u4")
    m = np.concatenate(masks).astype(np.uint8) if masks else np.empty(0, np.uint8)
    t.tofile(d / TOKENS_FILE)
    m.tofile(d / MASK_FILE)
    np.asarray(idx, dtype="<u8").reshape(-1, 2).tofile(d / EPISODES_FILE)
    np.asarray([recs[r] for r in rows], dtype="<u8").tofile(d / SOURCES_FILE)
    if kind == "kto":
        np.asarray([(labels[r] if labels is not None else r % 2) for r in rows], dtype=np.uint8).tofile(d / LABELS_FILE)
    if kind == "prompts":
        lines = [orjson.dumps({"row": r, "record": recs[r],
                               "columns": columns[r] if columns is not None else {"answer": f'"{r}"'}})
                 for r in rows]
        (d / COLUMNS_FILE).write_bytes(b"".join(line + b"\n" for line in lines))
    files = {fn.name: {"bytes": fn.stat().st_size, "sha256": sha256_file(fn)} for fn in sorted(d.iterdir())}
    return {"name": d.name, "episodes": len(idx), "tokens": int(t.size), "trained_tokens": int(m.sum()),
            "files": files, "token_id_range": [int(t.min()), int(t.max())] if t.size else [0, 0],
            "mask_value_range": [0, 1]}


# lengths (prompt, chosen, rejected) of the pairs the tests read: 9 pairs, 3 per shard
PAIR_LENGTHS = [(3, 2, 4), (2, 5, 1), (4, 3, 3), (1, 2, 2), (5, 4, 6), (2, 2, 3), (3, 6, 2), (2, 3, 3), (4, 1, 2)]


EVERY_ROW = 1 << 40  # --retokenize N with N above any row count: every row rendered again


def verify_every_row(path, **kw) -> VerifyReport:
    """``verify`` of a row dataset with every row rendered again from its input record
    (``--retokenize`` of all of them: the drift check, ids and masks)."""
    return verify(path, retokenize_episodes=EVERY_ROW, rerender=rerender_records, **kw)

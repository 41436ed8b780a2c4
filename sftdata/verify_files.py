"""The file-level side of ``verify``: opening a possibly broken dataset tolerantly, and
the checks of its description files, file list and checksums.

Every function records problems on the run (``run.problems``), notes what cannot be
checked (``run.report.notes``, ``run.skip``) and carries on: verify never stops at the
first problem.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .errors import DatasetError, SftDataError
from .store import (
    EPISODES_FILE,
    FORMAT_NAME,
    FORMAT_VERSION,
    IDX_DTYPE,
    MASK_FILE,
    METADATA_FILE,
    SEGMENT_FIELDS,
    SEGMENTS_FILE,
    SOURCES_FILE,
    SPLITS,
    TOKENIZER_FILE,
    TOKENS_FILE,
    Dataset,
    list_shards,
    read_json,
    token_dtype_for,
)
from .tokenizer import MarkerIds, load_tokenizer, tokenizer_from_state
from .verify_checks import RECREATE, REPACK, Part, Problem, Vocab, check_shard_list


# ------------------------------------------------------------------------- opening
def read_values(path: Path, dtype) -> np.ndarray:
    """Read-only map of the whole values in ``path`` (a truncated tail is ignored here:
    the sizes check reports it)."""
    dtype = np.dtype(dtype)
    n = path.stat().st_size // dtype.itemsize
    return np.memmap(path, dtype=dtype, mode="r", shape=(n,)) if n else np.empty(0, dtype)


def open_part(root: Path, split: str, name: str, d: Path, dtype: np.dtype, first_gid: int,
              meta: dict | None, problems: list[Problem], packed: bool = False) -> Part:
    """A shard (or a flat split folder) opened tolerantly: what exists is mapped, what is
    missing or malformed is recorded as a problem and left None."""
    rel = d.relative_to(root).as_posix()
    part = Part(split=split, name=name, rel=rel, dir=d, first_gid=first_gid, token_dtype=dtype, meta=meta,
                recreate=REPACK if packed else RECREATE)
    if name == split:  # the older flat layout
        required: tuple = (TOKENS_FILE, EPISODES_FILE)
    else:
        required = (TOKENS_FILE, MASK_FILE, EPISODES_FILE, SEGMENTS_FILE if packed else SOURCES_FILE)
    listed = tuple((meta or {}).get("files", {}))
    for fn in dict.fromkeys(required + listed):
        if not (d / fn).is_file():
            problems.append(Problem("files", f"{rel}/{fn}", "", f"{rel}/{fn} is missing",
                                    "restore the file from a good copy of the dataset, or " + part.recreate))
    if (d / TOKENS_FILE).is_file():
        part.tokens = read_values(d / TOKENS_FILE, dtype)
    if (d / EPISODES_FILE).is_file():
        part.episodes = read_values(d / EPISODES_FILE, IDX_DTYPE).reshape(-1, 2)
    if (d / MASK_FILE).is_file():
        n = 0 if part.tokens is None else part.tokens.shape[0]
        size = (d / MASK_FILE).stat().st_size
        part.mask = read_values(d / MASK_FILE, "<f4" if size == 4 * n and n else np.uint8)
    if (d / SOURCES_FILE).is_file():
        part.sources = read_values(d / SOURCES_FILE, IDX_DTYPE)
    if packed and (d / SEGMENTS_FILE).is_file():
        seg = read_values(d / SEGMENTS_FILE, IDX_DTYPE)
        k = len(SEGMENT_FIELDS)
        part.segments = seg[:seg.shape[0] // k * k].reshape(-1, k)
    return part


def parts_from_dataset(ds: Dataset) -> list[Part]:
    """Parts over an already opened dataset (store did the opening and its own checks)."""
    parts = []
    for split, sp in ds.splits.items():
        metas = shard_metas(ds.metadata, split)
        for i, sh in enumerate(sp.shards):
            first = int(sp.episode_offsets[i])
            parts.append(Part(split=split, name=sh.name, rel=sh.path.relative_to(ds.root).as_posix(),
                              dir=sh.path, first_gid=first, token_dtype=ds.token_dtype,
                              meta=metas.get(sh.name), tokens=sh.tokens, mask=sh.mask,
                              episodes=sh.episodes, sources=sh.sources, segments=getattr(sh, "segments", None),
                              recreate=REPACK if ds.kind == "packed" else RECREATE))
    return parts


def shard_metas(meta: dict | None, split: str) -> dict:
    shards = ((meta or {}).get("splits", {}).get(split) or {}).get("shards") or []
    return {s.get("name"): s for s in shards if isinstance(s, dict)}


def vocab_from_state(state: dict | None) -> Vocab | None:
    try:
        return Vocab(MarkerIds.from_special_tokens(state["special_tokens"]), int(state["vocab_size"]))
    except (SftDataError, KeyError, TypeError, ValueError):
        return None


def check_metadata(run, layout: str) -> dict | None:
    root, meta = run.root, None
    path = root / METADATA_FILE
    if not path.is_file():
        if layout == "sharded":
            run.problems.append(Problem("metadata", METADATA_FILE, "", f"{METADATA_FILE} is missing: the "
                                        "dataset was never completed (prepare writes it last) or it was deleted",
                                        "re-create the dataset; without it counts and checksums cannot be checked"))
        else:
            run.report.notes.append(f"older flat layout without {METADATA_FILE}: counts, file sizes and "
                                    "checksums cannot be checked against a record of what was written")
        run.skip("counts", "no metadata")
        run.skip("checksums", "no metadata")
        return None
    try:
        meta = read_json(path)
    except DatasetError as e:
        run.problems.append(Problem("metadata", METADATA_FILE, "", str(e), RECREATE))
        return None
    if meta.get("format") != FORMAT_NAME:
        run.problems.append(Problem("metadata", METADATA_FILE, "", f"format is {meta.get('format')!r}, "
                                    f"not {FORMAT_NAME!r}", "this folder was not written by sftdata; " + RECREATE))
    elif meta.get("format_version") != FORMAT_VERSION:
        run.problems.append(Problem("metadata", METADATA_FILE, "", f"format_version "
                                    f"{meta.get('format_version')!r} is not known (this sftdata reads "
                                    f"{FORMAT_VERSION})", "upgrade sftdata, or re-create the dataset with this one"))
    return meta


def check_tokenizer(run, tokenizer: str | None) -> tuple[dict | None, Vocab | None]:
    path = run.root / TOKENIZER_FILE
    if tokenizer is not None:
        tok = load_tokenizer(tokenizer)
        run.report.notes.append(f"token ids, EOS endings and the mask rule checked with --tokenizer {tokenizer}")
        return None, Vocab(tok.ids, tok.vocab_size)
    if not path.is_file():
        if run.report.layout == "sharded":
            run.problems.append(Problem("tokenizer", TOKENIZER_FILE, "", f"{TOKENIZER_FILE} is missing: the "
                                        "tokenizer the ids were made with is unknown", RECREATE))
        else:
            run.report.notes.append(f"no {TOKENIZER_FILE}: token ids, EOS endings and the loss mask cannot be "
                                    "checked (pass --tokenizer NAME to check them with a known tokenizer)")
        for c in ("vocab", "eos", "mask_rule"):
            run.skip(c, "tokenizer unknown")
        return None, None
    try:
        state = read_json(path)
    except DatasetError as e:
        run.problems.append(Problem("tokenizer", TOKENIZER_FILE, "", str(e), RECREATE))
        return None, None
    try:
        tok = tokenizer_from_state(state, TOKENIZER_FILE)
        return state, Vocab(tok.ids, tok.vocab_size)
    except SftDataError as e:
        run.problems.append(Problem("tokenizer", TOKENIZER_FILE, "", str(e),
                                    "use the encoding or ranks file the dataset was prepared with"))
        return state, vocab_from_state(state)  # the recorded ids still allow the other checks


def pick_token_dtype(run, meta: dict | None, state: dict | None, token_dtype) -> np.dtype:
    if meta is not None and "token_dtype" in meta:
        try:
            dt = np.dtype(meta["token_dtype"]).newbyteorder("<")
        except TypeError:
            run.problems.append(Problem("metadata", METADATA_FILE, "", f"token_dtype {meta['token_dtype']!r} "
                                        "is not a numpy dtype", RECREATE))
            return np.dtype("<u4")
        vocab = (state or {}).get("vocab_size")
        if isinstance(vocab, int) and dt.itemsize < token_dtype_for(vocab).itemsize:
            run.problems.append(Problem("metadata", METADATA_FILE, "", f"token_dtype {dt.name} cannot hold the "
                                        f"{vocab:,} ids of the tokenizer", RECREATE))
        return dt
    if token_dtype is not None:
        return np.dtype(token_dtype).newbyteorder("<")
    if isinstance((state or {}).get("vocab_size"), int):  # metadata lost: the tokenizer still says
        return token_dtype_for(state["vocab_size"])
    if meta is None and run.report.layout == "flat":
        run.report.notes.append("no metadata: tokens read as uint32 (pass --token-dtype uint16 if they are not)")
    return np.dtype("<u4")


def discover(run, meta: dict | None, dtype: np.dtype) -> list[Part]:
    root, parts = run.root, []
    on_disk: dict[str, list[str]] = {}
    for split in SPLITS:
        if run.report.layout == "flat":
            d = root / split
            if (d / TOKENS_FILE).is_file() and not (d / EPISODES_FILE).is_file():
                run.report.notes.append(f"{split}/{TOKENS_FILE} has no {EPISODES_FILE}: a token stream, not "
                                        "episodes; not checked")
            elif (d / TOKENS_FILE).is_file():
                parts.append(open_part(root, split, split, d, dtype, 0, None, run.problems))
            continue
        metas = shard_metas(meta, split)
        first = 0
        for d in list_shards(root, split):
            on_disk.setdefault(split, []).append(d.name)
            part = open_part(root, split, d.name, d, dtype, first, metas.get(d.name), run.problems,
                             packed=run.report.kind == "packed")
            first += part.num_episodes
            parts.append(part)
    if meta is not None and run.report.layout == "sharded":
        run.problems += check_shard_list(meta, on_disk)
    return parts


def hash_jobs(run, meta: dict, parts: list[Part]) -> list[tuple[str, Path, dict, str | None]]:
    """(relative file, path, recorded {bytes, sha256}, shard rel) of every file whose size
    matches the record (a size mismatch is already a sizes problem: no need to hash)."""
    jobs = []
    for fn, rec in (meta.get("files") or {}).items():
        p = run.root / fn
        if not p.is_file():
            run.problems.append(Problem("files", fn, "", f"{fn} is missing", "restore it, or " + RECREATE))
        elif rec.get("bytes") not in (None, p.stat().st_size):
            run.problems.append(Problem("sizes", fn, "", f"{fn} is {p.stat().st_size:,} bytes; {METADATA_FILE} "
                                        f"recorded {rec['bytes']:,}: it changed after prepare", RECREATE))
        else:
            jobs.append((fn, p, rec, None))
    for part in parts:
        for fn, rec in ((part.meta or {}).get("files") or {}).items():
            p = part.dir / fn
            if p.is_file() and p.stat().st_size == rec.get("bytes", p.stat().st_size):
                jobs.append((f"{part.rel}/{fn}", p, rec, part.rel))
    return jobs


def checksum_problems(results: list[tuple[str, str, str, str | None]], parts: list[Part]) -> list[Problem]:
    """One problem per changed file, or one per shard when every file of it changed."""
    bad = [r for r in results if r[1] != r[2]]
    out = []
    by_shard = {p.rel: p for p in parts}
    for rel, part in by_shard.items():
        recorded = list((part.meta or {}).get("files") or {})
        mine = [r for r in bad if r[3] == rel]
        if len(recorded) >= 2 and len(mine) == len(recorded):
            out.append(Problem("checksums", rel, "", f"every file of {rel} ({', '.join(recorded)}) differs from "
                               f"the sha256 recorded in {METADATA_FILE}: the shard was replaced, e.g. by a "
                               "shard of another dataset", "restore this shard from this dataset's copy, or "
                               + RECREATE))
            bad = [r for r in bad if r[3] != rel]
    for fn, got, want, _ in bad:
        out.append(Problem("checksums", fn, "", f"sha256 is {got[:16]}..., {METADATA_FILE} recorded "
                           f"{str(want)[:16]}...: the file changed after prepare (a flipped bit, a partial "
                           "copy or an edit)", "restore the file from a good copy, or " + RECREATE))
    return out



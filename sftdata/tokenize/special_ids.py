"""Ids a model keeps for itself beyond its ``.tiktoken`` ranks, read from its files.

A bare ranks file says nothing about the model's own special tokens: Llama 3's
``tokenizer.model`` holds ranks 0..127999, while the model uses 128000..128255 for
``<|begin_of_text|>``, ``<|start_header_id|>`` and reserved tokens. The files a model
ships beside its ranks do say: ``tokenizer_config.json`` (``added_tokens_decoder``),
``tokenizer.json`` (``added_tokens``) and Meta's ``params.json`` (``vocab_size``).
"""

from __future__ import annotations

import json
from pathlib import Path

SIDECARS = ("tokenizer_config.json", "tokenizer.json", "params.json")
SIDECAR_MAX_BYTES = 64 << 20


def _sidecar_ids(data, filename: str, ranks_end: int) -> dict[int, str | None]:
    """Ids one model file declares: {id: name or None}."""
    out: dict[int, str | None] = {}
    if not isinstance(data, dict):
        return out
    if filename == "tokenizer_config.json" and isinstance(data.get("added_tokens_decoder"), dict):
        for k, v in data["added_tokens_decoder"].items():
            if str(k).isdigit():
                out[int(k)] = v.get("content") if isinstance(v, dict) else None
    elif filename == "tokenizer.json" and isinstance(data.get("added_tokens"), list):
        for v in data["added_tokens"]:
            if isinstance(v, dict) and isinstance(v.get("id"), int):
                out[v["id"]] = v.get("content")
    elif filename == "params.json":
        n = data.get("vocab_size")
        if isinstance(n, int) and not isinstance(n, bool) and ranks_end < n <= ranks_end + (1 << 20):
            out.update((i, None) for i in range(ranks_end, n))
    return out


def declared_ids(ranks_path: Path, ranks_end: int) -> tuple[dict[int, str | None], str | None]:
    """Ids at or after ``ranks_end`` (one past the highest rank) that the model of a ranks
    file uses itself, read from the model files beside it (or one folder up, as in
    ``Meta-Llama-3-8B/original/tokenizer.model``), and the first file that declared any.
    Unreadable files are skipped: they are the model's, not sftdata's to judge."""
    out: dict[int, str | None] = {}
    source = None
    folders = [ranks_path.parent, ranks_path.parent.parent]
    for folder in dict.fromkeys(f.resolve() for f in folders):
        for filename in SIDECARS:
            f = folder / filename
            try:
                if not f.is_file() or f.stat().st_size > SIDECAR_MAX_BYTES:
                    continue
                data = json.loads(f.read_bytes())
            except (OSError, ValueError, RecursionError):
                continue
            found = {i: n for i, n in _sidecar_ids(data, filename, ranks_end).items() if i >= ranks_end}
            if found:
                source = source or str(f)
                for i, n in found.items():
                    out[i] = out.get(i) or n
    return out, source


# ranks files whose model is known: sha256 of the ranks (of the file, for a canonical
# .tiktoken file) -> (what it is, first id, end id, names of some ids)
LLAMA3_RANKS_SHA256 = "82e9d31979e92ab929cd544440f129d9ecd797b69e327f80f17e1c50d5551b55"
KNOWN_MODELS = {
    LLAMA3_RANKS_SHA256: ("the Llama 3 tokenizer.model (256 special ids after its 128000 ranks)", 128000, 128256,
                          {128000: "<|begin_of_text|>", 128001: "<|end_of_text|>", 128006: "<|start_header_id|>",
                           128007: "<|end_header_id|>", 128009: "<|eot_id|>"}),
}


def known_ids(ranks_sha256: str) -> tuple[dict[int, str | None], str | None]:
    """Ids a well-known model keeps beyond its ranks, recognised by the ranks' sha256
    (so a bare ``tokenizer.model`` copied on its own is still safe)."""
    known = KNOWN_MODELS.get(ranks_sha256)
    if known is None:
        return {}, None
    what, lo, hi, names = known
    return {i: names.get(i) for i in range(lo, hi)}, what


def id_ranges(ids) -> str:
    """``[1, 2, 3, 7]`` -> ``"1-3, 7"``."""
    ids = sorted(set(int(i) for i in ids))
    out: list[str] = []
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        out.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ", ".join(out)


def marker_start(base_max: int, count: int, declared) -> int:
    """The first id of ``count`` consecutive marker ids: right after ``base_max``, moved
    past any run of ``declared`` ids (ids the model uses) they would land on.

    >>> marker_start(127999, 7, range(128000, 128256))
    128256
    """
    start = base_max + 1
    for i in sorted(d for d in declared if d > base_max):
        if i >= start + count:
            break
        start = max(start, i + 1)
    return start


def marker_collisions(special_tokens: dict[str, int], is_used, allowed=()) -> list[int]:
    """Ids of ``special_tokens`` that ``is_used(id)`` says the base encoding or its model
    uses, except those in ``allowed`` (the base's own end-of-text token, which is
    ``<|EOS|>`` by design)."""
    return sorted(i for i in special_tokens.values() if i not in allowed and is_used(i))

"""``serving.json`` on disk: written beside the data by prepare and pack (before the
metadata, so it is listed in its ``files`` and ``--overwrite`` treats it as the
dataset's own), read by verify and inspect. Its content is ``sftdata.chat.serving``'s.

A dataset written before ``serving.json`` existed has none: ``read_serving`` returns
None and every reader goes on as before.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..chat.loss_rule import rule_from_state
from ..chat.serving import bos_policy_of, serving_manifest
from ..errors import DatasetError
from ..storage import SPLITS, read_json
from .format import EPISODES_FILE, IDX_DTYPE, SERVING, SERVING_FILE, TOKENS_FILE, clean_fields, dumps_json
from .shard import map_values


def episode_first_ids(root: Path, token_dtype) -> np.ndarray:
    """The first token id of every non-empty episode of every split under ``root``
    (shard folders), read through the episode index: a few bytes per episode."""
    out = []
    for split in SPLITS:
        for shard in sorted((Path(root) / split).glob("shard_*")):
            idx = map_values(shard / EPISODES_FILE, IDX_DTYPE)
            toks = map_values(shard / TOKENS_FILE, token_dtype)
            if idx is None or toks is None or not idx.size:
                continue
            pairs = np.asarray(idx)[:idx.size // 2 * 2].reshape(-1, 2)  # a partial record is verify's sizes problem
            starts = pairs[pairs[:, 1] > 0, 0]  # uint64: a damaged start past 2**63 must not wrap negative
            out.append(np.asarray(toks)[starts[starts < np.uint64(toks.shape[0])].astype(np.int64)])
    return np.concatenate(out) if out else np.empty(0, np.int64)


def write_serving(folder: Path, state: dict, token_dtype, pad_id: int | None = None,
                  episodes: Path | None = None) -> dict:
    """Write ``serving.json`` into ``folder`` (a writer's staging folder) and return it.
    ``pad_id`` defaults to the rule's. The BOS policy is measured from the episodes (of
    ``token_dtype``) under ``episodes`` (default: ``folder``; pack: its source dataset)."""
    rule = rule_from_state(state)
    bos_id = state.get("bos_id") if isinstance(state.get("bos_id"), int) else None
    firsts = episode_first_ids(folder if episodes is None else episodes, token_dtype)
    bos_policy = bos_policy_of(firsts, bos_id) or "none"
    manifest = serving_manifest(state, rule, rule.pad_id if pad_id is None else int(pad_id), bos_policy)
    (Path(folder) / SERVING_FILE).write_bytes(dumps_json(manifest))
    return manifest


def read_serving(root: Path) -> dict | None:
    """The dataset's ``serving.json``, or None when it has none (written by an older
    sftdata). ``DatasetError`` when it is there but not a JSON object, or a field is not
    of its type (``fields.SERVING``), naming the field."""
    path = Path(root) / SERVING_FILE
    if not path.is_file():
        return None
    serving, damaged = clean_fields(read_json(path), SERVING, SERVING_FILE, "")
    if damaged:
        raise DatasetError(f"{path}: {damaged[0].message}")
    return serving

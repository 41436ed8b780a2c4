"""The ``serving`` check of ``verify``: ``serving.json`` says what the data trained.

Every field ``sftdata.chat.serving.serving_manifest`` derives from ``tokenizer_state.json``
(stop ids and strings, the chat format, template name and sha256, the tokenizer) must
equal the recorded one; its pad id must be the one the dataset pads with (the rule's, or
a packed dataset's ``packing.pad_token_id``); its BOS policy must be the data's (every
episode begins with BOS under ``template``, none under ``none``; packed: every segment
that starts an episode).

A dataset written before ``serving.json`` existed has none: the check is skipped with
"absent, written by an older version", never a problem.
"""

from __future__ import annotations

import numpy as np

from ..chat.loss_rule import LossRule
from ..chat.serving import SERVING_FORMAT, SERVING_VERSION, bos_policy_of, serving_manifest
from ..errors import DatasetError
from ..store.format import SERVING_FILE, Problem, decode_segments
from ..store.serving_file import episode_first_ids
from ..store.shard import Shard
from ..store.structure import readable_rows

ABSENT = "absent, written by an older version"
FIX = "re-create the dataset (`sftdata prepare-chat` / `prepare-tool`, or `sftdata pack`) to rewrite serving.json"


def packed_first_ids(shards: list[Shard], row_len: int) -> np.ndarray:
    """The first token of every segment that starts its episode (no injected prefix)."""
    out = []
    for sh in shards:
        rows = readable_rows(sh, row_len)
        if sh.tokens is None or sh.segments is None or rows == 0:
            continue
        seg = decode_segments(sh.segments)
        keep = (seg.episode_start == 0) & (seg.prefix == 0) & (seg.length > 0) & (seg.row < rows)
        pos = seg.row[keep].astype(np.int64) * row_len + seg.offset[keep].astype(np.int64)
        out.append(np.asarray(sh.tokens)[pos[pos < sh.tokens.shape[0]]])
    return np.concatenate(out) if out else np.empty(0, np.int64)


def check_serving(serving: dict, state: dict, rule: LossRule, pad_id: int, first_ids: np.ndarray) -> list[Problem]:
    """Problems of a present ``serving.json`` against the tokenizer state, the dataset's
    pad id and the first token of every episode (``first_ids``)."""
    def problem(message: str, code: str) -> Problem:
        return Problem("serving", SERVING_FILE, "", message, FIX, code=code)

    if serving.get("format") != SERVING_FORMAT or serving.get("version") != SERVING_VERSION:
        return [problem(f"it is not a {SERVING_FORMAT} version {SERVING_VERSION} file (format "
                        f"{serving.get('format')!r}, version {serving.get('version')!r})", "format")]
    out = []
    policy = (serving.get("bos") or {}).get("policy") if isinstance(serving.get("bos"), dict) else None
    try:
        expected = serving_manifest(state, rule, pad_id, policy if policy in ("template", "none") else "none")
    except (TypeError, ValueError, KeyError) as e:
        return [problem(f"it cannot be compared with tokenizer_state.json ({e})", "format")]
    if serving.get("pad_id") != pad_id:
        out.append(problem(f"it says pad id {serving.get('pad_id')!r}, but the dataset pads with {pad_id}: an "
                           f"inference config made from it would disagree with training", "pad_id"))
    for key, want in expected.items():
        if key == "pad_id" or serving.get(key) == want:
            continue
        out.append(problem(f"{key} is {serving.get(key)!r}, but tokenizer_state.json and the data say {want!r}",
                           key))
    bos_id = state.get("bos_id") if isinstance(state.get("bos_id"), int) else None
    measured = bos_policy_of(first_ids, bos_id)
    if policy != measured:
        said = ("some episodes begin with BOS and some do not" if measured is None else
                f"the data's episodes {'all begin' if measured == 'template' else 'never begin'} with BOS "
                f"({bos_id})")
        out.append(problem(f"its BOS policy is {policy!r}, but {said}", "bos"))
    return out


def serving_findings(root, serving_error: DatasetError | None, serving: dict | None, state: dict | None,
                     rule: LossRule | None, pad_id: int | None, shards: list[Shard], token_dtype, packed: bool,
                     row_len: int | None) -> tuple[list[Problem], str | None]:
    """The serving check's problems, and why it was skipped (None: it ran)."""
    if serving_error is not None:
        return [Problem("serving", SERVING_FILE, "", str(serving_error), FIX, code="unreadable")], None
    if serving is None:
        return [], ABSENT
    if state is None or rule is None or pad_id is None:
        return [], "tokenizer unknown"
    firsts = packed_first_ids(shards, row_len) if packed and row_len else episode_first_ids(root, token_dtype)
    return check_serving(serving, state, rule, pad_id, firsts), None

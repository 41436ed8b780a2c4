"""One episode as data: what ``sftdata inspect DATASET --episode N`` shows.

An episode becomes pieces of decoded text, each one marker or a run of text tokens
that are all trained or all not, and, on request, one line per token with the span it
lies in::

    <|SYSTEM|> | Be brief. | <|END|> | <|USER|> | What is ...? | <|END|> | <|ASSISTANT|> | Paris. | <|END|> | <|EOS|>
    untrained ..................................................... | trained ......................... | untrained
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import orjson

from ..errors import DatasetError, UsageError
from ..hf_tokenizer import HFTokenizer
from ..loss_rule import LossRule, MarkerRule
from ..store import REJECTS_FILE, Dataset
from ..tokenizer import ChatTokenizer

Tokenizer = ChatTokenizer | HFTokenizer


@dataclass
class Piece:
    """A run of decoded text: one marker, or text tokens that are all trained or all not."""

    text: str
    trained: bool
    marker: bool
    injected: bool = False  # packed rows: context the packer prepended (never trained)


@dataclass
class EpisodeToken:
    position: int
    id: int
    text: str
    trained: bool
    marker: bool
    span: str  # the span the token lies in: system, user, assistant, tool, or "" outside


@dataclass
class EpisodeView:
    split: str
    episode: int
    record: int | None  # input record number (sources.idx), when stored
    shard: str
    start: int  # token offset in the shard's tokens.bin
    length: int
    trained_tokens: int | None
    pieces: list[Piece]
    tokens: list[EpisodeToken] | None = None
    rule_differs_at: list[int] | None = None  # positions where the stored mask is not the rule's

    def as_dict(self) -> dict:
        return asdict(self)


def spans_of(ids: np.ndarray, tok: Tokenizer, rule: LossRule | None = None) -> list[str]:
    """The span each token lies in: system, user, assistant, tool, or "" outside any (a
    model's template: assistant, header, or "")."""
    return (rule or MarkerRule(tok.ids)).span_names(ids)


def pieces_of(ids: np.ndarray, trained: np.ndarray, is_marker: np.ndarray, tok: Tokenizer,
              injected: bool = False) -> list[Piece]:
    """Runs of text that break at every marker and wherever training starts or stops."""
    n = ids.shape[0]
    cut = np.flatnonzero(is_marker[1:] | is_marker[:-1] | (trained[1:] != trained[:-1])) + 1
    bounds = [0, *cut.tolist(), n] if n else [0]
    return [Piece(tok.token_text(int(ids[a])) if is_marker[a] else tok.decode(ids[a:b].tolist()),
                  bool(trained[a]), bool(is_marker[a]), injected) for a, b in zip(bounds[:-1], bounds[1:])]


def is_marker(ids: np.ndarray, tok: Tokenizer) -> np.ndarray:
    """Bool per token: a marker (or EOS; a model's special token), drawn apart from the text."""
    return np.isin(ids, list(tok.special_tokens.values()))


def read_episode(ds: Dataset, split: str, episode: int):
    """Episode ``episode`` of ``split``: (shard, ids int64, stored mask or None, trained
    bool, its input record number or None, its start in the shard). An id out of range says so."""
    sp = ds.split(split)
    shard, local = sp.locate(episode)
    ids, mask = sp.episode(episode)
    ids = np.asarray(ids, dtype=np.int64)
    trained = np.zeros(ids.shape[0], bool) if mask is None else np.asarray(mask) != 0
    src = shard.sources
    record = None if src is None or local >= src.shape[0] else int(src[local])
    return shard, ids, mask, trained, record, int(shard.index[local, 0])


def episode_view(ds: Dataset, split: str, episode: int, tok: Tokenizer, rule: LossRule | None = None, *,
                 tokens: bool = False) -> EpisodeView:
    """One episode as pieces of text (and, with ``tokens``, one line per token), decoded
    with ``tok`` and compared with ``rule`` (default: the chat markers of ``tok``)."""
    rule = rule or MarkerRule(tok.ids)
    shard, ids, mask, trained, record, start = read_episode(ds, split, episode)
    marker = is_marker(ids, tok)
    lines = None
    if tokens:
        spans = rule.span_names(ids)
        lines = [EpisodeToken(p, int(t), tok.token_text(int(t)), bool(trained[p]), bool(marker[p]), spans[p])
                 for p, t in enumerate(ids)]
    derived = rule.masks(ids, np.array([ids.shape[0]]))
    differs = None if mask is None else np.flatnonzero(derived != trained).tolist()
    return EpisodeView(split=split, episode=int(episode), record=record, shard=shard.name, start=start,
                       length=int(ids.shape[0]),
                       trained_tokens=None if mask is None else int(trained.sum()),
                       pieces=pieces_of(ids, trained, marker, tok), tokens=lines, rule_differs_at=differs)


def find_record(ds: Dataset, record: int) -> tuple[str, int]:
    """(split, episode id) of the episode made from input record ``record``."""
    for name, sp in ds.splits.items():
        src = sp.sources
        if src is None:
            raise DatasetError(f"split {name} has no sources.idx: record numbers are not stored in this dataset; "
                               f"use --episode")
        hit = np.flatnonzero(src == record)
        if hit.size:
            return name, int(hit[0])
    why = ""
    rejects = ds.root / REJECTS_FILE
    if rejects.is_file():
        with open(rejects, "rb") as f:
            for line in f:
                try:
                    r = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue
                if r.get("record") == record:
                    why = f": it was rejected at prepare time ({r.get('reason')}: {r.get('message')}; {r.get('where')})"
                    break
    raise DatasetError(f"input record {record} is in no split of {ds.root}{why or ' (no such record was kept)'}")


def sample_ids(n: int, k: int, seed: int) -> list[int]:
    """``k`` distinct ids of ``n`` (episodes, or rows), drawn with ``RandomState(seed)``, in id order."""
    if k < 1:
        raise UsageError(f"--sample must be at least 1, got {k}")
    return sorted(np.random.RandomState(seed).choice(n, min(k, n), replace=False).tolist()) if n else []

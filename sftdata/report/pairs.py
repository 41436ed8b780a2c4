"""One pair (KTO row, RL prompt) as data: what ``sftdata inspect PAIRS --row N`` shows and
the report's samples draw, chosen and rejected side by side::

    prompt    <|USER|> What color is the sky? <|END|> <|ASSISTANT|>        (never trained)
    chosen    ⟦Blue.<|END|>⟧<|EOS|>        rejected   ⟦Green.<|END|>⟧<|EOS|>

The prompt's pieces once (it starts both sequences), then each completion's pieces,
trained runs marked (``views.pieces_of``); with ``tokens``, one line per token of each
sequence as the trainer reads it (``prompt + completion``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ..errors import DatasetError, UsageError
from ..store.format import KIND_KTO, KIND_PAIRS, KIND_PROMPTS
from ..store.reader import Dataset
from ..store.rows import RowSplit
from .tokens import Run, token_runs
from .views import EpisodeToken, Piece, Tokenizer, is_marker, pieces_of, sample_ids

SIDE_NAMES = {KIND_PAIRS: ("chosen", "rejected"), KIND_KTO: ("completion",), KIND_PROMPTS: ()}


@dataclass
class SideView:
    name: str  # chosen, rejected, completion
    length: int  # tokens of the completion
    trained_tokens: int
    pieces: list[Piece]
    tokens: list[EpisodeToken] | None = None  # prompt + completion, one line per token


@dataclass
class PairView:
    kind: str  # pairs, kto, prompts
    split: str
    row: int  # the pair (row) id, as replay-order names it
    record: int | None
    shard: str
    prompt_length: int
    prompt: list[Piece]
    sides: list[SideView]
    label: bool | None = None  # kto: desirable
    columns: str | None = None  # prompts: the row's other columns, as columns.jsonl holds them

    def as_dict(self) -> dict:
        return asdict(self)


def pair_view(ds: Dataset, split: str, row: int, tok: Tokenizer, *, tokens: bool = False) -> PairView:
    """Row ``row`` of a pairs, KTO or prompts split, decoded with ``tok``."""
    rs = RowSplit(ds.kind, ds.split(split))
    if not 0 <= row < rs.num_rows:
        raise DatasetError(f"{ds.kind} row {row} does not exist in split {split!r}, which has {rs.num_rows} rows "
                           f"(ids 0..{rs.num_rows - 1})")
    p_ids, p_mask = (np.asarray(a, dtype=np.int64) for a in rs.part(row, 0))
    p_marker = is_marker(p_ids, tok)
    sides = []
    for k, name in enumerate(SIDE_NAMES[ds.kind], 1):
        ids, mask = (np.asarray(a, dtype=np.int64) for a in rs.part(row, k))
        trained = mask != 0
        lines = None
        if tokens:
            seq = np.concatenate([p_ids, ids])
            tr = np.concatenate([p_mask != 0, trained])
            mk = is_marker(seq, tok)
            lines = [EpisodeToken(p, int(t), tok.token_text(int(t)), bool(tr[p]), bool(mk[p]),
                                  "prompt" if p < p_ids.size else name) for p, t in enumerate(seq)]
        sides.append(SideView(name, int(ids.size), int(trained.sum()), pieces_of(ids, trained, is_marker(ids, tok), tok),
                              lines))
    shard, _ = ds.split(split).locate(row * rs.entries)
    return PairView(kind=ds.kind, split=split, row=int(row),
                    record=None if rs.records is None else int(rs.records[row]), shard=shard.name,
                    prompt_length=int(p_ids.size), prompt=pieces_of(p_ids, p_mask != 0, p_marker, tok), sides=sides,
                    label=bool(rs.labels[row]) if ds.kind == KIND_KTO else None,
                    columns=rs.columns_text([row])[0].decode() if ds.kind == KIND_PROMPTS else None)


def select_pairs(ds: Dataset, split: str, *, rows=None, episodes=None, record=None, sample=None, seed=0
                 ) -> list[tuple[str, int]]:
    """The (split, row) ``inspect --row/--record/--sample`` shows on a pairs, KTO or prompts dataset."""
    if episodes:
        raise UsageError(f"{ds.root} holds {ds.kind}: use --row N for pair (row) N, as replay-order names it, or "
                         f"--record N for the one made from input record N")
    if record is not None:
        for name, sp in ds.splits.items():
            recs = RowSplit(ds.kind, sp).records
            hit = np.flatnonzero(recs == record) if recs is not None else np.zeros(0, np.int64)
            if hit.size:
                return [(name, int(hit[0]))]
        raise DatasetError(f"input record {record} is in no split of {ds.root} (not kept by prepare: see "
                           f"rejects.jsonl)")
    if sample is not None:
        return [(split, r) for r in sample_ids(RowSplit(ds.kind, ds.split(split)).num_rows, sample, seed)]
    return [(split, int(r)) for r in rows]


@dataclass
class SampleSide:
    name: str
    length: int
    trained_tokens: int
    shown: int
    runs: list[Run]


@dataclass
class SamplePair:
    """A pair (KTO row, RL prompt) the report draws: the prompt's runs once, then each
    completion's, side by side."""

    kind: str
    split: str
    row: int
    chosen: bool  # asked for (--row); else drawn by the seeded sample
    record: int | None
    prompt_length: int
    prompt_shown: int
    prompt: list[Run]
    sides: list[SampleSide]
    label: bool | None = None
    columns: str | None = None


def sample_pair(ds: Dataset, split: str, row: int, tok: Tokenizer, *, chosen: bool, limit: int) -> SamplePair:
    """Row ``row`` drawn as runs of tokens, at most ``limit`` tokens: the prompt's share
    first, then each side's share of the rest."""
    rs = RowSplit(ds.kind, ds.split(split))
    if not 0 <= row < rs.num_rows:
        raise DatasetError(f"{ds.kind} row {row} does not exist in split {split!r}, which has {rs.num_rows} rows")
    p_ids, p_mask = (np.asarray(a, dtype=np.int64) for a in rs.part(row, 0))
    names = SIDE_NAMES[ds.kind]
    p_shown = min(p_ids.size, max(limit // (1 + len(names)), limit - sum(int(x) for x in rs.part_lengths[row, 1:])))
    left = max(0, limit - p_shown)
    sides = []
    for k, name in enumerate(names, 1):
        ids, mask = (np.asarray(a, dtype=np.int64) for a in rs.part(row, k))
        trained = mask != 0
        shown = min(ids.size, max(1, left // len(names)))
        sides.append(SampleSide(name, int(ids.size), int(trained.sum()), shown,
                                token_runs(ids[:shown], trained[:shown], tok)))
    return SamplePair(kind=ds.kind, split=split, row=int(row), chosen=chosen,
                      record=None if rs.records is None else int(rs.records[row]), prompt_length=int(p_ids.size),
                      prompt_shown=int(p_shown), prompt=token_runs(p_ids[:p_shown], p_mask[:p_shown] != 0, tok),
                      sides=sides, label=bool(rs.labels[row]) if ds.kind == KIND_KTO else None,
                      columns=rs.columns_text([row])[0].decode() if ds.kind == KIND_PROMPTS else None)

"""What ``inspect --episode/--row/--record/--sample`` shows, chosen by the dataset's kind:
episodes and packed rows (``views``), or pairs, KTO rows and RL prompts (``pairs``), which
build on ``views``' pieces; so the choice stands above both."""

from __future__ import annotations

from pathlib import Path

from ..errors import UsageError
from ..store.format import ROW_KINDS
from .overview import open_checked
from .pairs import PairView, pair_view, select_pairs
from .views import (
    EpisodeView,
    RowView,
    dataset_tokenizer,
    episode_view,
    find_record,
    row_view,
    sample_ids,
    select_rows,
)


def views(path: str | Path, split: str = "train", *, episodes: list[int] | None = None,
          rows: list[int] | None = None, record: int | None = None, sample: int | None = None, seed: int = 0,
          tokens: bool = False, token_dtype=None, tokenizer: str | None = None
          ) -> tuple[list[EpisodeView] | list[RowView] | list[PairView], list[str]]:
    """What ``inspect --episode/--row/--record/--sample`` shows, and notes about it: on a
    pairs, KTO or prompts dataset ``PairView``s (``--row`` names the pair).

    ``tokenizer`` decodes an older flat layout (which records none; default cl100k_base),
    or names where the tokenizer.json of a dataset made with a model's tokenizer is now.
    Views are decoded with the dataset's tokenizer and compared with its mask rule.
    """
    chosen = sum(x is not None for x in (episodes or None, rows or None, record, sample))
    if chosen != 1:
        raise UsageError("give exactly one of --episode, --row, --record or --sample")
    ds = open_checked(path, token_dtype, tokenizer)
    tok, rule, notes = dataset_tokenizer(ds, tokenizer)
    if ds.kind in ROW_KINDS:
        found = select_pairs(ds, split, rows=rows, episodes=episodes, record=record, sample=sample, seed=seed)
        return [pair_view(ds, s, r, tok, tokens=tokens) for s, r in found], notes
    if ds.kind == "packed":
        found = select_rows(ds, split, rows=rows, episodes=episodes, record=record, sample=sample, seed=seed)
        return [row_view(ds, s, r, tok, rule, tokens=tokens) for s, r in found], notes
    if rows:
        raise UsageError("--row is for packed datasets; this one holds episodes: use --episode")
    if record is not None:
        split, gid = find_record(ds, record)
        ids = [gid]
    elif sample is not None:
        ids = sample_ids(ds.split(split).num_episodes, sample, seed)
    else:
        ids = list(episodes)
    return [episode_view(ds, split, i, tok, rule, tokens=tokens) for i in ids], notes

"""Episodes or rows chosen by id, input record or sample: ``sftdata inspect --episode/--row/
--record/--sample``. An episodes dataset gives ``EpisodeView``s, a packed one ``RowView``s."""

from __future__ import annotations

from pathlib import Path

from ..errors import UsageError
from ..tokenizer import load_tokenizer
from .episodes import EpisodeView, episode_view, find_record, sample_ids
from .overview import open_checked
from .rows import RowView, row_view, select_rows


def views(path: str | Path, split: str = "train", *, episodes: list[int] | None = None,
          rows: list[int] | None = None, record: int | None = None, sample: int | None = None, seed: int = 0,
          tokens: bool = False, token_dtype=None, tokenizer: str | None = None
          ) -> tuple[list[EpisodeView] | list[RowView], list[str]]:
    """What ``inspect --episode/--row/--record/--sample`` shows, and notes about it.

    ``tokenizer`` decodes an older flat layout (which records none; default cl100k_base).
    """
    chosen = sum(x is not None for x in (episodes or None, rows or None, record, sample))
    if chosen != 1:
        raise UsageError("give exactly one of --episode, --row, --record or --sample")
    ds = open_checked(path, token_dtype, tokenizer)
    notes = []
    if ds.tokenizer_state is not None:
        tok = ds.tokenizer()
    else:
        tok = load_tokenizer(tokenizer)
        notes.append(f"the dataset records no tokenizer: decoded with {tok.name} (pass --tokenizer to choose)")
    if ds.kind == "packed":
        found = select_rows(ds, split, rows=rows, episodes=episodes, record=record, sample=sample, seed=seed)
        return [row_view(ds, s, r, tok, tokens=tokens) for s, r in found], notes
    if rows:
        raise UsageError("--row is for packed datasets; this one holds episodes: use --episode")
    if record is not None:
        split, gid = find_record(ds, record)
        ids = [gid]
    elif sample is not None:
        ids = sample_ids(ds.split(split).num_episodes, sample, seed)
    else:
        ids = list(episodes)
    return [episode_view(ds, split, i, tok, tokens=tokens) for i in ids], notes

"""Episodes or rows chosen by id, input record or sample: ``sftdata inspect --episode/--row/
--record/--sample``. An episodes dataset gives ``EpisodeView``s, a packed one ``RowView``s."""

from __future__ import annotations

from pathlib import Path

from ..errors import UsageError
from ..hf_tokenizer import hf_tokenizer_from_state
from ..loss_rule import LossRule, MarkerRule, is_template_state, rule_from_state
from ..store import TOKENIZER_FILE, Dataset
from ..tokenizer import load_tokenizer
from .episodes import EpisodeView, Tokenizer, episode_view, find_record, sample_ids
from .overview import open_checked
from .rows import RowView, row_view, select_rows


def dataset_tokenizer(ds: Dataset, tokenizer: str | None = None) -> tuple[Tokenizer, LossRule, list[str]]:
    """The tokenizer that decodes ``ds``, its mask rule, and notes: the recorded one (a
    model's tokenizer.json: from ``tokenizer`` when it has moved), else for an older flat
    layout ``tokenizer`` or cl100k_base."""
    if is_template_state(ds.tokenizer_state):
        tok = hf_tokenizer_from_state(ds.tokenizer_state, str(ds.root / TOKENIZER_FILE), path=tokenizer)
        return tok, rule_from_state(ds.tokenizer_state, str(ds.root / TOKENIZER_FILE)), []
    if ds.tokenizer_state is not None:
        tok = ds.tokenizer()
        return tok, MarkerRule(tok.ids), []
    tok = load_tokenizer(tokenizer)
    return tok, MarkerRule(tok.ids), [f"the dataset records no tokenizer: decoded with {tok.name} (pass "
                                      f"--tokenizer to choose)"]


def views(path: str | Path, split: str = "train", *, episodes: list[int] | None = None,
          rows: list[int] | None = None, record: int | None = None, sample: int | None = None, seed: int = 0,
          tokens: bool = False, token_dtype=None, tokenizer: str | None = None
          ) -> tuple[list[EpisodeView] | list[RowView], list[str]]:
    """What ``inspect --episode/--row/--record/--sample`` shows, and notes about it.

    ``tokenizer`` decodes an older flat layout (which records none; default cl100k_base),
    or names where the tokenizer.json of a dataset made with a model's tokenizer is now.
    Views are decoded with the dataset's tokenizer and compared with its mask rule.
    """
    chosen = sum(x is not None for x in (episodes or None, rows or None, record, sample))
    if chosen != 1:
        raise UsageError("give exactly one of --episode, --row, --record or --sample")
    ds = open_checked(path, token_dtype, tokenizer)
    tok, rule, notes = dataset_tokenizer(ds, tokenizer)
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

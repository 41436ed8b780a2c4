"""The entry points of the build pipeline, one a command, each a kind of row handed to the
one driver (``driver.build``): ``prepare`` (episodes: prepare-chat, prepare-tool) and
``prepare_pref`` (pairs and KTO rows: prepare-pref; RL prompts: prepare-rl; the kind is
``pref.run.RowsKind``).

An episodes run where the inputs can be cut (``driver.can_partition``; ``--engine ray``:
always) is partitioned: the workers read their own partitions and write the final
shards, the driver plans and commits (``partitioned``). Memory is bounded by options,
not by the input (docs/CLI.md has the formula): a few chunks in flight, each at most
``CHUNK_BYTES`` plus one record, and no record longer than ``max_record_bytes`` is ever
held (``sources`` reads past it and it is rejected as ``record_too_large``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from pathlib import Path

from ..chat.tokenizer import engine_record
from ..curate import CurateSettings
from ..pref.options import PrefOptions
from ..pref.run import PrefSummary, RowsKind
from ..records.turns import TURN_COUNTS
from ..sources import SourceInfo
from ..store.build_key import BuildCheck
from ..store.format import KIND_EPISODES, media_count
from ..template import open_for_build
from .chunk import EpisodeWork, episode_rows
from .driver import build
from .options import PrepareOptions
from .results import SUMMED, ChunkResult, Executor, PrepareSummary, Progress

MAX_NAMED_MISMATCHES = 100  # rule_mismatch records named in the summary and the metadata


class EpisodesKind:
    """Episodes: one sequence a row; a record becomes one episode (or, with a chat template
    that must, one per reply: ``chunk.process_chunk``)."""

    build_kind = store_kind = KIND_EPISODES
    item, same = "episode", "the same conversation as"
    trains = remote = empty_val = counts_tokens = local_parts = True
    records_dedup = False
    summary_type = PrepareSummary

    def __init__(self, opts: PrepareOptions):
        self.opts = self.memo_opts = opts
        self.repaired: Counter = Counter()
        self.turns: Counter = Counter()

    def open(self) -> None:
        opts = self.opts
        self.tok, self.profile, self.state = open_for_build(opts, opts.per_reply, opts.mode)
        self.work = EpisodeWork(self.tok, self.profile, opts.mode, opts.max_tokens, opts.policy, opts.media_root)

    @contextmanager
    def local(self, curate: CurateSettings):
        memo = self.opts.new_memo(self.tok)
        yield (lambda items: self.work.outcome(items, memo, curate)), (lambda res: res)

    def new_summary(self, output_dir: str) -> PrepareSummary:
        self.summary = PrepareSummary(output_dir=output_dir, max_record_bytes=self.opts.max_record_bytes,
                                      tokenizer_engine=engine_record(self.tok), memo_mb=self.opts.memo_mb)
        return self.summary

    def accept(self, res: ChunkResult, drop: set[int]):
        """The counts of a chunk's records, and its episodes but those of ``drop``."""
        summary = self.summary
        self.repaired.update(res.repairs)
        self.turns.update(res.turns)
        for name in SUMMED:
            setattr(summary, name, getattr(summary, name) + getattr(res, name.removeprefix("records_")))
        if res.memo is not None:
            summary.memo.add(res.memo)
        keep = MAX_NAMED_MISMATCHES - len(summary.rule_mismatch)
        summary.rule_mismatch += [{"record": r, "where": wh} for r, wh in res.mismatches[:max(keep, 0)]]
        rows = episode_rows(res) if res.staged is None else res.staged.get(KIND_EPISODES)
        return [], rows.without(drop) if drop and rows is not None else rows

    def finish(self, summary: PrepareSummary, splits: dict, infos: list[SourceInfo]) -> tuple[dict, dict, dict]:
        summary.input_bytes = sum(i.bytes for i in infos)
        summary.repaired = dict(sorted(self.repaired.items()))
        summary.turns = {name: self.turns[name] for name in TURN_COUNTS}
        summary.add_splits(splits)
        for split, m in splits.items():
            summary.episodes[split], summary.shards[split] = m["episodes"], len(m["shards"])
        counts = {"episodes": sum(m["episodes"] for m in splits.values()), "repaired": summary.repaired,
                  "turns": summary.turns, "records_truncated": summary.records_truncated,
                  "pairs_dropped": summary.pairs_dropped}
        if self.profile is None:
            return {}, counts, {}
        counts.update(per_reply_records=summary.per_reply_records, per_reply_episodes=summary.per_reply_episodes,
                      per_reply_automatic=summary.per_reply_automatic)
        # the dataset's media items, where it holds any (each split's are in its record)
        media = media_count(list(splits.values()))
        summary.media = media.get("media", {})
        return {}, counts, {"rule_mismatch": summary.rule_mismatch, **media}


def prepare(inputs: Sequence[str | Path], output_dir: str | Path, opts: PrepareOptions,
            progress: Callable[[Progress], None] | None = None, executor: Executor | None = None,
            planned: Callable[[BuildCheck], None] | None = None) -> PrepareSummary:
    """Prepare ``inputs`` into an episodes dataset at ``output_dir`` (``driver.build``).
    Raises ``SftDataError``s. ``executor`` runs a partitioned run's tasks (default: this
    process, or ``--workers`` processes; ``sftdata.engine`` has Ray's): the dataset is the
    same whichever runs it."""
    opts.validate()
    return build(EpisodesKind(opts), inputs, output_dir, opts, progress, planned, executor)


def prepare_pref(inputs: Sequence[str | Path], output_dir: str | Path, opts: PrefOptions,
                 progress: Callable[[Progress], None] | None = None, rl: bool = False,
                 planned: Callable[[BuildCheck], None] | None = None,
                 executor: Executor | None = None) -> PrefSummary:
    """Prepare preference records (``rl``: RL prompts) into a dataset at ``output_dir``:
    kind ``pairs`` (or ``kto`` when the records are KTO rows; ``prompts`` with ``rl``),
    by the same driver as ``prepare`` (``driver.build``: the build key of kind "pairs" or
    "prompts", the up-to-date check, rejects, curation, the exact split). Every record
    that cannot be written exactly is rejected by name into ``rejects.jsonl``.
    ``executor``: an engine (``sftdata.engine.prepare_ray``) that runs it partitioned, as
    ``prepare``'s: the dataset is the same whichever runs it."""
    opts.validate()
    return build(RowsKind(opts, rl), inputs, output_dir, opts, progress, planned, executor)

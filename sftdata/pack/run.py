"""The pack pipeline: an episodes dataset -> a ``kind: "packed"`` dataset.

::

    open_dataset(source) ──► per split: lengths ──► plan (packing.plan_bfd / plan_stream)
        ──► rows, a chunk at a time: gather segment tokens, mask per segment (the rule),
            pad ──► PackedSplitWriter (shards, sha256) ──► metadata last ──► atomic rename

``build_rows`` builds the rows of a plan; ``--engine local`` runs it over each whole split
here, ``--engine ray`` (``sftdata.engine.ray_engine``) over ranges of whole output
shards as Ray tasks, whose shards the split writer adopts: the same bytes either way.

The output keeps the source's tokenizer and records the packing options and the
source's identity (path and sha256 of its ``dataset_metadata.json``). Same source and
options give a byte-identical output.

A result that cannot train is refused (``NothingToTrainError``): a train split of 0 rows
or 0 trained tokens. Losing more than 1% of a split's trained tokens is a warning (logged,
in the report and in the metadata) naming the smallest block size that keeps 99% of them
(``packing.min_block_size``). The rows a pack holds at once are checked against the
memory available before anything is planned (``memory.check_fits``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from functools import partial
from pathlib import Path

import numpy as np

from .. import __version__
from ..chat.loss_rule import LossRule, rule_from_state
from ..chat.stops import rule_stop_ids
from ..errors import DatasetError, NothingToTrainError, UsageError
from ..order.batches import DEFAULT_SEED
from ..packing.block_size import KEEP_PERCENT, TrainedSpans, min_block_size, trained_spans
from ..packing.layout import PAD_SEQ_ID
from ..packing.plan import DEFAULT_OVERLONG, MIN_BLOCK_SIZE, OVERLONG_POLICIES, STRATEGIES, PackPlan, padding_baseline
from ..packing.strategies import plan_bfd, plan_stream
from ..storage import METADATA_FILE
from ..storage.location import dataset_path, remote_url
from ..store.build_key import BUILD, BuildCheck, build_record
from ..store.format import DEFAULT_SHARD_TOKENS, MEDIA_KEY, SEGMENT_FIELDS, TOKENIZER_FILE
from ..store.reader import open_dataset
from ..store.serving_file import write_serving
from ..store.shard import Split
from ..store.writer import DatasetWriter, sweep_beside
from ..tasks import Engine
from ..util.hashing import sha256_file
from ..util.memory import check_fits
from ..util.ranges import CHUNK_TOKENS, whole_runs
from .build import pack_components, plan_pack
from .media import COUNTS, refuse_stream, write_split_media
from .rows import build_rows, gather_segments
from .tasks import run_rows

log = logging.getLogger("sftdata.pack")
# peak bytes per row token while a chunk of rows is built: the tokens, the mask, their
# positions and the mask rule's work arrays (measured: tests/test_safety_results.py)
ROW_BYTES_PER_TOKEN = 48


@dataclass(frozen=True)
class PackOptions:
    block_size: int = 2048
    strategy: str = "bfd"
    overlong: str = DEFAULT_OVERLONG
    pad_id: int | None = None  # default: the rule's pad id (EOS; a model tokenizer's pad token)
    seed: int = DEFAULT_SEED
    shard_tokens: int = DEFAULT_SHARD_TOKENS
    overwrite: bool = False
    force: bool = False  # rebuild even when the target is up to date (implies overwrite)
    wait: bool = False  # wait for another sftdata writing the same output

    @property
    def row_len(self) -> int:
        return self.block_size + 1

    def recorded(self) -> dict:
        """The options that decide the packed bytes (part of the build key): not overwrite,
        force, wait, nor the CLI's --engine, --json and --quiet."""
        return {"block_size": self.block_size, "strategy": self.strategy, "overlong": self.overlong,
                "pad_id": self.pad_id, "seed": self.seed, "shard_tokens": self.shard_tokens}

    def validate(self) -> None:
        if self.block_size < MIN_BLOCK_SIZE:
            raise UsageError(f"--block-size must be at least {MIN_BLOCK_SIZE} (a row of {MIN_BLOCK_SIZE + 1} "
                             f"tokens, <|USER|> <|END|> <|ASSISTANT|> <|END|>, is the smallest that can train a "
                             f"reply), got {self.block_size}")
        if self.strategy not in STRATEGIES:
            raise UsageError(f"--strategy must be one of {', '.join(STRATEGIES)}, not {self.strategy!r}")
        if self.overlong not in OVERLONG_POLICIES:
            raise UsageError(f"--overlong must be one of {', '.join(OVERLONG_POLICIES)}, not {self.overlong!r}")
        if self.shard_tokens < 1:
            raise UsageError(f"--shard-tokens must be positive, got {self.shard_tokens}")


@dataclass
class SplitReport:
    """What packing did to one split. Tokens count real (non-padding) tokens."""

    episodes: int
    rows: int
    row_len: int
    tokens_in: int  # episode tokens in the source
    tokens_packed: int  # real tokens in the rows (injected ones included)
    tokens_injected: int  # stream: system span / <|USER|> prepended to rewritten rows
    tokens_lost: int  # episode tokens in no row (truncated, dropped, stopped)
    lower_bound_rows: int  # ceil(tokens_packed / row_len)
    padding_rows: int  # one episode per row, truncated
    padding_fill: float
    overlong_episodes: int
    dropped_episodes: int
    stopped_conversations: int
    trained_in: int  # trained tokens of the source episodes, by the mask rule
    trained_packed: int
    segments: int
    # when more than 1% of the trained tokens is lost: the smallest --block-size that keeps
    # 99% of them with bfd and this --overlong (split: truncate's), and with keep_end
    min_block_size_99: int | None = None
    min_block_size_99_keep_end: int | None = None

    @property
    def fill(self) -> float:
        return self.tokens_packed / (self.rows * self.row_len) if self.rows else 0.0

    @property
    def bound_ratio(self) -> float:
        return self.lower_bound_rows / self.rows if self.rows else 1.0

    @property
    def trained_lost(self) -> int:
        return self.trained_in - self.trained_packed

    @property
    def trained_lost_share(self) -> float:
        return self.trained_lost / self.trained_in if self.trained_in else 0.0

    @property
    def lossy(self) -> bool:
        """More than 1% of the trained tokens lost."""
        return self.trained_lost * 100 > self.trained_in

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(fill=round(self.fill, 6), bound_ratio=round(self.bound_ratio, 6),
                 trained_lost=self.trained_lost, trained_lost_share=round(self.trained_lost_share, 6),
                 padding_fill=round(self.padding_fill, 6))
        return d


@dataclass
class PackReport:
    output_dir: str
    source: str
    strategy: str
    block_size: int
    overlong: str
    pad_id: int
    seed: int
    splits: dict[str, SplitReport] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)  # trained tokens lost, stale staging swept
    seconds: float = 0.0
    build_key: str | None = None  # the packed dataset's build key (store.build_key)
    up_to_date: bool = False  # the target held this build already: nothing was done
    changed: list[str] = field(default_factory=list)  # why the target was rebuilt (empty: a new target)

    def as_dict(self, timing: bool = True) -> dict:
        d = {"output_dir": self.output_dir, "source": self.source, "strategy": self.strategy,
             "block_size": self.block_size, "row_len": self.block_size + 1, "overlong": self.overlong,
             "pad_id": self.pad_id, "seed": self.seed,
             "splits": {k: v.as_dict() for k, v in self.splits.items()}, "warnings": list(self.warnings)}
        if timing:
            d.update(seconds=round(self.seconds, 3), build_key=self.build_key, up_to_date=self.up_to_date,
                     changed=list(self.changed))
        return d

    @classmethod
    def of_dataset(cls, output_dir: str, meta: dict) -> PackReport:
        """The report of the packed dataset a run found up to date, from its metadata."""
        pk, names = meta.get("packing") or {}, {f.name for f in fields(SplitReport)}
        out = cls(output_dir, (meta.get("source") or {}).get("path", ""), pk.get("strategy", ""),
                  pk.get("block_size", 0), pk.get("overlong", ""), pk.get("pad_token_id", 0), pk.get("seed", 0),
                  warnings=list(meta.get("warnings") or []), up_to_date=True)
        for name, rep in (meta.get("report") or {}).items():
            out.splits[name] = SplitReport(**{k: v for k, v in rep.items() if k in names})
        return out


@dataclass
class PackProgress:
    split: str
    rows_done: int
    rows_total: int


def _rule(ds) -> LossRule:
    """The dataset's mask rule (its chat markers, or its template's rule)."""
    rule = rule_from_state(ds.tokenizer_state, str(ds.root / TOKENIZER_FILE))
    if rule is None:
        raise DatasetError(f"{ds.root} has no {TOKENIZER_FILE}, so its mask rule is unknown and the loss mask "
                           f"cannot be recomputed per row. Re-create it with `sftdata prepare-chat`")
    return rule


def _check_cuts(split: Split, opts: PackOptions, rule: LossRule) -> None:
    """A template rule that trains only each episode's last reply (the rule's, or episodes
    flagged so: ``format.LAST_REPLY_FILE``) cannot tell a cut episode from a whole one by
    its tokens (an earlier reply would become the last): refuse to cut."""
    if getattr(getattr(rule, "rule", None), "last_reply_only", False):
        only, which = np.ones(split.lengths.shape, dtype=bool), "each episode"
    elif split.flagged:
        only = split.last_only_of(np.arange(split.lengths.shape[0]))
        which = f"{int(only.sum()):,} episode(s) of split {split.name} (served one per reply)"
    else:
        return
    if opts.strategy == "stream":
        raise UsageError(f"this dataset's template rule trains only the last reply of {which}, and stream packing "
                         f"cuts episodes across rows, which would train other replies; use --strategy bfd")
    long = np.flatnonzero((split.lengths > opts.row_len) & only)
    if long.size and opts.overlong != "drop":
        raise UsageError(f"episode {int(long[0])} of split {split.name} ({int(split.lengths[long[0]]):,} tokens) is "
                         f"longer than a row ({opts.row_len}), and this dataset's template rule trains only the "
                         f"last reply of this episode: a cut episode's last reply would be another one. Use "
                         f"--overlong drop, or a --block-size of at least {int(split.lengths.max()) - 1}")


def _plan(split: Split, opts: PackOptions, m: LossRule) -> PackPlan:
    if opts.strategy == "bfd":
        return plan_bfd(split.lengths, opts.row_len, opts.overlong, opts.seed)
    return plan_stream(split.lengths, lambda i: split.episode(i)[0], m, opts.row_len)


def pack_split(split: Split, writer, opts: PackOptions, m: LossRule, pad_id: int,
               progress: Callable[[PackProgress], None] | None = None,
               executor: Engine | None = None) -> SplitReport:
    """Plan and write one split's rows; returns its report. ``executor`` builds the rows
    as tasks (``--engine ray``: tasks write whole shards that the writer adopts,
    ``tasks.run_rows``); the plan, the report and the bytes are the same."""
    plan = _plan(split, opts, m)
    L = plan.row_len
    # trained tokens lost: only episodes not placed whole can differ from their rule mask
    whole = plan.whole_episodes()
    nonwhole = np.flatnonzero(~whole & (plan.lengths > 0))
    seg_whole = whole[plan.segments.episode]

    def on_rows(r1: int) -> None:
        progress(PackProgress(split.name, r1, plan.num_rows))

    run = build_rows if executor is None or plan.num_rows == 0 else partial(run_rows, executor)
    built = run(split, plan, seg_whole, writer, m, pad_id, nonwhole, on_rows if progress else None)
    pad_rows, pad_fill = padding_baseline(plan.lengths, L)
    return SplitReport(
        episodes=plan.episodes, rows=plan.num_rows, row_len=L, tokens_in=plan.tokens_in,
        tokens_packed=plan.tokens_placed, tokens_injected=plan.tokens_injected,
        tokens_lost=plan.tokens_lost, lower_bound_rows=plan.lower_bound_rows, padding_rows=pad_rows,
        padding_fill=pad_fill, overlong_episodes=plan.overlong_episodes, dropped_episodes=plan.dropped_episodes,
        stopped_conversations=plan.stopped_conversations, trained_in=built.trained_whole + built.trained_extra,
        trained_packed=built.trained, segments=plan.num_segments)


def _split_spans(split: Split, m: LossRule) -> TrainedSpans:
    """The trained spans of every episode of ``split``, a bounded number of tokens at a time."""
    lengths = split.lengths
    ids = np.arange(lengths.size, dtype=np.int64)
    parts = []
    for i, j in whole_runs(np.cumsum(lengths)):
        toks = gather_segments(split, ids[i:j], np.zeros(j - i, np.int64), lengths[i:j])
        parts.append(trained_spans(toks, lengths[i:j], m))
    return TrainedSpans.concat(parts)


def suggest_block_size(split: Split, r: SplitReport, opts: PackOptions, m: LossRule) -> None:
    """Fill ``r.min_block_size_99`` and ``r.min_block_size_99_keep_end`` (one more pass
    over the split's tokens)."""
    spans = _split_spans(split, m)
    r.min_block_size_99 = min_block_size(spans, opts.overlong if opts.strategy == "bfd" else "truncate")
    r.min_block_size_99_keep_end = min_block_size(spans, "keep_end")


def _hint(r: SplitReport, opts: PackOptions) -> str:
    """What keeps 99% of the trained tokens, from the figures of ``suggest_block_size``."""
    n, k = r.min_block_size_99, r.min_block_size_99_keep_end
    if n is None:
        return ""
    if opts.strategy == "stream":
        return f"`--strategy bfd --block-size {n}` keeps {KEEP_PERCENT}% of the trained tokens"
    if opts.overlong == "keep_end":
        return f"--block-size {n} keeps {KEEP_PERCENT}% of the trained tokens"
    at_least = "at least " if opts.overlong == "split" else ""
    out = f"--block-size {n} keeps {at_least}{KEEP_PERCENT}% of the trained tokens"
    if k is not None and k < n:
        out += f" (with --overlong keep_end, which keeps each conversation's end: --block-size {k})"
    return out


def _check_memory(ds, opts: PackOptions) -> None:
    """Refuse a block size whose rows cannot be built in the memory available."""
    L = opts.row_len
    at_once = 1
    for split in ds.splits.values():  # no more rows than a split can fill, CHUNK_TOKENS of tokens at a time
        fill = split.num_episodes + -(-split.num_tokens // L)
        at_once = max(at_once, min(max(1, CHUNK_TOKENS // L), fill))
    check_fits(at_once * L * ROW_BYTES_PER_TOKEN,
               f"--block-size {opts.block_size:,} (building {at_once:,} row(s) of {L:,} tokens at a time)",
               "lower --block-size (it is the training config's block_size: a few thousand tokens is usual)")


def _refuse_source(ds, source: Path) -> None:
    """A source whose train split trains nothing: no pack of it can."""
    train = ds.splits.get("train")
    if train is None or train.num_episodes == 0:
        raise NothingToTrainError(f"{source} has no episode in its train split, so a pack of it trains nothing; "
                                  f"re-create it with `sftdata prepare-chat` / `prepare-tool`")
    recorded = (((ds.metadata or {}).get("splits") or {}).get("train") or {}).get("trained_tokens")
    if recorded == 0:
        raise NothingToTrainError(f"{source}: the mask trains no token of its train split (0 trained tokens), so "
                                  f"a pack of it trains nothing; re-create it with `sftdata prepare-chat` / "
                                  f"`prepare-tool` from records with assistant replies")


def _refuse_result(r: SplitReport, opts: PackOptions, output_dir) -> None:
    """Rows of train that train nothing: an error, not a dataset."""
    if r.rows and r.trained_packed:
        return
    if r.trained_in == 0:
        why = (f"its {r.episodes:,} episodes hold 0 trained tokens by the mask rule (no assistant reply after a "
               f"complete user or tool turn)")
        raise NothingToTrainError(f"pack would write rows that train nothing: {why}; nothing was written to "
                                  f"{output_dir}. Re-create the source with `sftdata prepare-chat` / "
                                  f"`prepare-tool`")
    if r.rows == 0:
        what = (f"0 rows for train: --overlong drop leaves out all {r.episodes:,} episodes, each longer than a row "
                f"of {r.row_len:,} tokens (--block-size {opts.block_size:,})")
    else:
        what = (f"rows that train nothing: with --overlong {opts.overlong} at --block-size {opts.block_size:,} "
                f"(rows of {r.row_len:,} tokens), 0 of the {r.trained_in:,} trained tokens of train are left: no "
                f"row holds a complete assistant reply with the user or tool turn before it")
    raise NothingToTrainError(f"pack would write {what}; nothing was written to {output_dir}. {_hint(r, opts)}")


def _open_source(source: Path, output_dir, opts: PackOptions) -> tuple:
    """The source dataset, its mask rule and the pad id, once every refusal is passed:
    not an episodes dataset, no metadata, a pad id out of range or a stop id, a cut the
    template rule cannot take, the source as output, nothing to train, too little memory."""
    ds = open_dataset(source)
    if ds.kind != "episodes":
        raise DatasetError(f"{source} is a {ds.kind!r} dataset; pack reads an episodes dataset (the "
                           f"--output-dir of prepare-chat / prepare-tool)")
    if ds.metadata is None:
        raise DatasetError(f"{source} has no {METADATA_FILE} (an older flat layout); its tokenizer and markers "
                           f"are unknown. Re-create it with `sftdata prepare-chat`")
    m = _rule(ds)
    pad_id = m.pad_id if opts.pad_id is None else int(opts.pad_id)
    limit = min(int(np.iinfo(ds.token_dtype).max) + 1, int(ds.tokenizer_state.get("vocab_size") or 1 << 62))
    if not 0 <= pad_id < limit:
        what = "EOS" if m.kind == "markers" else "the tokenizer's pad token"
        raise UsageError(f"--pad-id {pad_id} is not a token id of this dataset (0..{limit - 1}); "
                         f"leave it out to pad with {what} ({m.pad_id})")
    if opts.pad_id is not None and pad_id in rule_stop_ids(m):
        raise UsageError(f"--pad-id {pad_id} is the end-of-turn token the model learns to stop with; choose a "
                         f"token the data never trains (or leave --pad-id out to pad with {m.pad_id})")
    for split in ds.splits.values():
        _check_cuts(split, opts, m)
    refuse_stream(ds, opts.strategy)
    if Path(output_dir).resolve() == source.resolve():
        raise UsageError(f"--output-dir {output_dir} is the source dataset; choose another folder")
    _refuse_source(ds, source)
    _check_memory(ds, opts)
    return ds, m, pad_id


def _metadata(ds, opts: PackOptions, pad_id: int, source_path: str, splits_meta: dict, report: PackReport,
              lossy: list[str]) -> dict:
    """The packed dataset's metadata (its build record is added by ``pack``)."""
    return {
        "kind": "packed",
        "created_by": f"sftdata {__version__}",
        "token_dtype": ds.token_dtype.name,
        "tokenizer": ds.metadata.get("tokenizer"),
        "tokenizer_identity": ds.metadata.get("tokenizer_identity"),
        "packing": {"block_size": opts.block_size, "row_len": opts.row_len, "strategy": opts.strategy,
                    "overlong": opts.overlong, "pad_token_id": pad_id, "seed": opts.seed,
                    "shard_tokens": opts.shard_tokens, "pad_seq_id": PAD_SEQ_ID,
                    "segment_fields": list(SEGMENT_FIELDS)},
        "source": {"path": source_path, "metadata_sha256": sha256_file(ds.root / METADATA_FILE),
                   "kind": ds.kind, "counts": ds.metadata.get("counts")},
        "splits": splits_meta,
        "report": report.as_dict(timing=False)["splits"],
        "warnings": lossy,
    }


def pack(source: str | Path, output_dir: str | Path, opts: PackOptions,
         progress: Callable[[PackProgress], None] | None = None, executor: Engine | None = None,
         planned: Callable[[BuildCheck], None] | None = None) -> PackReport:
    """Pack the episodes dataset at ``source`` into a packed dataset at ``output_dir``.

    Refuses (``NothingToTrainError``, nothing written) a train split that would hold 0
    rows or 0 trained tokens; warns (``sftdata.pack`` logger, ``report.warnings``, the
    metadata) when a split loses more than 1% of its trained tokens. ``executor``: where
    the rows are built (``sftdata.engine.ray_engine``; default this process); the
    output is byte-identical either way.

    A target whose metadata holds this pack's build key (the source's metadata sha256 and
    the packing options, ``store.build_key``) is up to date: nothing is done and the report
    (``up_to_date``) is the dataset's. Another key is refused without ``overwrite``
    (``force`` rebuilds regardless), naming what changed; ``planned`` is called with the
    decision to build before any work."""
    opts.validate()
    t0 = time.perf_counter()
    output_dir = remote_url(output_dir) or output_dir  # s3:/b/x (a URL through Path) -> s3://b/x
    source_url = remote_url(source)
    source = Path(source)
    plan = plan_pack(source_url or str(source.resolve()), dataset_path(source) / METADATA_FILE, output_dir, opts)
    if plan.up_to_date:
        sweep_beside(output_dir)  # nothing to build, but what a killed run left beside it still goes
        report = PackReport.of_dataset(str(output_dir), plan.target.metadata)
        report.build_key, report.seconds = plan.key, time.perf_counter() - t0
        return report
    plan.refuse_unless(opts.overwrite or opts.force)
    ds, m, pad_id = _open_source(source, output_dir, opts)
    report = PackReport(str(output_dir), source_url or str(source), opts.strategy, opts.block_size, opts.overlong, pad_id,
                        opts.seed, changed=list(plan.changes))
    if planned is not None:
        planned(plan)
    lossy: list[str] = []  # one warning per split losing more than 1% of its trained tokens
    with DatasetWriter(output_dir, overwrite=opts.overwrite or opts.force, wait=opts.wait) as w:
        splits_meta = {}
        for name in sorted(ds.splits, key=lambda s: s != "train"):  # train first: refused before the rest
            split = ds.splits[name]
            sw = w.packed_split(name, ds.token_dtype, opts.row_len, opts.shard_tokens)
            r = report.splits[name] = pack_split(split, sw, opts, m, pad_id, progress, executor)
            if r.lossy or (name == "train" and not (r.rows and r.trained_packed)):
                suggest_block_size(split, r, opts, m)
            if name == "train":
                _refuse_result(r, opts, output_dir)
            if r.lossy:
                msg = (f"{name}: pack loses {r.trained_lost:,} of the {r.trained_in:,} trained tokens "
                       f"({r.trained_lost_share:.1%}) at --block-size {opts.block_size:,} with --overlong "
                       f"{opts.overlong}" + (" (stream)" if opts.strategy == "stream" else "")
                       + (f"; {_hint(r, opts)}" if r.min_block_size_99 is not None else ""))
                lossy.append(msg)
                log.warning(msg)
            splits_meta[name] = sw.close()
            if ds.has_media:  # each shard's media table, "episode" its packed row
                write_split_media(ds, name, sw.dir, splits_meta[name])
        w.write_json(TOKENIZER_FILE, ds.tokenizer_state)
        write_serving(w.path, ds.tokenizer_state, ds.token_dtype, pad_id, episodes=ds.root)
        metadata = _metadata(ds, opts, pad_id, source_url or str(source.resolve()), splits_meta, report, lossy)
        if ds.has_media:
            metadata[MEDIA_KEY] = {k: sum(s[MEDIA_KEY][k] for s in splits_meta.values()) for k in COUNTS}
        metadata[BUILD] = build_record(pack_components(metadata["source"]["path"], metadata["source"]["metadata_sha256"],
                                                   opts), [])
        report.build_key = metadata[BUILD]["key"]
        w.commit(metadata)
    report.warnings = lossy + w.notes  # w.notes: what the writer did beside the dataset (logged by it)
    report.seconds = time.perf_counter() - t0
    return report


def speedup(r: SplitReport) -> float:
    """Padding rows per packed row: how many times fewer rows the model sees."""
    return r.padding_rows / r.rows if r.rows else math.nan

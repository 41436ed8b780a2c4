"""``sftdata export``: a dataset's splits as Parquet or JSONL files other tools read.

Every row is one sequence a model is given alone, with the columns ``transformers``
models take, ``labels`` aligned with ``input_ids`` (-100 where the mask is 0; the model
shifts them itself)::

    episodes:  episode, record, input_ids, labels, attention_mask
    packed:    row, episode, record, input_ids, labels, attention_mask   (one row per sequence of a packed row)

A packed dataset is exported one sequence (segment) per row, in row order, ``row``
naming the packed row it belongs to: every collator that pads or flattens examples
(TRL's ``DataCollatorForLanguageModeling``, with or without ``padding_free``,
``transformers``' ``DataCollatorWithFlattening``, ``DataCollatorForSeq2Seq``) then keeps
the sequences apart. A whole packed row as one example cannot be: TRL's collator, by
default (``SFTConfig(padding_free=False)``), gives every example an attention mask of
ones of its own making, and ``DataCollatorWithFlattening`` takes each example for one
sequence; both would let a row's conversations attend to each other (docs/INTEROP.md).
Packed rows as stored are served by ``sftdata.torch.SFTDataset``.

Pairs, KTO rows and RL prompts: one row per pair with TRL's tokenized columns
(``prompt_ids``, ``chosen_ids``, ``rejected_ids``; KTO's ``completion_ids`` and ``label``),
see ``export_rows``.

``record`` is the 0-based input record number (null when the dataset does not know it).

A dataset with images (or videos) adds ``images`` (``videos``): each row's items in token
order, their uris, or with ``media_bytes`` their bytes in Hugging Face's Image layout
(``export_media``).

Streamed: a split is read a chunk of whole items at a time (plain file reads, so memory
stays flat in the dataset size), and each chunk is one Parquet row group of about
``row_group_tokens`` tokens. The output folder is written like a dataset (staging folder
beside it, renamed on success, one writer at a time, ``dataset_metadata.json`` with
``kind: "export"`` listing its files) with a build key (``export_build``): re-exporting
an unchanged dataset with the same options is up to date and does nothing; another
build replaces an earlier export only with ``--overwrite``, naming what changed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import orjson

from .. import __version__
from ..errors import ConfigError, DatasetError, OutputExistsError, UsageError
from ..loader import IGNORE_INDEX, dataset_identity
from ..storage import METADATA_FILE, read_json
from ..storage.fsops import OUTPUT_DIR_FIX, refuse_link
from ..storage.location import remote_url
from ..storage.object_cache import remote_metadata
from ..store.build_key import BUILD, BuildCheck, Target, base_components, build_record, check_target, read_target
from ..store.format import ROW_KINDS
from ..store.reader import open_dataset
from ..store.rows import RowSplit
from ..store.shard import Split, split_segments
from ..store.writer import DatasetWriter, sweep_beside
from ..util.hashing import sha256_file
from ..util.oserrors import naming
from ..util.ranges import range_index, whole_runs
from .export_media import MediaCells, media_columns, parquet_type
from .export_rows import RowJsonlSink, RowParquetSink, row_chunks, row_columns

FORMATS = ("parquet", "jsonl")
ROW_GROUP_TOKENS = 1 << 20  # ~1M tokens per row group: ~25 MB of columns, a few ms to decode
EXPORT_KIND = "export"
PARQUET_KEY = b"sftdata"  # the Parquet file's key-value metadata: where it came from
# the modules whose output is an export's bytes (its build key's code version)
EXPORT_CODE = ("__init__.py", "interop/export.py", "interop/export_rows.py", "interop/export_media.py",
               "store/format.py", "store/writer.py", "store/rows.py", "store/shard.py", "store/media_table.py")


@dataclass(frozen=True)
class ExportOptions:
    format: str = "parquet"
    splits: tuple[str, ...] | None = None  # None: every split of the dataset
    overwrite: bool = False
    row_group_tokens: int = ROW_GROUP_TOKENS
    force: bool = False  # export again even when the target is up to date (implies overwrite)
    media_bytes: bool = False  # a dataset with media: each item's bytes in its cell, not only its uri

    def recorded(self) -> dict:
        """The options that decide the export's bytes (its build key), as the CLI names them."""
        return {"format": self.format, "split": list(self.splits) if self.splits else None,
                "row_group_tokens": self.row_group_tokens, **({"media_bytes": True} if self.media_bytes else {})}


@dataclass(frozen=True)
class ExportProgress:
    split: str
    rows_done: int
    rows_total: int


@dataclass
class SplitExport:
    file: str  # relative to the output folder
    rows: int = 0
    tokens: int = 0
    trained_tokens: int = 0
    bytes: int = 0


@dataclass
class ExportReport:
    dataset: str
    output_dir: str
    format: str
    kind: str  # of the dataset: episodes | packed | pairs | kto | prompts
    columns: list[str]
    splits: dict[str, SplitExport] = field(default_factory=dict)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    build_key: str | None = None
    up_to_date: bool = False  # the target held this export already: nothing was done
    changed: list[str] = field(default_factory=list)  # why an earlier export was replaced

    def as_dict(self) -> dict:
        return {**asdict(self), "splits": {k: asdict(v) for k, v in self.splits.items()}}

    @classmethod
    def of_export(cls, dataset: str, output_dir: str, meta: dict) -> ExportReport:
        """The report of the earlier export at ``output_dir`` (its metadata), up to date."""
        e = meta.get("export") or {}
        splits = {k: SplitExport(**v) for k, v in (e.get("files") or {}).items()}
        return cls(dataset, output_dir, e.get("format", ""), e.get("kind", ""), list(e.get("columns") or []), splits,
                   up_to_date=True)


EPISODE_COLUMNS = ["episode", "record", "input_ids", "labels", "attention_mask"]
PACKED_COLUMNS = ["row", "episode", "record", "input_ids", "labels", "attention_mask"]


def export(dataset_dir: str | Path, output_dir: str | Path, options: ExportOptions = ExportOptions(),
           progress: Callable[[ExportProgress], None] | None = None,
           planned: Callable[[BuildCheck], None] | None = None) -> ExportReport:
    """Write the splits of ``dataset_dir`` to ``output_dir/<split>.<format>``.

    A target that is an earlier export with this build key (the source's metadata sha256,
    the options, the export code) is up to date: nothing is done and the report
    (``up_to_date``) is that export's. Another is refused without ``overwrite`` (``force``
    exports again regardless), naming what changed; ``planned`` is called with the
    decision to build before any work."""
    if options.format not in FORMATS:
        why = " (MosaicML MDS is not offered: docs/INTEROP.md says why)" if options.format == "mds" else ""
        raise UsageError(f"--format must be one of {', '.join(FORMATS)}, got {options.format!r}{why}")
    if options.row_group_tokens < 1:
        raise UsageError(f"row_group_tokens must be >= 1, got {options.row_group_tokens}")
    t0 = time.perf_counter()
    source, target, url = Path(dataset_dir), Path(output_dir), remote_url(output_dir)
    ds = open_dataset(source)
    replace = options.overwrite or options.force
    if url is None:
        _check_target(source, target, replace)
    elif replace:
        _check_kind(url, remote_metadata(url))
    plan = plan_export(source, url or target, options)
    if plan.up_to_date:
        sweep_beside(url or target)  # nothing to build, but what a killed export left beside it still goes
        report = ExportReport.of_export(str(source), url or str(target), plan.target.metadata)
        report.build_key, report.seconds = plan.key, time.perf_counter() - t0
        return report
    plan.refuse_unless(replace)
    names = list(options.splits) if options.splits else list(ds.splits)
    for name in names:
        ds.split(name)  # an unknown split: the reader's message names the ones there are
        if ds.split(name).num_items and not ds.split(name).has_mask:
            raise DatasetError(f"split {name!r} of {source} has no mask.bin, so labels cannot say which tokens are "
                               f"trained; re-create the dataset with `sftdata prepare-chat`")
    rows = ds.kind in ROW_KINDS  # pairs, KTO rows, RL prompts: TRL's tokenized columns (export_rows)
    sink_cls, columns = _layout(ds.kind, options.format)
    media = [] if rows else media_columns(ds)
    cells = MediaCells(media, options.media_bytes, options.format == "jsonl") if media else None
    columns = columns + media
    report = ExportReport(str(source), url or str(target), options.format, ds.kind, columns, changed=list(plan.changes))
    provenance = {"source": str(source.resolve()), "source_identity": dataset_identity(source), "kind": ds.kind,
                  "sftdata_version": __version__}
    if planned is not None:
        planned(plan)
    with DatasetWriter(url or target, overwrite=replace) as w:
        for name in names:
            sp = ds.split(name)
            out = report.splits[name] = SplitExport(f"{name}.{options.format}")
            # a full disk or a file-size limit names the file (its write errors carry no name)
            with naming(w.path / out.file, f"while exporting to {url or target}"), \
                    sink_cls(w.path / out.file, ds.kind, {**provenance, "split": name}, PARQUET_KEY,
                             **({"media": media, "media_bytes": options.media_bytes} if media else {})) as sink:
                if rows:
                    chunks = row_chunks(RowSplit(ds.kind, sp), options.row_group_tokens)
                elif ds.kind == "packed":
                    chunks = packed_chunks(sp, ds.packing, options.row_group_tokens, cells)
                else:
                    chunks = episode_chunks(sp, options.row_group_tokens, cells)
                total = sp.num_items // ds.entries
                for chunk in chunks:
                    sink.write(chunk)
                    out.rows += chunk.rows
                    out.tokens += chunk.token_count
                    out.trained_tokens += chunk.trained_count
                    if progress is not None:
                        progress(ExportProgress(name, out.rows, total))
            out.bytes = (w.path / out.file).stat().st_size
        record = build_record(export_components(source, _metadata_sha256(source), options), [])
        report.build_key = record["key"]
        w.commit({"kind": EXPORT_KIND, "splits": {}, "export": {
            **provenance, "format": options.format, "columns": columns,
            "files": {k: asdict(v) for k, v in report.splits.items()}}, BUILD: record})
        report.notes = list(w.notes) + (cells.note() if cells else [])
    report.seconds = time.perf_counter() - t0
    return report


def _layout(kind: str, fmt: str) -> tuple[type, list[str]]:
    """The writer class and the columns of an export of ``kind`` as ``fmt``."""
    parquet = fmt == "parquet"
    sink_cls = _parquet_sink() if parquet else JsonlSink  # says which extra --format parquet needs
    if kind in ROW_KINDS:
        return (RowParquetSink if parquet else RowJsonlSink), row_columns(kind)
    return sink_cls, PACKED_COLUMNS if kind == "packed" else EPISODE_COLUMNS


def export_components(source: Path, metadata_sha256: str | None, options: ExportOptions) -> dict:
    """An export's build key components: the source dataset (its path and the sha256 of its
    metadata, which holds the sha256 of every file of it), the options, the export code."""
    return {**base_components(EXPORT_KIND, EXPORT_CODE), "source": {"path": str(source.resolve()),
                                                                     "metadata_sha256": metadata_sha256},
            "options": options.recorded()}


def _metadata_sha256(source: Path) -> str | None:
    try:
        return sha256_file(source / METADATA_FILE)
    except OSError:
        return None


def plan_export(source: Path, target, options: ExportOptions) -> BuildCheck:
    """Is the target up to date? Only an earlier export is compared (a dataset or other
    files there are the writer's, and ``_check_target``'s, to refuse)."""
    def planned():
        sha = _metadata_sha256(source)
        if sha is None:
            return None, f"the dataset {source} has no readable {METADATA_FILE}, so its content is not known"
        return export_components(source, sha, options), None

    t = read_target(target)
    if t.metadata is not None and t.metadata.get("kind") != EXPORT_KIND:
        t = Target(t.location, t.exists)  # not an export: no build key to compare
    return check_target(t, planned, force=options.force)


def _check_target(source: Path, target: Path, overwrite: bool) -> None:
    """Never the dataset itself (or a folder around or inside it); with ``--overwrite``
    only an earlier export (the writer then removes exactly the files it lists)."""
    refuse_link(target, OUTPUT_DIR_FIX)  # the writer's rule, said before anything else
    s, t = source.resolve(), target.resolve()
    if s == t or s in t.parents or t in s.parents:
        raise UsageError(f"the output {target} would overlap the dataset {source}; choose an --output-dir outside it")
    if not target.exists():
        return
    if not overwrite:  # the writer refuses an existing target; one --overwrite cannot replace is named as such
        if target.is_dir() and (target / METADATA_FILE).is_file():
            _check_kind(target, read_json(target / METADATA_FILE))
        return
    if target.is_dir() and any(target.iterdir()):
        _check_kind(target, read_json(target / METADATA_FILE) if (target / METADATA_FILE).is_file() else {})


def _check_kind(target, meta: dict | None) -> None:
    """``--overwrite`` replaces only an earlier export (an object-store target without
    metadata is left to the writer's checks: empty, or refused)."""
    if meta is not None and meta.get("kind") != EXPORT_KIND:
        raise OutputExistsError(f"{target} is not an earlier export of sftdata: --overwrite replaces only an export "
                                f"(never a dataset or other files); choose another --output-dir")


# -------------------------------------------------------------------------- chunks of rows
@dataclass
class Chunk:
    """Consecutive items as flat token arrays and per-item offsets (``offsets[k]`` to
    ``offsets[k + 1]`` are item ``k``'s tokens)."""

    offsets: np.ndarray  # int64 (rows + 1,)
    input_ids: np.ndarray  # int64
    labels: np.ndarray  # int64
    attention: np.ndarray  # int8
    scalars: dict[str, np.ndarray]  # per-row int64 columns (-1 = unknown)
    media: dict[str, list[list]] = field(default_factory=dict)  # a dataset with media: each row's cells per column

    @property
    def rows(self) -> int:
        return self.offsets.shape[0] - 1

    @property
    def token_count(self) -> int:
        return int(self.attention.sum())

    @property
    def trained_count(self) -> int:
        return int(np.count_nonzero(self.labels != IGNORE_INDEX))


def episode_chunks(sp: Split, budget: int, cells: MediaCells | None = None) -> Iterator[Chunk]:
    """The episodes of ``sp`` in global id order, whole episodes of up to ``budget`` tokens
    (``cells``: a dataset with media, each episode's media cells)."""
    sources = sp.sources
    for si, sh in enumerate(sp.shards):
        starts = sh.index[:, 0].astype(np.int64)
        lengths = sh.index[:, 1].astype(np.int64)
        first = int(sp.item_offsets[si])
        for i, j in whole_runs(starts + lengths, budget, starts=starts):
            st, ln = starts[i:j], lengths[i:j]
            lo, hi = int(st.min()), int((st + ln).max())
            toks, mask = sh.read_range(lo, hi)
            if not (lo == st[0] and np.array_equal(st[1:], (st + ln)[:-1])):  # not laid end to end: gather
                idx = range_index(st - lo, ln)
                toks, mask = toks[idx], mask[idx]
            ids = toks.astype(np.int64)
            gid = np.arange(first + i, first + j, dtype=np.int64)
            rec = sources[gid] if sources is not None else np.full(j - i, -1, dtype=np.int64)
            yield Chunk(np.concatenate([[0], np.cumsum(ln)]), ids, np.where(mask == 1, ids, IGNORE_INDEX),
                        np.ones(ids.shape[0], dtype=np.int8), {"episode": gid, "record": rec},
                        cells.rows(sh, np.arange(i, j)) if cells else {})


def packed_chunks(sp: Split, packing: dict, budget: int, cells: MediaCells | None = None) -> Iterator[Chunk]:
    """The sequences (segments) of a packed split, one item each, in row order (and in
    order within a row), whole rows of up to ``budget`` tokens a chunk: each sequence is
    its own example, so a collator that pads or flattens examples never lets two
    sequences of a row attend to each other (module docstring)."""
    L = int(packing["row_len"])
    seg = split_segments(sp)
    per = max(1, budget // L)
    for si, sh in enumerate(sp.shards):
        first = int(sp.item_offsets[si])
        for a in range(0, sh.num_items, per):
            b = min(sh.num_items, a + per)
            s = seg.of_rows(np.arange(first + a, first + b, dtype=np.int64))
            if not len(s):
                continue
            toks, mask = sh.read_range(a * L, b * L)
            idx = range_index((s.row - (first + a)) * L + s.offset, s.length)
            ids, trained = toks[idx].astype(np.int64), mask[idx] == 1
            media = cells.rows(sh, s.row - first, np.stack([s.offset, s.offset + s.length], axis=1)) if cells else {}
            yield Chunk(np.concatenate([[0], np.cumsum(s.length)]), ids, np.where(trained, ids, IGNORE_INDEX),
                        np.ones(ids.shape[0], dtype=np.int8), {"row": s.row, "episode": s.episode, "record": s.source},
                        media)


# ------------------------------------------------------------------------------ writers
def _parquet_sink():
    try:
        import pyarrow  # noqa: F401  (optional dependency: only for --format parquet)
    except ImportError:
        raise ConfigError("--format parquet needs pyarrow: pip install 'sftdata[parquet]' (or use --format jsonl)") from None
    return ParquetSink


class ParquetSink:
    """One Parquet file; each chunk is one row group. The file's key-value metadata
    says where it came from (``sftdata``: source, identity, split, kind)."""

    def __init__(self, path: Path, kind: str, provenance: dict, key: bytes = PARQUET_KEY, media: list[str] = (),
                 media_bytes: bool = False):
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.pa, self.pq = pa, pq
        tokens, mask = pa.list_(pa.int64()), pa.list_(pa.int8())
        lists = [("input_ids", tokens), ("labels", tokens), ("attention_mask", mask)]
        fields = [(name, pa.int64()) for name in (PACKED_COLUMNS if kind == "packed" else EPISODE_COLUMNS)[:-3]] + lists
        fields += [(name, parquet_type(pa, media_bytes)) for name in media]
        self.schema = pa.schema(fields, metadata={key: orjson.dumps(provenance)})
        self.path = path
        self._writer = None

    def __enter__(self) -> ParquetSink:
        self._writer = self.pq.ParquetWriter(self.path, self.schema, compression="snappy")
        return self

    def write(self, c: Chunk) -> None:
        pa = self.pa
        off = pa.array(c.offsets.astype(np.int32))

        def lists(values: np.ndarray):
            return pa.ListArray.from_arrays(off, pa.array(values))

        cols = {name: pa.array(v, mask=v < 0) for name, v in c.scalars.items()}
        cols.update(input_ids=lists(c.input_ids), labels=lists(c.labels), attention_mask=lists(c.attention))
        cols.update({name: pa.array(cells, type=self.schema.field(name).type) for name, cells in c.media.items()})
        table = pa.Table.from_arrays([cols[f.name] for f in self.schema], schema=self.schema)
        self._writer.write_table(table, row_group_size=max(1, c.rows))

    def __exit__(self, *exc) -> None:
        if self._writer is not None:
            self._writer.close()


class JsonlSink:
    """One JSON object per line, the columns as keys (unknown record numbers as null)."""

    def __init__(self, path: Path, kind: str, provenance: dict, key: bytes = PARQUET_KEY, media: list[str] = (),
                 media_bytes: bool = False):
        self.path = path
        self._f = None

    def __enter__(self) -> JsonlSink:
        self._f = open(self.path, "wb")
        return self

    def write(self, c: Chunk) -> None:
        o = c.offsets
        lines = []
        for k in range(c.rows):
            a, b = int(o[k]), int(o[k + 1])
            row = {name: (None if v[k] < 0 else int(v[k])) for name, v in c.scalars.items()}
            row.update(input_ids=c.input_ids[a:b], labels=c.labels[a:b], attention_mask=c.attention[a:b])
            row.update({name: cells[k] for name, cells in c.media.items()})
            lines.append(orjson.dumps(row, option=orjson.OPT_SERIALIZE_NUMPY))
        self._f.write(b"\n".join(lines) + b"\n")

    def __exit__(self, *exc) -> None:
        if self._f is not None:
            self._f.close()

"""Batches of 64 x 2048 for a transformers model: ``SFTDataset`` + ``collate`` through a
``DataLoader`` (2 workers) against the same batches built by Hugging Face ``datasets`` +
``DataCollatorForSeq2Seq`` from Parquet, in the same run: the episodes as ``sftdata export``
wrote them, the packed rows as stored (the export holds one sequence per row).

    python benchmarks/bench_interop.py [--episodes 30000] [--batches 40] [--workers 2]

The dataset is synthetic (lognormal lengths, median 350 tokens, chat markers, the mask
rule), packed into rows of 2048 tokens (``--block-size 2047``), and its episodes cut to
2048 tokens for the padded form. Both sides visit the same rows in the same order (the
sftdata sampler's) and the first batches are checked equal. The time is per batch over
``--batches`` batches after the first (worker start-up excluded), best of ``--repeat``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_pack import synthetic_dataset  # noqa: E402

from sftdata.interop.export import export  # noqa: E402
from sftdata.order.config import LoaderConfig  # noqa: E402
from sftdata.pack import PackOptions, pack  # noqa: E402
from sftdata.torch import SFTDataset, SFTSampler, collate  # noqa: E402

BLOCK = 2047  # rows of 2048 tokens


def per_batch(loader, batches: int) -> tuple[float, dict]:
    """Seconds per batch over ``batches`` batches after the first, and the first batch."""
    it = iter(loader)
    first = next(it)
    t = time.perf_counter()
    n = 0
    for _ in range(batches):
        try:
            next(it)
        except StopIteration:
            break
        n += 1
    return (time.perf_counter() - t) / max(n, 1), first


def hf_tokenizer(pad_id: int):
    """A stand-in tokenizer for ``DataCollatorForSeq2Seq`` (it only pads): pad = the dataset's pad id."""
    import transformers
    from tokenizers import Tokenizer, models

    vocab = {"<pad>": pad_id}
    return transformers.PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="<pad>")),
                                                pad_token="<pad>")


def compare(label: str, ds: SFTDataset, parquet: Path, columns: list[str], args, collator) -> float:
    import datasets
    import torch
    import transformers

    cfg = LoaderConfig(batch_size=args.batch, block_size=BLOCK, epoch_seed=1337)
    ours_dl = torch.utils.data.DataLoader(ds, batch_size=args.batch, sampler=SFTSampler(ds, cfg), collate_fn=collator,
                                          num_workers=args.workers, persistent_workers=True)
    hf = datasets.load_dataset("parquet", data_files={"train": str(parquet)}, split="train",
                               cache_dir=str(parquet.parent / "hf_cache"))
    hf = hf.select_columns(columns)
    seq2seq = transformers.DataCollatorForSeq2Seq(hf_tokenizer(ds.pad_id or 0), padding="longest",
                                                  label_pad_token_id=-100, return_tensors="pt")
    hf_dl = torch.utils.data.DataLoader(hf, batch_size=args.batch, sampler=list(SFTSampler(ds, cfg)),
                                        collate_fn=seq2seq, num_workers=args.workers, persistent_workers=True)
    best_ours = best_hf = float("inf")
    for _ in range(args.repeat):
        t_ours, b_ours = per_batch(ours_dl, args.batches)
        t_hf, b_hf = per_batch(hf_dl, args.batches)
        best_ours, best_hf = min(best_ours, t_ours), min(best_hf, t_hf)
    for k in columns:  # the same batch, token for token
        assert torch.equal(b_ours[k], b_hf[k].to(b_ours[k].dtype)), k
    shape = tuple(b_ours["input_ids"].shape)
    print(f"{label}: batch {shape[0]} x {shape[1]}  sftdata {best_ours * 1e3:8.2f} ms   datasets + "
          f"DataCollatorForSeq2Seq {best_hf * 1e3:8.2f} ms   -> {best_hf / best_ours:5.1f}x")
    return best_hf / best_ours


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--episodes", type=int, default=30_000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        t = time.perf_counter()
        synthetic_dataset(tmp / "episodes", args.episodes)
        pack(tmp / "episodes", tmp / "packed", PackOptions(block_size=BLOCK))
        export(tmp / "packed", tmp / "packed_export")
        export(tmp / "episodes", tmp / "episodes_export")
        packed = SFTDataset(tmp / "packed")
        episodes = SFTDataset(tmp / "episodes", block_size=BLOCK)
        print(f"dataset: {len(episodes):,} episodes, {int(episodes.lengths.sum()):,} tokens -> {len(packed):,} rows of "
              f"{BLOCK + 1} (built and exported in {time.perf_counter() - t:.1f} s); DataLoader num_workers="
              f"{args.workers}")
        # the export holds one sequence per row (docs/INTEROP.md); the packed rows as stored, for the datasets side
        rows_parquet(packed, tmp / "packed_rows.parquet")
        compare("packed rows   ", packed, tmp / "packed_rows.parquet",
                ["input_ids", "labels", "position_ids"], args, collate())
        # the episodes export is whole episodes: cut both sides to rows of 2048 the same way
        cut = tmp / "episodes_cut.parquet"
        _cut_parquet(tmp / "episodes_export" / "train.parquet", cut, BLOCK + 1)
        compare("episodes     ", episodes, cut, ["input_ids", "labels", "attention_mask"], args,
                collate(pad_id=episodes.pad_id))


def rows_parquet(ds: SFTDataset, dst: Path, chunk: int = 512) -> None:
    """The packed rows of ``ds`` as stored (input_ids, labels, position_ids), one Parquet row each."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([(c, pa.list_(pa.int64())) for c in ("input_ids", "labels", "position_ids")])
    with pq.ParquetWriter(dst, schema) as w:
        for a in range(0, len(ds), chunk):
            items = ds.__getitems__(list(range(a, min(len(ds), a + chunk))))
            w.write_table(pa.table({c: [it[c].tolist() for it in items] for c in schema.names}, schema=schema))


def _cut_parquet(src: Path, dst: Path, keep: int) -> None:
    """The exported episodes cut to their first ``keep`` tokens (what SFTDataset(block_size) serves)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    f = pq.ParquetFile(src)
    with pq.ParquetWriter(dst, f.schema_arrow) as w:
        for batch in f.iter_batches():
            cols = []
            for name in f.schema_arrow.names:
                col = batch.column(name)
                if pa.types.is_list(col.type):
                    col = pc.list_slice(col, 0, keep)
                cols.append(col.cast(f.schema_arrow.field(name).type))
            w.write_table(pa.Table.from_arrays(cols, schema=f.schema_arrow))


if __name__ == "__main__":
    np.set_printoptions(linewidth=120)
    main()

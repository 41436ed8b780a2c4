"""pack of a dataset with images: each packed shard carries its media table ("episode" the
packed row, offset within the row), format_version 4, and verify's media check passes on
it; inspect and export read the rows' media; a plan that would cut an image is refused."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sftdata.errors import UsageError
from sftdata.interop.export import ExportOptions, export
from sftdata.pack.run import PackOptions, pack
from sftdata.report import row_view
from sftdata.report.views import dataset_tokenizer
from sftdata.store import open_dataset
from sftdata.store.format import MEDIA_FILE
from sftdata.verify import verify
from tests.helpers.media_dataset import media_dataset

RECORDS = [[(56, 56), (100, 200)], [(300, 120)], [], [(56, 56)] * 3]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return media_dataset(tmp_path_factory.mktemp("media"), RECORDS)


@pytest.fixture(scope="module")
def packed(built, tmp_path_factory):
    out = tmp_path_factory.mktemp("packed") / "p"
    pack(built.root, out, PackOptions(block_size=255))
    return out



def test_every_packed_row_carries_its_images_and_verify_passes(built, packed):
    report = verify(packed)
    assert report.ok, [str(p) for p in report.problems]
    assert next(c.status for c in report.checks if c.name == "media") == "ok"
    ds, src = open_dataset(packed), open_dataset(built.root)
    assert ds.metadata["format_version"] == 4 and ds.processor_settings == built.settings
    assert ds.metadata["media"] == src.metadata["media"] == {"items": 6, "images": 6, "videos": 0, "tokens": 88}
    sp = ds.split("train")
    got = []
    for row in range(sp.num_rows):
        ids, _ = sp.row(row)
        for s in ds.media_spans("train", row):
            assert ids[s.offset:s.offset + s.item.count.tokens].tolist() == [built.image_pad] * s.item.count.tokens
            got.append(s.item)
    assert sorted(got, key=lambda i: i.uri) == sorted((s.item for spans in built.spans["train"] for s in spans),
                                                       key=lambda i: i.uri)


def test_a_row_places_each_image_at_its_segments_offset(packed):
    ds = open_dataset(packed)
    lines = [json.loads(line) for line in (packed / "train" / "shard_00000" / MEDIA_FILE).read_text().splitlines()]
    seg = np.fromfile(packed / "train" / "shard_00000" / "segments.idx", dtype="<u8").reshape(-1, 7)
    by_episode = {int(e): (int(r), int(o)) for r, o, _, _, e, _, _ in seg.tolist()}
    src = {0: [28, 37], 1: [28], 3: [28, 37, 46]}  # each source episode's image offsets
    want = sorted((by_episode[e][0], by_episode[e][1] + o) for e, offs in src.items() for o in offs)
    assert [(line["episode"], line["offset"]) for line in lines] == want
    assert [s.offset for r in range(ds.split("train").num_rows) for s in ds.media_spans("train", r)] == \
        [o for _, o in want]


def test_inspect_and_export_read_the_rows_media(built, packed, tmp_path):
    ds = open_dataset(packed)
    tok, rule, _ = dataset_tokenizer(ds)
    labels = [p.text for r in range(ds.split("train").num_rows)
              for sg in row_view(ds, "train", r, tok, rule).segments for p in sg.pieces if p.media]
    assert sorted(labels) == sorted(["<image 1: 56x56 -> 4 tokens>", "<image 2: 100x200 -> 28 tokens>",
                                     "<image 1: 300x120 -> 44 tokens>", "<image 1: 56x56 -> 4 tokens>",
                                     "<image 2: 56x56 -> 4 tokens>", "<image 3: 56x56 -> 4 tokens>"])
    export(packed, tmp_path / "out", ExportOptions(format="jsonl"))
    rows = [json.loads(line) for line in (tmp_path / "out" / "train.jsonl").read_text().splitlines()]
    assert {r["episode"]: r["images"] for r in rows} == {e: [str(p) for p in built.images[e]] for e in range(4)}


def test_stream_packing_is_refused(built, tmp_path):
    with pytest.raises(UsageError, match=r"holds images or videos: stream packing cuts conversations across rows "
                                         r"and injects their context again, which would cut or repeat a media "
                                         r"item; use --strategy bfd"):
        pack(built.root, tmp_path / "p", PackOptions(block_size=255, strategy="stream"))
    assert not (tmp_path / "p").exists()


def test_a_row_that_would_cut_an_image_is_refused(built, tmp_path):
    with pytest.raises(UsageError, match=r"episode \d of split train is longer than a row, and the part of it a row "
                                         r"keeps \(tokens \[0, 51\)\) cuts its image at tokens \[\d+, \d+\): a media "
                                         r"item is never cut\. Use --overlong drop"):
        pack(built.root, tmp_path / "p", PackOptions(block_size=50))
    assert not (tmp_path / "p").exists()

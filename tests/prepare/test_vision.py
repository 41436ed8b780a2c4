"""prepare-chat on image records for a Qwen-VL model folder built offline: every kept
episode's ids are transformers' ``processor.apply_chat_template(messages, tokenize=True)``,
no media token is trained, each shard's media table says where each image's tokens are, the
metadata and tokenizer_state.json pin the processor and count the media, one and two workers
write the same bytes, and a bad media file is one named reject."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import orjson
import pytest
from typer.testing import CliRunner

from sftdata.chat.loss_rule import rule_from_state
from sftdata.cli import app
from sftdata.errors import OutputExistsError
from sftdata.media.item import span_from_row
from sftdata.prepare import PrepareOptions, pool, prepare
from sftdata.prepare.build import MEDIA_NOTE
from sftdata.store.format import MEDIA_FILE, MEDIA_FORMAT_VERSION
from tests.helpers.data import write_jsonl
from tests.helpers.vision import IMAGES, model_folder, reference_ids, reference_processor, write_images

NAMES = [name for name, *_ in IMAGES]


def _records() -> list[dict]:
    """Records in each form a user writes: OpenAI image_url parts, TRL / transformers image
    parts, LLaMA-Factory's images list with <image> in the text; several images a record."""
    out = []
    for k, name in enumerate(NAMES):
        other = NAMES[(k + 2) % len(NAMES)]
        if k % 3 == 0:
            user = [{"type": "image_url", "image_url": {"url": name}}, {"type": "text", "text": f"What is {k}?"}]
            out.append({"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": f"It is {k}."}]})
        elif k % 3 == 1:
            out.append({"messages": [
                {"role": "system", "content": "You describe pictures."},
                {"role": "user", "content": [{"type": "text", "text": "Compare "}, {"type": "image", "image": name},
                                             {"type": "text", "text": " and "}, {"type": "image", "image": other}]},
                {"role": "assistant", "content": "They differ."},
                {"role": "user", "content": "Why?"}, {"role": "assistant", "content": "Sizes."}]})
        else:
            out.append({"messages": [{"role": "user", "content": "<image>Describe it."},
                                     {"role": "assistant", "content": "Noise."}], "images": [name]})
    out.append({"messages": [{"role": "user", "content": "No picture here."}, {"role": "assistant", "content": "Ok."}]})
    return out


def _reference_messages(record: dict) -> list[dict]:
    """The record as transformers is given it: image parts naming files (LLaMA-Factory's
    form as its <image> placeholders stand)."""
    out = []
    images = iter(record.get("images", []))
    for m in record["messages"]:
        content = m["content"]
        if isinstance(content, str) and "<image>" in content:
            pieces = content.split("<image>")
            parts = [{"type": "text", "text": pieces[0]}] if pieces[0] else []
            for piece in pieces[1:]:
                parts.append({"type": "image", "image": next(images)})
                if piece:
                    parts.append({"type": "text", "text": piece})
            content = parts
        elif isinstance(content, list):
            content = [{"type": "image", "image": p["image_url"]["url"]} if p["type"] == "image_url" else p
                       for p in content]
        out.append({**m, "content": content})
    return out


def _episodes(root, split="train"):
    """Each episode of ``split`` as (ids, mask, record, its media table lines), read from the files."""
    meta = json.loads((root / "dataset_metadata.json").read_text())
    dtype = np.dtype(meta["token_dtype"])
    out = []
    for sh in meta["splits"][split]["shards"]:
        folder = root / split / sh["name"]
        tokens = np.fromfile(folder / "tokens.bin", dtype=dtype)
        mask = np.fromfile(folder / "mask.bin", dtype=np.uint8)
        idx = np.fromfile(folder / "episodes.idx", dtype="<u8").reshape(-1, 2)
        sources = np.fromfile(folder / "sources.idx", dtype="<u8")
        table = [orjson.loads(line) for line in (folder / MEDIA_FILE).read_bytes().splitlines()] \
            if (folder / MEDIA_FILE).exists() else []
        for e, (start, length) in enumerate(idx.tolist()):
            out.append((tokens[start:start + length], mask[start:start + length], int(sources[e]),
                        [r for r in table if r["episode"] == e]))
    return meta, out


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    root = tmp_path_factory.mktemp("vision")
    folder = model_folder(root / "model", "qwen2_5_vl")
    write_images(root / "data")
    records = _records()
    src = write_jsonl(root / "data" / "records.jsonl", records)
    return root, folder, src, records


def _proven(root, folder, family: str, src, records: list[dict], out) -> None:
    """prepare-chat of ``records`` for ``family``'s folder: each episode the processor's."""
    summary = prepare([src], out, PrepareOptions(tokenizer=str(folder), shard_tokens=2000))
    assert summary.rejected == {}
    processor = reference_processor(folder, family)
    meta, episodes = _episodes(out)
    state = json.loads((out / "tokenizer_state.json").read_text())
    assert state["processor"]["family"] == family
    rule = rule_from_state(state)
    pad = state["mask_rule"]["media_ids"][0]
    assert len(episodes) == len(records) and meta["format_version"] == MEDIA_FORMAT_VERSION
    items = 0
    for ids, mask, record, table in episodes:
        assert ids.tolist() == reference_ids(processor, _reference_messages(records[record]), root / "data")
        assert mask[np.isin(ids, state["mask_rule"]["media_ids"])].sum() == 0
        assert np.array_equal(rule.masks(ids, np.array([ids.size])), mask)
        for row in table:
            _, span = span_from_row(row)
            n = span.item.count.tokens
            assert ids[span.offset:span.offset + n].tolist() == [pad] * n and ids[span.offset - 1] != pad
        assert int(np.count_nonzero(ids == pad)) == sum(r["tokens"] for r in table)
        items += len(table)
    assert items == 11
    tokens = sum(r["tokens"] for *_, t in episodes for r in t)
    assert meta["media"] == {"items": 11, "images": 11, "videos": 0, "tokens": tokens} == summary.media
    assert meta["splits"]["train"]["media"] == meta["media"]


def test_every_episode_is_the_processors_and_no_media_token_is_trained(model, tmp_path):
    root, folder, src, records = model
    _proven(root, folder, "qwen2_5_vl", src, records, tmp_path / "ds")
    state = json.loads((tmp_path / "ds" / "tokenizer_state.json").read_text())
    assert state["processor"]["max_pixels"] == 12845056


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen3_vl"])
def test_the_other_qwen_families_too(model, family, tmp_path):
    root, _, src, records = model
    _proven(root, model_folder(tmp_path / family, family), family, src, records, tmp_path / "ds")


def test_one_and_two_workers_write_the_same_bytes(model, tmp_path, monkeypatch):
    root, folder, src, _ = model
    opts = PrepareOptions(tokenizer=str(folder), val_split=0.3, seed=4, shard_tokens=300)
    prepare([src], tmp_path / "one", opts)
    monkeypatch.setattr(pool, "MAX_PART_BYTES", 400)  # several partitions, each staging its own episodes
    monkeypatch.setattr(pool, "MIN_PART_BYTES", 400)
    prepare([src], tmp_path / "two", dataclasses.replace(opts, workers=2))
    files = {str(p.relative_to(tmp_path / "one")): p.read_bytes() for p in sorted((tmp_path / "one").rglob("*"))
             if p.is_file() and p.name != "dataset_metadata.json"}
    assert files == {str(p.relative_to(tmp_path / "two")): p.read_bytes()
                     for p in sorted((tmp_path / "two").rglob("*")) if p.is_file() and p.name != "dataset_metadata.json"}
    one, two = (json.loads((tmp_path / d / "dataset_metadata.json").read_text()) for d in ("one", "two"))
    assert one["splits"] == two["splits"] and one["media"] == two["media"]
    shards = [sh for m in one["splits"].values() for sh in m["shards"]]
    assert len(shards) >= 4 and sum(1 for k in files if k.endswith(MEDIA_FILE)) == len(shards)  # every shard's
    assert all(MEDIA_FILE in sh["files"] and "media" in sh for sh in shards)
    assert one["media"]["items"] == 11 and one["format_version"] == MEDIA_FORMAT_VERSION


def test_a_bad_media_file_is_one_named_reject(model, tmp_path):
    root, folder, _, records = model
    data = tmp_path / "data"
    write_images(data)
    (data / "cut.jpg").write_bytes((data / "portrait.jpg").read_bytes()[:700])
    bad = [{"messages": [{"role": "user", "content": [{"type": "image", "image": "cut.jpg"}]},
                         {"role": "assistant", "content": "?"}]},
           {"messages": [{"role": "user", "content": [{"type": "image", "image": "gone.png"}]},
                         {"role": "assistant", "content": "?"}]}]
    src = write_jsonl(data / "in.jsonl", records[:3] + bad)
    result = CliRunner().invoke(app, ["prepare-chat", str(src), "-o", str(tmp_path / "ds"), "--tokenizer", str(folder),
                                      "--json", "--quiet"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["rejected"] == {"media_missing": 1, "media_unreadable": 1}
    assert out["media"] == json.loads((tmp_path / "ds" / "dataset_metadata.json").read_text())["media"]
    assert out["media"]["images"] == 4  # one, two and one in the three good records
    lines = [orjson.loads(line) for line in (tmp_path / "ds" / "rejects.jsonl").read_bytes().splitlines()]
    assert [(r["record"], r["reason"]) for r in lines] == [(3, "media_unreadable"), (4, "media_missing")]
    assert lines[1]["message"].startswith(f"image gone.png: no such file: {data / 'gone.png'}")
    assert lines[0]["where"] == f"{src}:line 4"


def test_a_record_with_media_needs_a_processor(model, tmp_path):
    root, folder, _, records = model
    plain = tmp_path / "plain"
    plain.mkdir()
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (plain / f).write_bytes((folder / f).read_bytes())
    src = write_jsonl(root / "data" / "needs.jsonl", records[:1] + records[-1:])
    summary = prepare([src], tmp_path / "ds", PrepareOptions(tokenizer=str(plain)))
    assert summary.rejected == {"media_needs_processor": 1}
    (line,) = (tmp_path / "ds" / "rejects.jsonl").read_bytes().splitlines()
    assert b"preprocessor_config.json" in line and b"--tokenizer" in line
    assert "processor" not in json.loads((tmp_path / "ds" / "tokenizer_state.json").read_text())


def test_media_too_long_for_max_tokens_is_rejected_by_name(model, tmp_path):
    root, folder, _, records = model
    src = write_jsonl(root / "data" / "long.jsonl", records[3:4] + records[-1:])  # a panorama: 1600x120
    summary = prepare([src], tmp_path / "ds", PrepareOptions(tokenizer=str(folder), max_tokens=60))
    assert summary.rejected == {"media_truncated": 1}
    (line,) = [orjson.loads(x) for x in (tmp_path / "ds" / "rejects.jsonl").read_bytes().splitlines()]
    assert "never cut" in line["message"] and "--max-tokens 60" in line["message"]


def test_a_dataset_with_media_is_never_up_to_date(model, tmp_path):
    root, folder, _, records = model
    src = write_jsonl(root / "data" / "again.jsonl", records[:2])
    opts = PrepareOptions(tokenizer=str(folder))
    prepare([src], tmp_path / "ds", opts)
    with pytest.raises(OutputExistsError, match="holds images or videos, whose files its build key does not cover"):
        prepare([src], tmp_path / "ds", opts)
    again = prepare([src], tmp_path / "ds", dataclasses.replace(opts, overwrite=True))
    assert not again.up_to_date and again.changed == [MEDIA_NOTE]
    text = write_jsonl(root / "data" / "text.jsonl", records[-1:])
    prepare([text], tmp_path / "text", opts)
    assert prepare([text], tmp_path / "text", opts).up_to_date  # no media: the build key decides as before

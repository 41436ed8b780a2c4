"""inspect and report on a dataset with images: each run of placeholder tokens shown as one
label (``<image 1: 56x56 -> 4 tokens>``), ``--json`` carrying the spans, and the report's
tokens-per-image histogram. A text dataset shows as before."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from sftdata.cli import app
from sftdata.report import dataset_report, episode_view
from sftdata.report.views import dataset_tokenizer
from sftdata.store import open_dataset
from tests.helpers.media_dataset import media_dataset

ENV = {"COLUMNS": "100", "NO_COLOR": "1", "TERM": "dumb"}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return media_dataset(tmp_path_factory.mktemp("media"), [[(56, 56), (100, 200)], [(300, 120)], []])


def test_an_episode_shows_each_image_as_one_labelled_piece(built):
    ds = open_dataset(built.root)
    tok, rule, _ = dataset_tokenizer(ds)
    v = episode_view(ds, "train", 0, tok, rule)
    user = [(p.text, p.trained, p.media) for p in v.pieces[5:10]]
    assert user == [("user\nPhoto 1:", False, False), ("<image 1: 56x56 -> 4 tokens>", False, True),
                    (". Photo 2:", False, False), ("<image 2: 100x200 -> 28 tokens>", False, True),
                    (". What is in record 0?", False, False)]
    assert not any("<|image_pad|>" in p.text for p in v.pieces)
    assert v.media == [{k: val for k, val in s.row(0).items() if k != "episode"} for s in built.spans["train"][0]]
    assert [(m["offset"], m["tokens"], m["size"]) for m in v.media] == [(28, 4, [56, 56]), (37, 28, [100, 200])]
    text_only = episode_view(ds, "train", 2, tok, rule)
    assert (text_only.media, any(p.media for p in text_only.pieces)) == ([], False)


def test_inspect_draws_the_labels_and_json_carries_the_spans(built):
    r = CliRunner().invoke(app, ["inspect", str(built.root), "--episode", "1"], env=ENV)
    assert r.exit_code == 0, r.output
    assert "Photo 1:<image 1: 300x120 -> 44 tokens>. What is in record 1?<|im_end|>" in r.output.splitlines()
    assert "image_pad" not in r.output
    r = CliRunner().invoke(app, ["inspect", str(built.root), "--episode", "0", "--episode", "2", "--json"], env=ENV)
    assert r.exit_code == 0, r.output
    got = [e["media"] for e in json.loads(r.stdout)["episodes"]]
    assert [[(m["kind"], m["offset"], m["tokens"], m["uri"]) for m in spans] for spans in got] == [
        [("image", 28, 4, str(built.images[0][0])), ("image", 37, 28, str(built.images[0][1]))], []]


def test_the_report_has_a_tokens_per_image_histogram(built, tmp_path):
    rep = dataset_report(built.root)
    h = rep.figures[0].media_tokens
    assert (h.total, [(h.edges[i], c) for i, c in enumerate(h.counts) if c]) == (3, [(4.0, 1), (27.0, 1), (39.0, 1)])
    r = CliRunner().invoke(app, ["report", str(built.root), "-o", str(tmp_path / "r.html")], env=ENV)
    assert r.exit_code == 0, r.output
    html = (tmp_path / "r.html").read_text()
    assert 'id="media"' in html and "Tokens per image" in html


def test_a_text_dataset_report_has_no_media_section(tmp_path):
    from sftdata.prepare import PrepareOptions, prepare
    from tests.helpers.data import chat, write_jsonl

    prepare([write_jsonl(tmp_path / "in.jsonl", [chat("hi", "hello")])], tmp_path / "text", PrepareOptions(workers=1))
    rep = dataset_report(tmp_path / "text")
    assert rep.figures[0].media_tokens is None
    r = CliRunner().invoke(app, ["report", str(tmp_path / "text"), "-o", str(tmp_path / "r.html")], env=ENV)
    assert r.exit_code == 0 and "Tokens per image" not in (tmp_path / "r.html").read_text()


def test_the_overview_names_the_media_and_the_processor(built):
    r = CliRunner().invoke(app, ["inspect", str(built.root)], env=ENV)
    assert r.exit_code == 0, r.output
    assert "media: 3 images, 76 placeholder tokens (never trained) · processor qwen2_5_vl, pixels 3,136..50,176" \
        in r.output.splitlines()
    r = CliRunner().invoke(app, ["inspect", str(built.root), "--json"], env=ENV)
    media = json.loads(r.stdout)["media"]
    assert ({k: v for k, v in media.items() if k != "processor"}, media["processor"]) == \
        ({"items": 3, "images": 3, "videos": 0, "tokens": 76}, built.settings)


def test_the_reports_samples_show_each_image_as_a_thumbnail_and_one_label(built, tmp_path):
    import re

    r = CliRunner().invoke(app, ["report", str(built.root), "-o", str(tmp_path / "r.html")], env=ENV)
    assert r.exit_code == 0, r.output
    html = (tmp_path / "r.html").read_text()
    assert re.findall(r"<figcaption>([^<]*)</figcaption>", html) == [
        "&lt;image 1: 56x56 -&gt; 4 tokens&gt;", "&lt;image 2: 100x200 -&gt; 28 tokens&gt;",
        "&lt;image 1: 300x120 -&gt; 44 tokens&gt;"]
    assert html.count('<img src="data:image/jpeg;base64,') == 3
    assert ">&lt;|image_pad|&gt;<" not in html  # no placeholder drawn token by token
    assert '<span class="k" data-i="' + " ".join(["151655"] * 4) + '">&lt;image 1: 56x56 -&gt; 4 tokens&gt;</span>' \
        in html


def test_a_media_run_is_one_labelled_run_and_a_missing_image_has_no_thumbnail(built, tmp_path):
    from PIL import Image

    from sftdata.report.thumbnails import thumbnail
    from sftdata.report.tokens import token_runs

    ds = open_dataset(built.root)
    tok, _, _ = dataset_tokenizer(ds)
    ids, mask = ds.split("train").episode(0)
    runs = token_runs(ids[20:70], mask[20:70] != 0, tok, media=[(8, 12, "<image 1>"), (17, 45, "<image 2>")])
    labelled = [(r.start, r.marker, [len(g.ids) for g in r.groups], [g.text for g in r.groups]) for r in runs
                if r.start in (8, 17)]
    assert labelled == [(8, True, [4], ["<image 1>"]), (17, True, [28], ["<image 2>"])]
    assert "".join(g.text for r in runs for g in r.groups if r.start not in (8, 17)) == \
        tok.decode(ids[20:28].tolist()) + tok.decode(ids[32:37].tolist()) + tok.decode(ids[65:70].tolist())
    src = thumbnail(str(built.images[0][1]))
    import base64
    import io
    with Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1]))) as im:
        assert (im.format, im.size) == ("JPEG", (48, 96))  # 100x200 shrunk to 96 on its longer side
    assert thumbnail(str(tmp_path / "gone.jpg")) is None and thumbnail("data:") is None

"""`sftdata report`: the distributions behind the page are exactly those of the data, the
page shows exactly the trained tokens, works offline, and is written only where it may
be; the command's output and errors. (tests/report/test_browser.py opens it in Chromium.)"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from html.parser import HTMLParser

import numpy as np
import pytest
from typer.testing import CliRunner

from sftdata.cli import app
from sftdata.errors import DatasetError, OutputExistsError, UsageError
from sftdata.report import dataset_report, overview, write_report
from sftdata.report.collect import is_opener, scan_split
from sftdata.report.distributions import (
    count_histogram,
    curve_block_sizes,
    file_table,
    log_edges,
    log_histogram,
    share_by_length,
    truncation_curve,
    unit_histogram,
)
from sftdata.report.html import GENERATOR
from sftdata.report.plots import ReportExtraMissing, log_ticks
from sftdata.report.rejects import read_rejects
from sftdata.report.samples import TOKEN_BUDGET, budget, pick
from sftdata.report.tokens import token_groups, token_runs
from sftdata.store import open_dataset, split_segments
from tests.helpers.audit import make_dataset, make_packed, to_flat

pytest.importorskip("plotly", reason="the report extra (plotly) is not installed: pip install 'sftdata[report]'")
runner = CliRunner()


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("report"), bad_lines=2)


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    return make_packed(tmp_path_factory.mktemp("report_packed"), block_size=40)


def trained_runs_text(ids, mask, tok) -> list[str]:
    """The decoded text of each run of trained tokens."""
    m = np.concatenate([[0], np.asarray(mask) != 0, [0]]).astype(np.int8)
    starts, ends = np.flatnonzero(np.diff(m) == 1), np.flatnonzero(np.diff(m) == -1)
    return [tok.decode(np.asarray(ids)[a:b].tolist()) for a, b in zip(starts, ends)]


# -- distributions ------------------------------------------------------------------------
def test_log_edges_are_integers_shared_by_every_dataset():
    assert log_edges(1, 9).tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 10]
    assert log_edges(3, 40).tolist() == [3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 23, 27, 32, 39, 46]
    assert set(log_edges(100, 700).tolist()) <= set(log_edges(1, 5000).tolist())  # two reports overlay


def test_log_histogram_counts_cdf_and_zeros():
    b = log_histogram(np.array([0, 3, 5, 5, 40]))
    assert b.edges[0] == 3 and b.edges[-1] == 46
    assert dict(zip(b.edges, b.counts)) == {3: 1, 4: 0, 5: 2, 6: 0, 7: 0, 8: 0, 10: 0, 12: 0, 14: 0, 16: 0, 20: 0,
                                            23: 0, 27: 0, 32: 0, 39: 1}
    assert (b.total, b.zeros) == (5, 1)
    assert b.cdf[0] == 0.4 and b.cdf[2] == 0.8 and b.cdf[-1] == 1.0  # zeros count in the cdf
    assert log_histogram(np.zeros(3, np.int64)).counts == []


def test_count_histogram_one_bin_per_value_then_log_bins():
    b = count_histogram(np.array([2, 2, 4, 6]))
    assert (b.edges, b.counts, b.cdf) == ([2, 3, 4, 5, 6, 7], [2, 0, 1, 0, 1], [0.5, 0.5, 0.75, 0.75, 1.0])
    wide = count_histogram(np.array([1, 200]))
    assert wide.edges[0] == 1 and wide.edges[-1] > 200 and sum(wide.counts) == 2


def test_unit_histogram_closes_the_last_bin():
    b = unit_histogram(np.array([0.0, 0.5, 1.0, 1.0]), bins=4)
    assert b.edges == [0.0, 0.25, 0.5, 0.75, 1.0] and b.counts == [1, 0, 1, 2] and b.zeros == 1


def test_share_by_length_percentiles_per_bin():
    s = share_by_length(np.array([10, 11, 12, 13, 100, 14]), np.array([0.1, 0.2, 0.3, 0.4, 0.9, 0.5]))
    assert (s.lo, s.hi, s.episodes) == ([8, 12, 91], [12, 16, 128], [2, 3, 1])  # empty bins left out
    assert (s.p10, s.p50, s.p90) == ([0.1, 0.3, 0.9], [0.1, 0.4, 0.9], [0.1, 0.4, 0.9])  # nearest rank below
    assert s.mean == [0.15, 0.4, 0.9]


def test_truncation_curve_equals_brute_force():
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 300, 200)
    sizes = curve_block_sizes(int(lengths.max()), chosen=100)
    assert sizes == [32, 64, 100, 128, 256, 512]
    curve = truncation_curve(lengths, sizes, [7] * len(sizes), 70)
    for c in curve:
        keep = c.block_size + 1
        assert c.episodes_longer == int((lengths > keep).sum())
        assert c.tokens_dropped == int(np.maximum(lengths - keep, 0).sum())
        assert (c.trained_tokens_dropped, c.trained_dropped_share) == (7, 0.1)
    assert truncation_curve(lengths, sizes, None, None)[0].trained_tokens_dropped is None


def test_file_table_splits_episodes_by_record_range():
    sources = [{"path": "a.jsonl", "first_record": 0, "records": 4}, {"path": "b.jsonl", "first_record": 4,
                                                                      "records": 3}]
    rows = file_table(sources, np.array([0, 2, 3, 4, 6]), np.array([10, 20, 30, 40, 50]), np.array([1, 2, 3, 4, 5]),
                      {"b.jsonl": 1})
    assert [(r.path, r.records, r.episodes, r.tokens, r.trained_tokens, r.rejected, r.length_p50) for r in rows] == [
        ("a.jsonl", 4, 3, 60, 6, 0, 20.0), ("b.jsonl", 3, 2, 90, 9, 1, 45.0)]


def test_log_ticks_label_every_tick():
    assert log_ticks(3, 46) == [3, 5, 7, 10, 20, 30]
    assert log_ticks(1, 5000) == [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000]


# -- the pass over mask and tokens --------------------------------------------------------
def test_is_opener():
    toks = np.array([0, 4, 5, 6, 7, 2**32 - 1, 3], np.uint32)
    assert is_opener(toks.copy(), [4, 5, 6]).tolist() == np.isin(toks, [4, 5, 6]).tolist()
    assert is_opener(toks, [4, 6]).tolist() == [False, True, False, True, False, False, False]


@pytest.mark.parametrize("chunk", [16, 1 << 20])
def test_scan_split_equals_per_episode_sums(ds, tok, chunk):
    sp = open_dataset(ds).split("train")
    keeps = [5, 20, 29, 1000]
    openers = [tok.ids.user, tok.ids.assistant, tok.ids.tool]
    got = scan_split(sp, keeps, openers, chunk=chunk)
    eps = [sp.episode(i) for i in range(sp.num_episodes)]
    assert got.trained.tolist() == [int(np.asarray(m).sum()) for _, m in eps]
    assert got.trained_past == [sum(int(np.asarray(m)[k:].sum()) for _, m in eps) for k in keeps]
    assert got.turns.tolist() == [int(np.isin(np.asarray(t), openers).sum()) for t, _ in eps]
    assert got.turns.tolist() == [2, 4, 4, 2, 4, 4]  # the chats: one user/assistant pair, or two


def test_report_truncation_agrees_with_the_overview(ds):
    r = dataset_report(ds, block_size=20, sample=0)
    for fig, ov in zip(r.figures, r.overview.splits):
        at = next(c for c in fig.truncation if c.block_size == 20)
        assert at == ov.block
        assert sum(fig.lengths.counts) == ov.episodes == fig.count and fig.tokens == ov.tokens
        assert sum(fig.trained.counts) + fig.trained.zeros == ov.episodes


# -- tokens, rejects, samples -------------------------------------------------------------
@pytest.mark.parametrize("text", ["plain words", "😀", "héllo 😀 wörld", "日本語のテキスト", "🇫🇷 flag"])
def test_token_groups_join_to_the_decoded_text(tok, text):
    ids = tok.encode(text)
    groups = token_groups(ids, tok)
    assert "".join(g.text for g in groups) == tok.decode(ids) == text
    assert [i for g in groups for i in g.ids] == ids
    if text == "😀":
        assert [(g.ids, g.text) for g in groups] == [(ids, "😀")]


def test_token_runs_break_at_markers_training_and_segments(tok):
    hi, yo = tok.encode("hi there"), tok.encode("yo")
    ids = np.array([tok.ids.user, *hi, tok.ids.end, tok.ids.assistant, *yo, tok.ids.end])
    trained = np.array([0] * (len(hi) + 2) + [1] * (len(yo) + 2), bool)
    runs = token_runs(ids, trained, tok)
    assert [("".join(g.text for g in r.groups), r.trained, r.marker) for r in runs] == [
        ("<|USER|>", False, True), ("hi there", False, False), ("<|END|>", False, True), ("<|ASSISTANT|>", True, True),
        ("yo", True, False), ("<|END|>", True, True)]
    seg = np.repeat([0, 1], [len(hi) + 2, len(yo) + 2])
    assert [r.segment for r in token_runs(ids, trained, tok, segment=seg)] == [0, 0, 0, 1, 1, 1]
    seg[1] = 1  # a segment change inside a text run cuts it
    assert [(r.start, r.segment) for r in token_runs(ids, trained, tok, segment=seg)][:3] == [(0, 0), (1, 1), (2, 0)]


def test_read_rejects_groups_by_reason_with_examples(tmp_path):
    p = tmp_path / "rejects.jsonl"
    lines = [{"record": i, "source": "a.jsonl" if i < 5 else "b.jsonl", "where": f"x:line {i + 1}",
              "reason": "invalid_json" if i % 3 else "unknown_role", "message": f"m{i}"} for i in range(8)]
    p.write_text("\n".join(json.dumps(x) for x in lines) + "\n[1]\n{bad\n", encoding="utf-8")
    r = read_rejects(p, examples=2)
    assert [(g.reason, g.count, [x.record for x in g.examples]) for g in r.groups] == [
        ("invalid_json", 5, [1, 2]), ("unknown_role", 3, [0, 3])]
    assert r.groups[0].examples[0].where == "x:line 2" and r.groups[0].examples[0].message == "m1"
    assert (r.by_file, r.total, r.unreadable_lines) == ({"a.jsonl": 5, "b.jsonl": 3}, 8, 2)
    assert read_rejects(tmp_path / "none.jsonl").groups == []


def test_pick_takes_chosen_ids_first_then_the_seeded_sample():
    got = pick(100, [7, 3, 7], 4, seed=0)
    assert got[:2] == [(7, True), (3, True)] and len(got) >= 5 and all(not c for _, c in got[2:])
    assert [i for i, _ in got[2:]] == sorted(i for i, _ in got[2:]) and len({i for i, _ in got}) == len(got)
    assert pick(100, None, 4, seed=0) == pick(100, None, 4, seed=0)
    with pytest.raises(UsageError, match=r"--sample must be 0 or more, got -1"):
        pick(10, None, -1, 0)
    assert budget(1) == TOKEN_BUDGET and budget(10_000) == 512


def test_samples_errors(ds, packed):
    with pytest.raises(DatasetError, match=r"episode 99 does not exist in split 'train', which has 6 episodes"):
        dataset_report(ds, episodes=[99])
    with pytest.raises(UsageError, match=r"--row is for packed datasets; this one holds episodes: use --episode"):
        dataset_report(ds, rows=[0])
    with pytest.raises(UsageError, match=r"a packed dataset holds rows: use --row R"):
        dataset_report(packed, episodes=[0])
    with pytest.raises(DatasetError, match=r"has no split 'test' \(splits: train, val\)"):
        dataset_report(ds, split="test")
    with pytest.raises(UsageError, match=r"is packed: its rows are already 41 tokens"):
        dataset_report(packed, block_size=64)


def test_long_episodes_show_their_first_tokens(ds, tok, monkeypatch):
    monkeypatch.setattr("sftdata.report.samples.budget", lambda count, total: 10)
    r = dataset_report(ds, episodes=[1], sample=0)
    (s,) = r.samples
    assert (s.episode, s.shown, s.length) == (1, 10, 28)
    assert sum(len(g.ids) for run in s.runs for g in run.groups) == 10


# -- the page -----------------------------------------------------------------------------
class PageText(HTMLParser):
    """Per sample (``details.sample``): the text of its trained runs; the scripts' sources."""

    def __init__(self):
        super().__init__()
        self.samples: list[dict] = []
        self.stack: list[bool] = []  # per open span: inside a trained run
        self.remote: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for key in ("src", "href"):
            if a.get(key) and not a[key].startswith(("#", "data:")):
                self.remote.append(a[key])
        if tag == "details" and "sample" in (a.get("class") or ""):
            self.samples.append({**a, "trained": ""})
        if tag == "span":
            cls = (a.get("class") or "").split()
            self.stack.append(("run" in cls and "t" in cls) or bool(self.stack and self.stack[-1]))

    def handle_endtag(self, tag):
        if tag == "span" and self.stack:
            self.stack.pop()

    def handle_data(self, data):
        if self.stack and self.stack[-1] and self.samples:
            self.samples[-1]["trained"] += data


def test_the_page_is_self_contained_and_highlights_exactly_the_trained_tokens(ds, tok, tmp_path):
    out = tmp_path / "r.html"
    s = write_report(ds, out, sample=3, episodes=[5], block_size=20)
    page = out.read_text(encoding="utf-8")
    assert s.bytes == len(page.encode()) and GENERATOR in page[:400]
    assert (s.kind, s.plots, s.samples[0]) == ("episodes", 7, {"split": "train", "episode": 5})
    parsed = PageText()
    parsed.feed(page)
    assert parsed.remote == []  # no script, style, font or image from elsewhere
    assert not re.search(r"<script[^>]+src=|@import|url\(http", page)
    sp = open_dataset(ds).split("train")
    assert [int(x["data-episode"]) for x in parsed.samples] == [v["episode"] for v in s.samples]
    for x in parsed.samples:
        ids, mask = sp.episode(int(x["data-episode"]))
        assert x["trained"] == "".join(trained_runs_text(ids, mask, tok))
    figures = json.loads(re.search(r'id="sftdata-figures">(.*?)</script>', page, re.S).group(1))
    ids_on_page = re.findall(r'data-figure="([^"]+)"', page)
    assert sorted(figures) == sorted(ids_on_page) and len(figures) == s.plots
    assert "2 rejected records, by reason" in page and "invalid_json" in page
    assert "4 episodes (66.7%) are longer than one row of 21 tokens" in page


def test_packed_rows_draw_segments_and_boundaries(packed, tmp_path):
    out = tmp_path / "p.html"
    s = write_report(packed, out, rows=[0], sample=0)
    page = out.read_text(encoding="utf-8")
    sp = open_dataset(packed).split("train")
    n = len(split_segments(sp).of_rows([0]))
    assert (s.kind, s.samples) == ("packed", [{"split": "train", "row": 0}])
    assert page.count('class="segment"') == n and page.count('class="boundary"') == n - 1
    assert 'data-figure="fill"' in page and 'data-figure="segments"' in page and "truncation" not in page.lower()


def test_compare_overlays_two_datasets(ds, tmp_path):
    other = make_dataset(tmp_path / "b", "other", val_split=0.0)
    out = tmp_path / "c.html"
    s = write_report(ds, out, compare=other, sample=1)
    page = out.read_text(encoding="utf-8")
    assert s.compare == str(other)
    figures = json.loads(re.search(r'id="sftdata-figures">(.*?)</script>', page, re.S).group(1))
    assert [t["name"] for t in figures["lengths"]["data"]] == ["ds · train", "other · train"]
    assert page.count('class="stats"') == 2


def test_an_older_flat_layout_without_mask_is_shown_with_what_is_known(ds, tmp_path):
    flat = to_flat(ds, tmp_path / "flat", with_mask=False)
    s = write_report(flat, tmp_path / "f.html", sample=1, block_size=20)
    page = (tmp_path / "f.html").read_text(encoding="utf-8")
    assert s.plots == 4  # lengths, their cumulative curve, turns, truncation: nothing needs the mask
    assert "note: split train has no mask.bin: trained tokens unknown" in page
    assert "note: the dataset records no tokenizer: its samples are decoded with cl100k_base" in page
    assert "are longer than one row of 21 tokens; cutting them drops" in page and 'class="run t"' not in page


def test_where_the_page_may_be_written(ds, packed, tmp_path):
    out = tmp_path / "r.html"
    write_report(ds, out, sample=0)
    write_report(ds, out, sample=1)  # a report sftdata wrote is replaced
    other = tmp_path / "notes.html"
    other.write_text("<p>mine</p>")
    with pytest.raises(OutputExistsError, match=r"notes.html exists and is not a report sftdata wrote; choose another"):
        write_report(ds, other)
    assert other.read_text() == "<p>mine</p>"
    with pytest.raises(UsageError, match=r"is a folder; give the path of the HTML file to write"):
        write_report(ds, tmp_path)
    with pytest.raises(UsageError, match=r"is inside the dataset .*; write the report elsewhere"):
        write_report(ds, ds / "report.html")
    with pytest.raises(UsageError, match=r"--compare needs two datasets of one kind: .* is episodes, .* is packed"):
        write_report(ds, tmp_path / "x.html", compare=packed)
    assert not (tmp_path / "x.html").exists() and not list(tmp_path.glob(".x.html.*"))


def test_without_plotly_one_line_names_the_extra(ds, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "plotly", None)
    monkeypatch.setitem(sys.modules, "plotly.graph_objects", None)
    with pytest.raises(ReportExtraMissing, match=r"^sftdata report draws its plots with plotly, which is not "
                                                  r"installed: pip install 'sftdata\[report\]'$"):
        write_report(ds, tmp_path / "r.html")
    r = runner.invoke(app, ["report", str(ds), "-o", str(tmp_path / "r.html")])
    assert r.exit_code == 1 and r.output.strip().count("\n") == 0 and "pip install 'sftdata[report]'" in r.output
    assert not (tmp_path / "r.html").exists()


# -- the command --------------------------------------------------------------------------
def test_cli_writes_the_page_and_says_where(ds, tmp_path):
    out = tmp_path / "r.html"
    r = runner.invoke(app, ["report", str(ds), "-o", str(out), "--sample", "2", "-e", "1", "--block-size", "20"])
    assert r.exit_code == 0, r.output
    assert r.output.startswith(f"wrote {out} (") and "7 plots, 3 sample episodes" in r.output
    page = out.read_text(encoding="utf-8")
    assert f"sftdata report {ds} -o {out} --sample 2 --episode 1 --block-size 20" in page


def test_cli_json_summary(ds, tmp_path):
    r = runner.invoke(app, ["report", str(ds), "-o", str(tmp_path / "r.html"), "--sample", "1", "--seed", "3",
                            "--json"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert sorted(got) == ["bytes", "compare", "dataset", "kind", "output", "plots", "samples", "seconds"]
    assert got["samples"] == [{"split": "train", "episode": pick(6, None, 1, 3)[0][0]}]


def test_cli_errors(ds, tmp_path):
    r = runner.invoke(app, ["report", str(ds)])
    assert r.exit_code == 2 and "Missing option '--output'" in r.output
    r = runner.invoke(app, ["report", str(ds / "nope"), "-o", str(tmp_path / "r.html")])
    assert r.exit_code == 1 and "does not exist" in r.output
    r = runner.invoke(app, ["report", str(ds), "-o", str(tmp_path / "r.html"), "--compare", str(tmp_path / "none")])
    assert r.exit_code == 1 and f"dataset folder {tmp_path / 'none'} does not exist" in r.output
    r = runner.invoke(app, ["report", str(ds), "-o", str(tmp_path / "r.html"), "--token-dtype", "int8"])
    assert r.exit_code == 2 and "--token-dtype must be uint16 or uint32, got 'int8'" in r.output


def test_overview_of_inspect_is_unchanged_by_the_report(ds):
    before = overview(ds, block_size=20).as_dict()
    dataset_report(ds, block_size=20)
    assert overview(ds, block_size=20).as_dict() == before


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def test_labels_from_the_data_reach_plotly_as_text_never_as_markup(tmp_path):
    from sftdata.prepare import PrepareOptions, prepare
    from tests.helpers.audit import chats
    from tests.helpers.data import write_jsonl

    link = tmp_path / '<a href="http:' / 'x">x<' / "a>.jsonl"  # the path holds <a href="http:/x">x</a>.jsonl
    link.parent.mkdir(parents=True)
    write_jsonl(link, chats()[:6])
    plain = write_jsonl(tmp_path / "plain.jsonl", chats()[6:])
    a, b = tmp_path / "<b>bold", tmp_path / '<span style="font-size:99px">big'
    prepare([link, plain], a, PrepareOptions(val_split=0.25, shard_tokens=100, workers=1))
    prepare([plain], b, PrepareOptions(val_split=0.25, shard_tokens=100, workers=1))
    for kwargs in ({}, {"compare": b}):
        out = tmp_path / f"r{len(kwargs)}.html"
        write_report(a, out, sample=1, **kwargs)
        page = out.read_text(encoding="utf-8")
        figures = json.loads(re.search(r'id="sftdata-figures">(.*?)</script>', page, re.S).group(1))
        texts = list(_strings(figures))
        markup = [t for t in texts if re.search(r"<(?!br>|extra>|/extra>)", t)]
        assert markup == []  # plotly.js reads only the report's own <br> and <extra>
        assert not any("%{" in t and ("bold" in t or "http" in t) for t in texts)  # no label inside a template
        assert '<a href="http:' not in page and "<b>bold" not in page and '<span style="font-size' not in page
    files = {c for t in json.loads(re.search(r'id="sftdata-figures">(.*?)</script>', page, re.S).group(1))["files"]["data"]
             for c in t["y"]}
    assert f"&lt;b&gt;bold: {str(link).replace('<', '&lt;').replace('>', '&gt;')}" in files
    names = [t["name"] for t in figures["lengths"]["data"]]
    assert names == ["&lt;b&gt;bold · train", '&lt;span style="font-size:99px"&gt;big · train']


def test_a_note_beside_a_plot_escapes_the_label():
    from types import SimpleNamespace

    from sftdata.report.html_sections import _zero_note
    from sftdata.report.plots import Series

    s = Series("<img src=x onerror=alert(1)> · train", "#000", SimpleNamespace(lengths=SimpleNamespace(zeros=3)))
    assert _zero_note([s], "lengths", "episode") == (" episodes training nothing are left out of the log axis "
                                                    "(&lt;img src=x onerror=alert(1)&gt; · train: 3).")


def test_only_an_unchanged_page_sftdata_wrote_is_replaced(ds, tmp_path):
    """A file carrying the generator tag is not enough: the page's last line records the
    sha256 of what precedes it, so an edited page, or a user's file copying the tag, is
    never replaced."""
    out = tmp_path / "r.html"
    write_report(ds, out, sample=0)
    page = out.read_bytes()
    body, seal = page.rsplit(b"<!-- sftdata report sha256 ", 1)
    assert seal == hashlib.sha256(body).hexdigest().encode() + b" -->\n"
    edited = page.replace(b"<title>", b"<title>my notes: ", 1)
    for name, data in (("edited.html", edited), ("tagged.html", GENERATOR.encode() + b"<p>mine</p>"),
                       ("forged.html", GENERATOR.encode() + b"<p>mine</p>\n<!-- sftdata report sha256 " + b"0" * 64
                        + b" -->\n")):
        (tmp_path / name).write_bytes(data)
        with pytest.raises(OutputExistsError, match=rf"{name} exists and is not a report sftdata wrote; choose"):
            write_report(ds, tmp_path / name, sample=0)
        assert (tmp_path / name).read_bytes() == data
    write_report(ds, out, sample=1)  # unchanged since sftdata wrote it: replaced
    assert out.read_bytes() != page


def test_a_page_is_never_written_inside_any_dataset(ds, packed, tmp_path):
    with pytest.raises(UsageError, match=rf"-o {packed}/train/r.html is inside the dataset {packed}; write the "
                                         r"report elsewhere"):
        write_report(ds, packed / "train" / "r.html", sample=0)
    assert not (packed / "train" / "r.html").exists()

"""``inspect`` and ``report`` on pairs, KTO rows and RL prompts: the prompt once, chosen and
rejected side by side, trained text marked; exact pieces, and the command lines."""

from __future__ import annotations

import orjson
import pytest
from typer.testing import CliRunner

from sftdata.cli import app
from sftdata.errors import DatasetError, UsageError
from sftdata.pref import PrefOptions
from sftdata.prepare import prepare_pref
from sftdata.report import views
from sftdata.report.pairs import PairView
from sftdata.report.write import write_report
from tests.helpers.data import write_jsonl

runner = CliRunner()
U = {"role": "user", "content": "What color is the sky?"}
PAIRS = [{"prompt": [U], "chosen": [{"role": "assistant", "content": "It is blue."}],
          "rejected": [{"role": "assistant", "content": "Green."}]},
         {"prompt": "Name a prime.", "chosen": "13.", "rejected": "15."}]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    d = tmp_path_factory.mktemp("p")
    prepare_pref([write_jsonl(d / "in.jsonl", [{"bad": 1}] + PAIRS)], d / "ds", PrefOptions())
    return d / "ds"


def texts(pieces) -> list[tuple[str, bool]]:
    return [(p.text, p.trained) for p in pieces]


def test_a_pair_view_is_the_prompt_once_then_each_side_with_its_trained_text(pairs):
    (v,), notes = views(pairs, rows=[0])
    assert isinstance(v, PairView) and notes == []
    assert (v.kind, v.row, v.record, v.label, v.columns) == ("pairs", 0, 1, None, None)  # record 0 was rejected
    assert texts(v.prompt) == [("<|USER|>", False), ("What color is the sky?", False), ("<|END|>", False),
                               ("<|ASSISTANT|>", False)]
    assert [s.name for s in v.sides] == ["chosen", "rejected"]
    assert texts(v.sides[0].pieces) == [("It is blue.", True), ("<|END|>", True), ("<|EOS|>", False)]
    assert texts(v.sides[1].pieces) == [("Green.", True), ("<|END|>", True), ("<|EOS|>", False)]
    assert v.sides[1].trained_tokens == v.sides[1].length - 1


def test_a_pair_is_found_by_its_input_record_and_tokens_list_each_whole_sequence(pairs):
    (v,), _ = views(pairs, record=2, tokens=True)
    assert v.row == 1
    chosen = v.sides[0].tokens
    assert [t.span for t in chosen[:v.prompt_length]] == ["prompt"] * v.prompt_length
    assert [t.trained for t in chosen] == [False] * v.prompt_length + [True] * (v.sides[0].length - 1) + [False]
    with pytest.raises(DatasetError, match=r"^input record 0 is in no split of .* \(not kept by prepare: see "):
        views(pairs, record=0)
    with pytest.raises(UsageError, match=r"holds pairs: use --row N for pair \(row\) N"):
        views(pairs, episodes=[0])


def test_inspect_draws_chosen_and_rejected_side_by_side(pairs):
    r = runner.invoke(app, ["inspect", str(pairs), "--row", "0"], env={"NO_COLOR": "1"})
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[1].startswith("train pair 0 · input record 1 · shard_00000 · prompt ")
    header = next(line for line in lines if "chosen ·" in line)
    assert "rejected ·" in header  # one row of the table: the two sides beside each other
    body = next(line for line in lines if "⟦It is blue." in line)
    assert "⟦Green.<|END|>⟧" in body


def test_inspect_json_lists_pairs(pairs):
    r = runner.invoke(app, ["inspect", str(pairs), "--row", "1", "--json"])
    out = orjson.loads(r.stdout)
    assert [s["name"] for s in out["pairs"][0]["sides"]] == ["chosen", "rejected"] and out["pairs"][0]["record"] == 2


def test_kto_and_rl_rows_show_their_label_and_columns(tmp_path):
    kto = [{"prompt": [U], "completion": [{"role": "assistant", "content": "Blue."}], "label": False}]
    prepare_pref([write_jsonl(tmp_path / "k.jsonl", kto)], tmp_path / "kto", PrefOptions())
    (v,), _ = views(tmp_path / "kto", rows=[0])
    assert (v.kind, v.label, [s.name for s in v.sides]) == ("kto", False, ["completion"])
    (tmp_path / "rl.jsonl").write_bytes(b'{"prompt": "2+2?", "answer": 4.00}\n')
    prepare_pref([tmp_path / "rl.jsonl"], tmp_path / "rl", PrefOptions(), rl=True)
    (v,), _ = views(tmp_path / "rl", rows=[0])
    assert (v.kind, v.sides, v.columns) == ("prompts", [], '{"answer": "4.00"}')
    r = runner.invoke(app, ["inspect", str(tmp_path / "rl"), "--row", "0"], env={"NO_COLOR": "1"})
    assert 'columns {"answer": "4.00"}' in r.stdout


def test_the_report_draws_each_sampled_pair_side_by_side(pairs, tmp_path):
    pytest.importorskip("plotly")
    s = write_report(pairs, tmp_path / "r.html", sample=2)
    assert s.kind == "pairs" and s.samples == [{"split": "train", "row": 0}, {"split": "train", "row": 1}]
    page = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert page.count('data-kind="pairs"') == 2
    assert page.count('data-side="chosen"') == 2 and page.count('data-side="rejected"') == 2
    assert "Sample pairs" in page


def test_the_overview_counts_pairs(pairs):
    r = runner.invoke(app, ["inspect", str(pairs), "--json"])
    assert orjson.loads(r.stdout)["rows"] == {"per_row": 3, "splits": {"train": 2},
                                              "truncation": orjson.loads((pairs / "dataset_metadata.json")
                                                                         .read_bytes())["truncation"]}
    text = runner.invoke(app, ["inspect", str(pairs)], env={"NO_COLOR": "1"}).stdout
    assert "pairs: 2 in train · each 3 index entries (prompt, chosen, rejected)" in text

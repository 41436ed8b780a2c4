"""prepare --dedup and --decontaminate: what is dropped, the rejects naming the kept record
or the evaluation item, the counts in the summary and the metadata, byte-identical output
for any worker count, and today's output unchanged when both are off."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from sftdata.cli import app
from sftdata.errors import UsageError
from sftdata.prepare import PrepareOptions, prepare
from sftdata.store import METADATA_FILE
from sftdata.verify import verify
from tests.helpers.data import chat, write_jsonl

runner = CliRunner()
WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
         "quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()


def long_text(seed: int, n: int = 120) -> str:
    import random

    r = random.Random(seed)
    return " ".join(r.choice(WORDS) + str(r.randrange(50)) for _ in range(n))


def records() -> list:
    base = [chat(f"question {i}: " + long_text(i, 30), long_text(100 + i)) for i in range(8)]
    exact = chat("  " + base[2]["messages"][0]["content"].replace(" ", "\n "), base[2]["messages"][1]["content"])
    reply = base[5]["messages"][1]["content"].split()
    near = chat(base[5]["messages"][0]["content"], " ".join(reply[:-3] + ["changed", "three", "words"]))
    return base + [exact, near, base[0]]  # records 8 (= 2), 9 (near 5), 10 (= 0)


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    return write_jsonl(tmp_path_factory.mktemp("curate") / "in.jsonl", records())


def rejects(out: Path) -> list[dict]:
    p = out / "rejects.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


def files(d: Path) -> dict:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_off_keeps_everything_counts_exact_duplicates_and_records_nothing_new(src, tmp_path):
    s = prepare([src], tmp_path / "o", PrepareOptions())
    assert s.episodes["train"] == 11 and s.dedup == {"mode": "off", "exact_duplicates": 2}
    meta = json.loads((tmp_path / "o" / METADATA_FILE).read_text())
    assert "dedup" not in meta and "dedup" not in meta["options"] and "decontamination" not in meta
    assert rejects(tmp_path / "o") == []


def test_exact_drops_repeats_naming_the_first(src, tmp_path):
    s = prepare([src], tmp_path / "e", PrepareOptions(dedup="exact"))
    assert s.episodes["train"] == 9 and s.rejected == {"duplicate": 2}
    assert [(r["record"], r["where"], r["reason"], r["message"]) for r in rejects(tmp_path / "e")] == [
        (8, f"{src}:line 9", "duplicate", f"the same conversation as record 2 ({src}:line 3), which is kept (the "
                                          f"first occurrence)"),
        (10, f"{src}:line 11", "duplicate", f"the same conversation as record 0 ({src}:line 1), which is kept (the "
                                            f"first occurrence)")]
    meta = json.loads((tmp_path / "e" / METADATA_FILE).read_text())
    assert meta["dedup"] == {"mode": "exact", "exact_duplicates": 2} and meta["options"]["dedup"] == "exact"
    assert meta["counts"]["rejected"] == {"duplicate": 2}
    assert verify(tmp_path / "e").ok  # the recorded options and counts are a valid dataset's


def test_near_drops_the_near_copy_too(src, tmp_path):
    pytest.importorskip("rensa")
    s = prepare([src], tmp_path / "n", PrepareOptions(dedup="near"))
    assert s.episodes["train"] == 8 and s.rejected == {"duplicate": 3}
    near = [r for r in rejects(tmp_path / "n") if r["record"] == 9]
    assert near[0]["message"].startswith("a near duplicate (estimated Jaccard similarity 0.")
    assert near[0]["message"].endswith(f"of record 5 ({src}:line 6), which is kept (the first occurrence)")
    assert s.dedup["near_duplicates"] == 1 and s.dedup["threshold"] == 0.85
    strict = prepare([src], tmp_path / "n2", PrepareOptions(dedup="near", dedup_threshold=0.99))
    assert strict.rejected == {"duplicate": 2}  # the near copy is below 0.99


@pytest.mark.parametrize("dedup", ["near", "exact", "off"])
@pytest.mark.parametrize("workers", [2, 3])
def test_byte_identical_for_any_worker_count(tmp_path, workers, dedup, monkeypatch):
    """Workers reading ranges of the input stage their records' keys; group tasks find the
    equal keys bucket by bucket and the parent decides the candidates alone: the drops,
    rejects and counts of the one decision in input order."""
    pytest.importorskip("rensa")
    import sftdata.prepare.pool as prep

    monkeypatch.setattr(prep, "CHUNK_RECORDS", 3)  # several chunks: the decision crosses chunk borders
    monkeypatch.setattr(prep, "MAX_PART_BYTES", 3000)  # several ranges: the groups cross the workers' ranges
    monkeypatch.setattr(prep, "MIN_PART_BYTES", 3000)
    recs = records()
    src = write_jsonl(tmp_path / "in.jsonl", recs + recs[3:7] + ["oops"] + [recs[9], recs[1]])
    ev = write_jsonl(tmp_path / "ev.jsonl", [{"prompt": records()[3]["messages"][1]["content"][:400]}])
    opts = dict(dedup=dedup, decontaminate=(str(ev),), val_split=0.2)
    one = prepare([src], tmp_path / "one", PrepareOptions(workers=1, **opts))
    many = prepare([src], tmp_path / "many", PrepareOptions(workers=workers, **opts))
    assert files(tmp_path / "one") == files(tmp_path / "many")
    assert one.dedup == many.dedup and one.rejected == many.rejected
    assert one.rejected["contaminated"] == 2 and one.rejected.get("duplicate", 0) == {"near": 8, "exact": 7}.get(dedup, 0)


def test_several_inputs_in_ranges_drop_the_records_one_process_drops(tmp_path, monkeypatch):
    """Records are numbered from their input's start in a worker: the contaminated ones and
    the keys of the second input are placed after the first input's records."""
    pytest.importorskip("rensa")
    import sftdata.prepare.pool as prep

    monkeypatch.setattr(prep, "MAX_PART_BYTES", 3000)
    monkeypatch.setattr(prep, "MIN_PART_BYTES", 3000)
    recs = records()
    a = write_jsonl(tmp_path / "a.jsonl", recs[:6])
    b = write_jsonl(tmp_path / "b.jsonl", [recs[7], recs[3], "oops", recs[1], recs[6], recs[7]])
    ev = write_jsonl(tmp_path / "ev.jsonl", [{"prompt": recs[6]["messages"][1]["content"][:400]}])
    opts = dict(dedup="near", decontaminate=(str(ev),), val_split=0.2)
    one = prepare([a, b], tmp_path / "one", PrepareOptions(workers=1, **opts))
    many = prepare([a, b], tmp_path / "many", PrepareOptions(workers=2, **opts))
    assert files(tmp_path / "one") == files(tmp_path / "many")
    assert [(r["record"], r["reason"]) for r in rejects(tmp_path / "many")] == [
        (7, "duplicate"), (8, "invalid_json"), (9, "duplicate"), (10, "contaminated"), (11, "duplicate")]
    assert one.rejected == many.rejected == {"contaminated": 1, "duplicate": 3, "invalid_json": 1}


def test_contaminated_records_name_the_eval_file_and_item(src, tmp_path):
    recs = records()
    leaked = " ".join(recs[4]["messages"][1]["content"].split()[10:30])
    ev_jsonl = write_jsonl(tmp_path / "ev.jsonl", [{"question": "unrelated " * 20, "answer": "no"},
                                                   {"question": leaked.upper() + "?"}])
    ev_json = tmp_path / "ev2.json"
    ev_json.write_text(json.dumps([{"messages": [{"role": "user", "content": recs[6]["messages"][0]["content"]}]},
                                   "short item"]))
    s = prepare([src], tmp_path / "c", PrepareOptions(decontaminate=(str(ev_jsonl), str(ev_json))))
    assert s.rejected == {"contaminated": 2}
    got = [(r["record"], r["reason"]) for r in rejects(tmp_path / "c")]
    assert got == [(4, "contaminated"), (6, "contaminated")]
    msg = rejects(tmp_path / "c")[0]["message"]
    shared = " ".join(leaked.lower().split()[:13])
    assert msg == (f'shares the 13-word sequence "{shared}" with item 1 of the evaluation file {ev_jsonl} '
                   f"({ev_jsonl}:line 2); dropped so that the evaluation stays unseen")
    assert s.decontamination == {"ngram": 13, "files": [
        {"path": str(ev_jsonl), "items": 2, "too_short": 0, "contaminated": 1},
        {"path": str(ev_json), "items": 2, "too_short": 1, "contaminated": 1}]}
    meta = json.loads((tmp_path / "c" / METADATA_FILE).read_text())
    assert meta["decontamination"] == s.decontamination and meta["options"]["decontaminate_ngram"] == 13


def test_a_parquet_eval_file(src, tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    leaked = " ".join(records()[1]["messages"][1]["content"].split()[:15])
    pq.write_table(pa.table({"prompt": [leaked], "answer": ["x"]}), tmp_path / "ev.parquet")
    s = prepare([src], tmp_path / "p", PrepareOptions(decontaminate=(str(tmp_path / "ev.parquet"),)))
    assert s.rejected == {"contaminated": 1} and rejects(tmp_path / "p")[0]["record"] == 1


def test_bad_options_and_eval_files(src, tmp_path):
    with pytest.raises(UsageError, match="--dedup must be one of off, exact, near, not 'all'"):
        prepare([src], tmp_path / "x", PrepareOptions(dedup="all"))
    with pytest.raises(UsageError, match=r"--dedup-threshold must be a Jaccard similarity in \(0, 1\], got 0.0"):
        prepare([src], tmp_path / "x", PrepareOptions(dedup="near", dedup_threshold=0.0))
    with pytest.raises(UsageError, match="--decontaminate-ngram must be at least 1, got 0"):
        prepare([src], tmp_path / "x", PrepareOptions(decontaminate=("e",), decontaminate_ngram=0))
    (tmp_path / "bad.jsonl").write_text('{"q": 1}\n{oops\n')
    with pytest.raises(UsageError, match=r"evaluation file .*bad.jsonl:line 2: .*give JSONL, JSON or Parquet"):
        prepare([src], tmp_path / "x", PrepareOptions(decontaminate=(str(tmp_path / "bad.jsonl"),)))
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(UsageError, match="evaluation file .*empty.jsonl holds no item"):
        prepare([src], tmp_path / "x", PrepareOptions(decontaminate=(str(tmp_path / "empty.jsonl"),)))
    assert not (tmp_path / "x").exists()


def test_the_cli_flags_and_the_hint_to_drop_duplicates(src, tmp_path):
    r = runner.invoke(app, ["prepare-chat", str(src), "-o", str(tmp_path / "a"), "-j", "1"])
    assert r.exit_code == 0
    assert "2 record(s) repeat an earlier record exactly (whitespace aside) and were kept: rerun with --dedup " \
           "exact" in " ".join(r.stderr.split())
    r = runner.invoke(app, ["prepare-chat", str(src), "-o", str(tmp_path / "b"), "-j", "1", "--dedup", "exact",
                            "--json"])
    assert r.exit_code == 0 and orjson.loads(r.stdout)["dedup"] == {"mode": "exact", "exact_duplicates": 2}
    r = runner.invoke(app, ["prepare-chat", str(src), "-o", str(tmp_path / "c"), "--dedup", "some"])
    assert r.exit_code == 2 and "--dedup must be one of off, exact, near, not 'some'" in r.stderr

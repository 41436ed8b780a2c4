"""benchmarks/run_all.py: the table of ratios (its layout, exactly) and its smallest mode
end to end, so the benchmarks it calls cannot rot unnoticed."""

from __future__ import annotations

import json
import sys

import pytest

from tests.helpers.paths import ROOT

BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))

import run_all  # noqa: E402

INFO = {"cpu": "Test CPU", "cores": 2, "memory_gib": 8.0, "python": "3.11.7", "system": "Linux 6", "commit": "abc1234",
        "load_average": 1.25, "versions": {"sftdata": "0.1.0", "numpy": "2.0", "trl": "1.0", "torch": None}}


def test_the_table_has_the_machine_one_line_per_row_and_says_what_ratios_mean():
    rows = [run_all.Row("pack", "bfd plan", "2.50 s", "TRL 100.00 s", 40.0, "speed", "fill 99.99%"),
            run_all.Row("pack", "rows", "2,577,191", "TRL 2,577,200", 2577191 / 2577200, "rows"),
            run_all.Row("inputs", "peak", "Parquet 164 MiB", "JSONL 105 MiB", 164 / 105, "memory", "goal <= 1.2"),
            run_all.Row("load", "batch", "-", "peer missing", None, "speed")]
    assert run_all.format_table(rows, INFO).splitlines() == [
        "machine: Test CPU, 2 cores, 8.0 GiB, Python 3.11.7, Linux 6, load average 1.2",
        "sftdata 0.1.0 (commit abc1234); numpy 2.0, trl 1.0",
        "section  what      ours             reference      ratio    kind    note",
        "-------  --------  ---------------  -------------  -------  ------  -----------",
        "pack     bfd plan  2.50 s           TRL 100.00 s   40.00x   speed   fill 99.99%",
        "pack     rows      2,577,191        TRL 2,577,200  1.00000  rows",
        "inputs   peak      Parquet 164 MiB  JSONL 105 MiB  1.56x    memory  goal <= 1.2",
        "load     batch     -                peer missing   -        speed",
        "speed = reference time / ours (>1: ours faster); memory = our peak / reference peak (<1: ours smaller); "
        "rows = our rows / peer rows (<1: ours tighter)",
    ]


def test_an_unknown_section_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as e:
        run_all.main(["--smoke", "--only", "pack,speed"])
    assert e.value.code == 2
    assert "unknown section(s) speed; choose from pack, prepare, load, verify, inputs" in capsys.readouterr().err


def test_the_smallest_mode_measures_pack_load_and_verify_against_their_references(capsys):
    pytest.importorskip("trl")
    pytest.importorskip("torch")
    assert run_all.main(["--smoke", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mode"] == "smoke" and out["machine"]["cores"] >= 1 and out["machine"]["versions"]["trl"]
    rows = out["rows"]
    assert [(r["section"], r["kind"]) for r in rows] == [("pack", "speed"), ("pack", "rows"), ("load", "speed"),
                                                        ("load", "speed"), ("verify", "speed")]
    assert all(r["ratio"] is not None and r["ratio"] > 0 for r in rows)
    # both packers are best-fit decreasing over the same 2,000 lengths: the same rows, or within 0.1%
    assert abs(rows[1]["ratio"] - 1) <= 0.001
    assert rows[0]["reference"].startswith("TRL pack_dataset") and rows[0]["command"].startswith("python benchmarks/")

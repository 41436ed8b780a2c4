"""prepare-pref / prepare-rl record prepare-chat's build key: an unchanged rerun is up to
date and touches nothing, --force rebuilds, a changed input or option is refused without
--overwrite and named."""

from __future__ import annotations

import orjson
import pytest
from typer.testing import CliRunner

from sftdata.cli import app
from sftdata.errors import OutputExistsError
from sftdata.pref import PrefOptions
from sftdata.prepare import prepare_pref
from sftdata.store import build_key as bk
from sftdata.util.hashing import sha256_file
from tests.helpers.data import write_jsonl

U = {"role": "user", "content": "What color is the sky?"}


def _pair(i: int) -> dict:
    return {"prompt": [{**U, "content": f"question {i}"}], "chosen": [{"role": "assistant", "content": f"yes {i}"}],
            "rejected": [{"role": "assistant", "content": f"no, not {i}"}]}


def _prompt(i: int) -> dict:
    return {"prompt": [{**U, "content": f"question {i}"}], "answer": i}


def snapshot(root) -> dict:
    return {p.relative_to(root).as_posix(): (p.read_bytes(), p.stat().st_mtime_ns) if p.is_file() else None
            for p in sorted(root.rglob("*"))}


def meta_of(ds) -> dict:
    return orjson.loads((ds / "dataset_metadata.json").read_bytes())


@pytest.mark.parametrize("rl", [False, True])
def test_an_unchanged_rerun_is_up_to_date_and_touches_nothing(tmp_path, rl):
    src = write_jsonl(tmp_path / "in.jsonl", [(_prompt if rl else _pair)(i) for i in range(6)])
    first = prepare_pref([src], tmp_path / "ds", PrefOptions(val_split=0.34), rl=rl)
    meta = meta_of(tmp_path / "ds")
    build = meta["build"]
    assert first.build_key == build["key"] == bk.build_key(build["components"]) and not first.up_to_date
    c = build["components"]
    assert (c["kind"], c["format_version"]) == ("prompts" if rl else "pairs", 2)
    assert c["inputs"] == [{"path": str(src), "sha256": sha256_file(src)}] and c["options"] == meta["options"]
    before = snapshot(tmp_path / "ds")
    again = prepare_pref([src], tmp_path / "ds", PrefOptions(val_split=0.34), rl=rl)
    assert again.up_to_date and again.changed == [] and again.build_key == first.build_key
    assert (again.kind, again.records_read, again.rows, again.tokens, again.trained_tokens) == (
        first.kind, first.records_read, first.rows, first.tokens, first.trained_tokens)
    assert snapshot(tmp_path / "ds") == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds", "in.jsonl"]


def test_force_rebuilds_an_up_to_date_target(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [_pair(i) for i in range(3)])
    first = prepare_pref([src], tmp_path / "ds", PrefOptions())
    s = prepare_pref([src], tmp_path / "ds", PrefOptions(force=True))
    assert not s.up_to_date and s.changed == ["--force rebuilds it whatever its build key says"] and s.build_key == first.build_key


def test_a_changed_input_is_refused_without_overwrite_and_named(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [_pair(i) for i in range(3)])
    prepare_pref([src], tmp_path / "ds", PrefOptions())
    old = sha256_file(src)
    write_jsonl(src, [_pair(i) for i in range(4)])
    with pytest.raises(OutputExistsError, match=f"^{tmp_path / 'ds'} already exists and is not up to date: the input "
                       f"{src} changed \\(sha256 {old[:12]}"):
        prepare_pref([src], tmp_path / "ds", PrefOptions())
    s = prepare_pref([src], tmp_path / "ds", PrefOptions(overwrite=True))
    assert s.rows == {"train": 4} and s.changed[0].startswith(f"the input {src} changed (sha256 {old[:12]}")
    assert prepare_pref([src], tmp_path / "ds", PrefOptions()).up_to_date


def test_a_changed_option_is_named_as_its_flag(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [_pair(i) for i in range(3)])
    prepare_pref([src], tmp_path / "ds", PrefOptions())
    s = prepare_pref([src], tmp_path / "ds", PrefOptions(seed=7, overwrite=True))
    assert s.changed == ["the option --seed changed (1337 -> 7)"]


def test_the_cli_says_up_to_date_and_rebuilding(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [_pair(i) for i in range(3)])
    ds = tmp_path / "ds"
    runner = CliRunner()
    assert runner.invoke(app, ["prepare-pref", str(src), "-o", str(ds), "--quiet"]).exit_code == 0
    key = meta_of(ds)["build"]["key"]
    r = runner.invoke(app, ["prepare-pref", str(src), "-o", str(ds)], env={"COLUMNS": "400"})
    assert r.exit_code == 0, r.output
    assert f"{ds}: up to date (build key {key[:12]}...); nothing to do (--force rebuilds it)" in r.output
    r = runner.invoke(app, ["prepare-pref", str(src), "-o", str(ds), "--json"])
    out = orjson.loads(r.stdout)
    assert (out["up_to_date"], out["build_key"], out["rows"]) == (True, key, {"train": 3})
    r = runner.invoke(app, ["prepare-pref", str(src), "-o", str(ds), "--force"], env={"COLUMNS": "400"})
    assert r.exit_code == 0 and f"rebuilding {ds}: --force rebuilds it" in r.output

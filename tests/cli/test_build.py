"""What prepare-chat, prepare-tool and pack say about their build key: up to date (exit 0,
nothing touched), rebuilding and why, refused without --overwrite, --force; --json."""

from __future__ import annotations

import json

import orjson
from typer.testing import CliRunner

from sftdata.cli import app
from sftdata.util.hashing import sha256_file
from tests.helpers.data import chat, write_jsonl

runner = CliRunner()


def run(*args):
    return runner.invoke(app, [str(a) for a in args])


def key_of(ds) -> str:
    return orjson.loads((ds / "dataset_metadata.json").read_bytes())["build"]["key"]


def test_prepare_says_up_to_date_rebuilding_or_refused(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [chat(f"q{i}", f"a{i}") for i in range(6)])
    ds = tmp_path / "ds"
    assert run("prepare-chat", src, "-o", ds, "-j", "1", "-q").exit_code == 0
    key = key_of(ds)
    r = run("prepare-chat", src, "-o", ds, "-j", "1")
    assert r.exit_code == 0 and r.output == f"{ds}: up to date (build key {key[:12]}...); nothing to do (--force " \
                                            f"rebuilds it)\n"
    r = run("prepare-chat", src, "-o", ds, "--json")
    out = json.loads(r.stdout)
    assert (out["up_to_date"], out["build_key"], out["changed"], out["records_read"]) == (True, key, [], 6)
    a = sha256_file(src)
    write_jsonl(src, [chat(f"q{i}", f"a{i}") for i in range(7)])
    b = sha256_file(src)
    r = run("prepare-chat", src, "-o", ds, "-q")
    assert r.exit_code == 1 and r.output == (
        f"error: {ds} already exists and is not up to date: the input {src} changed (sha256 {a[:12]}... -> "
        f"{b[:12]}...). Pass --overwrite to rebuild it, or choose another --output-dir\n")
    r = run("prepare-chat", src, "-o", ds, "--overwrite", "-j", "1")
    assert r.exit_code == 0 and r.output.startswith(f"rebuilding {ds}: the input {src} changed (sha256 {a[:12]}... "
                                                    f"-> {b[:12]}...)\n")
    r = run("prepare-chat", src, "-o", ds, "--overwrite", "--json")
    assert json.loads(r.stdout)["up_to_date"] is True  # --overwrite replaces only what is not up to date
    r = run("prepare-chat", src, "-o", ds, "--force", "--json")
    out = json.loads(r.stdout)
    assert (out["up_to_date"], out["changed"]) == (False, ["--force rebuilds it whatever its build key says"])


def test_prepare_tool_has_force_too(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [chat(f"q{i}", f"a{i}") for i in range(4)])
    assert run("prepare-tool", src, "-o", tmp_path / "ds", "-q").exit_code == 0
    r = run("prepare-tool", src, "-o", tmp_path / "ds", "--force", "-q")
    assert r.exit_code == 0 and r.output == ""


def test_stdin_is_never_up_to_date(tmp_path):
    data = "".join(json.dumps(chat(f"q{i}", f"a{i}")) + "\n" for i in range(3))
    ds = tmp_path / "ds"
    assert runner.invoke(app, ["prepare-chat", "-", "-o", str(ds), "-q"], input=data).exit_code == 0
    r = runner.invoke(app, ["prepare-chat", "-", "-o", str(ds), "--overwrite"], input=data)
    assert r.exit_code == 0 and r.output.startswith(
        f"rebuilding {ds}: standard input (-) is read anew on every run, so a dataset made from it is never up to "
        f"date (its content is known only once it has been read)\n")


def test_pack_says_up_to_date_and_names_a_changed_option(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [chat(f"q{i}", f"a{i} " * 5) for i in range(6)])
    assert run("prepare-chat", src, "-o", tmp_path / "ds", "-q").exit_code == 0
    p = tmp_path / "p"
    assert run("pack", tmp_path / "ds", "-o", p, "-b", "32", "-q").exit_code == 0
    r = run("pack", tmp_path / "ds", "-o", p, "-b", "32")
    assert r.exit_code == 0 and r.output == (f"{p}: up to date (build key {key_of(p)[:12]}...); nothing to do "
                                             f"(--force rebuilds it)\n")
    r = run("pack", tmp_path / "ds", "-o", p, "-b", "48", "--overwrite")
    assert r.exit_code == 0 and r.output.startswith(f"rebuilding {p}: the option --block-size changed (32 -> 48)\n")
    r = run("pack", tmp_path / "ds", "-o", p, "-b", "48", "--json")
    out = json.loads(r.stdout)
    assert (out["up_to_date"], out["build_key"]) == (True, key_of(p))

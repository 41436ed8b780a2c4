"""A hostile chat template through prepare: a probe that runs past the limits refuses the run
in one line; a record that does is rejected as template_limit (the same with workers); the
limits are options, recorded in the dataset's metadata."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sftdata.cli import app
from sftdata.template import PRESETS
from tests.helpers.data import chat, write_jsonl
from tests.helpers.templates import TOKENS, train_tokenizer

runner = CliRunner()
NESTED = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
# hostile only on a record whose text says BOOM: the probes pass, that record does not
ON_BOOM = "{%- for m in messages if 'BOOM' in m.content %}" + NESTED + "{% endfor %}"
RECORDS = [chat("Hi", "Hello!"), chat("BOOM, then", "ok"), chat("Name a colour", "Blue"), chat("4?", "Four.")]


def run(*args):
    r = runner.invoke(app, [str(a) for a in args])
    assert "Traceback" not in r.output
    return r


@pytest.fixture(scope="module")
def tok(tmp_path_factory) -> Path:
    specials, bos, eos, extra = TOKENS["llama3"]
    return train_tokenizer(tmp_path_factory.mktemp("tok") / "llama3", specials, bos, eos, extra)


def template(tmp_path: Path, prefix: str) -> Path:
    path = tmp_path / "hostile.jinja"
    path.write_text(prefix + PRESETS["llama3"], encoding="utf-8")
    return path


def files(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_probe_past_the_limits_refuses_the_run_in_one_line(tmp_path, tok):
    src = write_jsonl(tmp_path / "chats.jsonl", RECORDS)
    r = run("prepare-chat", src, "-o", tmp_path / "ds", "--tokenizer", tok, "--chat-template",
            template(tmp_path, NESTED), "-j", "1")
    assert r.exit_code == 1
    assert re.fullmatch(r"error: chat template hostile\.jinja ran past its budget of [\d,]+ steps "
                        r"\(--template-max-steps 100,000 \+ 8 per character of this conversation\): it loops, "
                        r"recurses or builds text without bound; raise --template-max-steps only for a template you "
                        r"trust\. It did so on a probe conversation sftdata renders before any record, so the run is "
                        r"refused\n", r.output)
    assert not (tmp_path / "ds").exists()


def test_a_record_past_the_limits_is_rejected_the_same_with_workers(tmp_path, tok):
    src = write_jsonl(tmp_path / "chats.jsonl", RECORDS * 3)
    hostile = template(tmp_path, ON_BOOM)
    for workers in (1, 2):
        r = run("prepare-chat", src, "-o", tmp_path / f"ds{workers}", "--tokenizer", tok, "--chat-template", hostile,
                "-j", workers, "--json")
        assert r.exit_code == 0, r.output
        summary = json.loads(r.stdout)
        assert summary["rejected"] == {"template_limit": 3} and summary["episodes"] == {"train": 9}
    assert files(tmp_path / "ds1") == files(tmp_path / "ds2")
    rejects = [json.loads(line) for line in (tmp_path / "ds1" / "rejects.jsonl").read_text().splitlines()]
    assert [(x["where"], x["reason"]) for x in rejects] == [
        (f"{src}:line {n}", "template_limit") for n in (2, 6, 10)]
    assert re.fullmatch(r"chat template hostile\.jinja ran past its budget of [\d,]+ steps \(--template-max-steps "
                        r"100,000 \+ 8 per character of this conversation\): it loops, recurses or builds text "
                        r"without bound; raise --template-max-steps only for a template you trust",
                        rejects[0]["message"])
    options = json.loads((tmp_path / "ds1" / "dataset_metadata.json").read_text())["options"]
    assert options["template_limits"] == {
        "max_steps": 100000, "steps_per_char": 8, "write_chars_per_step": 4, "build_chars_per_step": 256,
        "item_chars": 16, "max_depth": 48, "max_output": 64 << 20, "max_built": 8 * (64 << 20)}


def test_strict_stops_at_the_record_in_one_line(tmp_path, tok):
    src = write_jsonl(tmp_path / "chats.jsonl", RECORDS)
    r = run("prepare-chat", src, "-o", tmp_path / "ds", "--tokenizer", tok, "--chat-template",
            template(tmp_path, ON_BOOM), "-j", "1", "--strict")
    assert r.exit_code == 1
    assert r.output.count("\n") == 1 and r.output.startswith(f"error: {src}:line 2: chat template hostile.jinja ran "
                                                             f"past its budget of ")


def test_the_limits_are_options(tmp_path, tok):
    src = write_jsonl(tmp_path / "chats.jsonl", RECORDS[:1] + [chat("Say it long", "x " * 3000)])
    slow = template(tmp_path, "{% for i in range(100000) %}{% for j in range(2) %}{% endfor %}{% endfor %}")
    r = run("prepare-chat", src, "-o", tmp_path / "ds", "--tokenizer", tok, "--chat-template", slow, "-j", "1")
    assert r.exit_code == 1 and "ran past its budget" in r.output
    r = run("prepare-chat", src, "-o", tmp_path / "ds", "--tokenizer", tok, "--chat-template", slow, "-j", "1",
            "--template-max-steps", "1000000", "--template-max-output", "4K", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["rejected"] == {"template_limit": 1}  # 6,000 characters > 4K
    (reject,) = [json.loads(line) for line in (tmp_path / "ds" / "rejects.jsonl").read_text().splitlines()]
    assert reject["message"] == ("chat template hostile.jinja renders more than 4,096 characters for this "
                                 "conversation (--template-max-output, by default --max-record-bytes)")
    options = json.loads((tmp_path / "ds" / "dataset_metadata.json").read_text())["options"]
    assert options["template_limits"]["max_steps"] == 1_000_000 and options["template_limits"]["max_output"] == 4096
    r = run("prepare-chat", src, "-o", tmp_path / "ds2", "--tokenizer", tok, "--template-max-steps", "0")
    assert r.exit_code == 2 and "error: --template-max-steps must be positive, got 0" in r.output

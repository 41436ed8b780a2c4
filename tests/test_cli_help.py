"""`--help` teaches: every command explains itself, shows examples that parse, and no
flag is drawn as if it took a value."""

import re
import shlex

import pytest
import typer
from typer.testing import CliRunner

from sftdata.cli import app

runner = CliRunner()
COMMANDS = ["prepare-chat", "prepare-tool", "pack", "mix", "export", "inspect", "report", "verify", "replay-order", "clean"]
EXAMPLE = re.compile(r"`(sftdata [^`]+)`")


def _examples(text: str) -> list[list[str]]:
    """The `sftdata ...` commands quoted in a help text, cut at a pipe or a redirection."""
    out = []
    for m in EXAMPLE.finditer(text):
        words = shlex.split(m.group(1))
        for stop in ("|", ">"):
            if stop in words:
                words = words[:words.index(stop)]
        out.append(words[1:])
    return out


def test_the_root_help_shows_the_typical_run_and_every_command():
    r = runner.invoke(app, ["--help"])
    assert r.exit_code == 0
    text = " ".join(r.output.split())
    assert "sftdata prepare-chat chats.jsonl --output-dir data/chat_sft --val-split 0.1" in text
    for name in COMMANDS:
        assert f"│ {name} " in r.output
    assert runner.invoke(app, ["-h"]).output == r.output


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_has_examples_that_parse(name):
    r = runner.invoke(app, [name, "-h"])
    assert r.exit_code == 0
    assert "Examples:" in r.output
    group = typer.main.get_command(app)
    command = group.commands[name]
    examples = [e for e in _examples(command.help) if e[0] == name]
    assert len(examples) >= 2, command.help
    for words in examples:  # parse only: an unknown option or a missing value raises here
        command.make_context(name, words[1:])


@pytest.mark.parametrize("name", COMMANDS)
def test_flags_show_no_value(name):
    r = runner.invoke(app, [name, "-h"])
    for line in r.output.splitlines():
        if "<bool>" in line:
            assert "--help" in line, line  # typer's own --help is the one left


def test_the_root_examples_parse():
    group = typer.main.get_command(app)
    for words in _examples(group.help):
        if words[0] in group.commands:
            group.commands[words[0]].make_context(words[0], words[1:])


def test_pack_help_speaks_plainly():
    r = runner.invoke(app, ["pack", "-h"])
    text = " ".join(r.output.split())
    assert "seed 002" not in text
    assert "bfd or stream." in text and "truncate, keep_end, split or drop." in text

"""`--help` teaches: every command explains itself, shows examples that parse, and no
flag is drawn as if it took a value."""

import inspect
import re
import shlex

import pytest
import typer
from typer.testing import CliRunner

from sftdata.cli import app
from sftdata.cli.app import COMMANDS as REGISTRY
from tests.helpers.imports import modules_after

runner = CliRunner()
COMMANDS = ["prepare-chat", "prepare-tool", "prepare-pref", "prepare-rl", "pack", "mix", "export", "inspect",
            "report", "verify", "replay-order", "clean"]
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


@pytest.mark.parametrize("name", [None, *COMMANDS])
def test_flags_show_no_value(name):
    r = runner.invoke(app, [name, "-h"] if name else ["-h"])
    assert r.exit_code == 0
    assert "<bool>" not in r.output  # not even typer's own --help
    assert re.search(r"│ +--help +-h +Show this message and exit\. +│", r.output)


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


def test_the_registry_lists_each_command_with_the_first_paragraph_of_its_help():
    group = typer.main.get_command(app)
    assert sorted(REGISTRY) == sorted(COMMANDS)
    for name, entry in REGISTRY.items():
        assert entry.help == inspect.cleandoc(group.commands[name].help).split("\n\n")[0], name
    with pytest.raises(KeyError):
        group.commands["nope"]


def test_a_misspelt_command_is_named_with_its_likely_spelling():
    r = runner.invoke(app, ["pak"])
    assert r.exit_code == 2
    assert "No such command 'pak'. Did you mean 'pack'?" in r.output


def test_a_command_imports_only_its_own_module_and_the_root_help_none():
    # the progress bar the CLI shares with the scripts (rich only, which cli.app imports anyway)
    light = {"sftdata", "sftdata.errors", "sftdata.cli", "sftdata.cli.app", "sftdata.cli.terminal", "sftdata.util",
             "sftdata.util.progress"}
    assert modules_after("--help") == light
    pack = modules_after("pack", "--help")
    assert {"sftdata.cli.pack_cmd", "sftdata.pack"} <= pack
    assert {m for m in pack if m.startswith("sftdata.cli.")} == {"sftdata.cli.app", "sftdata.cli.options",
                                                                 "sftdata.cli.build_output", "sftdata.cli.pack_cmd",
                                                                 "sftdata.cli.terminal"}
    assert not {"sftdata.prepare", "sftdata.report", "sftdata.curate", "sftdata.verify", "sftdata.loader"} & pack


BRACKETED = re.compile(r"<[^<>\s]+>|\[[^\[\]\s]+\]")  # <think>, <|END|>, sftdata[parquet]: markup may eat them


@pytest.mark.parametrize("name", typer.main.get_command(app).list_commands(None))
def test_help_keeps_every_bracketed_token_its_text_holds(name):
    """The help is drawn as markdown: a token that reads as an HTML tag (`<think>`) or as
    markup must be quoted in the text, or the help shows a gap where it was."""
    command = typer.main.get_command(app).commands[name]
    texts = [command.help, *(p.help for p in command.params if getattr(p, "help", None))]
    tokens = {t for text in texts for t in BRACKETED.findall(text)}
    r = runner.invoke(app, [name, "--help"], env={"COLUMNS": "300", "NO_COLOR": "1", "TERM": "dumb"})
    assert r.exit_code == 0
    assert sorted(t for t in tokens if t not in r.output) == []
    if any("--reasoning" in getattr(p, "opts", ()) for p in command.params):
        assert "into the reply as a <think> block of text" in " ".join(r.output.split())

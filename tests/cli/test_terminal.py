"""Control characters from datasets, inputs and file names reach no terminal raw: every view
of inspect (overview, --episode, --tokens, --row, --sample, a mixture), verify's problems
and error lines show them escaped, through a pipe and on a TTY; a decoded episode keeps its
line breaks; no markup or hyperlink is read from a file name."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from sftdata.cli import app
from sftdata.cli.terminal import escape_controls, one_line
from tests.helpers.audit import make_dataset, make_packed
from tests.helpers.data import write_jsonl
from tests.helpers.paths import ROOT

runner = CliRunner()
# a window title (OSC), a screen clear (CSI), the same by its C1 code, a carriage return that
# would overwrite a line with a fake one, a backspace, a bell, and a right-to-left override
HOSTILE = "hi \x1b]0;PWNED\x07 \x1b[2J \x9b2J \rFAKE OK \x08 \u202eevil"
SHOWN = "hi \\x1b]0;PWNED\\x07 \\x1b[2J \\x9b2J \\rFAKE OK \\x08 \\u202eevil"
RAW = ("\x1b]", "\x1b[2J", "\x9b", "\r", "\x08", "\x07", "\u202e")


def test_escapes():
    assert escape_controls(HOSTILE) == SHOWN
    assert escape_controls("two\nlines\tand a tab") == "two\nlines\tand a tab"
    assert one_line("two\nlines\tand a tab\x7f") == "two\\nlines\\tand a tab\\x7f"
    assert one_line(HOSTILE + "\n") == SHOWN + "\\n" and one_line(3) == "3"
    assert one_line("é ✓ 日本 😀 ⟦x⟧") == "é ✓ 日本 😀 ⟦x⟧"  # printable text stays as it is


def records():
    return [{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": HOSTILE},
                          {"role": "assistant", "content": f"line one\nline two {HOSTILE}"}]},
            {"messages": [{"role": "user", "content": "plain"}, {"role": "assistant", "content": "also plain"}]}] * 3


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    root = tmp_path_factory.mktemp("term")
    ds = make_dataset(root, "ds\x1b[2J\nname", records=records(), val_split=0.0)
    packed = make_packed(root, "packed", source=ds, block_size=64)
    return ds, packed


def raw_free(text: str) -> bool:
    return not any(c in text for c in RAW)


def run(*args):
    r = runner.invoke(app, [str(a) for a in args])
    assert r.exit_code == 0, r.output
    return r.output


def test_every_view_of_inspect_escapes_what_the_dataset_holds(hostile, tmp_path):
    ds, packed = hostile
    views = {"overview": run("inspect", ds), "episode": run("inspect", ds, "--episode", 0),
             "tokens": run("inspect", ds, "--episode", 0, "--tokens"), "row": run("inspect", packed, "--row", 0),
             "sample": run("inspect", ds, "--sample", 2, "--seed", 1), "packed": run("inspect", packed)}
    for name, out in views.items():
        assert raw_free(out), name
    shown_path = str(ds).replace("\x1b", "\\x1b").replace("\n", "\\n")
    assert views["overview"].startswith(shown_path + "\n")
    assert f"<|USER|>{SHOWN}<|END|>" in views["episode"]  # the episode's own line break stays one
    assert f"line one\nline two {SHOWN}" in views["episode"]
    assert "'\\x1b'" in views["tokens"] and SHOWN in views["row"]
    other = make_dataset(tmp_path, "other", val_split=0.0)
    mix = tmp_path / "mix.json"
    assert raw_free(run("mix", f"weird={ds}:1", f"plain={other}:1", "-o", mix))
    out = run("inspect", mix)
    assert raw_free(out) and "weird" in out


def test_an_error_quoting_the_input_is_one_escaped_line(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [{"messages": [{"role": "us\x1b[2J\rer", "content": "x"},
                                                            {"role": "assistant", "content": "y"}]}])
    r = runner.invoke(app, ["prepare-chat", str(src), "-o", str(tmp_path / "ds"), "--strict", "-j", "1"])
    assert r.exit_code == 1 and r.output.count("\n") == 1 and raw_free(r.output)
    assert "message 0 has role us\\x1b[2j\\rer;" in r.output


def test_verify_names_a_damaged_file_escaped(hostile, tmp_path, monkeypatch):
    ds, _ = hostile
    import shutil

    copy = tmp_path / "copy\x1b]0;T\x07"
    shutil.copytree(ds, copy)
    (copy / "train" / "shard_00000" / "mask.bin").write_bytes(b"\x02" * 4)
    monkeypatch.chdir(tmp_path)  # a relative path: the table shows it whole, however long the temp folder
    r = runner.invoke(app, ["verify", copy.name])
    assert r.exit_code == 1 and raw_free(r.output)
    assert "copy\\x1b]0;T\\x07" in r.output


def _on_a_terminal(*args: str) -> str:
    """``python -m sftdata ARGS`` with a pseudo-terminal as its standard output and error."""
    master, slave = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "300", "TERM": "xterm-256color"}
    env.pop("NO_COLOR", None)
    p = subprocess.Popen([sys.executable, "-m", "sftdata", *args], stdout=slave, stderr=slave, env=env)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the other end closed: the command is done
            break
        if not chunk:
            break
        out += chunk
    p.wait()
    os.close(master)
    return out.decode("utf-8", errors="replace")


def test_on_a_terminal_only_the_styles_are_escape_sequences(hostile, tmp_path):
    ds, _ = hostile
    out = _on_a_terminal("inspect", str(ds), "--episode", "0")
    assert "\x1b[" in out  # a terminal gets colours...
    styles = re.sub(r"\x1b\[[0-9;]*m", "", out)  # ...and nothing else: no title, no clear, no cursor move
    assert "\x1b" not in styles and "\x9b" not in styles and "\x07" not in styles and "\u202e" not in styles
    assert SHOWN in styles
    link = tmp_path / "[link=https:x]click"  # rich markup would make the rest of the line a hyperlink
    link.mkdir()
    out = _on_a_terminal("inspect", str(link))
    assert "\x1b]8;" not in out and "[link=https:x]click" in out  # no hyperlink from a file name
    assert json.loads(_on_a_terminal("inspect", str(ds), "--episode", "0", "--json").replace("\r\n", "\n"))

"""The CLI's contract stays put across restructuring: the `--help` text of every command
and the keys of every `--json` output are compared with snapshots in tests/contract/.

A deliberate change to a command's interface updates the snapshots:
``SFTDATA_UPDATE_CONTRACT=1 python -m pytest tests/cli/test_contract.py`` (then review the diff).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from sftdata.cli import app
from sftdata.storage.lock import OWNER_FILE, owner_record
from tests.helpers.paths import CONTRACT, ROOT

UPDATE = os.environ.get("SFTDATA_UPDATE_CONTRACT") == "1"
# the snapshots are what the main install's typer and rich draw; the floors run (the oldest
# declared typer and rich, .ci/floors.txt) draws the same help with other spacing
FLOORS_RUN = pytest.mark.skipif(os.environ.get("SFTDATA_FLOORS") == "1",
                                reason="help snapshots are drawn by the main install's typer and rich")
COMMANDS = ["prepare-chat", "prepare-tool", "prepare-pref", "prepare-rl", "pack", "mix", "export", "inspect",
            "report", "verify", "replay-order", "clean"]
runner = CliRunner()


def _invoke(*args):
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "100", "NO_COLOR": "1", "TERM": "dumb"})


def _check(name: str, text: str) -> None:
    path = CONTRACT / name
    if UPDATE:
        CONTRACT.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.is_file(), f"missing snapshot {path}; create it with SFTDATA_UPDATE_CONTRACT=1"
    assert text == path.read_text(encoding="utf-8")


def key_paths(value, prefix: str = "") -> list[str]:
    """Every key path of a JSON value, list items folded into ``[]``: ``a.b``, ``a.c[].d``."""
    out: set[str] = set()
    if isinstance(value, dict):
        for k, v in value.items():
            p = f"{prefix}.{k}" if prefix else str(k)
            out.add(p)
            out.update(key_paths(v, p))
    elif isinstance(value, list):
        for v in value:
            out.update(key_paths(v, prefix + "[]"))
    return sorted(out)


def test_key_paths_folds_lists_and_nests():
    assert key_paths({"a": {"b": 1}, "c": [{"d": 1}, {"e": 2}]}) == ["a", "a.b", "c", "c[].d", "c[].e"]


@FLOORS_RUN
@pytest.mark.parametrize("name", ["", *COMMANDS])
def test_help_text_is_unchanged(name):
    r = _invoke(*([name] if name else []), "--help")
    assert r.exit_code == 0
    _check(f"help_{name or 'root'}.txt", r.output)


# json keys can depend on the data: dict keys that are data (reasons, shard names,
# dtype names) are folded so only the structure is compared
DATA_KEYED = ("rejected", "repaired", "reasons", "counts", "by_reason", "repairs", "histogram", "files", "forms")


def _fold(value):
    if isinstance(value, dict):
        return {k: (sorted(v) if k in DATA_KEYED and isinstance(v, dict) else _fold(v)) for k, v in value.items()}
    if isinstance(value, list):
        return [_fold(v) for v in value]
    return value


def test_json_keys_are_unchanged(tmp_path):
    chat = tmp_path / "chat"
    tool = tmp_path / "tool"
    packed = tmp_path / "packed"
    runs = {
        "prepare-chat": ["prepare-chat", ROOT / "sample_data/chat.jsonl", "-o", chat, "--val-split", "0.1",
                         "-j", "1", "--json"],
        "prepare-tool": ["prepare-tool", ROOT / "sample_data/tools.jsonl", "-o", tool, "--val-split", "0.1",
                         "-j", "1", "--json"],
        "pack": ["pack", chat, "-o", packed, "--block-size", "64", "--json"],
        "export": ["export", chat, "-o", tmp_path / "export", "--json"],
        "export packed": ["export", packed, "-o", tmp_path / "export_packed", "--format", "jsonl", "--json"],
        "inspect": ["inspect", chat, "--json"],
        "inspect --episode": ["inspect", chat, "--episode", "1", "--json"],
        "inspect packed": ["inspect", packed, "--json"],
        "inspect --row": ["inspect", packed, "--row", "0", "--json"],
        "report": ["report", chat, "-o", tmp_path / "report.html", "--json"],
        "verify": ["verify", chat, "--json"],
        "verify --sources": ["verify", chat, "--sources", "--json"],
        "verify packed": ["verify", packed, "--json"],
        "replay-order": ["replay-order", chat, "--config", ROOT / "configs/sft/tiny.json", "--step", "1", "--json"],
        "replay-order packed": ["replay-order", packed, "--config", ROOT / "configs/sft/tiny.json", "--step", "0",
                                "--json"],
        "prepare-pref": ["prepare-pref", ROOT / "sample_data/pairs.jsonl", "-o", tmp_path / "pairs", "--json"],
        "verify pairs": ["verify", tmp_path / "pairs", "--json"],
        "prepare-rl": ["prepare-rl", ROOT / "sample_data/rl_prompts.jsonl", "-o", tmp_path / "rl", "--json"],
        "mix": ["mix", f"{chat}:0.8", f"{tool}:0.2", "-o", tmp_path / "mix.json", "--json"],
        "inspect mixture": ["inspect", tmp_path / "mix.json", "--json"],
        "verify mixture": ["verify", tmp_path / "mix.json", "--quick", "--json"],
        "replay-order mixture": ["replay-order", tmp_path / "mix.json", "--config", ROOT / "configs/sft/tiny.json",
                                 "--step", "1", "--json"],
    }
    # a stale staging folder (its owner pid has ended) for clean to list
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f".old.tmp-{dead.pid}-abcd1234"
    stale.mkdir()
    (stale / OWNER_FILE).write_bytes(json.dumps(owner_record() | {"pid": dead.pid, "start": "0"}).encode())
    runs["clean"] = ["clean", tmp_path, "--json"]
    keys = {}
    for label, args in runs.items():
        r = _invoke(*args)
        assert r.exit_code == 0, (label, r.output)
        keys[label] = key_paths(_fold(json.loads(r.stdout)))
    _check("json_keys.json", json.dumps(keys, indent=1, sort_keys=True) + "\n")

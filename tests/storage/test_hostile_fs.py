"""A folder other people write to: links planted under every name sftdata uses beside a
target, a symlinked target, a lock file that is not sftdata's, folders named like
sftdata's. Nothing outside the target is ever created, changed or removed, and nothing of
the user's is taken for sftdata's by its name."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from sftdata.cli import app
from sftdata.prepare import PrepareOptions, prepare
from sftdata.storage.lock import OWNER_FILE, owner_record
from tests.helpers.data import chat, write_jsonl
from tests.helpers.paths import ROOT

runner = CliRunner()
LINK_FIX = "give the folder it points to as --output-dir, or remove the link"


def _run(*args):
    r = runner.invoke(app, [str(a) for a in args])
    assert "Traceback" not in r.output
    return r


def _tree(root: Path) -> dict[str, object]:
    """Every entry below ``root`` (links not followed): a file's bytes, a link's target,
    a folder as "dir"."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        out[rel] = os.readlink(p) if p.is_symlink() else "dir" if p.is_dir() else p.read_bytes()
    return out


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


@pytest.fixture
def src(tmp_path):
    return write_jsonl(tmp_path / "chats.jsonl", [chat(f"question {i}", f"answer {i}") for i in range(8)])


@pytest.fixture
def outside(tmp_path):
    """What a link planted beside a target may point to: a file, a folder holding a
    dataset, and a stale staging folder (with its owner record) of a dataset there."""
    o = tmp_path / "outside"
    (o / "folder").mkdir(parents=True)
    (o / "precious.txt").write_text("years of work")
    (o / "folder" / "notes.txt").write_text("mine")
    prepare([write_jsonl(tmp_path / "o.jsonl", [chat("a", "b")])], o / "ds", PrepareOptions(workers=1))
    stale = o / f".ds.tmp-{_dead_pid()}-5ca1ab1e"
    stale.mkdir()
    record = owner_record() | {"target": "ds", "kind": "staging", "pid": _dead_pid()}
    (stale / OWNER_FILE).write_bytes(orjson.dumps(record))
    return o


# ---------------------------------------------------------------- the lock file

@pytest.mark.parametrize("dangling", [False, True])
def test_a_link_at_the_lock_file_is_refused_and_never_written_through(tmp_path, src, outside, dangling):
    dest = outside / ("nothing-here" if dangling else "precious.txt")
    lock = tmp_path / ".out.sftdata-lock"
    lock.symlink_to(dest)
    before = _tree(outside)
    r = _run("prepare-chat", src, "-o", tmp_path / "out", "-q")
    assert (r.exit_code, r.output) == (1, f"error: {lock} is a symbolic link (to {dest}); sftdata never writes "
                                          f"through a link: remove the link (sftdata's lock file is created there), "
                                          f"or choose another --output-dir\n")
    assert _tree(outside) == before and os.readlink(lock) == str(dest)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".out.sftdata-lock", "chats.jsonl", "o.jsonl", "outside"]


def test_a_lock_file_holding_other_data_or_other_names_is_never_overwritten(tmp_path, src, outside):
    lock = tmp_path / ".out.sftdata-lock"
    lock.write_text("a user's file under sftdata's lock name")
    r = _run("prepare-chat", src, "-o", tmp_path / "out", "-q")
    assert (r.exit_code, r.output) == (1, f"error: {lock} holds data sftdata did not write, so it is not "
                                          f"sftdata's lock file and is left as it is: move it away, or choose "
                                          f"another --output-dir\n")
    assert lock.read_text() == "a user's file under sftdata's lock name"
    lock.unlink()
    os.link(outside / "precious.txt", lock)  # a hard link: the same file under a second name
    r = _run("prepare-chat", src, "-o", tmp_path / "out", "-q")
    assert (r.exit_code, r.output) == (1, f"error: {lock} has 2 names (hard links), so it is not sftdata's lock "
                                          f"file; sftdata writes nothing there: move it away, or choose another "
                                          f"--output-dir\n")
    assert (outside / "precious.txt").read_text() == "years of work"
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- a symlinked target

@pytest.fixture
def ds(tmp_path, src):
    prepare([src], tmp_path / "ds", PrepareOptions(workers=1))
    return tmp_path / "ds"


def test_a_symlinked_output_is_refused_up_front_by_every_writing_command(tmp_path, src, ds, outside):
    """The one rule: sftdata never writes through a link at its output. Refused before
    anything is written, naming the link and what it points to; the link and what is
    behind it stay as they were."""
    link = tmp_path / "link"
    link.symlink_to(outside / "ds")
    (tmp_path / "mix.json").symlink_to(outside / "precious.txt")
    (tmp_path / "page.html").symlink_to(outside / "precious.txt")
    before, beside = _tree(outside), sorted(p.name for p in tmp_path.iterdir())
    tools = ROOT / "sample_data" / "tools.jsonl"
    for args, fix in [
        (["prepare-chat", src, "-o", link, "--overwrite"], LINK_FIX),
        (["prepare-tool", tools, "-o", link, "--overwrite"], LINK_FIX),
        (["pack", ds, "-o", link, "--block-size", "64", "--overwrite"], LINK_FIX),
        (["export", ds, "-o", link, "--overwrite"], LINK_FIX),
        (["mix", f"{ds}:1", "-o", tmp_path / "mix.json", "--overwrite"],
         "give the file it points to as --output, or remove the link"),
        (["report", ds, "-o", tmp_path / "page.html"], "give the file it points to as -o, or remove the link"),
    ]:
        r = _run(*args, "-q") if args[0] not in ("mix", "report") else _run(*args)
        out = args[args.index("-o") + 1]
        assert (r.exit_code, r.output) == (1, f"error: {out} is a symbolic link (to {os.readlink(out)}); sftdata "
                                              f"never writes through a link: {fix}\n"), args[0]
    r = _run("clean", link, "--yes")
    assert (r.exit_code, r.output) == (2, f"error: {link} is a symbolic link (to {outside / 'ds'}); sftdata never "
                                          f"removes through a link: give the folder it points to\n")
    assert _tree(outside) == before and sorted(p.name for p in tmp_path.iterdir()) == beside


# ---------------------------------------------------------------- links at every name sftdata creates

def _tags():
    """The random parts sftdata would draw (uuid4), made predictable: 00000000, 00000001, ..."""
    it = iter(range(1 << 30))
    return lambda: uuid.UUID(int=next(it) << 96)


def test_links_planted_at_every_name_sftdata_creates_are_never_followed(tmp_path, src, ds, outside, monkeypatch):
    """Beside each target, a link (to a file outside, to a folder outside, dangling) at each
    name a run would choose first: its staging folder, the replaced dataset's folder, a
    mixture's temporary file, the rejects file; and links named like leftovers that lead to
    a stale staging folder outside, for clean. Every command runs (and takes other names);
    nothing outside changes and every link stays."""
    pid = os.getpid()
    work = tmp_path / "work"
    work.mkdir()
    kinds = [outside / "precious.txt", outside / "folder", outside / "nothing-here"]
    links = {}
    for name in ("out", "packed", "exported", "mix.json", "allbad"):
        for k in range(6):
            tag = f"{k:08x}"
            for planted in (f".{name}.tmp-{pid}-{tag}", f".{name}.old-{tag}", f".{name}.tmp{pid}"):
                links[work / planted] = kinds[k % 3]
    links[work / "allbad.rejects.jsonl"] = outside / "precious.txt"
    links[work / f".ds.tmp-{_dead_pid()}-00000000"] = outside / next(p.name for p in outside.iterdir()
                                                                     if p.name.startswith(".ds.tmp-"))
    links[work / f".out.tmp-{_dead_pid()}-feedf00d"] = outside / "ds"
    for link, dest in links.items():
        link.symlink_to(dest)
    bad = write_jsonl(tmp_path / "bad.jsonl", ['{"messages": 1}', "not json"])
    before = _tree(outside)
    for code, args in [
        (0, ["prepare-chat", src, "-o", work / "out", "-q"]),
        (0, ["prepare-chat", src, "-o", work / "out", "-q", "--overwrite"]),
        (0, ["pack", ds, "-o", work / "packed", "--block-size", "64", "-q"]),
        (0, ["pack", ds, "-o", work / "packed", "--block-size", "32", "-q", "--overwrite"]),
        (0, ["export", ds, "-o", work / "exported", "-q"]),
        (0, ["export", ds, "-o", work / "exported", "-q", "--overwrite", "--format", "jsonl"]),
        (0, ["mix", f"{ds}:1", "-o", work / "mix.json"]),
        (0, ["mix", f"{ds}:2", "-o", work / "mix.json", "--overwrite"]),
        (1, ["prepare-chat", bad, "-o", work / "allbad", "-q"]),  # every record rejected: the rejects beside it
        (0, ["clean", work, "--yes"]),
    ]:
        monkeypatch.setattr(uuid, "uuid4", _tags())  # each command meets the planted names first
        r = _run(*args)
        assert r.exit_code == code, (args, r.output)
        assert _tree(outside) == before, args
        assert all(os.readlink(link) == str(dest) for link, dest in links.items()), args
    assert (work / "allbad.rejects-2.jsonl").is_file()  # the planted rejects name was passed over
    assert not (outside / "nothing-here").exists()


# ---------------------------------------------------------------- a name is not ownership

def test_a_users_folders_named_like_sftdatas_are_never_taken_for_sftdatas(tmp_path, src):
    """A user's experiment folder ``.exp.tmp-2024-05`` (a pid-like number, and what a
    staging folder holds) and a backup ``.chat_sft.old-v1`` (a whole dataset) carry no
    owner record: the next run to their target and ``clean --yes`` leave them alone."""
    exp = tmp_path / ".exp.tmp-2024-05"
    (exp / "train").mkdir(parents=True)
    (exp / "train" / "tokens.bin").write_bytes(b"\1\2")
    old = 1_000_000_000
    os.utime(exp, (old, old))  # long past any grace period
    chat_sft = tmp_path / "chat_sft"
    prepare([src], chat_sft, PrepareOptions(workers=1))
    backup = tmp_path / ".chat_sft.old-v1"
    shutil.copytree(chat_sft, backup)
    before = {p.name: _tree(p) for p in (exp, backup)}
    assert _run("prepare-chat", src, "-o", tmp_path / "exp", "-q").exit_code == 0
    assert _run("prepare-chat", src, "-o", chat_sft, "-q", "--overwrite").exit_code == 0
    r = _run("clean", tmp_path, "--yes", "--json")
    assert r.exit_code == 0 and orjson.loads(r.stdout)["leftovers"] == []
    assert {p.name: _tree(p) for p in (exp, backup)} == before


# ---------------------------------------------------------------- a mixture file inside a dataset

def test_a_mixture_file_is_never_written_inside_a_dataset(tmp_path, ds):
    """A dataset folder holds only the files its metadata lists: mix -o ds/m.json (or deeper)
    is refused before anything is written, naming the dataset."""
    before = _tree(ds)
    for out in (ds / "m.json", ds / "train" / "m.json"):
        r = _run("mix", f"{ds}:1", "-o", out)
        assert (r.exit_code, r.output) == (2, f"error: --output {out} is inside the dataset {ds}; write the mixture "
                                              f"file elsewhere (a dataset folder holds only its own files), e.g. "
                                              f"{tmp_path / 'm.json'}\n")
    assert _tree(ds) == before
    r = _run("mix", f"{ds}:1", "-o", tmp_path / "m.json")
    assert r.exit_code == 0 and (tmp_path / "m.json").is_file()

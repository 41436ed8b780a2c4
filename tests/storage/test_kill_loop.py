"""A run killed at any instant (``kill -9``, a power cut) leaves the old dataset or the new
one whole at its target, and nothing beside it that ``sftdata clean`` cannot remove.

Kill points are operations, not times: each run is forked from this process and killed
just before its Nth file system operation (tests/helpers/kill.py), N drawn from a fixed
seed over the whole run and, as often, over the removal of the dataset it replaced."""

from __future__ import annotations

import hashlib
import random
import shutil
from pathlib import Path

import numpy as np
import orjson
import pytest
from typer.testing import CliRunner

import sftdata.store.writer as writer
from sftdata.cli import app
from sftdata.interop.export import ExportOptions, export
from sftdata.pack.run import PackOptions, pack
from sftdata.prepare import PrepareOptions, prepare
from sftdata.storage import METADATA_FILE
from sftdata.storage.leftovers import clean
from sftdata.storage.manifest import manifest_of
from sftdata.util.cache import CACHE_ENV
from sftdata.verify import verify
from tests.helpers.data import random_conversation
from tests.helpers.kill import run_forked

SEED = 32
ANYWHERE = 8  # kill points per command drawn over the whole run
REMOVING = 4  # ... and over the removal of the replaced dataset (after the commit)


def _listed_sha256(root: Path, meta: dict) -> dict[str, str]:
    """Every file the metadata lists (but itself) and the sha256 it records for it."""
    out = {name: rec["sha256"] for name, rec in meta["files"].items()}
    for split, info in meta["splits"].items():
        for shard in info["shards"]:
            out.update({f"{split}/{shard['name']}/{fn}": rec["sha256"] for fn, rec in shard["files"].items()})
    return out


def _whole(target: Path) -> bytes:
    """The metadata of the dataset at ``target`` once every file it lists is checked
    against its recorded sha256 (and, for episodes and packed rows, ``verify`` is clean)."""
    raw = (target / METADATA_FILE).read_bytes()
    meta = orjson.loads(raw)
    files, _ = manifest_of(meta)
    assert sorted(p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file()) == files
    for rel, sha in _listed_sha256(target, meta).items():
        assert hashlib.sha256((target / rel).read_bytes()).hexdigest() == sha, rel
    if meta["kind"] in ("episodes", "packed"):
        report = verify(target)
        assert report.ok, [str(p) for p in report.problems]
    return raw


@pytest.fixture(autouse=True)
def _no_user_cache(monkeypatch):
    """A run keeps a touched input's sha256 in the user's cache: the first run would write
    it and the next ones not, so the same job would make other operations from one run to
    the next. Without that cache each run makes the same ones, and a kill point names one
    instant."""
    monkeypatch.setenv(CACHE_ENV, "off")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Inputs, and two versions of each command's output: the one on disk before (old)
    and the one a run with other options writes (new)."""
    d = tmp_path_factory.mktemp("kill")
    rng = np.random.default_rng(5)
    src = d / "chats.jsonl"
    src.write_bytes(b"\n".join(orjson.dumps(random_conversation(rng, i)) for i in range(40)) + b"\n")
    base = d / "base"
    prepare([src], base, PrepareOptions(workers=1, val_split=0.25, seed=1, shard_tokens=600))
    jobs = {
        "prepare": (lambda out: prepare([src], out, PrepareOptions(workers=1, val_split=0.25, seed=1,
                                                                    shard_tokens=600)),
                    lambda out: prepare([src], out, PrepareOptions(workers=1, val_split=0.5, seed=2,
                                                                    shard_tokens=900, overwrite=True))),
        "pack": (lambda out: pack(base, out, PackOptions(block_size=64, shard_tokens=700)),
                 lambda out: pack(base, out, PackOptions(block_size=128, shard_tokens=700, overwrite=True))),
        "export": (lambda out: export(base, out, ExportOptions(format="jsonl", splits=("train",))),
                   lambda out: export(base, out, ExportOptions(format="jsonl", overwrite=True))),
    }
    return d, jobs


def _stage(d: Path, name: str, old_job) -> tuple[Path, bytes]:
    """A fresh folder holding the command's old output at ``out``; its metadata."""
    root = d / f"{name}-old"
    if not root.exists():
        root.mkdir()
        old_job(root / "out")
    return root / "out", (root / "out" / METADATA_FILE).read_bytes()


def _trial_root(d: Path, name: str, k: int) -> Path:
    root = d / f"{name}-{k}"
    shutil.copytree(d / f"{name}-old", root, symlinks=True)
    return root


def _full_run(d: Path, name: str, jobs) -> tuple[bytes, bytes, object]:
    """The old metadata, the new one, and the run to the end (how many operations, which
    one commits)."""
    old_job, new_job = jobs[name]
    _, old_meta = _stage(d, name, old_job)
    full = _trial_root(d, name, 0)
    done = run_forked(lambda: new_job(full / "out"), full / "out")
    assert not done.killed and done.error is None and done.commit is not None, done
    new_meta = _whole(full / "out")
    assert new_meta != old_meta
    shutil.rmtree(full)
    return old_meta, new_meta, done


def _killed(d: Path, name: str, jobs, kill_at: int, done, old_meta: bytes, new_meta: bytes) -> None:
    """Kill the command's run before operation ``kill_at``; then the target holds the old
    dataset (killed before the commit) or the new one, whole, and after ``clean --yes``
    nothing else is left beside it."""
    root = _trial_root(d, name, kill_at)
    target = root / "out"
    outcome = run_forked(lambda: jobs[name][1](target), target, kill_at)
    assert outcome.killed, (name, kill_at, outcome)
    where = f"{name} killed before operation {kill_at} of {done.ops} (commit: {done.commit})"
    meta = _whole(target)
    assert meta == (old_meta if kill_at <= done.commit else new_meta), where
    clean(root, remove=True)
    assert sorted(p.name for p in root.iterdir()) == ["out"], where  # nothing left beside it
    assert (target / METADATA_FILE).read_bytes() == meta, where  # and clean touched nothing of it
    shutil.rmtree(root)


def test_a_run_killed_at_any_operation_leaves_the_old_or_the_new_dataset_and_nothing_clean_cannot_remove(world):
    d, jobs = world
    rng = random.Random(SEED)
    trials = 0
    for name in jobs:
        old_meta, new_meta, done = _full_run(d, name, jobs)
        points = sorted(set(rng.sample(range(1, done.ops + 1), ANYWHERE))
                        | set(rng.sample(range(done.commit + 1, done.ops + 1), REMOVING)))
        for kill_at in points:
            _killed(d, name, jobs, kill_at, done, old_meta, new_meta)
            trials += 1
    assert trials >= 30


def test_a_kill_while_the_replaced_dataset_is_removed_leaves_nothing_clean_cannot_remove(world):
    """The removal of the dataset --overwrite replaced, killed at its start, in its middle
    and at each of its last operations (the manifest, the owner record, the folder, the
    lock): a half-removed dataset is recognised as sftdata's and clean finishes it."""
    d, jobs = world
    old_meta, new_meta, done = _full_run(d, "prepare", jobs)
    window = range(done.commit + 1, done.ops + 1)
    assert len(window) >= 10, window  # the old dataset's files, folders, manifest, record, folder, lock
    for kill_at in sorted({window[0], window[1], window[len(window) // 2], *window[-6:]}):
        _killed(d, "prepare", jobs, kill_at, done, old_meta, new_meta)


def test_without_a_swap_a_kill_between_the_two_renames_keeps_the_old_dataset_and_says_how_to_put_it_back(world):
    """Where the system cannot swap two folders, the old dataset is renamed aside first:
    a run killed before the new one is renamed in leaves no dataset at the target. The old
    one, proved sftdata's by the dead run's journal alone, is never removed: clean keeps it
    and prints the ``mv`` that puts it back; after that, nothing is left."""
    d, jobs = world
    _, old_meta = _stage(d, "prepare", jobs["prepare"][0])

    def no_swap(target):
        writer.exchange = lambda a, b: False  # in the forked child only
        jobs["prepare"][1](target)

    full = _trial_root(d, "prepare", 0)
    done = run_forked(lambda: no_swap(full / "out"), full / "out")
    assert not done.killed and done.error is None, done
    shutil.rmtree(full)
    root = _trial_root(d, "prepare", done.commit)
    target = root / "out"
    assert run_forked(lambda: no_swap(target), target, done.commit).killed  # just before the new one goes in
    assert not target.exists()
    (aside,) = [p for p in root.iterdir() if p.name.startswith(".out.old-")]
    r = CliRunner().invoke(app, ["clean", str(root), "--yes"])
    assert r.exit_code == 0 and r.output.splitlines()[-1] == (
        f"{aside} holds the dataset that --overwrite was replacing when its run died, and {target} is not a "
        f"complete dataset: check it, then move it back with `mv {aside} {target}`")
    aside.rename(target)
    assert _whole(target) == old_meta
    clean(root, remove=True)
    assert sorted(p.name for p in root.iterdir()) == ["out"]

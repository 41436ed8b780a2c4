"""hf://datasets/ inputs pinned to a commit: the revision resolved once per run, the files
read at that commit, both recorded, the commit in the build key. No network: the Hub is a
stub file system for hf:// (fsspec's memory file system, paths as huggingface_hub's
HfFileSystem names them, ``datasets/ORG/NAME@COMMIT/PATH``) and a stub resolver."""

from __future__ import annotations

import sys
import types

import orjson
import pytest

pytest.importorskip("fsspec", reason="the cloud extra (fsspec) is not installed")

from fsspec.implementations.memory import MemoryFileSystem  # noqa: E402

from sftdata.errors import InputError  # noqa: E402
from sftdata.prepare import PrepareOptions, prepare  # noqa: E402
from sftdata.sources import expand_inputs, hub  # noqa: E402
from tests.helpers.data import chat  # noqa: E402

C1, C2 = "1" * 40, "2" * 40


class StubHub(MemoryFileSystem):
    """hf:// as a memory file system; ``opened`` lists every file opened for reading."""

    protocol = "hf"
    store: dict = {}
    pseudo_dirs = [""]
    opened: list = []

    @classmethod
    def _strip_protocol(cls, path):
        path = str(path)
        return "/" + (path[5:] if path.startswith("hf://") else path).strip("/")

    def unstrip_protocol(self, path):
        return "hf://" + path.lstrip("/")

    def _open(self, path, mode="rb", **kw):
        if "r" in mode:
            StubHub.opened.append(self._strip_protocol(path))
        return super()._open(path, mode, **kw)


@pytest.fixture
def hub_stub(monkeypatch):
    """The stub Hub, and the resolver's answers (``branches``) and questions (``asked``)."""
    monkeypatch.setitem(sys.modules["fsspec.registry"]._registry, "hf", StubHub)
    monkeypatch.setattr(StubHub, "store", {})
    monkeypatch.setattr(StubHub, "pseudo_dirs", [""])
    monkeypatch.setattr(StubHub, "opened", [])
    state = types.SimpleNamespace(branches={"main": C1}, asked=[], fs=StubHub())

    def resolve(repo, revision):
        state.asked.append((repo, revision))
        return state.branches[revision]

    monkeypatch.setattr(hub, "hub_commit", resolve)
    return state


def _put(fs, commit, path, n):
    lines = b"".join(orjson.dumps(chat(f"q{i} at {commit[:4]}", f"a{i}")) + b"\n" for i in range(n))
    fs.pipe_file(f"hf://datasets/org/chats@{commit}/{path}", lines)


def test_a_url_is_pinned_to_the_commit_its_revision_names():
    asked = {}
    assert hub.pin_hub_url("s3://bucket/a.jsonl") is None
    assert hub.pin_hub_url(f"hf://datasets/org/chats@{C1}/a.jsonl", asked) == (
        f"hf://datasets/org/chats@{C1}/a.jsonl", hub.HubPin("org/chats", C1, C1))
    assert asked == {}  # a commit needs no question to the Hub


def test_each_revision_is_asked_once_per_run(hub_stub):
    resolved: dict = {}
    url, pin = hub.pin_hub_url("hf://datasets/org/chats/train.jsonl", resolved)
    assert url == f"hf://datasets/org/chats@{C1}/train.jsonl" and pin == hub.HubPin("org/chats", "", C1)
    assert pin.given(url) == "hf://datasets/org/chats/train.jsonl" and pin.as_dict() == {"revision": "main",
                                                                                         "commit": C1}
    hub.pin_hub_url("hf://datasets/org/chats@main/other.jsonl", resolved)
    assert hub_stub.asked == [("org/chats", "main")]


def test_the_default_resolver_asks_huggingface_hub_and_names_a_failure(monkeypatch):
    hf = pytest.importorskip("huggingface_hub", reason="the cloud extra (huggingface_hub) is not installed")

    class Api:
        def dataset_info(self, repo, revision):
            if revision == "gone":
                raise RuntimeError("Revision Not Found")
            return types.SimpleNamespace(sha=C2)

    monkeypatch.setattr(hf, "HfApi", Api)
    assert hub.hub_commit("org/chats", "main") == C2
    with pytest.raises(InputError, match=r"^hf://datasets/org/chats@gone: the revision cannot be resolved to a commit "
                                         r"\(RuntimeError: Revision Not Found\); check the dataset's name and revision "
                                         r"and the network, or name the commit itself"):
        hub.hub_commit("org/chats", "gone")


def test_a_folder_is_listed_at_the_commit(hub_stub):
    _put(hub_stub.fs, C1, "data/a.jsonl", 2)
    _put(hub_stub.fs, C1, "data/b.jsonl", 2)
    got = expand_inputs(["hf://datasets/org/chats@main/data"])
    assert [(i.name, i.given) for i in got] == [
        (f"hf://datasets/org/chats@{C1}/data/a.jsonl", "hf://datasets/org/chats@main/data/a.jsonl"),
        (f"hf://datasets/org/chats@{C1}/data/b.jsonl", "hf://datasets/org/chats@main/data/b.jsonl")]


def test_prepare_records_the_commit_is_up_to_date_unread_and_rebuilds_when_the_branch_moves(tmp_path, hub_stub):
    url = "hf://datasets/org/chats@main/train.jsonl"
    _put(hub_stub.fs, C1, "train.jsonl", 3)
    s = prepare([url], tmp_path / "ds", PrepareOptions())
    meta = orjson.loads((tmp_path / "ds" / "dataset_metadata.json").read_bytes())
    src = meta["sources"][0]
    assert (src["path"], src["revision"], src["commit"]) == (f"hf://datasets/org/chats@{C1}/train.jsonl", "main", C1)
    assert meta["build"]["components"]["inputs"] == [{"path": url, "commit": C1}]
    assert s.episodes == {"train": 3}
    hub_stub.fs.opened.clear()
    again = prepare([url], tmp_path / "ds", PrepareOptions())
    assert again.up_to_date and hub_stub.fs.opened == []  # the commit alone says: not a byte read
    _put(hub_stub.fs, C2, "train.jsonl", 5)
    hub_stub.branches["main"] = C2  # the branch moved
    moved = prepare([url], tmp_path / "ds", PrepareOptions(overwrite=True))
    assert moved.changed == [f"the input {url} changed (commit 111111111111... -> 222222222222...)"]
    assert moved.episodes == {"train": 5}
    assert hub_stub.asked == [("org/chats", "main")] * 3  # re-resolved on every run

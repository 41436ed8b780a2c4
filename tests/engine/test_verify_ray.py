"""``verify --engine ray``: one task per shard; the report, ``--json`` and the exit code are
those of ``--engine local``, on good and damaged datasets, episodes and packed. On the
session's local Ray cluster (2 CPUs, tests/conftest.py)."""

from __future__ import annotations

import re
import shutil
import sys

import numpy as np
import orjson
import pytest
from typer.testing import CliRunner

from sftdata.cli import app
from sftdata.engine import ray_engine
from sftdata.pack import PackOptions, pack
from sftdata.pref import PrefOptions
from sftdata.prepare import PrepareOptions, prepare, prepare_pref
from sftdata.template import PRESETS
from sftdata.tokenize.open import load_hf_tokenizer
from sftdata.verify import verify
from tests.helpers.bpe import RECORDS, edited
from tests.helpers.data import random_conversation, write_jsonl
from tests.helpers.imports import modules_after

runner = CliRunner()


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """An episodes dataset and its pack, several shards per split."""
    d = tmp_path_factory.mktemp("verify")
    rng = np.random.default_rng(1)
    (d / "chats.jsonl").write_bytes(b"\n".join(orjson.dumps(random_conversation(rng, i, 60, 80)) for i in range(300)) + b"\n")
    prepare([d / "chats.jsonl"], d / "episodes", PrepareOptions(val_split=0.2, workers=1, shard_tokens=6000))
    pack(d / "episodes", d / "packed", PackOptions(block_size=128, shard_tokens=2000))
    return d


def damaged(datasets, tmp_path, kind: str) -> object:
    """A copy of the ``kind`` dataset with one trained mask byte cleared in its first
    train shard and one token id past the vocabulary in its third (the vocab, mask rule, stops and
    checksums checks fail)."""
    out = tmp_path / kind
    shutil.copytree(datasets / kind, out)
    mask = out / "train" / "shard_00000" / "mask.bin"
    m = bytearray(mask.read_bytes())
    m[m.index(1) + 2] = 0
    mask.write_bytes(bytes(m))
    tokens = out / "train" / "shard_00002" / "tokens.bin"
    t = bytearray(tokens.read_bytes())
    t[40:44] = (2**31 - 1).to_bytes(4, "little")  # token 10 (uint32 ids): past the vocabulary
    tokens.write_bytes(bytes(t))
    return out


def as_dict(report) -> dict:
    d = report.as_dict()
    d.pop("seconds")
    return d


@pytest.mark.parametrize("kind", ["episodes", "packed"])
@pytest.mark.parametrize("damage", [False, True])
@pytest.mark.parametrize("quick", [False, True])
def test_ray_verify_reports_what_local_reports(ray_cluster, datasets, tmp_path, kind, damage, quick):
    path = damaged(datasets, tmp_path, kind) if damage else datasets / kind
    assert len(list((path / "train").iterdir())) >= 4
    local = verify(path, quick=quick)
    ray = verify(path, quick=quick, executor=ray_engine())
    assert as_dict(ray) == as_dict(local)
    assert local.ok is not damage
    if damage:
        failed = {c.name for c in local.checks if c.status == "failed"}
        assert {"vocab", "mask_rule", "stops"} <= failed and ("checksums" in failed) is not quick
        assert [(p.check, p.file) for p in local.problems if p.check in ("mask_rule", "vocab")] == [
            ("vocab", "train/shard_00002/tokens.bin"), ("mask_rule", "train/shard_00000/mask.bin")]
        refs = [(p.code, p.file) for p in local.problems if p.check == "references"]  # compared by a task per shard
        assert refs == ([("tokens_differ", "train/shard_00002/segments.idx")] if kind == "packed" else [])


def _without_timing(text: str) -> str:
    return re.sub(r"checked in [0-9.]+ s( \([0-9,]+ MB/s\))?", "checked in T s", text)


@pytest.mark.parametrize("kind", ["episodes", "packed"])
def test_the_cli_verifies_on_ray_with_the_same_output_and_exit_code(ray_cluster, datasets, tmp_path, kind):
    bad = damaged(datasets, tmp_path, kind)
    for path, code in ((datasets / kind, 0), (bad, 1)):
        for extra in (["--json"], []):
            loc = runner.invoke(app, ["verify", str(path), *extra])
            ray = runner.invoke(app, ["verify", str(path), *extra, "--engine", "ray"])
            assert (loc.exit_code, ray.exit_code) == (code, code), ray.output
            if extra:
                a, b = orjson.loads(loc.stdout), orjson.loads(ray.stdout)
                a.pop("seconds"), b.pop("seconds")
                assert a == b and a["ok"] is (code == 0)
            else:
                assert _without_timing(ray.stdout) == _without_timing(loc.stdout)
                assert ("FAILED: " in ray.stdout) is (code == 1)
    r = runner.invoke(app, ["verify", str(bad), "--ray-address", "auto"])
    assert (r.exit_code, r.output.strip()) == (2, "error: --ray-address needs --engine ray")


def test_a_truncated_shard_is_checked_on_ray_as_locally(ray_cluster, datasets, tmp_path):
    """A shard the reader finds damaged (a truncated mask) is still checked by its task,
    mapped as tolerantly as the local reader maps it."""
    path = tmp_path / "ds"
    shutil.copytree(datasets / "episodes", path)
    mask = path / "train" / "shard_00001" / "mask.bin"
    mask.write_bytes(mask.read_bytes()[:-7])
    local = verify(path)
    ray = verify(path, executor=ray_engine())
    assert as_dict(ray) == as_dict(local)
    assert "sizes" in {p.check for p in local.problems}


def test_without_ray_pack_and_verify_say_which_extra_to_install(datasets, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails
    for args in (["pack", str(datasets / "episodes"), "-o", str(tmp_path / "p")], ["verify", str(datasets / "packed")]):
        r = runner.invoke(app, [*args, "--engine", "ray"])
        assert (r.exit_code, r.output.strip()) == (2, "error: --engine ray needs Ray: pip install 'sftdata[ray]'")
        r = runner.invoke(app, [*args, "--engine", "spark"])
        assert (r.exit_code, r.output.strip()) == (2, "error: --engine must be one of local, ray, not 'spark'")
    assert list(tmp_path.iterdir()) == []


def unmerged(tok, ids: np.ndarray) -> np.ndarray:
    """``ids`` with the user's "What is" written as the tokens "h" and "e", which the
    library never gives (it merges them into "he")."""
    out = ids.copy()
    i = next(k for k in range(ids.size) if tok.decode([int(ids[k])]) == "What")
    assert tok.token_id("he") is not None
    out[i], out[i + 1] = tok.token_id("h"), tok.token_id("e")
    return out


def test_retokenize_on_ray_gives_the_local_result(ray_cluster, trained, tmp_path):
    """--retokenize: each shard's sampled episodes re-encoded by a task; an episode whose
    ids the library would not give is the same problem either way."""
    folder = edited(trained, tmp_path / "chatml", lambda d: None)
    (folder / "tokenizer_config.json").write_text(orjson.dumps(
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "chat_template": PRESETS["chatml"]}).decode())
    src = write_jsonl(tmp_path / "in.jsonl", RECORDS * 4)
    ds = tmp_path / "ds"
    r = runner.invoke(app, ["prepare-chat", str(src), "-o", str(ds), "--tokenizer", str(folder), "--shard-tokens",
                            "200"])
    assert r.exit_code == 0, r.output
    assert len(list((ds / "train").iterdir())) >= 3
    local = verify(ds, retokenize_episodes=1000)
    ray = verify(ds, retokenize_episodes=1000, executor=ray_engine())
    assert as_dict(ray) == as_dict(local) and local.ok and local.retokenized["differ"] == 0
    tokens = ds / "train" / "shard_00001" / "tokens.bin"
    dtype = orjson.loads((ds / "dataset_metadata.json").read_bytes())["token_dtype"]
    ids = np.fromfile(tokens, dtype=dtype)
    tok = load_hf_tokenizer(folder, engine="hf")
    ids[:] = unmerged(tok, ids)
    ids.tofile(tokens)
    local = verify(ds, quick=True, retokenize_episodes=1000)
    ray = verify(ds, quick=True, retokenize_episodes=1000, executor=ray_engine())
    assert as_dict(ray) == as_dict(local) and local.retokenized["differ"] >= 1
    assert [p.file for p in local.problems if p.check == "retokenize"][0] == "train/shard_00001/tokens.bin"


def test_verify_with_its_engine_imports_no_other_pipeline():
    mods = modules_after("verify", "--help")
    assert {"sftdata.cli.verify_cmd", "sftdata.engine.cluster", "sftdata.verify"} <= mods
    assert not {"sftdata.prepare", "sftdata.pack", "sftdata.engine.prepare_ray",
                "sftdata.report", "sftdata.loader"} & mods


@pytest.fixture(scope="module")
def one_shard(tmp_path_factory):
    """An episodes dataset of one shard per split (about 1,000 train episodes) and its pack."""
    d = tmp_path_factory.mktemp("one-shard")
    rng = np.random.default_rng(5)
    (d / "chats.jsonl").write_bytes(b"\n".join(orjson.dumps(random_conversation(rng, i, 20, 40))
                                               for i in range(1200)) + b"\n")
    prepare([d / "chats.jsonl"], d / "episodes", PrepareOptions(val_split=0.2, workers=1, shard_tokens=10**8))
    pack(d / "episodes", d / "packed", PackOptions(block_size=128, shard_tokens=10**8))
    return d


@pytest.mark.parametrize("kind", ["episodes", "packed"])
def test_a_split_of_one_shard_is_verified_in_parts_on_ray_with_the_local_report(ray_cluster, one_shard, tmp_path,
                                                                               kind):
    """Two shards on a 2-CPU cluster: each cut into parts (by default, and of 150 episodes
    or rows), problems planted in three of them; the report, --json and the exit code are
    the local ones."""
    path = tmp_path / kind
    shutil.copytree(one_shard / kind, path)
    assert [p.name for p in (path / "train").iterdir() if p.is_dir()] == ["shard_00000"]
    clean = verify(path)
    assert as_dict(verify(path, executor=ray_engine(items_per_task=150))) == as_dict(clean) and clean.ok
    sh = path / "train" / "shard_00000"
    ids, mask = np.fromfile(sh / "tokens.bin", np.uint32), np.fromfile(sh / "mask.bin", np.uint8)
    ones = np.flatnonzero(mask == 1)
    mask[ones[np.searchsorted(ones, [ids.size // 5, ids.size // 2])]] = 0  # mask rule and stops, two parts
    ids[[ids.size // 3, ids.size * 4 // 5]] = 2**32 - 1  # past the vocabulary, two parts
    ids.tofile(sh / "tokens.bin")
    mask.tofile(sh / "mask.bin")
    local = verify(path)
    assert {"vocab", "mask_rule", "stops", "checksums"} <= {c.name for c in local.checks if c.status == "failed"}
    for items in (None, 150):
        assert as_dict(verify(path, executor=ray_engine(items_per_task=items))) == as_dict(local)
    loc = runner.invoke(app, ["verify", str(path), "--json"])
    ray = runner.invoke(app, ["verify", str(path), "--json", "--engine", "ray"])
    assert (loc.exit_code, ray.exit_code) == (1, 1)
    a, b = orjson.loads(loc.stdout), orjson.loads(ray.stdout)
    a.pop("seconds"), b.pop("seconds")
    assert a == b


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """A pairs dataset of several shards per split, and episodes from the same questions."""
    d = tmp_path_factory.mktemp("pairs")
    user = [{"role": "user", "content": f"Question {i}: what color is the sky?"} for i in range(60)]
    write_jsonl(d / "pairs.jsonl", [{"prompt": [u], "chosen": [{"role": "assistant", "content": f"Blue, {i} times."}],
                                     "rejected": [{"role": "assistant", "content": "Green."}]} for i, u in enumerate(user)])
    write_jsonl(d / "chats.jsonl", [{"messages": [u, {"role": "assistant", "content": f"Blue, {i} times."}]}
                                    for i, u in enumerate(user)])
    prepare_pref([d / "pairs.jsonl"], d / "pairs", PrefOptions(val_split=0.2, shard_tokens=400))
    prepare([d / "chats.jsonl"], d / "episodes", PrepareOptions(val_split=0.2, workers=1, shard_tokens=400))
    return d


def test_a_pairs_dataset_runs_every_check_on_ray_as_an_episodes_dataset_does(ray_cluster, pairs, tmp_path):
    """Issue 42: ``verify --sources --retokenize 5 --engine ray`` on a pairs dataset runs the
    episodes dataset's checks by name (KTO's labels beside them, skipped with why), each
    shard checked by a task; the report is the local one, and a damaged mask fails alike."""
    args = ["--sources", "--retokenize", "5", "--engine", "ray", "--json"]
    got = {k: orjson.loads(runner.invoke(app, ["verify", str(pairs / k), *args]).stdout) for k in ("pairs", "episodes")}
    checks = {k: [(c["name"], c["status"], c["note"]) for c in r["checks"]] for k, r in got.items()}
    tiktoken = "the dataset's tokenizer is a tiktoken encoding with sftdata's markers, not a tokenizer.json"
    assert checks["pairs"] == [
        ("metadata", "ok", ""), ("metadata_checksum", "ok", ""), ("tokenizer", "ok", ""), ("files", "ok", ""),
        ("sizes", "ok", ""), ("index", "ok", ""), ("labels", "skipped", "a pairs dataset has no labels"),
        ("columns", "skipped", "a pairs dataset has no columns.jsonl"),
        ("eos", "skipped", "a row's prompt ends with the generation prompt, not <|EOS|>"), ("counts", "ok", ""),
        ("vocab", "ok", ""), ("mask_values", "ok", ""), ("ranges", "ok", ""), ("mask_rule", "ok", ""),
        ("media", "skipped", "no media (a text dataset)"), ("stops", "ok", ""), ("serving", "ok", ""),
        ("checksums", "ok", ""), ("sources", "ok", ""),
        ("retokenize", "skipped", tiktoken), ("drift", "ok", "")]
    assert [c[0] for c in checks["pairs"] if c[0] not in ("labels", "columns")] == [c[0] for c in checks["episodes"]]
    assert got["pairs"]["ok"] and got["pairs"]["drift"]["episodes"] == 5 and len(got["pairs"]["splits"]) == 2
    assert sum(s["shards"] for s in got["pairs"]["splits"].values()) >= 4  # several tasks
    bad = tmp_path / "bad"
    shutil.copytree(pairs / "pairs", bad)
    mask = bad / "train" / "shard_00001" / "mask.bin"
    m = bytearray(mask.read_bytes())
    m[0] = 1  # row's prompt trains its first token
    mask.write_bytes(bytes(m))
    local, ray = verify(bad), verify(bad, executor=ray_engine())
    assert as_dict(ray) == as_dict(local) and not local.ok
    row = (bad / "train" / "shard_00000" / "sources.idx").stat().st_size // 8  # the shard's first row
    record = int(np.fromfile(bad / "train" / "shard_00001" / "sources.idx", dtype="<u8")[0])
    assert [(p.check, p.file, p.where, p.message) for p in local.problems if p.check == "mask_rule"] == [
        ("mask_rule", "train/shard_00001/mask.bin", f"row {row}, record {record}", "the prompt holds trained tokens")]

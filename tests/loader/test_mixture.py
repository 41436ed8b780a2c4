"""Mixtures end to end: the file, the loader (batches, resume, ranks, packed members,
audit), replay-order, inspect and verify, and the refusals by name."""

from __future__ import annotations

import csv
import io
import json
from collections import Counter
from pathlib import Path

import numpy as np
import orjson
import pytest
from typer.testing import CliRunner

from sftdata.cli import app
from sftdata.errors import ConfigError, DatasetError, OutputExistsError
from sftdata.loader import LoaderConfig, make_loader
from sftdata.order.audit import read_log
from sftdata.pack import PackOptions, pack
from sftdata.prepare import PrepareOptions, prepare
from sftdata.replay.mixture import replay_mixture
from sftdata.store.mixture import is_mixture_file, make_mixture, open_mixture
from tests.helpers.data import chat, write_jsonl

runner = CliRunner()


def _records(prefix: str, n: int) -> list[dict]:
    return [chat(f"{prefix} question {i} " + "word " * (i % 9), f"{prefix} answer {i} " + "more " * (i % 5))
            for i in range(n)]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("mix")
    for name, n in (("chat", 12), ("tools", 40)):
        prepare([write_jsonl(d / f"{name}.jsonl", _records(name, n))], d / name, PrepareOptions(val_split=0.2))
    pack(d / "chat", d / "chat_packed", PackOptions(block_size=63))
    pack(d / "tools", d / "tools_packed", PackOptions(block_size=63))
    pack(d / "tools", d / "tools_packed_127", PackOptions(block_size=127))
    make_mixture([(None, str(d / "chat"), 0.8), (None, str(d / "tools"), 0.2)], d / "mix.json")
    return d


CFG = LoaderConfig(batch_size=4, block_size=63, use_loss_mask=True)


def _run(*args):
    r = runner.invoke(app, [str(a) for a in args])
    return r.exit_code, r.stdout, r.stderr


def test_the_file_holds_relative_paths_checksums_weights_and_seed(data):
    obj = json.loads((data / "mix.json").read_text())
    assert obj["format"] == "sftdata-mixture" and obj["by"] == "rows" and obj["seed"] == 1337
    assert [(m["name"], m["path"], m["weight"]) for m in obj["members"]] == [("chat", "chat", 0.8),
                                                                              ("tools", "tools", 0.2)]
    assert all(len(m["metadata_sha256"]) == 64 for m in obj["members"])
    assert is_mixture_file(data / "mix.json") and not is_mixture_file(data / "chat.jsonl")


def test_batches_are_the_members_own_rows(data):
    ld = make_loader(CFG, data / "mix.json", backend="numpy")
    own = [make_loader(CFG, data / m, backend="numpy") for m in ("chat", "tools")]
    o = ld.order("train")
    for _ in range(5):
        b = ld.get_batch("train")
        member, local = o.locate(ld.last_ids["train"])
        for row, (i, j) in enumerate(zip(member.tolist(), local.tolist())):
            ref = own[i].batch_at("train", 0, ids=np.array([j]))
            assert np.array_equal(b.x[row], ref.x[0]) and np.array_equal(b.mask[row], ref.mask[0])


def test_resume_is_exact_and_another_mixture_is_refused(data, tmp_path):
    a = make_loader(CFG, data / "mix.json", backend="numpy")
    for _ in range(3):
        a.get_batch("train")
    state = a.state_dict()
    b = make_loader(CFG, data / "mix.json", backend="numpy")
    b.load_state_dict(state)
    for _ in range(4):
        assert np.array_equal(a.get_batch("train").x, b.get_batch("train").x)
    make_mixture([(None, str(data / "chat"), 0.5), (None, str(data / "tools"), 0.5)], tmp_path / "other.json")
    c = make_loader(CFG, tmp_path / "other.json", backend="numpy")
    with pytest.raises(ConfigError, match="cannot resume.*mixture_sha256: saved '[0-9a-f]{64}', now"):
        c.load_state_dict(state)


def test_a_resume_on_another_layout_is_refused_by_name(data):
    a = make_loader(CFG, data / "mix.json", backend="numpy")
    a.get_batch("train")
    b = make_loader(CFG.replace(batch_size=2), data / "mix.json", backend="numpy", rank=0, world_size=2)
    with pytest.raises(ConfigError, match="batch_size 4 x world_size 1, and a mixture's batches cannot change their "
                                          "layout on resume"):
        b.load_state_dict(a.state_dict())


def test_ranks_split_each_global_batch(data):
    whole = make_loader(CFG.replace(batch_size=6), data / "mix.json", backend="numpy", rank=0, world_size=1)
    ranks = [make_loader(CFG.replace(batch_size=3), data / "mix.json", backend="numpy", rank=r, world_size=2)
             for r in range(2)]
    for step in range(6):
        x = whole.batch_at("train", step).x
        assert np.array_equal(np.concatenate([r.batch_at("train", step).x for r in ranks]), x)


def test_packed_members_mix_with_every_field(data, tmp_path):
    make_mixture([(None, str(data / "chat_packed"), 1), (None, str(data / "tools_packed"), 1)], tmp_path / "p.json",
                 by="tokens")
    ld = make_loader(CFG, tmp_path / "p.json", backend="numpy")
    own = make_loader(CFG, data / "tools_packed", backend="numpy")
    b = ld.get_batch("train")
    assert all(getattr(b, f) is not None for f in ("x", "y", "mask", "position_ids", "seq_ids"))
    assert ld.steps_total("train") is None  # a mixture has epochs, packed or not
    member, local = ld.order("train").locate(ld.last_ids["train"])
    k = int(np.flatnonzero(member == 1)[0])
    assert np.array_equal(b.seq_ids[k], own.batch_at("train", 0, ids=local[k:k + 1]).seq_ids[0])
    r = replay_mixture(tmp_path / "p.json", CFG, step=0)
    assert "row" in r.columns and set(r.column_lists()["dataset"]) <= {"chat_packed", "tools_packed"}
    rows = sorted(set(zip(r.columns["slot"].tolist(), r.columns["row"].tolist())))
    assert [row for _, row in rows] == local.tolist()


def test_members_that_cannot_train_together_are_refused_by_name(data, tmp_path):
    with pytest.raises(DatasetError, match=r"member 'chat_packed' \(.*\) has kind 'packed' but member 'chat' .* "
                                           r"has 'episodes'"):
        make_mixture([(None, str(data / "chat"), 1), (None, str(data / "chat_packed"), 1)], tmp_path / "x.json")
    with pytest.raises(DatasetError, match="member 'tools_packed_127' .* has block_size 127 but member "
                                           "'chat_packed' .* has 63"):
        make_mixture([(None, str(data / "chat_packed"), 1), (None, str(data / "tools_packed_127"), 1)],
                     tmp_path / "x.json")
    other = tmp_path / "bytes"
    (tmp_path / "bytes.tiktoken").write_text("".join(f"{__import__('base64').b64encode(bytes([i])).decode()} {i}\n"
                                                     for i in range(256)))
    prepare([write_jsonl(tmp_path / "b.jsonl", _records("b", 5))], other,
            PrepareOptions(tokenizer=str(tmp_path / "bytes.tiktoken")))
    with pytest.raises(DatasetError, match="member 'bytes' .* was made with another tokenizer than member 'chat'.*"
                                           "Prepare both with the same --tokenizer"):
        make_mixture([(None, str(data / "chat"), 1), (None, str(other), 1)], tmp_path / "x.json")
    with pytest.raises(DatasetError, match="two members are named 'chat'"):
        make_mixture([(None, str(data / "chat"), 1), (None, str(data / "chat"), 1)], tmp_path / "x.json")
    assert not (tmp_path / "x.json").exists()


def test_a_member_changed_or_moved_since_the_mixture_was_made_is_refused(data, tmp_path):
    import shutil

    for m in ("chat", "tools"):
        shutil.copytree(data / m, tmp_path / m)
    make_mixture([(None, str(tmp_path / "chat"), 1), (None, str(tmp_path / "tools"), 1)], tmp_path / "m.json")
    meta = tmp_path / "tools" / "dataset_metadata.json"
    meta.write_bytes(meta.read_bytes() + b"\n")
    with pytest.raises(DatasetError, match="member 'tools' .* has changed since the mixture was made.*re-create the "
                                           "mixture with `sftdata mix`"):
        open_mixture(tmp_path / "m.json")
    code, out, err = _run("verify", tmp_path / "m.json")
    assert code == 1 and "member_checksums" in out and "FAILED: 1 mixture problem(s)" in out
    shutil.rmtree(tmp_path / "chat")
    with pytest.raises(DatasetError, match="member 'chat' is .*chat, which does not exist"):
        make_loader(CFG, tmp_path / "m.json", backend="numpy")


def test_an_existing_file_is_kept_unless_overwrite(data, tmp_path):
    spec = [(None, str(data / "chat"), 1)]
    make_mixture(spec, tmp_path / "m.json")
    with pytest.raises(OutputExistsError, match="m.json exists; give --overwrite"):
        make_mixture(spec, tmp_path / "m.json")
    make_mixture(spec, tmp_path / "m.json", overwrite=True, seed=9)
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(OutputExistsError, match="notes.txt exists and is not a mixture file"):
        make_mixture(spec, tmp_path / "notes.txt", overwrite=True)


def test_the_audit_log_records_the_mixture_and_replays(data, tmp_path):
    ld = make_loader(CFG, data / "mix.json", backend="numpy", audit_dir=tmp_path / "audit")
    for _ in range(ld.order("train").batches_in_epoch(0) + 1):
        ld.get_batch("train")
    entries, _ = read_log(next((tmp_path / "audit").glob("*.log")))
    load = next(e for e in entries if e.action == "dataset_load")
    sha = open_mixture(data / "mix.json").sha256
    assert load.fields["mixture_sha256"] == sha and load.fields["mixture_members"] == "chat:0.8,tools:0.2"
    assert [e.fields["epoch"] for e in entries if e.action == "epoch_start"] == ["0", "1"]
    code, _, err = _run("replay-order", data / "mix.json", "--batch-size", 4, "--check-audit",
                        next((tmp_path / "audit").glob("*.log")))
    assert code == 0 and "match the replay" in " ".join(err.split())  # rich wraps a long audit path


def test_replay_csv_shows_the_weights_exactly_with_each_rows_source(data):
    code, out, _ = _run("replay-order", data / "mix.json", "--batch-size", 4, "--csv", "--epoch", 1)
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert list(rows[0]) == ["epoch", "position", "dataset", "episode", "shard", "length", "record", "step", "rank",
                             "slot"]
    om = open_mixture(data / "mix.json")
    n = sum(len(it.ids) for it in om.items("train", 2))
    counts = Counter(r["dataset"] for r in rows)
    assert n == 42 and counts == {"chat": 33, "tools": 9}  # 0.8 * 42 = 33.6: 34 + 33 = 67 = round(2 * 33.6)
    code, out, _ = _run("replay-order", data / "mix.json", "--batch-size", 4, "--csv")
    assert Counter(r["dataset"] for r in csv.DictReader(io.StringIO(out))) == {"chat": 34, "tools": 8}
    # the step column is the loader's: step 3 of the replay is the loader's step 3
    ld = make_loader(CFG, data / "mix.json", backend="numpy")
    step = int(rows[0]["step"])
    ids = ld.batch_ids("train", step)
    member, local = ld.order("train").locate(ids)
    first = [(r["dataset"], int(r["episode"])) for r in rows if r["step"] == str(step)]
    assert first == [(om.names[i], j) for i, j in zip(member.tolist(), local.tolist())]


def test_replay_refuses_a_seed_for_a_mixture(data):
    code, _, err = _run("replay-order", data / "mix.json", "--seed", 5)
    assert code == 2 and "is a mixture: its own seed orders it" in err


def test_inspect_shows_realized_shares_per_epoch(data):
    code, out, _ = _run("inspect", data / "mix.json", "--json", "--epochs", 2)
    assert code == 0
    ov = orjson.loads(out)
    assert [m["name"] for m in ov["members"]] == ["chat", "tools"] and ov["epoch_items"][0] > 0
    chat_ = ov["members"][0]
    assert chat_["share"] == 0.8 and len(chat_["epochs"]) == 2
    assert abs(chat_["epochs"][0]["items_share"] - 0.8) < 1 / ov["epoch_items"][0]
    code, out, _ = _run("inspect", data / "mix.json")
    assert code == 0 and "epoch 0 rows (share)" in out and "80.00%" in out
    code, _, err = _run("inspect", data / "mix.json", "--episode", 0)
    assert code == 2 and "is a mixture: inspect one of its member folders" in err


def test_verify_checks_every_member_and_the_checksums(data):
    code, out, _ = _run("verify", data / "mix.json", "--json")
    rep = orjson.loads(out)
    assert code == 0 and rep["ok"] and [m["name"] for m in rep["members"]] == ["chat", "tools"]
    assert [c["name"] for c in rep["checks"]] == ["members", "member_checksums", "compatible"]


def test_the_mix_command(data, tmp_path):
    code, out, _ = _run("mix", f"{data / 'chat'}:3", f"t={data / 'tools'}:1", "-o", tmp_path / "m.json", "--by",
                        "tokens", "--seed", 7, "--json")
    assert code == 0
    got = orjson.loads(out)
    assert got["by"] == "tokens" and got["seed"] == 7
    assert [(m["name"], m["share"]) for m in got["members"]] == [("chat", 0.75), ("t", 0.25)]
    code, _, err = _run("mix", f"{data / 'chat'}:x", "-o", tmp_path / "n.json")
    assert code == 2 and "the weight 'x' is not a number" in err
    code, _, err = _run("mix", str(data / "chat"), "-o", tmp_path / "n.json")
    assert code == 2 and "give DATASET:WEIGHT" in err
    code, _, err = _run("mix", f"{data / 'chat'}:1", "-o", tmp_path / "n.json", "--by", "bytes")
    assert code == 2 and "--by must be one of rows, tokens" in err
    code, _, err = _run("mix", f"{tmp_path / 'nope'}:1", "-o", tmp_path / "n.json")
    assert code == 1 and "nope is not a dataset folder" in err


def test_a_mixture_in_random_sampling_is_refused(data):
    with pytest.raises(ConfigError, match="batch_sampling_mode='random' is not supported"):
        make_loader(CFG.replace(batch_sampling_mode="random"), data / "mix.json", backend="numpy")


def test_the_config_seed_is_named_when_the_mixture_overrides_it(data, caplog):
    ld = make_loader(CFG.replace(epoch_seed=5), data / "mix.json", backend="numpy")
    assert ld.order("train").seed == 1337
    assert "epoch_seed 5 of the config is not used" in caplog.text


def test_paths_are_relative_to_the_mixture_file(data, tmp_path):
    make_mixture([(None, str(data / "chat"), 1)], data / "sub" / "m.json")
    assert json.loads((data / "sub" / "m.json").read_text())["members"][0]["path"] == "../chat"
    assert make_loader(CFG, Path(data / "sub" / "m.json"), backend="numpy").num_items("train") > 0


def test_packed_rows_keep_their_varlen_inputs(data, tmp_path):
    make_mixture([(None, str(data / "tools_packed"), 1)], tmp_path / "one.json")
    ld = make_loader(CFG, tmp_path / "one.json", backend="numpy")
    own = make_loader(CFG, data / "tools_packed", backend="numpy")
    for step in range(3):
        b = ld.batch_at("train", step)
        member, local = ld.order("train").locate(ld.batch_ids("train", step))
        ref = own.batch_at("train", 0, ids=local)
        assert np.array_equal(b.cu_seqlens, ref.cu_seqlens) and b.max_seqlen == ref.max_seqlen
        assert np.array_equal(b.cu_seqlens_padded, ref.cu_seqlens_padded)
        assert b.trained_tokens == ref.trained_tokens == ld.trained_tokens_at("train", step)


def test_token_budget_batches_and_padded_segments_are_refused_for_a_mixture(data, tmp_path):
    with pytest.raises(ConfigError, match="batch_tokens is not supported for mixtures"):
        make_loader(CFG.replace(batch_tokens=4096), data / "mix.json", backend="numpy")
    make_mixture([(None, str(data / "tools_packed"), 1)], tmp_path / "one.json")
    with pytest.raises(ConfigError, match="pad_to_multiple_of is not supported for a mixture of packed datasets"):
        make_loader(CFG.replace(pad_to_multiple_of=8), tmp_path / "one.json", backend="numpy")

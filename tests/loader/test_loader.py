"""The Loader and its Batch, the same for every dataset (episodes, packed rows, token
windows): fields, accessors, steps, resume, ranks, the iterable and torch forms,
make_loader, log lines and audit events."""

import dataclasses
import json
import logging
import pickle
import shutil
import subprocess
import sys

import numpy as np
import pytest

from sftdata.errors import ConfigError, DatasetError
from sftdata.loader import (
    IGNORE_INDEX,
    Batch,
    GPTDataLoader,
    GPTEpisodeDataLoader,
    Loader,
    LoaderConfig,
    PackedBatch,
    PackedDataLoader,
    apply_ignore_index,
    make_loader,
)
from sftdata.order.audit import read_log
from sftdata.prepare import PrepareOptions, prepare
from tests.helpers.data import chat, write_jsonl
from tests.helpers.loader import CONFIGS, EOS, load

KINDS = ("episodes", "packed", "windows")
ALL_FIELDS = ("x", "y", "mask", "position_ids", "seq_ids")
FIELDS = {"episodes": ("x", "y", "mask"), "packed": ALL_FIELDS, "windows": ("x", "y")}


def same(a: Batch, b: Batch) -> bool:
    return list(a.as_dict()) == list(b.as_dict()) and all(np.array_equal(np.asarray(u), np.asarray(v))
                                                          for u, v in zip(a, b))


def test_import_loader_needs_numpy_only():
    code = ("import sys, sftdata.loader, sftdata.order, sftdata.order.config, sftdata.order.audit; "
            "print(sorted(m for m in ('torch', 'typer', 'rich', 'click') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_import_loader_loads_no_parsing_template_source_or_curation_code():
    """A training process imports the loader, the store's reader (with the storage's commit
    protocol and location), the order and the mask markers: at most 30 sftdata modules, none
    of record parsing, templates, sources, curation, tokenizers or object storage, and no
    third-party library but numpy/orjson."""
    code = ("import json, sys, sftdata.loader; "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('sftdata', 'jinja2', 'tokenizers', 'tiktoken', 'pyarrow', 'fsspec', 'torch', 'typer', 'rich'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = json.loads(out.stdout)
    assert all(m.startswith("sftdata") for m in loaded), loaded
    assert len(loaded) <= 30, loaded
    heavy = ("sftdata.records", "sftdata.template", "sftdata.sources", "sftdata.curate", "sftdata.prepare",
             "sftdata.chat.render", "sftdata.chat.tokenizer", "sftdata.tokenize.", "sftdata.store.object",
             "sftdata.store.mixture", "sftdata.store.writer")
    assert [m for m in loaded if m.startswith(heavy)] == []


# ------------------------------------------------------------------------- the Batch
@pytest.mark.parametrize("kind", KINDS)
def test_a_batch_has_the_same_fields_for_every_dataset(each_kind, kind):
    loader = load(each_kind, kind)
    b = loader.get_batch("train")
    # the five array fields (the tuple form), then the count and the packed rows' varlen fields
    assert type(b) is Batch and [f.name for f in dataclasses.fields(b)] == list(ALL_FIELDS) + [
        "trained_tokens", "cu_seqlens", "cu_seqlens_padded", "max_seqlen"]
    names = FIELDS[kind]
    assert list(b.as_dict()) == list(names) and len(b) == len(names)
    assert all(getattr(b, f) is None for f in ALL_FIELDS if f not in names)
    assert isinstance(b.trained_tokens, int) and (b.cu_seqlens is not None) == (kind == "packed")
    assert [id(a) for a in b] == [id(getattr(b, f)) for f in names]  # iteration: the fields that are set, in order
    assert b[0] is b.x and b[1] is b.y and b[-1] is getattr(b, names[-1])
    bs, T = CONFIGS[kind]["batch_size"], CONFIGS[kind]["block_size"]
    for f in names:
        assert getattr(b, f).shape == (bs, T) and getattr(b, f).dtype == (np.float32 if f == "mask" else np.int64)


def test_the_tuple_forms_of_a_batch(each_kind):
    x, y, mask = load(each_kind, "episodes").get_batch("train")
    assert mask.dtype == np.float32
    x, y = load(each_kind, "episodes", use_loss_mask=False).get_batch("train")
    x, y = load(each_kind, "windows").get_batch("train")
    x, y, mask, position_ids, seq_ids = load(each_kind, "packed").get_batch("train")
    assert seq_ids.shape == x.shape
    assert PackedBatch is Batch and PackedBatch(x, y, mask, position_ids, seq_ids).seq_ids is seq_ids


def test_batch_map_keeps_unset_fields_unset():
    b = Batch(np.arange(3), np.arange(3) + 1)
    doubled = b.map(lambda a: a * 2)
    assert doubled.x.tolist() == [0, 2, 4] and doubled.y.tolist() == [2, 4, 6] and doubled.mask is None
    assert b.x.tolist() == [0, 1, 2]  # a new batch; the old one is untouched


# ---------------------------------------------------------------- common accessors
@pytest.mark.parametrize("kind, mode, sampling, pad, end, vocab, total", [
    ("episodes", "sft_episode", "epoch", EOS, EOS, 1 << 30, None),
    ("packed", "packed", "epoch", 100257, None, 100286, 92 // 4),
    ("windows", "token_stream", "random", None, None, None, None),
])
def test_every_loader_answers_the_same_questions(each_kind, kind, mode, sampling, pad, end, vocab, total):
    loader = load(each_kind, kind)
    assert type(loader) is Loader and GPTEpisodeDataLoader is GPTDataLoader is PackedDataLoader is Loader
    assert (loader.mode, loader.sampling, loader.pad_id, loader.end_id, loader.vocab_size) == (mode, sampling, pad,
                                                                                               end, vocab)
    assert loader.splits == ("train", "val") and loader.steps_total("train") == total
    assert (loader.step("train"), loader.step("val")) == (0, 0)
    loader.get_batch("train")
    assert (loader.step("train"), loader.step("val")) == (1, 0)
    assert loader.batch_ids("train", 0).tolist() == loader.last_ids["train"].tolist()
    assert loader.num_items("train") == loader.order("train").n > 0


# ------------------------------------------------------------------------- resume
@pytest.mark.parametrize("kind, kw", [
    ("episodes", dict(batch_sampling_mode="epoch", epoch_drop_last=True, batch_size=2)),
    ("episodes", dict(batch_sampling_mode="epoch", epoch_drop_last=False, batch_size=2)),
    ("episodes", dict(batch_sampling_mode="random", epoch_drop_last=False, batch_size=2)),
    ("packed", {}),
    ("windows", {}),
])
def test_resume_mid_way_equals_uninterrupted(each_kind, kind, kw):
    full = load(each_kind, kind, **kw)
    ref = [full.get_batch("train") for _ in range(9)]
    vals = [full.get_batch("val") for _ in range(2)]
    first = load(each_kind, kind, **kw)
    for _ in range(4):
        first.get_batch("train")
    first.get_batch("val")
    state = json.loads(json.dumps(first.state_dict()))  # survives a JSON (or torch.save) round trip
    assert state["steps"] == {"train": 4, "val": 1}
    resumed = load(each_kind, kind, **kw)
    resumed.load_state_dict(state)
    assert resumed.step("train") == 4 and resumed.step("val") == 1
    for i in range(4, 9):
        assert same(resumed.get_batch("train"), ref[i])
    assert same(resumed.get_batch("val"), vals[1])


@pytest.mark.parametrize("kind, saved, now, match", [
    ("episodes", dict(), dict(epoch_shuffle=False), r"cannot resume: .*epoch_shuffle: saved True, now False"),
    ("episodes", dict(batch_size=2), dict(batch_size=2, epoch_seed=1), r"epoch_seed: saved 1337, now 1"),
    ("episodes", dict(), dict(episode_min_tokens=3), r"episode_min_tokens: saved 2, now 3"),
    ("packed", dict(), dict(epoch_seed=8), r"cannot resume: .*epoch_seed: saved 7, now 8"),
    ("packed", dict(), dict(epoch_drop_last=False), r"epoch_drop_last: saved True, now False"),
    ("windows", dict(), dict(block_size=9), r"block_size: saved 8, now 9"),
])
def test_resume_with_other_order_settings_is_refused(each_kind, kind, saved, now, match):
    state = load(each_kind, kind, **saved).state_dict()
    with pytest.raises(ConfigError, match=match):
        load(each_kind, kind, **now).load_state_dict(state)


def test_a_state_that_is_not_a_loader_state_is_refused(each_kind):
    state = load(each_kind, "episodes", batch_size=2).state_dict()
    with pytest.raises(ConfigError, match="not a loader state"):
        load(each_kind, "episodes").load_state_dict({"steps": {}})
    with pytest.raises(ConfigError, match="version 9 is not supported"):
        load(each_kind, "episodes").load_state_dict({**state, "version": 9})
    with pytest.raises(ConfigError, match="step of split 'train' must be an integer >= 0, got -1"):
        load(each_kind, "episodes", batch_size=2).load_state_dict({**state, "steps": {"train": -1}})


def test_resume_on_another_dataset_with_the_same_counts_is_refused(tmp_path, monkeypatch):
    """Episode counts alone do not identify a dataset: re-prepared with another split seed
    (or edited records), the same ids are other conversations, so the batches after the
    resume would not be those of the run. A copy elsewhere, or the same data prepared
    again from the input named another way, resumes."""
    src = write_jsonl(tmp_path / "in.jsonl", [chat(f"question {i}", f"answer {i}") for i in range(12)])
    prepare([src], tmp_path / "a", PrepareOptions(val_split=0.25, seed=1))
    prepare([src], tmp_path / "b", PrepareOptions(val_split=0.25, seed=2))
    shutil.copytree(tmp_path / "a", tmp_path / "a_copy")
    monkeypatch.chdir(tmp_path)
    prepare(["in.jsonl"], tmp_path / "a_again", PrepareOptions(val_split=0.25, seed=1))

    def at(path):
        return make_loader(LoaderConfig(batch_size=2, block_size=6), path, backend="numpy")

    first = at(tmp_path / "a")
    first.get_batch("train")
    state = json.loads(json.dumps(first.state_dict()))
    other = at(tmp_path / "b")
    assert other.num_items("train") == first.num_items("train")
    with pytest.raises(ConfigError, match=r"cannot resume: .*dataset_content_sha256: saved '[0-9a-f]{64}', now "
                                          r"'[0-9a-f]{64}'"):
        other.load_state_dict(state)
    expected = first.get_batch("train")[0].tolist()
    for again in ("a_copy", "a_again"):
        resumed = at(tmp_path / again)
        resumed.load_state_dict(state)
        assert resumed.get_batch("train")[0].tolist() == expected
    del state["order"]["dataset_content_sha256"]  # a state saved before the field existed still resumes
    at(tmp_path / "b").load_state_dict(state)


# -------------------------------------------------------------------------- ranks
@pytest.mark.parametrize("kind, kw", [
    ("episodes", dict(batch_sampling_mode="epoch", epoch_drop_last=True)),
    ("episodes", dict(batch_sampling_mode="epoch", epoch_drop_last=False)),
    ("episodes", dict(batch_sampling_mode="random", epoch_drop_last=True)),
    ("packed", {}),
    ("windows", {}),
])
def test_ranks_partition_the_global_batch(each_kind, kind, kw):
    single = load(each_kind, kind, batch_size=4, **kw)
    ranks = [load(each_kind, kind, batch_size=2, rank=r, world_size=2, **kw) for r in range(2)]
    assert single.steps_total() == ranks[0].steps_total() == ranks[1].steps_total()
    for _ in range(7):
        whole = single.get_batch("train")
        parts = [rk.get_batch("train") for rk in ranks]
        assert len(parts[0]) == len(whole)
        for i in range(len(whole)):
            assert np.concatenate([p[i] for p in parts]).tolist() == whole[i].tolist()


def test_rank_from_environment(each_kind, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    loader = load(each_kind, "episodes", batch_size=2)
    assert (loader.rank, loader.world_size) == (1, 2)
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(ConfigError, match="RANK='x' is not an integer"):
        load(each_kind, "episodes")
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(ConfigError, match=r"rank must be an integer in 0..1"):
        load(each_kind, "episodes")


# ------------------------------------------------------------ iterable and torch
@pytest.mark.parametrize("kind", KINDS)
def test_numpy_iterable_equals_get_batch(each_kind, kind):
    kw = dict(epoch_drop_last=False) if kind == "episodes" else {}
    ref = load(each_kind, kind, **kw)
    expected = [ref.get_batch("train") for _ in range(7)]
    loader = load(each_kind, kind, **kw)
    loader.get_batch("train")
    got = list(loader.iterable("train", num_steps=6))  # starts at the loader's current step (1)
    assert len(got) == 6 and loader.step("train") == 1  # the iterable leaves the loader's counter alone
    assert all(same(g, e) for g, e in zip(got, expected[1:]))


def test_the_iterable_of_a_one_pass_order_ends_with_it(each_kind):
    a = load(each_kind, "packed")
    b = load(each_kind, "packed")
    total = a.steps_total()
    got = list(a.iterable("train"))
    assert len(got) == total
    assert all(same(g, b.get_batch("train")) for g in got)
    assert len(list(a.iterable("train", start_step=total - 2))) == 2
    assert len(list(a.iterable("train", start_step=1, num_steps=2))) == 2
    assert len(list(a.iterable("train", start_step=total - 1, num_steps=5))) == 1


@pytest.mark.parametrize("kind", KINDS)
def test_torch_backend_dtypes_and_values(each_kind, kind):
    torch = pytest.importorskip("torch")
    t = load(each_kind, kind, backend="torch")
    n = load(each_kind, kind)
    auto = load(each_kind, kind, backend="auto")  # auto = torch when installed
    for _ in range(3):
        tb, nb, ab = t.get_batch("train"), n.get_batch("train"), auto.get_batch("train")
        assert list(tb.as_dict()) == list(FIELDS[kind]) and isinstance(ab.x, torch.Tensor)
        for name, a in tb.as_dict().items():
            assert isinstance(a, torch.Tensor) and a.device.type == "cpu"
            assert a.dtype == (torch.float32 if name == "mask" else torch.int64)
            assert a.tolist() == getattr(nb, name).tolist()


def test_torch_dataloader_with_two_workers_gives_the_same_batches_in_order(each_kind, tmp_path):
    torch = pytest.importorskip("torch")
    ref = load(each_kind, "episodes", batch_size=2, epoch_drop_last=False)
    expected = [ref.get_batch("train") for _ in range(9)]
    loader = load(each_kind, "episodes", batch_size=2, epoch_drop_last=False, audit_dir=tmp_path / "audit")
    it = loader.iterable("train", start_step=2, num_steps=7, torch=True)
    assert isinstance(it, torch.utils.data.IterableDataset)
    dl = torch.utils.data.DataLoader(it, batch_size=None, num_workers=2)
    got = list(dl)
    assert len(got) == 7
    for g, e in zip(got, expected[2:]):
        assert type(g) is Batch and all(isinstance(a, torch.Tensor) for a in g) and same(g, e)
    # a worker started by spawn receives the iterable pickled: it is rebuilt the same
    again = pickle.loads(pickle.dumps(it))
    assert isinstance(again, torch.utils.data.IterableDataset)
    assert all(same(g, e) for g, e in zip(again, expected[2:]))


# --------------------------------------------------------------------- make_loader
def test_make_loader_errors(tmp_path, each_kind):
    with pytest.raises(DatasetError, match="does not exist"):
        make_loader(LoaderConfig(), tmp_path / "nope")
    with pytest.raises(ConfigError, match="backend 'jax' is not valid; choose one of: auto, numpy, torch"):
        make_loader(LoaderConfig(), each_kind["episodes"], backend="jax")
    with pytest.raises(ConfigError, match="needs a LoaderConfig"):
        make_loader("cfg.json", each_kind["episodes"])
    with pytest.raises(DatasetError, match="dataset_mode=sft_episode needs an episode index"):
        make_loader(LoaderConfig(dataset_mode="sft_episode"), each_kind["windows"])
    assert make_loader({"batch_size": 2, "block_size": 8}, each_kind["windows"], backend="numpy").mode == "token_stream"
    with pytest.raises(ConfigError, match="a loader needs a LoaderConfig, got dict"):
        Loader({"batch_size": 2}, {"train": [np.arange(10)]})
    with pytest.raises(ConfigError, match=r"a loader reads an opened Dataset or \{split: \[token arrays\]\}, got "
                                          r"list"):
        Loader(LoaderConfig(), [np.arange(10)])


def test_make_loader_refuses_a_broken_dataset_with_verifys_message(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text('{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}\n' * 3)
    prepare([src], tmp_path / "ds", PrepareOptions())
    idx = tmp_path / "ds" / "train" / "shard_00000" / "episodes.idx"
    a = np.fromfile(idx, dtype=np.uint64).reshape(-1, 2)
    a[2, 0] = 10**6  # the last episode points past the end of tokens.bin
    a.tofile(idx)
    with pytest.raises(DatasetError, match=r"episode 2.*Run `sftdata verify .*` for the full report"):
        make_loader(LoaderConfig(batch_size=1, block_size=8), tmp_path / "ds", backend="numpy")


# ------------------------------------------------------------------ logs and audit
def test_epoch_log_lines(each_kind, caplog):
    with caplog.at_level(logging.INFO, logger="sftdata.loader"):
        loader = load(each_kind, "episodes", batch_size=4, epoch_drop_last=False)
        for _ in range(4):
            loader.get_batch("train")
    msgs = [r.getMessage() for r in caplog.records]
    assert msgs[0] == (f"[EpisodeLoader] init dataset={each_kind['episodes']} split=train episodes=12 eligible=11 "
                       f"skipped_short=1 tokens=70 shards=6 mask=true sampling=epoch block_size=6 batch_size=4 "
                       f"world_size=1")
    epochs = [m for m in msgs if m.startswith("[EpisodeLoader] split=")]
    assert epochs == [
        "[EpisodeLoader] split=train epoch=0 episodes=11 batches=3 shuffle=true drop_last=false pad_id=7 mask=true",
        "[EpisodeLoader] split=train epoch=1 episodes=11 batches=3 shuffle=true drop_last=false pad_id=7 mask=true",
    ]


def test_audit_lines(tmp_path, each_kind):
    adir = tmp_path / "logs" / "audit"
    loader = load(each_kind, "episodes", batch_size=4, epoch_seed=42, audit_dir=adir)
    for _ in range(5):
        loader.get_batch("train")
    (path,) = adir.glob("audit_*.log")
    entries, bad = read_log(path)
    assert bad == []
    assert [e.action for e in entries] == ["dataset_load", "epoch_start", "epoch_complete", "epoch_start",
                                           "epoch_complete", "epoch_start"]
    load_ev = entries[0].fields
    assert list(load_ev) == ["dataset", "dataset_mode", "batch_sampling_mode", "epoch_seed", "epoch_shuffle",
                             "epoch_drop_last", "batch_size", "world_size", "block_size", "episode_min_tokens",
                             "num_train_episodes", "num_val_episodes", "num_train_skipped_short",
                             "num_val_skipped_short"]
    assert (load_ev["epoch_seed"], load_ev["epoch_shuffle"], load_ev["num_train_episodes"],
            load_ev["num_train_skipped_short"]) == ("42", "true", "11", "1")
    order = loader.order("train")
    for e, epoch in zip([entries[1], entries[3], entries[5]], [0, 1, 2]):
        assert list(e.fields) == ["split", "epoch", "seed", "num_episodes", "first_episode_ids", "step"]
        assert e.fields["epoch"] == str(epoch) and e.fields["seed"] == str(42 + epoch)
        assert json.loads(e.fields["first_episode_ids"]) == order.epoch_order(epoch)[:10].tolist()
    assert list(entries[2].fields) == ["split", "epoch", "seed_used", "episodes_seen", "episodes_dropped", "step"]
    assert entries[2].fields["episodes_seen"] == "8" and entries[2].fields["episodes_dropped"] == "3"
    assert entries[2].fields["seed_used"] == "42"
    # only rank 0 writes
    other = tmp_path / "other"
    load(each_kind, "episodes", batch_size=2, rank=1, world_size=2, audit_dir=other).get_batch("train")
    assert not other.exists() or list(other.iterdir()) == []


def test_audit_dir_from_config_and_resume_event(tmp_path, each_kind):
    adir = tmp_path / "a"
    loader = load(each_kind, "episodes", audit_dir=str(adir))
    loader.get_batch("train")
    state = loader.state_dict()
    again = load(each_kind, "episodes", audit_dir=str(adir))
    again.load_state_dict(state)
    entries = [e for f in sorted(adir.glob("audit_*.log")) for e in read_log(f)[0]]
    actions = [e.action for e in entries]
    assert actions.count("loader_resume") == 1 and actions.count("dataset_load") == 2
    (resume,) = [e for e in entries if e.action == "loader_resume"]
    assert resume.fields == {"split": "train", "step": "1", "epoch": "0"}


def test_a_token_stream_run_audits_its_settings(tmp_path, each_kind):
    load(each_kind, "windows", audit_dir=tmp_path).get_batch("train")
    (path,) = tmp_path.glob("audit_*.log")
    entries, bad = read_log(path)
    assert bad == [] and [e.action for e in entries] == ["dataset_load"]  # random sampling: no epochs
    f = entries[0].fields
    assert (f["dataset_mode"], f["batch_sampling_mode"], f["num_train_windows"], f["num_val_windows"]) == (
        "token_stream", "random", "4992", "592")


def test_apply_ignore_index():
    y = np.array([[5, 6, 7]])
    m = np.array([[1.0, 0.0, 1.0]], dtype=np.float32)
    assert apply_ignore_index(y, m).tolist() == [[5, IGNORE_INDEX, 7]]
    assert IGNORE_INDEX == -100

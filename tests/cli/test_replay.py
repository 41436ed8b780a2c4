"""``sftdata replay-order``: it prints what the loader actually trained on."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from sftdata.cli import app
from sftdata.loader import LoaderConfig, make_loader
from tests.helpers.loader import PACKED_BLOCK, make_dataset, make_packed

LENGTHS = [3, 5, 1, 12, 4, 7, 2, 9, 6, 10, 3, 8, 5, 5, 4]
SOURCES = [10 * g + 1 for g in range(len(LENGTHS))]
runner = CliRunner()


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return make_dataset(tmp_path_factory.mktemp("d") / "ds", LENGTHS, shard_tokens=15, sources=SOURCES,
                        val_lengths=[4, 4, 6])


def cli(*args):
    return runner.invoke(app, ["replay-order", *map(str, args)])


def flat(result) -> str:
    """Output with rich's line wrapping undone."""
    return " ".join(result.output.split())


def rows(result):
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["rows"]


@pytest.mark.parametrize("drop_last", [True, False])
def test_step_ids_equal_the_ids_the_loader_used(ds, tmp_path, drop_last):
    cfg_file = tmp_path / "exp.json"
    cfg_file.write_text(json.dumps({"batch_size": 2, "block_size": 8, "epoch_seed": 42, "n_layer": 4,
                                    "epoch_drop_last": drop_last}))
    cfg = LoaderConfig.from_file(cfg_file)
    ranks = [make_loader(cfg, ds, backend="numpy", rank=r, world_size=2) for r in range(2)]
    for step in range(12):  # several epochs (13 eligible episodes, global batch 4)
        used = []
        for loader in ranks:
            x, _ = loader.get_batch("train")
            used.append(loader.last_ids["train"].tolist())
            assert (x[:, 0] // 1000).tolist() == used[-1]  # the rows really hold those episodes
        got = rows(cli(ds, "--config", cfg_file, "--step", step, "--world-size", 2, "--json"))
        assert [r["episode"] for r in got] == used[0] + used[1]
        assert [r["rank"] for r in got] == [0, 0, 1, 1] and [r["slot"] for r in got] == [0, 1, 0, 1]
        assert [r["record"] for r in got] == [SOURCES[g] for g in used[0] + used[1]]
        assert [r["length"] for r in got] == [LENGTHS[g] for g in used[0] + used[1]]
        one = rows(cli(ds, "--config", cfg_file, "--step", step, "--world-size", 2, "--rank", 1, "--json"))
        assert [r["episode"] for r in one] == used[1]


def test_step_json_fields_and_epoch_of_step(ds):
    res = cli(ds, "--seed", 7, "--batch-size", 4, "--step", 3, "--json")
    out = json.loads(res.stdout)
    assert (out["epoch"], out["step"], out["num_eligible"], out["num_episodes"], out["total_rows"]) == (1, 3, 14, 15, 4)
    order1 = np.flatnonzero(np.array(LENGTHS) >= 2)[np.random.RandomState(8).permutation(14)]
    assert [r["episode"] for r in out["rows"]] == order1[:4].tolist()  # 3 batches of 4 per epoch
    assert [r["position"] for r in out["rows"]] == [0, 1, 2, 3]
    shard_names = {r["shard"] for r in out["rows"]}
    assert all(s.startswith("shard_000") for s in shard_names)


def test_epoch_listing_head_and_csv(ds):
    eligible = np.flatnonzero(np.array(LENGTHS) >= 2)
    order = eligible[np.random.RandomState(1337 + 2).permutation(14)]
    res = cli(ds, "--epoch", 2, "--batch-size", 2, "--no-drop-last", "--csv")
    assert res.exit_code == 0
    lines = res.stdout.splitlines()
    assert lines[0] == "epoch,position,episode,shard,length,record,step,rank,slot"
    assert len(lines) == 15
    assert [int(line.split(",")[2]) for line in lines[1:]] == order.tolist()
    first = lines[1].split(",")
    # epoch 2 starts at global position 28 -> step 14, slot 0
    assert (first[5], first[6], first[8]) == (str(SOURCES[order[0]]), "14", "0")
    head = rows(cli(ds, "--epoch", 2, "--batch-size", 2, "--head", 3, "--json"))
    assert [r["episode"] for r in head] == order[:3].tolist()
    # with drop_last, the epoch's tail is not trained: step/rank/slot are null
    tail = rows(cli(ds, "--epoch", 0, "--batch-size", 4, "--json"))
    assert [r["step"] for r in tail] == [0] * 4 + [1] * 4 + [2] * 4 + [None] * 2


def test_table_output(ds):
    res = cli(ds, "--batch-size", 2, "--epoch", 1)
    assert res.exit_code == 0
    assert "epoch 1 of split train" in res.stdout and "showing 14 of 14" not in res.stdout
    assert "14 eligible of 15 episodes" in res.stdout and "seed 1337 + epoch 1 = 1338" in res.stdout


def test_random_mode(ds, tmp_path):
    cfg = tmp_path / "r.xml"
    cfg.write_text("<training><batch_sampling_mode>random</batch_sampling_mode><batch_size>3</batch_size>"
                   "<epoch_seed>5</epoch_seed></training>")
    loader = make_loader(LoaderConfig.from_file(cfg), ds, backend="numpy")
    for step in range(3):
        loader.get_batch("train")
        got = rows(cli(ds, "--config", cfg, "--step", step, "--json"))
        assert [r["episode"] for r in got] == loader.last_ids["train"].tolist()
        assert all(r["epoch"] is None for r in got)
    res = cli(ds, "--config", cfg, "--epoch", 1)
    assert res.exit_code == 2 and "random has no epochs" in flat(res)
    res = cli(ds, "--config", cfg, "--epoch", 1, "--step", 1)
    assert res.exit_code == 2 and "drop --epoch" in flat(res)


def test_val_split(ds):
    got = rows(cli(ds, "--split", "val", "--batch-size", 1, "--epoch", 0, "--json"))
    assert [r["episode"] for r in got] == np.random.RandomState(1337).permutation(3).tolist()


def test_check_audit_ok_and_tampered(ds, tmp_path):
    cfg_file = tmp_path / "c.json"
    cfg_file.write_text(json.dumps({"batch_size": 4, "block_size": 8, "epoch_seed": 3,
                                    "audit_dir": str(tmp_path / "audit")}))
    loader = make_loader(LoaderConfig.from_file(cfg_file), ds, backend="numpy")
    for _ in range(7):  # 3 batches per epoch -> epochs 0, 1, 2 start
        loader.get_batch("train")
    (log,) = (tmp_path / "audit").glob("audit_*.log")  # 14 eligible, global batch 4: 3 batches per epoch
    res = cli(ds, "--config", cfg_file, "--check-audit", log)
    assert res.exit_code == 0 and "OK" in flat(res) and "epochs 0, 1, 2" in flat(res)
    res = cli(ds, "--config", cfg_file, "--check-audit", log, "--json")
    assert json.loads(res.stdout)["ok"] is True and json.loads(res.stdout)["checked"] == 3

    lines = log.read_text().splitlines()
    k = next(i for i, line in enumerate(lines) if "epoch=1 |" in line and "epoch_start" in line)
    order = loader.order("train").epoch_order(1)[:10].tolist()
    forged = order[:2] + [order[3], order[2]] + order[4:]  # swap two ids
    lines[k] = lines[k].replace(str(order), str(forged))
    log.write_text("\n".join(lines) + "\n")
    res = cli(ds, "--config", cfg_file, "--check-audit", log)
    assert res.exit_code == 1
    mismatch = (f"line {k + 1}: epoch 1: first_episode_ids differ at position 2: the log has {order[3]}, the "
                f"replay gives {order[2]}")
    assert mismatch in flat(res)
    res = cli(ds, "--config", cfg_file, "--check-audit", log, "-q")  # -q: the failure in one error line
    assert (res.exit_code, res.stdout) == (1, "")
    assert res.stderr == (f"error: {log}: 1 mismatch(es) with the replay of split train (3 epoch_start line(s) "
                          f"checked): the first: {mismatch}; without --quiet the first 10 are listed, --json lists "
                          f"them all\n")

    res = cli(ds, "--config", cfg_file, "--seed", 4, "--check-audit", log)  # replaying with another seed
    assert res.exit_code == 1 and "epoch_seed is 3 in the log, the replay gives 4" in flat(res)
    empty = tmp_path / "empty.log"
    empty.write_text("")
    res = cli(ds, "--config", cfg_file, "--check-audit", empty)
    assert res.exit_code == 1 and "no epoch_start line" in flat(res)


def test_errors(ds, tmp_path):
    res = cli(ds, "--batch-size", 4, "--step", 5, "--epoch", 0)
    assert res.exit_code == 2 and "step 5 is in epoch 1, not epoch 0 (epoch 0 is steps 0..2)" in flat(res)
    assert cli(ds, "--batch-size", 4, "--step", 4, "--epoch", 1).exit_code == 0
    res = cli(ds, "--json", "--csv")
    assert res.exit_code == 2 and "not both" in flat(res)
    res = cli(ds, "--step", -1)
    assert res.exit_code == 2 and "--step must be >= 0" in flat(res)
    res = cli(ds, "--rank", 2, "--world-size", 2, "--step", 0, "--batch-size", 2)
    assert res.exit_code == 2 and "--rank 2 is outside 0..1" in flat(res)
    res = cli(ds, "--head", -1)
    assert res.exit_code == 2 and "--head must be >= 0" in flat(res)
    res = cli(tmp_path / "nope")
    assert res.exit_code == 1 and "does not exist" in flat(res)
    res = cli(ds, "--split", "test")
    assert res.exit_code == 1 and "has no split 'test'" in flat(res)
    res = cli(ds, "--batch-size", 20)
    assert res.exit_code == 1 and "fewer than one global batch of 20" in flat(res)
    stream = tmp_path / "stream" / "train"
    stream.mkdir(parents=True)
    np.arange(10, dtype="<u4").tofile(stream / "tokens.bin")
    res = cli(stream.parent)
    assert res.exit_code == 1 and "no episode order to replay" in flat(res)
    bad = tmp_path / "bad.json"
    bad.write_text('{"dataset_mode": "x"}')
    res = cli(ds, "--config", bad)
    assert res.exit_code == 1 and "choose one of" in flat(res)


def test_the_runs_xml_config_with_training_tags_replays_like_its_json(ds, tmp_path):
    """tiny.xml holds train.py's keys (n_layer, learning_rate ...) next to the loader's:
    replay-order reads the loader's and keeps the rest, as it does for JSON."""
    (tmp_path / "run.xml").write_text("<training><batch_size>2</batch_size><epoch_seed>5</epoch_seed>"
                                      "<n_layer>2</n_layer><learning_rate>3e-3</learning_rate></training>")
    (tmp_path / "run.json").write_text(json.dumps({"batch_size": 2, "epoch_seed": 5, "n_layer": 2,
                                                   "learning_rate": 3e-3}))
    from_xml = cli(ds, "--config", tmp_path / "run.xml", "--step", 3, "--json")
    from_json = cli(ds, "--config", tmp_path / "run.json", "--step", 3, "--json")
    assert from_xml.exit_code == 0, from_xml.output
    assert rows(from_xml) == rows(from_json)
    assert json.loads(from_xml.stdout)["batch_size"] == 2 and json.loads(from_xml.stdout)["seed"] == 5


def test_a_typo_in_the_config_is_a_warning_on_stderr_only(ds, tmp_path):
    (tmp_path / "typo.xml").write_text("<training><epoch_sed>5</epoch_sed></training>")
    r = cli(ds, "--config", tmp_path / "typo.xml", "--head", 1, "--json")
    assert r.exit_code == 0
    assert json.loads(r.stdout)["seed"] == 1337
    assert r.stderr == (f"warning: config key 'epoch_sed' is not a loader setting (kept for the training script); "
                        f"did you mean 'epoch_seed'? (in {tmp_path / 'typo.xml'})\n")


def test_a_config_folder_is_named_as_such(ds, tmp_path):
    r = cli(ds, "--config", tmp_path)
    assert (r.exit_code, r.output) == (1, f"error: config file {tmp_path} is a folder; give a .json or .xml config "
                                          f"file\n")


def test_piped_table_keeps_whole_values_and_one_settings_line(ds):
    """Through a pipe (CliRunner is not a terminal) nothing is cut to 80 columns."""
    res = cli(ds, "--seed", 7, "--batch-size", 4, "--step", 3)
    assert res.exit_code == 0
    lines = res.stdout.splitlines()
    assert lines[0] == "step 3 of split train (epoch 1)"
    assert lines[1].split(" ┃ ") == ["step", "rank", "slot", "epoch", "position", "episode", "shard      ",
                                     "length", "record"]
    assert "…" not in res.stdout and len(lines) == 1 + 2 + 4 + 1
    assert lines[-1] == "14 eligible of 15 episodes (min 2 tokens); seed 7 + epoch 1 = 8; batch 4 x 1 rank(s); " \
                        "drop_last=true"


def test_check_audit_on_a_wrong_file_prints_ten_mismatches_and_a_count(ds, tmp_path):
    log = tmp_path / "chat.jsonl"
    log.write_text("".join(f'{{"messages": {i}}}\n' for i in range(40)))
    res = cli(ds, "--check-audit", log)
    assert res.exit_code == 1
    assert res.stderr.splitlines() == [f"mismatch line {i}: not an audit line (damaged or edited)"
                                       for i in range(1, 11)] + ["... and 30 more mismatches (--json lists them all)"]
    assert len(json.loads(cli(ds, "--check-audit", log, "--json").stdout)["mismatches"]) == 40


# ---------------------------------------------------------------- packed datasets
@pytest.fixture(scope="module")
def packed(source, tmp_path_factory):  # noqa: F811
    return make_packed(source, tmp_path_factory.mktemp("packed") / "p")


def packed_cfg(**kw):
    return LoaderConfig(**{"batch_size": 4, "block_size": PACKED_BLOCK, "use_loss_mask": True, "epoch_seed": 7, **kw})


def test_replay_order_cli_on_a_packed_dataset(packed):
    res = cli(packed, "--step", 1, "--batch-size", 4, "--seed", 7, "--json")
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    loader = make_loader(packed_cfg(), packed, backend="numpy")
    loader.get_batch()
    loader.get_batch()
    assert sorted({row["row"] for row in out["rows"]}) == sorted(loader.last_ids["train"].tolist())
    assert {"episode", "record", "segment", "episode_start", "length", "prefix"} <= set(out["rows"][0])


def test_audit_log_of_a_packed_run_checks_against_the_replay(packed, tmp_path):
    loader = make_loader(packed_cfg(), packed, backend="numpy", audit_dir=tmp_path)
    list(loader)
    (log,) = tmp_path.glob("audit_*.log")
    text = log.read_text()
    assert "action=dataset_load" in text and "dataset_mode=packed" in text and "num_train_rows=92" in text
    assert text.count("action=epoch_start") == 1 and text.count("action=epoch_complete") == 1
    assert "num_episodes=92 " in text and "episodes_seen=92 " in text  # the documented keys, counting rows
    res = cli(packed, "--seed", 7, "--batch-size", 4, "--check-audit", log)
    assert res.exit_code == 0 and "match the replay" in flat(res)


@pytest.mark.parametrize("drop_last", [True, False])
def test_resume_from_lists_what_a_loader_resumed_on_another_layout_trains(ds, tmp_path, drop_last):
    cfg = LoaderConfig(batch_size=2, block_size=8, epoch_seed=3, epoch_drop_last=drop_last)
    before = [make_loader(cfg, ds, backend="numpy", rank=r, world_size=2) for r in range(2)]
    for _ in range(3):
        for lo in before:
            lo.get_batch("train")
    state = before[0].state_dict()
    after = [make_loader(cfg.replace(batch_size=1), ds, backend="numpy", rank=r, world_size=3) for r in range(3)]
    flags = ["--seed", 3, "--batch-size", 1, "--world-size", 3, "--resume-from", 3, "--from-world-size", 2,
             "--from-batch-size", 2, "--drop-last" if drop_last else "--no-drop-last"]
    for lo in after:
        lo.load_state_dict(state)
    trained = {}
    for step in range(3, 12):
        used = []
        for lo in after:
            lo.get_batch("train")
            used += lo.last_ids["train"].tolist()
        got = rows(cli(ds, *flags, "--step", step, "--json"))
        assert [r["episode"] for r in got] == used and [r["rank"] for r in got] == [0, 1, 2]
        for r in got:
            trained[(r["epoch"], r["position"])] = (step, r["rank"])
    early = json.loads(cli(ds, *flags, "--step", 2, "--json").stdout)  # before the resume: the old layout
    assert (early["batch_size"], early["world_size"], early["resume_from"], early["from_world_size"]) == (2, 2, 3, 2)
    assert [r["rank"] for r in early["rows"]] == [0, 0, 1, 1]
    epoch0 = rows(cli(ds, *flags, "--epoch", 0, "--json"))
    assert [(r["step"], r["rank"]) for r in epoch0[:12]] == [(s, k) for s in range(3) for k in (0, 0, 1, 1)]
    assert all((r["step"], r["rank"]) == trained[(0, r["position"])] for r in epoch0[12:] if r["step"] is not None)
    # 13 eligible: with drop_last the 13th is epoch 0's dropped tail, else the resume continues with it
    assert epoch0[12]["step"] == (None if drop_last else 3)
    table = cli(ds, *flags, "--step", 5)
    assert "resumed at step 3 after batch 2 x 2 rank(s)" in flat(table)


def test_resume_from_needs_the_earlier_layout(ds):
    r = cli(ds, "--batch-size", 2, "--resume-from", 3, "--world-size", 2, "--step", 4)
    assert r.exit_code == 2 and "--resume-from needs --from-world-size (the number of ranks before the resume)" \
        in flat(r)
    r = cli(ds, "--batch-size", 2, "--resume-from", 3, "--world-size", 2, "--from-world-size", 1, "--step", 1, "--rank", 1)
    assert r.exit_code == 2 and "--rank 1 is outside 0..0 (--from-world-size 1)" in flat(r)

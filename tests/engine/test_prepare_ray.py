"""``--engine ray``: prepare on a local Ray cluster (2 CPUs, one per test session) gives
the dataset ``--engine local`` gives, byte for byte, and survives a killed worker."""

import gzip
import io
import json
import os
import random
import sys
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from sftdata.cli import app
from sftdata.engine import cluster, connect
from sftdata.engine.prepare_ray import ray_prepare_executor
from sftdata.errors import ConfigError, InputError, RecordError, UsageError
from sftdata.prepare import PrepareOptions, prepare
from tests.helpers.data import chat, write_jsonl
from tests.helpers.engines import kill_first_writer, same_dataset
from tests.helpers.paths import ROOT

runner = CliRunner()


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("in")
    lines = (ROOT / "sample_data" / "chat.jsonl").read_bytes().splitlines()
    a = d / "a.jsonl"  # the sample (bad records included), 8 times, with blank lines
    a.write_bytes(b"\n".join(lines * 8 + [b"", b"   "] + lines) + b"\n")
    b = d / "b.jsonl.gz"  # read whole by one task
    b.write_bytes(gzip.compress(b"\n".join(lines) + b"\n"))
    c = d / "c.json"
    c.write_text(json.dumps([chat(f"q{i}", f"a{i}") for i in range(30)] + [{"nope": 1}]))
    e = write_jsonl(d / "e.jsonl", [chat(f"question {i} " * (i % 7), f"answer {i}") for i in range(200)])
    return [str(a), str(b), str(c), str(e)]


@pytest.mark.parametrize("part_bytes", [None, 3000, 50_000])
def test_ray_prepare_is_byte_identical_to_local(ray_cluster, inputs, tmp_path, part_bytes):
    opts = PrepareOptions(val_split=0.1, seed=7, shard_tokens=3000, max_tokens=300)
    local = prepare(inputs, tmp_path / "local", opts)
    ray = prepare(inputs, tmp_path / "ray", opts, executor=ray_prepare_executor(part_bytes=part_bytes))
    same_dataset(tmp_path / "local", tmp_path / "ray")
    a, b = local.as_dict(), ray.as_dict()
    a.pop("seconds"), b.pop("seconds"), a.pop("output_dir"), b.pop("output_dir")
    a.pop("memo"), b.pop("memo")  # what the memo saved is a speed figure of the engine, like seconds (Ray's tasks keep none)
    assert a == b and a["rejected_total"] > 5 and len(a["shards"]) == 2
    assert not list(tmp_path.glob("*/_parts")) and sorted(p.name for p in tmp_path.iterdir()) == ["local", "ray"]


def test_ray_reads_a_parquet_file_in_row_groups(ray_cluster, tmp_path):
    """Each task reads whole row groups, numbered from the rows before them (the footer's):
    the dataset, the rejects and the input's hashes of a local run."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    rows = [json.dumps(chat(f"question {i % 40}", f"answer {i % 40}")) for i in range(60)]  # 40-59 repeat 0-19
    rows[17] = "{broken"
    pq.write_table(pa.table({"record": rows}), tmp_path / "in.parquet", row_group_size=6)
    opts = PrepareOptions(val_split=0.1, shard_tokens=500, dedup="exact")
    local = prepare([tmp_path / "in.parquet"], tmp_path / "local", opts)
    prepare([tmp_path / "in.parquet"], tmp_path / "ray", opts, executor=ray_prepare_executor(part_bytes=1))
    same_dataset(tmp_path / "local", tmp_path / "ray")
    assert local.rejected == {"duplicate": 19, "invalid_json": 1}


def test_ray_prepare_tool_with_workers_of_one_partition_each(ray_cluster, tmp_path):
    src = ROOT / "sample_data" / "tools.jsonl"
    opts = PrepareOptions(mode="tool", val_split=0.2)
    prepare([src], tmp_path / "local", opts)
    prepare([src], tmp_path / "ray", opts, executor=ray_prepare_executor(part_bytes=1))  # one line each
    same_dataset(tmp_path / "local", tmp_path / "ray")


@pytest.mark.parametrize("dedup", ["near", "exact"])
def test_dedup_and_decontamination_on_ray_drop_what_the_local_run_drops(ray_cluster, tmp_path, dedup):
    """Signatures and keys computed in the tasks, grouped by bucket across tasks, and the
    candidates decided in input order by the driver: the dataset of a local run."""
    pytest.importorskip("rensa")
    words = [random.Random(i).choices(range(5000), k=160) for i in range(60)]
    base = [chat(f"question {i}: " + " ".join(f"w{x}" for x in ws[:40]), " ".join(f"r{x}" for x in ws[40:]))
            for i, ws in enumerate(words)]
    near = [chat(r["messages"][0]["content"], r["messages"][1]["content"] + " and one more") for r in base[::7]]
    src = write_jsonl(tmp_path / "in.jsonl", base + base[5:25:3] + ["oops"] + near + base[:3])
    ev = write_jsonl(tmp_path / "ev.jsonl", [{"q": base[11]["messages"][1]["content"]}])
    opts = PrepareOptions(dedup=dedup, decontaminate=(str(ev),), val_split=0.1, shard_tokens=2000)
    local = prepare([src], tmp_path / "local", opts)
    ray = prepare([src], tmp_path / "ray", opts, executor=ray_prepare_executor(part_bytes=5000))
    same_dataset(tmp_path / "local", tmp_path / "ray")
    assert local.dedup == ray.dedup and local.rejected == ray.rejected
    assert local.rejected == {"contaminated": 2, "duplicate": {"near": 18, "exact": 9}[dedup], "invalid_json": 1}


def test_the_cli_runs_prepare_on_ray(ray_cluster, inputs, tmp_path):
    args = ["prepare-chat", *inputs, "--val-split", "0.1", "--json", "--quiet"]
    r = runner.invoke(app, [*args, "-o", str(tmp_path / "ray"), "--engine", "ray"])
    assert r.exit_code == 0, r.output
    assert runner.invoke(app, [*args, "-o", str(tmp_path / "local"), "--engine", "local"]).exit_code == 0
    same_dataset(tmp_path / "local", tmp_path / "ray")
    tool = runner.invoke(app, ["prepare-tool", str(ROOT / "sample_data" / "tools.jsonl"), "-o",
                               str(tmp_path / "tool"), "--engine", "ray", "--quiet"])
    assert tool.exit_code == 0, tool.output


@pytest.mark.parametrize("writing", ["part_*", "train_*"])
def test_a_killed_worker_is_retried_and_the_output_is_the_same(ray_cluster, tmp_path, writing):
    """A worker process killed (SIGKILL) while its task writes (a partition's staged
    episodes, or a final shard): Ray runs the task again, the dead attempt's partial folder
    is never read, and the dataset is identical."""
    src = write_jsonl(tmp_path / "in.jsonl", [chat(f"question {i} " * 40, f"answer {i} " * 40) for i in range(1500)])
    opts = PrepareOptions(val_split=0.05)
    prepare([src], tmp_path / "local", opts)
    with kill_first_writer(tmp_path, f".ray*/_parts/{writing}.tmp-*") as killed:
        prepare([src], tmp_path / "ray", opts, executor=ray_prepare_executor(part_bytes=200_000))
    assert len(killed) == 1
    same_dataset(tmp_path / "local", tmp_path / "ray")


def test_errors_of_a_task_are_the_errors_of_a_local_run(ray_cluster, tmp_path, monkeypatch):
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(gzip.compress(b'{"messages": []}\n' * 5000)[:-30])  # truncated
    with pytest.raises(InputError) as local:
        prepare([bad], tmp_path / "l", PrepareOptions())
    with pytest.raises(InputError) as ray:
        prepare([bad], tmp_path / "r", PrepareOptions(), executor=ray_prepare_executor())
    assert str(ray.value) == str(local.value)
    src = write_jsonl(tmp_path / "in.jsonl", [chat("q", "a")] * 50 + ["oops"] + [chat("q", "a")] * 50)
    with pytest.raises(RecordError, match=r"in.jsonl:line 51: .*--strict stops at the first bad record"):
        prepare([src], tmp_path / "s", PrepareOptions(strict=True), executor=ray_prepare_executor(part_bytes=200))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl.gz", "in.jsonl"]  # nothing left behind
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(json.dumps(chat("q", "a")).encode() + b"\n")))
    with pytest.raises(UsageError, match=r"--engine ray reads files and URLs.*stdin \(-\) can only be read here"):
        prepare(["-"], tmp_path / "x", PrepareOptions(), executor=ray_prepare_executor())


def test_without_ray_the_engine_is_a_one_line_error_naming_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails
    src = write_jsonl(tmp_path / "in.jsonl", [chat("q", "a")])
    r = runner.invoke(app, ["prepare-chat", str(src), "-o", str(tmp_path / "ds"), "--engine", "ray"])
    assert r.exit_code == 2 and r.output.strip() == "error: --engine ray needs Ray: pip install 'sftdata[ray]'"
    assert not (tmp_path / "ds").exists()
    r = runner.invoke(app, ["prepare-chat", str(src), "-o", str(tmp_path / "ds"), "--engine", "spark"])
    assert r.exit_code == 2 and "--engine must be one of local, ray, not 'spark'" in r.output
    r = runner.invoke(app, ["prepare-chat", str(src), "-o", str(tmp_path / "ds"), "--ray-address", "auto"])
    assert r.exit_code == 2 and "--ray-address needs --engine ray" in r.output


def test_connect_starts_a_local_cluster_at_normal_priority_or_names_the_unreachable_one(monkeypatch):
    calls = []

    def init(**kw):
        calls.append((kw.get("address"), os.environ.get("RAY_worker_niceness")))
        if kw.get("address") == "10.0.0.9:6379":
            raise ConnectionError("no cluster there")

    fake = SimpleNamespace(is_initialized=lambda: False, init=init, cluster_resources=lambda: {"CPU": 3.0})
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.setattr(os, "environ", {})
    # "local": a cluster of the run's own, never another run's local cluster; workers at nice 0, not Ray's 15
    assert connect().cpus == 3 and calls == [("local", "0")]
    os.environ.clear()
    # a head that accepts the connection but is no cluster: Ray's own refusal, named
    monkeypatch.setattr(cluster.socket, "create_connection", lambda *a, **kw: SimpleNamespace(close=lambda: None))
    with pytest.raises(ConfigError, match=r"cannot reach the Ray cluster at 10.0.0.9:6379 \(--ray-address\): no "
                                          r"cluster there\. Start the cluster there \(`ray start --head`\)"):
        connect("10.0.0.9:6379")
    assert calls[-1] == ("10.0.0.9:6379", None)  # a cluster of the user's: its settings are its own

#!/usr/bin/env python3
"""Benchmark: writing a dataset to, and reading it from, an S3 endpoint.

    python benchmarks/bench_object_store.py [--mb 20] [--rounds 2] [--workers 1]

Starts moto's S3 server in a process of its own (an S3 endpoint on this machine: it
measures the protocol and sftdata's side of it, not a real network), prepares a
generated corpus (benchmarks/corpus.py) to a local folder and to ``s3://``, alternately,
``--rounds`` times, and reports:

* prepare's wall time to each, and the upload (the commit: every file, then the
  metadata) in seconds and MB/s of dataset bytes;
* the first open of the URL (fetched into an empty cache: MB/s, ranged reads) and a later
  open (the copy is current: the metadata object alone);
* ``make_loader`` + one batch on the URL (cache warm) against the local folder;
* that the objects are byte-identical to the local dataset's files;
* the bytes the coordinator (this process) sends to the store, counted by wrapping the
  file system it commits through (``tests.helpers.moto_s3.CountingFS``): with
  ``--workers`` > 1 the workers put the final shards themselves, the coordinator only the
  metadata and the commit; with 1 it uploads the whole dataset.

The server shares this machine's cores with the client, so the figures are lower bounds.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from corpus import WORK, generated_corpus  # noqa: E402

from sftdata.loader import LoaderConfig, make_loader  # noqa: E402
from sftdata.prepare import PrepareOptions, prepare  # noqa: E402
from sftdata.storage import object_commit as oc  # noqa: E402
from sftdata.storage.object_cache import fetch_dataset  # noqa: E402
from tests.helpers.moto_s3 import CountingFS  # noqa: E402

BUCKET = "bench"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server() -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return proc, endpoint
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError("moto's server did not start")


def local_files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def run(mb: float, rounds: int, workers: int = 1) -> dict:
    import s3fs

    src = generated_corpus(mb)
    proc, endpoint = start_server()
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1",
                      AWS_ENDPOINT_URL=endpoint)
    timed: list[float] = []
    upload = oc.ObjectCommit.upload

    def timed_upload(self, staging):
        t = time.perf_counter()
        upload(self, staging)
        timed.append(time.perf_counter() - t)

    counters: list[CountingFS] = []
    remote_fs = oc.remote_fs

    def counted_fs(url, verb, error):
        fs, root = remote_fs(url, verb, error)
        counters.append(CountingFS(fs))
        return counters[-1], root

    oc.ObjectCommit.upload = timed_upload
    oc.remote_fs = counted_fs
    try:
        fs = s3fs.S3FileSystem()
        fs.mkdir(BUCKET)
        out = {"input_mb": mb, "workers": workers, "local_s": [], "s3_s": [], "upload_s": [], "coordinator_sent": []}
        local = WORK / "objstore_local"
        url = f"s3://{BUCKET}/sft"
        for _ in range(rounds):
            t = time.perf_counter()
            prepare([src], local, PrepareOptions(val_split=0.01, overwrite=True, workers=workers))
            out["local_s"].append(time.perf_counter() - t)
            t = time.perf_counter()
            prepare([src], url, PrepareOptions(val_split=0.01, overwrite=True, workers=workers))
            out["s3_s"].append(time.perf_counter() - t)
            out["coordinator_sent"].append(sum(counters[-1].sent.values()))
            out["upload_s"].append(timed[-1])
        files = local_files(local)
        out["dataset_mb"] = sum(map(len, files.values())) / 1e6
        out["objects"] = len(files)
        fs.invalidate_cache()
        out["identical"] = all(fs.cat_file(f"{BUCKET}/sft/{k}") == v for k, v in files.items()) and \
            len(fs.find(f"{BUCKET}/sft/")) == len(files)
        with tempfile.TemporaryDirectory() as cache:
            os.environ["SFTDATA_CACHE_DIR"] = cache
            cold = fetch_dataset(url)
            warm = [fetch_dataset(url) for _ in range(5)]
            out["fetch_cold_s"], out["fetch_requests"] = cold.seconds, cold.requests
            out["fetch_warm_ms"] = min(w.seconds for w in warm) * 1e3
            assert all(w.hit for w in warm) and not cold.hit
            cfg = LoaderConfig(batch_size=8, block_size=1024)
            times = {}
            for name, where in (("local", local), ("s3", url), ("local2", local), ("s3_2", url)):
                t = time.perf_counter()
                make_loader(cfg, where, backend="numpy").get_batch("train")
                times[name] = time.perf_counter() - t
            out["loader_local_s"] = min(times["local"], times["local2"])
            out["loader_s3_warm_s"] = min(times["s3"], times["s3_2"])
        return out
    finally:
        oc.ObjectCommit.upload = upload
        oc.remote_fs = remote_fs
        proc.terminate()
        proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=float, default=20.0, help="generated input size in MB (default 20)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--workers", type=int, default=1, help="prepare's --workers (default 1)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    r = run(a.mb, a.rounds, a.workers)
    if a.json:
        print(json.dumps(r, indent=2))
        return
    mb = r["dataset_mb"]
    up = min(r["upload_s"])
    print(f"input {a.mb:g} MB -> dataset {mb:.1f} MB in {r['objects']} objects; byte-identical: {r['identical']}")
    print(f"prepare, best of {a.rounds}: local {min(r['local_s']):.2f} s, s3:// {min(r['s3_s']):.2f} s "
          f"(ratio {min(r['s3_s']) / min(r['local_s']):.2f})")
    if a.workers == 1:
        print(f"upload (the commit): {up:.2f} s = {mb / up:.1f} MB/s")
    else:
        print(f"the coordinator's upload (the metadata, then the commit; the workers put the shards): {up:.2f} s")
    sent = max(r["coordinator_sent"])
    print(f"--workers {a.workers}: the coordinator sent {sent:,} bytes to the store ({sent / 1e6 / mb:.4%} of the "
          f"dataset's bytes; the lock object's notes included)")
    print(f"first open (fetch into an empty cache): {r['fetch_cold_s']:.2f} s = {mb / r['fetch_cold_s']:.1f} MB/s, "
          f"{r['fetch_requests']} ranged reads; later open (cache current): {r['fetch_warm_ms']:.1f} ms")
    print(f"make_loader + one batch: local {r['loader_local_s'] * 1e3:.0f} ms, s3:// with the cache warm "
          f"{r['loader_s3_warm_s'] * 1e3:.0f} ms")


if __name__ == "__main__":
    main()

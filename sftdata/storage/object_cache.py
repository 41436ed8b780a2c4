"""A dataset in object storage (``s3://``, ``gs://``, any fsspec URL), read through a
local cache: the readers memory-map files, so the files are fetched once into the
user's cache folder and read from there.

::

    $SFTDATA_CACHE_DIR (else ~/.cache/sftdata)/datasets/
      3f2a9c0d1e4b5a69-9b1c7e55d0a2f3c4/     sha256(URL)[:16] - sha256(dataset_metadata.json)[:16]
        dataset_metadata.json, tokenizer_state.json, train/shard_00000/...   (as at the URL)

  A copy is fetched into ``.<key>.tmp-PID`` and renamed into place once whole: a copy
  that exists is complete.

- ``dataset_metadata.json`` is the commit object (the writer puts it last): a URL without
  it is refused, naming the objects that are there.
- The key holds the sha256 of the metadata's bytes, and the metadata records the size and
  sha256 of every file: a dataset replaced at the URL is another key, never read stale.
  Opening a copy already in the cache reads the metadata object alone (one request).
- What is fetched: the files the metadata lists (nothing else under the prefix), small
  ones first (tokenizer state, episode and source indexes, segments), then ``tokens.bin``
  and ``mask.bin``; a file of more than ``RANGE_BYTES`` as ranged reads of that size,
  ``FETCH_THREADS`` at a time, each written in place into the copy.
- Each file is checked against its recorded size and sha256. A difference while the
  metadata at the URL changed (a writer replaced the dataset meanwhile) is an error: open
  it again. A difference while the metadata stays the same is kept as it is, so that
  ``sftdata verify`` reports the damaged object as it would a damaged file.
- Processes opening the same dataset at once (a node's ranks) take a lock on the copy:
  one fetches, the others wait for it. An older copy of the same URL is removed when a
  newer one is complete.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import orjson

from ..errors import DatasetError
from ..util.cache import cache_dir
from ..util.hashing import sha256_file
from .manifest import METADATA_FILE, manifest_of, named
from .objects import credentials_error, list_objects, lock_key, remote_fs

RANGE_BYTES = 16 << 20  # one ranged read
FETCH_THREADS = 8
DATASETS = "datasets"  # the cache's sub-folder of fetched datasets


@dataclass
class Fetched:
    """Where a URL's dataset is in the cache, and what opening it cost."""
    url: str
    path: Path
    hit: bool  # the copy was complete already: only the metadata object was read
    files: int = 0  # fetched now
    bytes: int = 0
    requests: int = 0  # ranged reads made (the metadata's not counted)
    seconds: float = 0.0


def fetch_dataset(url: str) -> Fetched:
    """The cached copy of the dataset at ``url``, fetched now unless it is current."""
    t0 = time.perf_counter()
    fs, root = remote_fs(url, "reading", DatasetError)
    raw = read_commit(fs, root, url)
    meta = _parse(raw, url)
    home = cache_dir()
    if home is None:
        raise DatasetError(f"{url}: a dataset in object storage is read through a local cache, and "
                           f"$SFTDATA_CACHE_DIR is off; set it to a folder with room for the dataset (or unset it "
                           f"for ~/.cache/sftdata)")
    ukey = hashlib.sha256(url.encode()).hexdigest()[:16]
    entry = home / DATASETS / f"{ukey}-{hashlib.sha256(raw).hexdigest()[:16]}"
    if entry.is_dir():
        return Fetched(url, entry, True, seconds=time.perf_counter() - t0)
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        lock = os.open(entry.parent / f".{entry.name}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise DatasetError(f"{url}: the cache folder {entry.parent} cannot be written ({e.strerror}); set "
                           f"$SFTDATA_CACHE_DIR to a folder with room for the dataset") from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process fetching the same copy: wait for it
        if entry.is_dir():
            return Fetched(url, entry, True, seconds=time.perf_counter() - t0)
        got = _fill(fs, root, url, raw, meta, entry)
    finally:
        os.close(lock)
    for old in entry.parent.glob(f"{ukey}-*"):  # older copies of this URL
        if old != entry and old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
    got.seconds = time.perf_counter() - t0
    return got


def remote_metadata(url: str) -> dict | None:
    """The metadata of the dataset at ``url``, or None when it has none."""
    fs, root = remote_fs(url, "reading", DatasetError)
    try:
        return _parse(fs.cat_file(f"{root}/{METADATA_FILE}"), url)
    except FileNotFoundError:
        return None


def read_commit(fs, root: str, url: str) -> bytes:
    """The bytes of ``url``'s commit object, or ``DatasetError`` naming what is there."""
    try:
        return fs.cat_file(f"{root}/{METADATA_FILE}")
    except FileNotFoundError:
        pass
    except Exception as e:  # credentials, network: the store's own words
        raise credentials_error(url, e, DatasetError) or \
            DatasetError(f"{url}/{METADATA_FILE} cannot be read ({type(e).__name__}: {e})") from None
    raise uncommitted(fs, root, url)


def uncommitted(fs, root: str, url: str) -> DatasetError:
    """The error for a URL with no commit object: nothing there, or objects but no dataset."""
    objects = list(list_objects(fs, root))
    if not objects:
        return DatasetError(f"dataset {url} does not exist (no object under it); check the URL, or make the dataset "
                            f"with `sftdata prepare-chat INPUT --output-dir {url}`")
    lock = lock_key(root)
    writer = f" ({fs.unstrip_protocol(lock)} names the run writing it)" if fs.exists(lock) else ""
    return DatasetError(
        f"{url} is not a committed sftdata dataset: it has no {METADATA_FILE}, the object a writer puts last, yet "
        f"holds {len(objects)} object(s): {named(objects)}. A write still running or one that died leaves this"
        f"{writer}. Wait for the writer, or remove these objects (if they are not someone else's) and write the "
        f"dataset again")


def _parse(raw: bytes, url: str) -> dict:
    try:
        meta = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise DatasetError(f"{url}/{METADATA_FILE} is not valid JSON ({e}); the object is damaged. Re-create the "
                           f"dataset") from None
    if not isinstance(meta, dict):
        raise DatasetError(f"{url}/{METADATA_FILE} holds a JSON {type(meta).__name__}, not an object")
    return meta


def recorded(meta: dict) -> dict[str, dict]:
    """{path relative to the dataset: {"bytes", "sha256"}} of every file the metadata records."""
    out = {fn: rec for fn, rec in (meta.get("files") or {}).items() if isinstance(rec, dict)}
    for split, info in (meta.get("splits") or {}).items():
        for shard in (info.get("shards") or []) if isinstance(info, dict) else []:
            if isinstance(shard, dict):
                for fn, rec in (shard.get("files") or {}).items():
                    if isinstance(rec, dict):
                        out[f"{split}/{shard.get('name')}/{fn}"] = rec
    return out


def _plan(fs, root: str, meta: dict) -> list[tuple[str, int]]:
    """(path, size) of each object to fetch, small files first. The files the metadata
    lists (an older dataset that lists none: every object under the prefix); a listed
    file that is not there is left out, for the reader to report."""
    present = list_objects(fs, root)
    listed = manifest_of(meta)
    names = [f for f in (listed[0] if listed else present) if f != METADATA_FILE and f in present]
    return sorted(((f, int(present[f].get("size") or 0)) for f in names),
                  key=lambda x: (x[1], x[0]))


def _fill(fs, root: str, url: str, raw: bytes, meta: dict, entry: Path) -> Fetched:
    """Fetch the dataset into ``entry`` (through a temporary folder renamed at the end)."""
    for old in entry.parent.glob(f".{entry.name}.tmp-*"):  # a fetch that died (we hold the lock)
        shutil.rmtree(old, ignore_errors=True)
    tmp = entry.parent / f".{entry.name}.tmp-{os.getpid()}"
    plan = _plan(fs, root, meta)
    ranges = []
    for rel, size in plan:
        dest = tmp / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        with open(dest, "wb") as f:
            f.truncate(size)
        ranges += [(rel, a, min(size, a + RANGE_BYTES)) for a in range(0, size, RANGE_BYTES)]

    def get(job: tuple[str, int, int]) -> None:
        rel, a, b = job
        data = fs.cat_file(f"{root}/{rel}", start=a, end=b)
        if len(data) != b - a:
            raise FileNotFoundError(f"{rel}: {len(data)} bytes at {a:,} instead of {b - a:,}")
        fd = os.open(tmp / rel, os.O_WRONLY)
        try:
            os.pwrite(fd, data, a)
        finally:
            os.close(fd)

    try:
        try:
            with ThreadPoolExecutor(FETCH_THREADS) as pool:
                list(pool.map(get, ranges))
        except Exception as e:
            _changed(fs, root, url, raw)
            raise DatasetError(f"{url}: fetching it into the cache failed ({type(e).__name__}: {e})") from None
        records = recorded(meta)
        if any(_differs(tmp / rel, records.get(rel)) for rel, _ in plan):
            _changed(fs, root, url, raw)  # else: the object itself differs from its record; verify says so
        (tmp / METADATA_FILE).write_bytes(raw)
        os.replace(tmp, entry)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Fetched(url, entry, False, len(plan), sum(s for _, s in plan), len(ranges))


def _differs(path: Path, record: dict | None) -> bool:
    if not record:
        return False
    return path.stat().st_size != record.get("bytes") or sha256_file(path) != record.get("sha256")


def _changed(fs, root: str, url: str, raw: bytes) -> None:
    """``DatasetError`` when the metadata at the URL is no longer ``raw``."""
    try:
        now = fs.cat_file(f"{root}/{METADATA_FILE}")
    except Exception:  # noqa: BLE001 - gone, or unreadable: not the dataset read first either way
        now = None
    if now != raw:
        raise DatasetError(f"{url} changed while it was being fetched (its {METADATA_FILE} is "
                           f"{'gone' if now is None else 'another'} now: a writer is replacing it); open it again "
                           f"once the writer is done")

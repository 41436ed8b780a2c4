"""``verify`` on a Ray cluster (``--engine ray``): one task per shard reads it and checks it.

::

    driver: scan the dataset (the reader's structural checks: indexes, sizes, metadata),
            the tokenizer ──► one task per shard: content checks (ids, mask values, the
                              mask rule, stops; packed: per segment, padding), trained
                              tokens, sha256 of its files, value ranges (``verify.shards``);
                              --retokenize: one task per shard holding sampled episodes
            (fewer than TASKS_PER_CPU shards per CPU: tasks over parts of a shard's
            episodes or rows, ``verify.shards.piece_checks``, and one hashing its files,
            merged in part order by ``verify.shards.merge_pieces``: the same report)
            merge in shard order ◄── problems and small figures; then counts, checksums,
            ranges, references, serving, as --engine local; the references' token
            comparison (packed: every segment against its source episode) again one task
            per shard, once the segments are found consistent here

What crosses the network: to a task, where its shard is (paths) and the dataset's
context (the mask rule, the vocabulary size, the metadata; for the references, the
source split's index: one object for all tasks);
back, its problems, a few counts and the sha256 of its files. The data is read where the
task runs, from storage every node sees. The report, ``--json`` and the exit code are
those of ``--engine local``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import orjson

from ..store.format import TOKENIZER_FILE
from ..store.shard import Shard
from ..tokenize.open import hf_tokenizer_from_state
from ..verify.references import compare_shard_tokens
from ..verify.retokenize import Retokenized, retokenize_shard
from ..verify.shards import PieceChecks, ShardChecks, file_checks, merge_pieces, piece_checks, shard_checks, shard_parts
from .cluster import RayCluster, connect, import_ray
from .tasks import TASK_RETRIES, TASKS_PER_CPU, get_result


def check_remote(where: dict, ctx, stops, jobs, meta, meta_sealed: bool, quick: bool) -> ShardChecks:
    """One task: the shard at ``where`` mapped as the reader maps it (tolerantly: a damaged
    shard is checked, not refused), then ``shard_checks``."""
    return shard_checks(Shard(**where), ctx, stops, jobs, meta, meta_sealed, quick)


def piece_remote(where: dict, ctx, stops, part, k: int, n: int) -> PieceChecks:
    """One task over part of a shard (``verify.shards.piece_checks``)."""
    return piece_checks(Shard(**where), ctx, stops, part, k, n)


def files_remote(where: dict, jobs, meta, meta_sealed: bool, quick: bool) -> tuple[dict, dict | None]:
    """One task: the sha256 of a cut shard's files and its ranges (``verify.shards.file_checks``)."""
    return file_checks(Shard(**where), jobs, meta, meta_sealed, quick)


def _where(sh: Shard) -> dict:
    return {"path": sh.path, "token_dtype": sh.token_dtype.str, "name": sh.name, "root": sh.root, "split": sh.split,
            "first_gid": sh.first_gid, "packed": sh.packed}


def run_shards(cluster: RayCluster, shards, ctx, stops, jobs, meta, meta_sealed: bool, quick: bool,
               items_per_task: int | None = None) -> Iterator[ShardChecks]:
    """Submit a task per shard (the largest first: they finish last otherwise), or, for a
    split of fewer than ``TASKS_PER_CPU`` shards per CPU (or when ``items_per_task``
    asks), tasks over parts of a shard plus one hashing its files; then yield the results
    in shard order, a cut shard's parts merged (``verify.shards.merge_pieces``)."""
    ray = cluster.ray
    task = ray.remote(num_cpus=1, max_retries=TASK_RETRIES)(check_remote)
    piece = ray.remote(num_cpus=1, max_retries=TASK_RETRIES)(piece_remote)
    files = ray.remote(num_cpus=1, max_retries=TASK_RETRIES)(files_remote)
    ctx_ref, stops_ref, meta_ref = ray.put(ctx), ray.put(stops), ray.put(meta)
    parts = shard_parts(shards, ctx, TASKS_PER_CPU * cluster.cpus, items_per_task)
    order = sorted(range(len(shards)), key=lambda i: -shards[i].data_bytes)
    refs: dict = {}
    for i in order:
        w = _where(shards[i])
        if parts[i] is None:
            refs[i] = task.remote(w, ctx_ref, stops_ref, jobs[i], meta_ref, meta_sealed, quick)
        else:
            n = len(parts[i])
            refs[i] = (files.remote(w, jobs[i], meta_ref, meta_sealed, quick),
                       [piece.remote(w, ctx_ref, stops_ref, p, k, n) for k, p in enumerate(parts[i])])
    for i in range(len(shards)):
        if parts[i] is None:
            yield get_result(ray, refs[i], "verifying")
        else:
            found = [get_result(ray, r, "verifying") for r in refs[i][1]]
            yield merge_pieces(shards[i], ctx, stops, found, get_result(ray, refs[i][0], "verifying"))


_TOKENIZERS: dict = {}  # per worker process: the tokenizer of --retokenize, built once per state


def retokenize_remote(where: dict, state: dict, local) -> Retokenized:
    """One task of ``--retokenize``: re-encode episodes ``local`` of the shard at ``where``
    with the tokenizers library (built once per worker from the dataset's state)."""
    key = hashlib.sha256(orjson.dumps(state, option=orjson.OPT_SORT_KEYS)).hexdigest()
    if key not in _TOKENIZERS:
        _TOKENIZERS.clear()
        _TOKENIZERS[key] = hf_tokenizer_from_state(state, TOKENIZER_FILE, engine="hf")
    return retokenize_shard(_TOKENIZERS[key], Shard(**where), local)


def compare_remote(where: dict, sp, row_len: int) -> list:
    """One task of the references check: the tokens of the packed shard at ``where``
    against source split ``sp`` (``references.compare_shard_tokens``)."""
    return compare_shard_tokens(Shard(**where), sp, row_len)


class RayVerifyExecutor:
    """``verify``'s per-shard work as tasks on the Ray cluster at ``address``."""

    def __init__(self, address: str | None = None, items_per_task: int | None = None):
        import_ray()  # without Ray: a UsageError now, before anything is read
        self.address = address
        self.items_per_task = items_per_task

    def check(self, shards, ctx, stops, jobs, meta, meta_sealed, quick) -> Iterator[ShardChecks]:
        return run_shards(connect(self.address), shards, ctx, stops, jobs, meta, meta_sealed, quick,
                          self.items_per_task)

    def compare_tokens(self, shards, sp, row_len: int) -> Iterator[list]:
        ray = connect(self.address).ray
        task = ray.remote(num_cpus=1, max_retries=TASK_RETRIES)(compare_remote)
        sp_ref = ray.put(sp)
        refs = [task.remote(_where(sh), sp_ref, row_len) for sh in shards]
        for ref in refs:
            yield get_result(ray, ref, "verifying")

    def retokenize(self, state: dict, picks: list) -> Iterator[Retokenized]:
        ray = connect(self.address).ray
        task = ray.remote(num_cpus=1, max_retries=TASK_RETRIES)(retokenize_remote)
        state_ref = ray.put(state)
        refs = [task.remote(_where(sh), state_ref, local) for sh, local in picks]
        for ref in refs:
            yield get_result(ray, ref, "verifying")


def ray_verify_executor(address: str | None = None, items_per_task: int | None = None) -> RayVerifyExecutor:
    """A shard executor for ``sftdata.verify.verify`` that checks each shard (and
    re-encodes each shard's ``--retokenize`` sample) as a task on the Ray cluster at
    ``address`` (else ``RAY_ADDRESS``, else a local one). A split of fewer than
    ``TASKS_PER_CPU`` shards per CPU is checked in parts of its shards' episodes (rows);
    ``items_per_task=N`` sets the part size (the report is the same). Without Ray
    installed, a ``UsageError`` now, before anything is read."""
    return RayVerifyExecutor(address, items_per_task)

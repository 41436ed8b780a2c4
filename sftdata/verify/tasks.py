"""``verify``'s per-shard work as tasks (``--engine ray``; any ``tasks.TaskRunner``): one task
per shard reads it and checks it.

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
those of ``--engine local``. A run that stops early (an error, Ctrl-C) waits for the tasks
it started (the one stop rule, ``sftdata.tasks``); they write nothing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import orjson

from ..store.format import TOKENIZER_FILE
from ..store.shard import Shard
from ..tasks import TASKS_PER_CPU, Engine, running
from ..tokenize.open import hf_tokenizer_from_state
from .references import compare_shard_tokens
from .retokenize import Retokenized, retokenize_shard
from .shards import PieceChecks, ShardChecks, file_checks, merge_pieces, piece_checks, shard_checks, shard_parts

DOING = "verifying"


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
            "first_gid": sh.first_gid, "packed": sh.packed, "entries": sh.entries}


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


def check_shards(engine: Engine, shards, ctx, stops, jobs, meta, meta_sealed: bool, quick: bool
                 ) -> Iterator[ShardChecks]:
    """``shards.shard_checks`` of every shard as tasks (the largest first: they finish last
    otherwise), or, for a split of fewer than ``TASKS_PER_CPU`` shards per CPU (or when the
    engine's ``items_per_task`` asks), tasks over parts of a shard plus one hashing its
    files; yielded in shard order, a cut shard's parts merged (``shards.merge_pieces``)."""
    with running(engine.start(None)) as runner:
        ctx_ref, stops_ref, meta_ref = runner.shared(ctx), runner.shared(stops), runner.shared(meta)
        parts = shard_parts(shards, ctx, TASKS_PER_CPU * runner.cpus, engine.size("items_per_task"))
        refs: dict = {}
        for i in sorted(range(len(shards)), key=lambda i: -shards[i].data_bytes):
            w = _where(shards[i])
            if parts[i] is None:
                refs[i] = runner.submit(check_remote, (w, ctx_ref, stops_ref, jobs[i], meta_ref, meta_sealed, quick),
                                        DOING)
            else:
                n = len(parts[i])
                refs[i] = (runner.submit(files_remote, (w, jobs[i], meta_ref, meta_sealed, quick), DOING),
                           [runner.submit(piece_remote, (w, ctx_ref, stops_ref, p, k, n), DOING)
                            for k, p in enumerate(parts[i])])
        for i in range(len(shards)):
            if parts[i] is None:
                yield runner.result(refs[i], DOING)
            else:
                found = [runner.result(r, DOING) for r in refs[i][1]]
                yield merge_pieces(shards[i], ctx, stops, found, runner.result(refs[i][0], DOING))


def compare_tokens(engine: Engine, shards, sp, row_len: int) -> Iterator[list]:
    """``references.compare_shard_tokens`` of each packed shard against source split ``sp``, as tasks."""
    with running(engine.start(None)) as runner:
        sp_ref = runner.shared(sp)
        refs = [runner.submit(compare_remote, (_where(sh), sp_ref, row_len), DOING) for sh in shards]
        for ref in refs:
            yield runner.result(ref, DOING)


def retokenize_shards(engine: Engine, state: dict, picks: list) -> Iterator[Retokenized]:
    """``retokenize.retokenize_shard`` of each (shard, sampled local episode ids), as tasks."""
    with running(engine.start(None)) as runner:
        state_ref = runner.shared(state)
        refs = [runner.submit(retokenize_remote, (_where(sh), state_ref, local), DOING) for sh, local in picks]
        for ref in refs:
            yield runner.result(ref, DOING)



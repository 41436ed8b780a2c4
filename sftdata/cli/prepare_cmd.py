"""``sftdata prepare-chat`` and ``sftdata prepare-tool``."""

from __future__ import annotations

import math
from dataclasses import replace

from rich.table import Table

from ..engine import check_engine
from ..engine.prepare_ray import ray_prepare_executor
from ..errors import UsageError
from ..options.option import CHAT, TOOL
from ..prepare import PrepareOptions, PrepareSummary, prepare, usable_workers
from ..util.progress import LazyProgress
from .app import app, err_console, handle_errors, make_progress, warn
from .build_output import show_prepared, show_rebuild
from .declared import declared_command


def reject_rows(t: Table, rejected: dict, repaired: dict) -> None:
    """A summary's rows of rejected records (by reason) and repairs: every build command's."""
    rej = sum(rejected.values())
    t.add_row("rejected records", f"{rej:,}", style="yellow" if rej else None)
    for reason, n in rejected.items():
        t.add_row(f"  rejected: {reason}", f"{n:,}", style="yellow")
    for reason, n in repaired.items():
        t.add_row(f"  repaired: {reason}", f"{n:,}")


def curation_rows(t: Table, s) -> None:
    """A summary's rows of duplicates and contaminated records: every build command's."""
    d = s.dedup
    if d and (d["exact_duplicates"] or d["mode"] != "off"):
        dropped = d["mode"] != "off"
        t.add_row("exact duplicates" + (" (dropped)" if dropped else " (kept)"), f"{d['exact_duplicates']:,}",
                  style="yellow" if d["exact_duplicates"] and not dropped else None)
        if d["mode"] == "near":
            t.add_row(f"near duplicates (dropped, Jaccard >= {d['threshold']})", f"{d['near_duplicates']:,}")
    for f in (s.decontamination or {}).get("files", []):
        t.add_row(f"contaminated by {f['path']}", f"{f['contaminated']:,} records ({f['items']:,} items)")


def new_summary_table(s, title: str, what: str, counts: dict) -> Table:
    """A build command's summary table (every build command's), its first rows: the records
    read, then each split's ``counts`` of ``what`` (episodes, pairs ...) and its tokens."""
    t = Table(title=title, show_header=True, header_style="bold")
    t.add_column("", no_wrap=True)
    t.add_column("value", justify="right")
    t.add_row("records read", f"{s.records_read:,}")
    for name, figures in ((what, counts), ("tokens", s.tokens)):
        for split, n in figures.items():
            t.add_row(f"{name} ({split})", f"{n:,}")
    return t


def summary_table(s: PrepareSummary) -> Table:
    t = new_summary_table(s, f"Prepared {s.output_dir}", "episodes", s.episodes)
    t.add_row("trained-token share", f"{s.trained_share:.1%}")
    t.add_row("record size limit", f"{s.max_record_bytes:,} bytes")
    if s.tokenizer_engine:
        e = s.tokenizer_engine
        t.add_row("tokenizer engine", e["engine"] if e["engine"] == "tiktoken" and e["requested"] == "auto"
                  and "tiktoken encoding" in e["reason"] else f"{e['engine']} ({e['reason']})")
    t.add_row("shards", ", ".join(f"{k}: {v}" for k, v in s.shards.items()))
    if s.media:
        m = s.media
        t.add_row("media", ", ".join(f"{m[k]:,} {k}" for k in ("images", "videos") if m.get(k))
                  + f": {m['tokens']:,} tokens, never trained")
    reject_rows(t, s.rejected, s.repaired)
    for name, n in s.turns.items():
        if n:
            t.add_row(f"  assistant turns: {name}", f"{n:,}")
    if s.records_truncated:
        t.add_row("  truncated by --max-tokens", f"{s.records_truncated:,} records, {s.pairs_dropped:,} pairs")
    if s.per_reply_records:
        t.add_row("  one episode per reply", f"{s.per_reply_records:,} records, {s.per_reply_episodes:,} episodes")
    if s.per_reply_automatic:
        t.add_row("  of them per_reply_automatic", f"{s.per_reply_automatic:,} records (whole render not exact)")
    curation_rows(t, s)
    if s.memo_mb and s.memo.lookups:
        m = s.memo
        idle = f"; idle on {m.chunks_idle:,} chunks, whose texts seldom repeat" if m.chunks_idle else ""
        t.add_row("memo of encoded texts", f"{m.hit_rate:.1%} hits, {m.tokens_reused:,} tokens not re-encoded "
                                           f"({m.reused_share:.1%}){idle}")
    secs = max(s.seconds, 1e-9)
    t.add_row("time", f"{s.seconds:.2f} s")
    t.add_row("speed", f"{s.records_read / secs:,.0f} records/s, {s.total_tokens / secs:,.0f} tokens/s, "
                       f"{s.input_bytes / secs / 1e6:.1f} MB/s")
    return t


def min_val_split(n: int) -> float:
    """The smallest --val-split, rounded up to two significant digits, that puts at least
    one of ``n`` episodes in val (the split takes floor(f x n + 0.5))."""
    f = 0.5 / n
    step = 10.0 ** (math.floor(math.log10(f)) - 1)
    return round(math.ceil(f / step) * step, 12)


def run_build(name: str, build, table, opts, inputs, output_dir, engine: str, ray_address: str | None, as_json: bool,
              quiet: bool, tokens: bool = True, **kw) -> tuple[object, bool]:
    """Run ``build`` (``prepare``, ``prepare_pref``) with ``opts`` on ``--engine``, its
    progress bar named ``name`` (records per second, and tokens where ``tokens``), then
    its result (``show_prepared``: ``table``); returns the summary and whether the command
    may add notes of its own. More ``opts.workers`` than the machine's cores are capped."""
    opts = replace(opts, workers=usable_workers(opts.workers, None if quiet else warn))
    executor = ray_prepare_executor(ray_address) if check_engine(engine) == "ray" else None
    if ray_address is not None and executor is None:
        raise UsageError("--ray-address needs --engine ray")
    with LazyProgress(make_progress(quiet or as_json)) as bar:  # drawn from the first report, after the checks

        def on_progress(p):
            bar.update(name, completed=p.bytes_done, total=p.bytes_total, records=p.records,
                       tokens=p.tokens if tokens else None)

        summary = build(inputs, output_dir, opts, progress=on_progress, executor=executor,
                        planned=None if quiet or as_json else show_rebuild, **kw)
    return summary, show_prepared(summary, table, output_dir, as_json, quiet)


def run_prepare(opts: PrepareOptions, inputs, output_dir, *, engine: str = "local", ray_address: str | None = None,
                as_json: bool = False, quiet: bool = False) -> None:
    """Run prepare with ``opts`` (the command's options, built once) and draw its progress
    and summary, with its notes."""
    summary, notes = run_build(f"prepare-{opts.mode}", prepare, summary_table, opts, inputs, output_dir, engine,
                               ray_address, as_json, quiet)
    val_split = opts.val_split
    if notes:
        exact = summary.dedup.get("exact_duplicates", 0)
        if exact and summary.dedup.get("mode") == "off":
            warn(f"{exact:,} record(s) repeat an earlier record exactly (whitespace aside) and were kept: rerun with "
                 f"--dedup exact to drop them (or --dedup near for near duplicates too)")
        for f in (summary.decontamination or {}).get("files", []):
            if f["too_short"]:
                warn(f"{f['too_short']:,} item(s) of {f['path']} are shorter than {summary.decontamination['ngram']} "
                     f"words, so no record can share that many with them: a smaller --decontaminate-ngram checks them")
        ignored = summary.repaired.get("tool_schemas_ignored_by_template", 0)
        if ignored:
            warn(f"{ignored:,} record(s) give tool schemas that the chat template never renders (the model does not "
                 f"see them at inference either): they were left out of the render and counted as "
                 f"tool_schemas_ignored_by_template; write them into the system message if the model should see them")
        if summary.per_reply_records:
            err_console.print(f"note: the chat template rewrites replies so that {summary.per_reply_records:,} "
                              f"record(s) could not be located in one render: each of their assistant replies became "
                              f"an episode of its own (the conversation up to it, only it trained)"
                              + (f"; {summary.per_reply_automatic:,} of them without --per-reply "
                                 f"(per_reply_automatic: their whole render rewrites an earlier reply; each such "
                                 f"episode is flagged in last_reply.bin)" if summary.per_reply_automatic else ""))
        if summary.rule_mismatch:
            named = ", ".join(m["where"] for m in summary.rule_mismatch[:5])
            more = summary.rejected.get("rule_mismatch", 0) - min(5, len(summary.rule_mismatch))
            warn(f"{summary.rejected.get('rule_mismatch', 0):,} record(s) rejected as rule_mismatch (the template's "
                 f"mask is not the one its stored rule re-derives, so verify could not prove it): {named}"
                 + (f" and {more:,} more" if more > 0 else "") + f"; see {summary.output_dir}/rejects.jsonl")
    n = sum(summary.episodes.values())
    if val_split > 0 and not summary.episodes.get("val") and not quiet and n > 1:
        warn(f"--val-split {val_split} of {n:,} episodes rounds to 0: the val split is empty; use --val-split "
             f"{min_val_split(n)} or more for at least one val episode, or leave it out for no val split")


def _run_declared(command: str, values: dict, inputs, output_dir, as_json: bool, quiet: bool) -> None:
    engine, ray_address = values.pop("engine"), values.pop("ray_address")
    opts = PrepareOptions(mode=command.removeprefix("prepare-"), **values)  # run_build caps --workers
    run_prepare(opts, inputs, output_dir, engine=engine, ray_address=ray_address, as_json=as_json, quiet=quiet)


CHAT_HELP = """Prepare chat conversations (OpenAI `messages` or ShareGPT `conversations`) into a dataset.

Each record becomes one episode: the conversation's tokens with chat markers, ending with
EOS, and a loss mask that trains the assistant turns only (docs/FORMAT.md); with a model's
own tokenizer (`--tokenizer` a tokenizer.json or its folder), the conversation in the
model's own chat format, each reply trained through its end-of-turn token
(docs/TOKENIZERS.md). Bad records
are skipped, counted by reason and written to DIR/rejects.jsonl with their line numbers
(or stop the run with --strict). Records with tools go to `prepare-tool`. The dataset is
built beside DIR and renamed at the end: an error or Ctrl-C leaves nothing there.

Examples:

* `sftdata prepare-chat chats.jsonl --output-dir data/chat_sft --val-split 0.1`
* `sftdata prepare-chat a.jsonl b.json.gz -o data/chat_sft --max-tokens 4096 --overwrite`
* `sftdata prepare-chat data/ hf://datasets/ORG/NAME/train.parquet -o data/chat_sft` (a folder and a URL)
* `zcat chats.jsonl.gz | sftdata prepare-chat - -o data/chat_sft` (stdin)
* `sftdata prepare-chat chats.jsonl -o data/chat_sft --json --quiet` (a JSON summary for scripts)
* `sftdata prepare-chat chats.jsonl -o data/chat_sft --dedup near --decontaminate evals/gsm8k_test.jsonl`
  (duplicates and evaluation items out; docs/CURATION.md)
* `sftdata prepare-chat chats.jsonl -o data/llama --tokenizer path/to/Llama-3-8B-Instruct/` (the model's
  tokenizer and chat template)
* `sftdata prepare-chat chats.jsonl -o data/qwen --tokenizer qwen/tokenizer.json --chat-template chatml`
* `sftdata prepare-chat big/ -o /shared/sft --engine ray --val-split 0.01` (tasks on a Ray cluster; docs/SCALE.md)
"""

TOOL_HELP = """Prepare tool-calling conversations (OpenAI `tools` + `tool_calls` + `role: tool`, or
ShareGPT/glaive `function_call` / `observation` turns) into a dataset.

Tool schemas go into the system span; each call is trained as `<|TOOL_CALL|>` + canonical
JSON inside its assistant span; tool results are context only (never trained). Plain
chat records are accepted too. Bad records (arguments that are not a JSON object,
calls to undeclared functions, results that answer no call...) are skipped, counted by
reason and written to DIR/rejects.jsonl (or stop the run with --strict). Same options
and dataset format as `prepare-chat`; see docs/TOOLS.md.

Examples:

* `sftdata prepare-tool agent_traces.jsonl --output-dir data/tool_sft --val-split 0.1`
* `sftdata prepare-tool glaive.json openai_tools.jsonl -o data/tool_sft --max-tokens 4096`
* `sftdata prepare-tool tools.jsonl -o data/tool_llama --tokenizer model_dir/ --chat-template my_template.jinja`
  (tool calls, results and schemas rendered by the model's template)
"""

prepare_chat = app.command(CHAT)(handle_errors(declared_command(CHAT, CHAT_HELP, _run_declared)))
prepare_tool = app.command(TOOL)(handle_errors(declared_command(TOOL, TOOL_HELP, _run_declared)))

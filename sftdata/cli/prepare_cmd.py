"""``sftdata prepare-chat`` and ``sftdata prepare-tool``."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from ..curate import DEFAULT_NGRAM, DEFAULT_THRESHOLD
from ..engine import check_engine
from ..engine.prepare_ray import ray_prepare_executor
from ..errors import UsageError
from ..order.batches import DEFAULT_SEED
from ..prepare import PrepareOptions, PrepareSummary, default_workers, prepare
from ..sources import DEFAULT_MAX_RECORD_BYTES
from ..store.format import DEFAULT_SHARD_TOKENS
from ..template import DEFAULT_MAX_STEPS
from ..tokenize.memo import DEFAULT_MEMO_MB
from .app import LazyProgress, app, err_console, handle_errors, make_progress, warn
from .build_output import show_prepared, show_rebuild
from .options import (
    AllowPadAsStopOpt,
    ChatTemplateOpt,
    DecontaminateNgramOpt,
    DecontaminateOpt,
    DedupOpt,
    DedupThresholdOpt,
    EngineOpt,
    ForceOpt,
    JsonOpt,
    MaxRecordBytesOpt,
    OverwriteOpt,
    PerReplyOpt,
    QuietOpt,
    RayAddressOpt,
    ReasoningOpt,
    TemplateVarOpt,
    TokenizerEngineOpt,
    TrainOnOpt,
    WaitOpt,
    parse_size,
    parse_template_vars,
)

InputsArg = Annotated[list[str], typer.Argument(
    metavar="INPUT", help="JSONL (one conversation per line), a JSON array or Parquet, each optionally "
                          "compressed (.gz .bz2 .xz .zst); a folder (its .jsonl/.json/.parquet files, recursively, "
                          "sorted), a glob ('data/*.jsonl.gz'), - for stdin, or a URL (s3:// gs:// hf:// https:// "
                          "file://, with the cloud extra). Several make one dataset; record numbers continue "
                          "across them.", show_default=False)]
OutputOpt = Annotated[Path, typer.Option("--output-dir", "-o", metavar="DIR", help="Dataset folder to create "
                                          "(written to a temporary folder beside it, renamed at the end).")]
ValSplitOpt = Annotated[float, typer.Option("--val-split", metavar="F", help="Fraction of episodes for the val split: "
                                             "exactly round(F x episodes), chosen with --seed. 0 = no val split.")]
SeedOpt = Annotated[int, typer.Option("--seed", metavar="N", help="Seed of the train/val split.")]
MaxTokensOpt = Annotated[int | None, typer.Option(
    "--max-tokens", metavar="N", help="Length filter: system + first user/assistant pair must fit in N tokens, "
                                      "each later pair must fit alone; the first later pair that does not fit "
                                      "is dropped with the rest; a record whose first pair does not fit is "
                                      "rejected (too_long). Default: no filter.")]
ShardTokensOpt = Annotated[int, typer.Option("--shard-tokens", metavar="N", help="Maximum tokens per shard "
                                              "(an episode never spans shards). A shard is a task of pack and verify; "
                                              "100000000 gives the fewer, larger shards of earlier versions.")]
TemplateMaxStepsOpt = Annotated[int, typer.Option(
    "--template-max-steps", metavar="N", help="With a model's chat template: the steps one render of a record may "
    "take, plus 8 per character of the record (a step: a loop iteration, a call, a filter, or 16 characters the "
    "template builds). A template that runs past it rejects the record as template_limit (or the run, on a probe "
    "conversation). Counts, not seconds: the same records are kept on every machine (docs/TOKENIZERS.md).")]
TemplateMaxOutputOpt = Annotated[int | None, typer.Option(
    "--template-max-output", metavar="SIZE", parser=parse_size, show_default="--max-record-bytes",
    help="With a model's chat template: the most characters one render of a record may return (K, M, G are "
    "powers of 1024); more rejects the record as template_limit. Keeps what is tokenized within the memory "
    "--max-record-bytes sets (docs/CLI.md).")]
TokenizerOpt = Annotated[str | None, typer.Option(
    "--tokenizer", metavar="NAME|PATH", help="tiktoken encoding name or path to a .tiktoken ranks file (sftdata's "
                                             "chat markers), or a model's own Hugging Face tokenizer.json, the "
                                             "folder holding it, or a Hub model id org/name[@revision] (from the "
                                             "Hugging Face cache first; the hf extra) (the model's chat template; "
                                             "see --chat-template). Default: the bundled cl100k_base (no network).")]
WorkersOpt = Annotated[int | None, typer.Option("--workers", "-j", metavar="N", help="Worker processes "
                                                   "(default: all cores; more than the cores are capped). The "
                                                   "output is byte-identical for any value.")]
SourceSha256Opt = Annotated[bool, typer.Option(
    "--source-sha256", metavar="", help="Record every input's whole-file sha256, however large. Without it, a plain JSONL file "
                            "over 1 GiB that workers read in ranges records its block hash only (block_sha256: "
                            "each range's task hashes its own 4 MiB blocks; docs/FORMAT.md).")]
MemoMbOpt = Annotated[float, typer.Option(
    "--memo-mb", metavar="MB", help="Memory (MiB, all workers together) for the memo of encoded texts: a system "
                                    "prompt, tool schema or message text seen before is not tokenized again. The "
                                    "output is byte-identical with any value; 0 turns the memo off.")]
StrictOpt = Annotated[bool, typer.Option("--strict", metavar="", help="Stop with exit code 1 at the first bad record "
                                         "instead of skipping it and writing it to rejects.jsonl.")]


def summary_table(s: PrepareSummary) -> Table:
    t = Table(title=f"Prepared {s.output_dir}", show_header=True, header_style="bold")
    t.add_column("", no_wrap=True)
    t.add_column("value", justify="right")
    t.add_row("records read", f"{s.records_read:,}")
    for split in s.episodes:
        t.add_row(f"episodes ({split})", f"{s.episodes[split]:,}")
    for split in s.tokens:
        t.add_row(f"tokens ({split})", f"{s.tokens[split]:,}")
    t.add_row("trained-token share", f"{s.trained_share:.1%}")
    t.add_row("record size limit", f"{s.max_record_bytes:,} bytes")
    if s.tokenizer_engine:
        e = s.tokenizer_engine
        t.add_row("tokenizer engine", e["engine"] if e["engine"] == "tiktoken" and e["requested"] == "auto"
                  and "tiktoken encoding" in e["reason"] else f"{e['engine']} ({e['reason']})")
    t.add_row("shards", ", ".join(f"{k}: {v}" for k, v in s.shards.items()))
    rej = sum(s.rejected.values())
    t.add_row("rejected records", f"{rej:,}", style="yellow" if rej else None)
    for reason, n in s.rejected.items():
        t.add_row(f"  rejected: {reason}", f"{n:,}", style="yellow")
    for reason, n in s.repaired.items():
        t.add_row(f"  repaired: {reason}", f"{n:,}")
    for name, n in s.turns.items():
        if n:
            t.add_row(f"  assistant turns: {name}", f"{n:,}")
    if s.records_truncated:
        t.add_row("  truncated by --max-tokens", f"{s.records_truncated:,} records, {s.pairs_dropped:,} pairs")
    if s.per_reply_records:
        t.add_row("  one episode per reply", f"{s.per_reply_records:,} records, {s.per_reply_episodes:,} episodes")
    if s.per_reply_automatic:
        t.add_row("  of them per_reply_automatic", f"{s.per_reply_automatic:,} records (whole render not exact)")
    d = s.dedup
    if d and (d["exact_duplicates"] or d["mode"] != "off"):
        dropped = d["mode"] != "off"
        t.add_row("exact duplicates" + (" (dropped)" if dropped else " (kept)"), f"{d['exact_duplicates']:,}",
                  style="yellow" if d["exact_duplicates"] and not dropped else None)
        if d["mode"] == "near":
            t.add_row(f"near duplicates (dropped, Jaccard >= {d['threshold']})", f"{d['near_duplicates']:,}")
    for f in (s.decontamination or {}).get("files", []):
        t.add_row(f"contaminated by {f['path']}", f"{f['contaminated']:,} records ({f['items']:,} items)")
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


def usable_workers(workers: int | None, quiet: bool) -> int:
    """``--workers`` as run: all cores when not given; more than the cores are capped (with
    a warning unless ``quiet``), as more processes than cores only cost memory and start-up."""
    cores = default_workers()
    if workers is None:
        return cores
    if workers > cores:
        if not quiet:
            warn(f"--workers {workers}: this machine gives sftdata {cores} core(s); using {cores}")
        return cores
    return workers


def run_prepare(opts: PrepareOptions, inputs, output_dir, *, engine: str = "local", ray_address: str | None = None,
                as_json: bool = False, quiet: bool = False) -> None:
    """Run prepare with ``opts`` (the command's options, built once) and draw its progress
    and summary. More ``opts.workers`` than the machine's cores are capped."""
    executor = ray_prepare_executor(ray_address) if check_engine(engine) == "ray" else None
    if ray_address is not None and executor is None:
        raise UsageError("--ray-address needs --engine ray")
    opts = replace(opts, workers=usable_workers(opts.workers, quiet))
    mode, val_split = opts.mode, opts.val_split
    with LazyProgress(make_progress(quiet or as_json)) as bar:  # drawn from the first report, after the checks

        def on_progress(p):
            bar.update(f"prepare-{mode}", completed=p.bytes_done, total=p.bytes_total, records=p.records,
                       tokens=p.tokens)

        summary = prepare(inputs, output_dir, opts, progress=on_progress, executor=executor,
                          planned=None if quiet or as_json else show_rebuild)
    if show_prepared(summary, summary_table, output_dir, as_json, quiet):
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


def _prepare_command(mode: str, doc: str):
    """One Typer command per mode over the same options (no second copy of the signature)."""

    @handle_errors
    def command(
        inputs: InputsArg,
        output_dir: OutputOpt,
        val_split: ValSplitOpt = 0.0,
        seed: SeedOpt = DEFAULT_SEED,
        max_tokens: MaxTokensOpt = None,
        shard_tokens: ShardTokensOpt = DEFAULT_SHARD_TOKENS,
        tokenizer: TokenizerOpt = None,
        chat_template: ChatTemplateOpt = None,
        template_var: TemplateVarOpt = None,
        per_reply: PerReplyOpt = False,
        template_max_steps: TemplateMaxStepsOpt = DEFAULT_MAX_STEPS,
        template_max_output: TemplateMaxOutputOpt = None,
        tokenizer_engine: TokenizerEngineOpt = "auto",
        allow_pad_as_stop: AllowPadAsStopOpt = False,
        workers: WorkersOpt = None,
        memo_mb: MemoMbOpt = DEFAULT_MEMO_MB,
        strict: StrictOpt = False,
        reasoning: ReasoningOpt = "keep",
        train_on: TrainOnOpt = "all",
        overwrite: OverwriteOpt = False,
        force: ForceOpt = False,
        wait: WaitOpt = False,
        max_record_bytes: MaxRecordBytesOpt = DEFAULT_MAX_RECORD_BYTES,
        engine: EngineOpt = "local",
        ray_address: RayAddressOpt = None,
        dedup: DedupOpt = "off",
        dedup_threshold: DedupThresholdOpt = DEFAULT_THRESHOLD,
        decontaminate: DecontaminateOpt = None,
        decontaminate_ngram: DecontaminateNgramOpt = DEFAULT_NGRAM,
        source_sha256: SourceSha256Opt = False,
        as_json: JsonOpt = False,
        quiet: QuietOpt = False,
    ) -> None:
        opts = PrepareOptions(mode=mode, val_split=val_split, seed=seed, max_tokens=max_tokens,
                              shard_tokens=shard_tokens, tokenizer=tokenizer, strict=strict,
                              workers=default_workers() if workers is None else workers,
                              overwrite=overwrite, force=force, wait=wait, max_record_bytes=max_record_bytes,
                              reasoning=reasoning, train_on=train_on, chat_template=chat_template,
                              template_vars=parse_template_vars(template_var), per_reply=per_reply,
                              tokenizer_engine=tokenizer_engine,
                              allow_pad_as_stop=allow_pad_as_stop, dedup=dedup, dedup_threshold=dedup_threshold,
                              decontaminate=tuple(decontaminate or ()), decontaminate_ngram=decontaminate_ngram,
                              memo_mb=memo_mb, template_max_steps=template_max_steps,
                              template_max_output=template_max_output, source_sha256=source_sha256)
        run_prepare(opts, inputs, output_dir, engine=engine, ray_address=ray_address, as_json=as_json, quiet=quiet)

    command.__name__ = f"prepare_{mode}"
    command.__doc__ = doc
    return app.command(f"prepare-{mode}")(command)


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

prepare_chat = _prepare_command("chat", CHAT_HELP)
prepare_tool = _prepare_command("tool", TOOL_HELP)

"""``sftdata prepare-pref`` and ``sftdata prepare-rl``: thin commands over ``pref.prepare_pref``,
with prepare-chat's option definitions (imported, not copied)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from ..curate import DEFAULT_NGRAM, DEFAULT_THRESHOLD
from ..engine import check_engine
from ..engine.prepare_ray import ray_prepare_executor
from ..errors import UsageError
from ..order.batches import DEFAULT_SEED
from ..pref import PrefOptions, PrefSummary, Truncation
from ..prepare import prepare_pref
from ..sources import DEFAULT_MAX_RECORD_BYTES
from ..store.format import DEFAULT_SHARD_TOKENS
from .app import LazyProgress, app, handle_errors, make_progress
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
    QuietOpt,
    RayAddressOpt,
    ReasoningOpt,
    TemplateVarOpt,
    WaitOpt,
    parse_template_vars,
)
from .prepare_cmd import (
    InputsArg,
    OutputOpt,
    SeedOpt,
    ShardTokensOpt,
    StrictOpt,
    TokenizerOpt,
    ValSplitOpt,
    WorkersOpt,
    usable_workers,
)

MaxLengthOpt = Annotated[int | None, typer.Option(
    "--max-length", metavar="N", help="Prompt + each completion at most N tokens: both completions are cut to the "
    "same budget (never inside a run of special tokens, never to no trained token), per --truncation. Default: no "
    "limit.")]
MaxPromptLengthOpt = Annotated[int | None, typer.Option(
    "--max-prompt-length", metavar="N", help="The prompt at most N tokens (default: --max-length - 1). prepare-rl: "
    "a longer prompt is rejected (prompt_too_long), never cut.")]
TruncationOpt = Annotated[str, typer.Option(
    "--truncation", metavar="keep-end|keep-start|drop", help="keep-end: a long prompt loses its start (cut where a "
    "turn begins), completions their end; keep-start: prompts are never cut (a long one drops the pair), "
    "completions lose their end; drop: nothing is cut, a pair over a budget is dropped. Counted in the summary.")]
FormatOpt = Annotated[str, typer.Option(
    "--format", metavar="auto|trl|kto|ultrafeedback|llamafactory", help="The record form (auto: by each record's "
    "keys; docs/PREFERENCE.md).")]


def _table(s: PrefSummary) -> Table:
    t = Table(title=f"Prepared {s.output_dir} ({s.kind})", show_header=True, header_style="bold")
    t.add_column("", no_wrap=True)
    t.add_column("value", justify="right")
    t.add_row("records read", f"{s.records_read:,}")
    what = {"pairs": "pairs", "kto": "rows", "prompts": "prompts"}[s.kind]
    for split, n in s.rows.items():
        t.add_row(f"{what} ({split})", f"{n:,}")
    for split, n in s.tokens.items():
        t.add_row(f"tokens ({split})", f"{n:,}")
    for form, n in s.forms.items():
        t.add_row(f"  form: {form}", f"{n:,}")
    for label, n in s.labels.items():
        t.add_row(f"  {label}", f"{n:,}")
    if s.kind != "prompts":
        t.add_row("prompts cut (--max-prompt-length)", f"{s.truncated.get('prompts_cut', 0):,}")
        t.add_row("completions cut (--max-length)", f"{s.truncated.get('completions_cut', 0):,}")
    if s.dedup:
        t.add_row("exact duplicates" + (" (dropped)" if s.dedup["mode"] != "off" else " (kept)"),
                  f"{s.dedup['exact_duplicates']:,}")
    for f in (s.decontamination or {}).get("files", []):
        t.add_row(f"contaminated by {f['path']}", f"{f['contaminated']:,} records ({f['items']:,} items)")
    rej = sum(s.rejected.values())
    t.add_row("rejected records", f"{rej:,}", style="yellow" if rej else None)
    for reason, n in s.rejected.items():
        t.add_row(f"  rejected: {reason}", f"{n:,}", style="yellow")
    for reason, n in s.repaired.items():
        t.add_row(f"  repaired: {reason}", f"{n:,}")
    t.add_row("time", f"{s.seconds:.2f} s")
    return t


def _options(template_var, decontaminate, workers, quiet: bool, **fields) -> PrefOptions:
    """The run's options from the command's: ``--template-var`` parsed, the evaluation files
    as a tuple, ``--workers`` capped at the cores (both commands read them alike)."""
    return PrefOptions(template_vars=parse_template_vars(template_var), decontaminate=tuple(decontaminate or ()),
                       workers=usable_workers(workers, quiet), **fields)


def _run(opts: PrefOptions, inputs, output_dir, rl: bool, as_json: bool, quiet: bool, engine: str = "local",
         ray_address: str | None = None) -> None:
    name = "prepare-rl" if rl else "prepare-pref"
    executor = ray_prepare_executor(ray_address) if check_engine(engine) == "ray" else None
    if ray_address is not None and executor is None:
        raise UsageError("--ray-address needs --engine ray")
    with LazyProgress(make_progress(quiet or as_json)) as bar:
        def on_progress(p):  # prepare_pref counts records as it goes, not tokens (its p.tokens stays 0)
            bar.update(name, completed=p.bytes_done, total=p.bytes_total, records=p.records, tokens=p.tokens or None)

        summary = prepare_pref(inputs, output_dir, opts, progress=on_progress, rl=rl,
                               planned=None if quiet or as_json else show_rebuild, executor=executor)
    show_prepared(summary, _table, output_dir, as_json, quiet)


@app.command("prepare-pref")
@handle_errors
def prepare_pref_cmd(
    inputs: InputsArg,
    output_dir: OutputOpt,
    tokenizer: TokenizerOpt = None,
    chat_template: ChatTemplateOpt = None,
    template_var: TemplateVarOpt = None,
    max_length: MaxLengthOpt = None,
    max_prompt_length: MaxPromptLengthOpt = None,
    truncation: TruncationOpt = "keep-end",
    form: FormatOpt = "auto",
    val_split: ValSplitOpt = 0.0,
    seed: SeedOpt = DEFAULT_SEED,
    shard_tokens: ShardTokensOpt = DEFAULT_SHARD_TOKENS,
    reasoning: ReasoningOpt = "keep",
    allow_pad_as_stop: AllowPadAsStopOpt = False,
    workers: WorkersOpt = None,
    engine: EngineOpt = "local",
    ray_address: RayAddressOpt = None,
    strict: StrictOpt = False,
    overwrite: OverwriteOpt = False,
    force: ForceOpt = False,
    wait: WaitOpt = False,
    max_record_bytes: MaxRecordBytesOpt = DEFAULT_MAX_RECORD_BYTES,
    dedup: DedupOpt = "off",
    dedup_threshold: DedupThresholdOpt = DEFAULT_THRESHOLD,
    decontaminate: DecontaminateOpt = None,
    decontaminate_ngram: DecontaminateNgramOpt = DEFAULT_NGRAM,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Prepare preference records (DPO/ORPO pairs, KTO rows) into a pair dataset, split in token space.

    Each pair is written as its prompt once and its two completions (KTO: one, with its
    label): the prompt's ids are the template's render of the prompt with the generation
    prompt, and both `prompt + chosen` and `prompt + rejected` begin with exactly those
    ids (a pair where they do not is rejected as prompt_not_prefix, never re-split in
    text). Each completion is trained through its end-of-turn token by the dataset's one
    mask rule; `sftdata verify` re-derives every pair. Forms: TRL (conversational or
    standard, explicit or implicit prompt), KTO, UltraFeedback scored completions,
    LLaMA-Factory pairwise; docs/PREFERENCE.md. `--dedup exact` drops a pair whose prompt
    and completions repeat an earlier pair's (`near`: nearly, by MinHash of its tokens); `--decontaminate EVAL` drops a pair whose
    prompt or either completion shares a word sequence with an evaluation item.

    Examples:

    * `sftdata prepare-pref pairs.jsonl -o data/dpo --tokenizer llama3/ --max-length 2048`
    * `sftdata prepare-pref dpo_en_demo.json -o data/dpo --format llamafactory --truncation drop`
    * `sftdata prepare-pref kto.jsonl -o data/kto --tokenizer qwen3/` (a "kto" dataset)
    * `sftdata prepare-pref big/ -o /shared/dpo --tokenizer qwen3/ --engine ray` (chunks rendered by tasks on a
      Ray cluster; the dataset byte-identical)
    """
    opts = _options(template_var, decontaminate, workers, quiet, tokenizer=tokenizer, chat_template=chat_template,
                    form=form, truncation=Truncation(max_length, max_prompt_length, truncation), val_split=val_split,
                    seed=seed, shard_tokens=shard_tokens, strict=strict, overwrite=overwrite, force=force, wait=wait,
                    max_record_bytes=max_record_bytes, reasoning=reasoning, allow_pad_as_stop=allow_pad_as_stop,
                    dedup=dedup, dedup_threshold=dedup_threshold, decontaminate_ngram=decontaminate_ngram)
    _run(opts, inputs, output_dir, False, as_json, quiet, engine, ray_address)


@app.command("prepare-rl")
@handle_errors
def prepare_rl_cmd(
    inputs: InputsArg,
    output_dir: OutputOpt,
    tokenizer: TokenizerOpt = None,
    chat_template: ChatTemplateOpt = None,
    template_var: TemplateVarOpt = None,
    max_prompt_length: MaxPromptLengthOpt = None,
    allow_pad_as_stop: AllowPadAsStopOpt = False,
    workers: WorkersOpt = None,
    engine: EngineOpt = "local",
    ray_address: RayAddressOpt = None,
    val_split: ValSplitOpt = 0.0,
    seed: SeedOpt = DEFAULT_SEED,
    shard_tokens: ShardTokensOpt = DEFAULT_SHARD_TOKENS,
    strict: StrictOpt = False,
    overwrite: OverwriteOpt = False,
    force: ForceOpt = False,
    wait: WaitOpt = False,
    max_record_bytes: MaxRecordBytesOpt = DEFAULT_MAX_RECORD_BYTES,
    dedup: DedupOpt = "off",
    dedup_threshold: DedupThresholdOpt = DEFAULT_THRESHOLD,
    decontaminate: DecontaminateOpt = None,
    decontaminate_ngram: DecontaminateNgramOpt = DEFAULT_NGRAM,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Prepare RL prompts (GRPO) rendered with the generation prompt, every other column kept byte-exact.

    Each row's prompt (`prompt`: a string or messages; else `messages`) is rendered as
    `apply_chat_template(prompt, tools=..., add_generation_prompt=True)` and tokenized
    (a "prompts" dataset, nothing trained); every other column (ground truth, metadata) is
    written to columns.jsonl beside it as the input's own JSON text, keyed by row and input
    record. A prompt over --max-prompt-length is rejected, never cut. docs/PREFERENCE.md.

    Examples:

    * `sftdata prepare-rl gsm8k.jsonl -o data/grpo --tokenizer qwen3/ --max-prompt-length 1024`
    * `sftdata prepare-rl prompts/ -o data/grpo --val-split 0.05 --json` (a folder; a JSON summary)
    """
    opts = _options(template_var, decontaminate, workers, quiet, tokenizer=tokenizer, chat_template=chat_template,
                    truncation=Truncation(None, max_prompt_length, "drop"), val_split=val_split, seed=seed,
                    shard_tokens=shard_tokens, strict=strict, overwrite=overwrite, force=force, wait=wait,
                    max_record_bytes=max_record_bytes, allow_pad_as_stop=allow_pad_as_stop, dedup=dedup,
                    dedup_threshold=dedup_threshold, decontaminate_ngram=decontaminate_ngram)
    _run(opts, inputs, output_dir, True, as_json, quiet, engine, ray_address)

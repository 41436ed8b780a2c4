"""Every option of the build commands (prepare-chat, prepare-tool, prepare-pref, prepare-rl),
declared once: its field, type, default, help, flags, panel, the commands that take it,
what it records in the build key (per family: ``prepare`` for chat and tool, ``pref`` for
pref and rl) and its check. ``PrepareOptions`` and ``PrefOptions`` take their fields,
``validate()`` and ``recorded()`` from here, the CLI its Typer parameters, ``--config``
its keys and ``scripts/prepare_*.py`` their arguments, so an option cannot miss the build
key or a command. No typer here: the library stays usable without the CLI.

An option's ``record`` (and ``record_pref``, the pref family's when it differs) is a
function of the options object giving the entries it adds to ``recorded()``; None: it
never changes a byte (``why`` says why), or it reaches the build key another way.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

from ..curate import DEDUP_MODES, DEFAULT_NGRAM, DEFAULT_THRESHOLD
from ..errors import UsageError
from ..order.batches import DEFAULT_SEED
from ..records.preference import FORMS
from ..records.turns import REASONING_POLICIES, RESERVED_TEMPLATE_VARIABLES, TRAIN_ON, TurnPolicy
from ..sources import DEFAULT_MAX_RECORD_BYTES
from ..store.format import DEFAULT_SHARD_TOKENS, TRUNCATION_POLICIES
from ..template import DEFAULT_MAX_STEPS, TemplateLimits
from ..tokenize.engine import check_engine
from ..tokenize.memo import DEFAULT_MEMO_MB, POLICIES
from ..tokenize.open import is_model_tokenizer_spec
from .option import (
    CURATION,
    EPISODES,
    FAMILY,
    IO,
    NOTHING,
    PAIRS,
    PREF,
    RUN,
    SHARED,
    SPLIT,
    TEMPLATE,
    Option,
    always,
    when_set,
)
from .values import SIZE


def _one_of(flag: str, allowed, word: str = "not") -> Callable:
    def check(v, o):
        if v not in allowed:
            raise UsageError(f"{flag} must be one of {', '.join(allowed)}, {word} {v!r}")
    return check


def _at_least(flag: str, low, what: str) -> Callable:
    def check(v, o):
        if v is not None and v < low:
            raise UsageError(f"{flag} must be {what}, got {v}")
    return check


def _fraction(v, o):
    if not (0.0 <= v < 1.0) or math.isnan(v):
        raise UsageError(f"--val-split must be a fraction in [0, 1), got {v}")


def _memo(v, o):
    if not v >= 0 or math.isinf(v):
        raise UsageError(f"--memo-mb must be 0 (no memo) or a positive number of megabytes, got {v}")


def _media_root(v, o):
    if v is not None and not Path(v).is_dir():
        said = "not a folder" if Path(v).exists() else "no such folder"
        raise UsageError(f"--media-root {v}: {said}; give the folder that relative image and video paths in the "
                         f"records are read from")


def _threshold(v, o):
    if not 0.0 < v <= 1.0 or math.isnan(v):
        raise UsageError(f"--dedup-threshold must be a Jaccard similarity in (0, 1], got {v}")


def _named(tok) -> str:
    return "the default tokenizer" if tok is None else repr(tok)


def _tokenizer_engine(v, o):
    check_engine(v)
    if v == "hf" and not is_model_tokenizer_spec(o.tokenizer):
        raise UsageError(f"--tokenizer-engine hf needs a model's own tokenizer (a tokenizer.json or its folder); "
                         f"{_named(o.tokenizer)} is a tiktoken encoding")


def _needs_model(what: Callable) -> Callable:
    def check(v, o):
        if v and not is_model_tokenizer_spec(o.tokenizer):
            named = _named(o.tokenizer)
            raise UsageError(f"{what(o)} needs a model's own tokenizer: --tokenizer path/to/tokenizer.json, the "
                             f"model folder holding it, or a Hub model id (org/name). {named[0].upper()}{named[1:]} "
                             f"uses sftdata's chat markers, which have no chat template")
    return check


def _template_vars(v, o):
    _needs_model(lambda o: "--template-var")(v, o)
    reserved = [k for k in v or () if k in RESERVED_TEMPLATE_VARIABLES]
    if reserved:
        raise UsageError(f"--template-var {reserved[0]}: sftdata gives the template {reserved[0]!r} itself; "
                         f"choose another name")


def _limits_prepare(o) -> dict:  # the limits decide which records a template keeps
    return {"template_limits": o.template_limits().recorded()} if is_model_tokenizer_spec(o.tokenizer) else {}


def _limits_pref(o) -> dict:  # recorded when given: a pair dataset made before them keeps its bytes
    given = o.template_max_steps != DEFAULT_MAX_STEPS or o.template_max_output is not None
    return {"template_limits": o.template_limits().recorded()} if given else {}


def _decontaminate(o) -> dict:
    if not o.decontaminate:
        return {}
    return {"decontaminate": [str(p) for p in o.decontaminate], "decontaminate_ngram": o.decontaminate_ngram}


def _truncation(o) -> dict:
    return {"truncation": o.truncation.recorded()}


def _check_truncation(v, o):
    o.truncation.validate()


_SAME_IDS = "the ids are the same with any engine; the engine that ran is in the tokenizer state"
OPTIONS: tuple[Option, ...] = (
    Option("mode", (), str, "chat", takes=EPISODES, record=always("mode"), record_pref=None,
           check=_one_of("mode", ("chat", "tool")), why="the command is the mode"),
    # input and output
    Option("max_record_bytes", ("--max-record-bytes",), SIZE, DEFAULT_MAX_RECORD_BYTES, metavar="SIZE", panel=IO,
           show_default="64M", record=always("max_record_bytes"), check=_at_least("--max-record-bytes", 1, "positive"),
           help="Longest record read: a longer JSONL line, JSON array item or Parquet row is read past (never held "
                "whole) and rejected as record_too_large. Bytes, or with K, M, G (powers of 1024). Bounds the memory "
                "a run needs (docs/CLI.md)."),
    Option("source_sha256", ("--source-sha256",), bool, False, panel=IO, record=when_set("source_sha256"),
           help="Record every input's whole-file sha256, however large. Without it, a plain JSONL file over 1 GiB "
                "that workers read in ranges records its block hash only (block_sha256: each range's task hashes "
                "its own 4 MiB blocks; docs/FORMAT.md)."),
    Option("strict", ("--strict",), bool, False, panel=IO, record=always("strict"), record_pref=None,
           why="prepare-pref / prepare-rl: a run that ends writes the same rows with or without it",
           help="Stop with exit code 1 at the first bad record instead of skipping it and writing it to "
                "rejects.jsonl. Duplicates and contaminated records, which --dedup and --decontaminate ask to "
                "drop, are dropped and counted either way."),
    Option("media_root", ("--media-root",), str, None, metavar="DIR", panel=IO, takes=EPISODES, nullable=True,
           record=when_set("media_root"), check=_media_root, why="prepare-pref / prepare-rl read no images or videos",
           help="Folder that relative image and video paths in records are read from (default: each record file's "
                "own folder). Recorded in the build key: it decides which files are read (docs/FORMAT.md)."),
    *(o for o in SHARED if o.panel == IO),
    # tokenizer and template
    Option("tokenizer", ("--tokenizer",), str, None, metavar="NAME|PATH", panel=TEMPLATE, nullable=True,
           record=None, record_pref=always("tokenizer"), why="in the key as the opened tokenizer and its state",
           help="tiktoken encoding name or path to a .tiktoken ranks file (sftdata's chat markers), or a model's own "
                "Hugging Face tokenizer.json, the folder holding it, or a Hub model id org/name[@revision] (from the "
                "Hugging Face cache first; the hf extra) (the model's chat template; see --chat-template). Default: "
                "the bundled cl100k_base (no network)."),
    Option("chat_template", ("--chat-template",), str, None, metavar="TEMPLATE", panel=TEMPLATE, nullable=True,
           record=when_set("chat_template"), record_pref=always("chat_template"),
           check=_needs_model(lambda o: f"--chat-template {o.chat_template}"),
           help="With a model's own tokenizer (--tokenizer tokenizer.json, its folder, or a Hub model id): the chat "
                "template to render with. `model` = the folder's own (chat_template.jinja or tokenizer_config.json; "
                "`model:NAME` for one of several: additional_chat_templates/NAME.jinja or a named entry), a preset "
                "(llama3, chatml, qwen3, mistral, gemma), or a .jinja file. Default: the folder's own template; a "
                "tokenizer that ships none needs this option."),
    Option("template_vars", ("--template-var",), dict, None, metavar="NAME=VALUE", panel=TEMPLATE, nullable=True,
           record=when_set("template_vars", lambda o: dict(o.template_vars)), record_pref=always("template_vars"),
           check=_template_vars, show_default=False,
           help="With a model's chat template: a variable it renders with, the VALUE read as JSON (repeatable): "
                "--template-var enable_thinking=false, --template-var date_string='\"26 Jul 2024\"'. A record's own "
                "chat_template_kwargs object overrides them for that record. Recorded in tokenizer_state.json; "
                "verify re-derives the mask rule with them."),
    Option("per_reply", ("--per-reply",), bool, False, panel=TEMPLATE, takes=EPISODES, record=when_set("per_reply"),
           check=_needs_model(lambda o: "--per-reply"),
           why="a pair's completion is one render after its prompt: one episode per reply makes no pair",
           help="With a model's chat template: serve every record one episode per assistant reply (the "
                "conversation up to it, only that reply trained), for templates that render earlier turns "
                "differently once later ones follow (Qwen3 drops the reasoning of earlier replies)."),
    Option("template_max_steps", ("--template-max-steps",), int, DEFAULT_MAX_STEPS, metavar="N", panel=TEMPLATE,
           record=_limits_prepare, record_pref=_limits_pref, check=_at_least("--template-max-steps", 1, "positive"),
           help="With a model's chat template: the steps one render of a record may take, plus 8 per character of "
                "the record (a step: a loop iteration, a call, a filter, or 16 characters the template builds). A "
                "template that runs past it rejects the record as template_limit (or the run, on a probe "
                "conversation). Counts, not seconds: the same records are kept on every machine "
                "(docs/TOKENIZERS.md)."),
    Option("template_max_output", ("--template-max-output",), SIZE, None, metavar="SIZE", panel=TEMPLATE,
           nullable=True, record=_limits_prepare, record_pref=_limits_pref, show_default="--max-record-bytes",
           check=_at_least("--template-max-output", 1, "positive"),
           help="With a model's chat template: the most characters one render of a record may return (K, M, G are "
                "powers of 1024); more rejects the record as template_limit. Keeps what is tokenized within the "
                "memory --max-record-bytes sets (docs/CLI.md)."),
    Option("tokenizer_engine", ("--tokenizer-engine",), str, "auto", metavar="ENGINE", panel=TEMPLATE,
           check=_tokenizer_engine, why=_SAME_IDS,
           help="With a model's own tokenizer: what encodes the text. auto = tiktoken's BPE core when the "
                "tokenizer.json is byte-level BPE with one split regex (Llama 3, Qwen2/2.5/3) and a self-check at "
                "load gives the tokenizers library's ids, else the tokenizers library; tiktoken = insist (an error "
                "says why it cannot); hf = always the tokenizers library. The ids are the same either way; the "
                "summary says which engine ran and why."),
    Option("allow_pad_as_stop", ("--allow-pad-as-stop",), bool, False, panel=TEMPLATE,
           record=when_set("allow_pad_as_stop"), record_pref=always("allow_pad_as_stop"),
           help="With a model's own tokenizer: silence the warning given when its pad token is also the "
                "end-of-turn token the model learns to stop with (accepted either way: the data carries its labels; "
                "a trainer that masks labels equal to the pad id would never train the stop token)."),
    # what is trained, and how rows are cut
    Option("reasoning", ("--reasoning",), str, "keep", metavar="MODE", panel=TEMPLATE, record=always("reasoning"),
           check=_one_of("--reasoning", REASONING_POLICIES),
           help="Reasoning of assistant turns (reasoning_content, reasoning or thinking fields or parts, a leading "
                "think-tag block), rendered between <|THINK|> and <|END_THINK|> (a chat template gets it as "
                "reasoning_content) and trained with the reply: keep every turn's, last (the final assistant turn's "
                "only), drop, or inline (written into the reply as a `<think>` block of text). Reasoning a chat "
                "template does not render is dropped and counted (reasoning_ignored_by_template) unless inline. "
                "Counted per turn."),
    Option("train_on", ("--train-on",), str, "all", metavar="WHICH", panel=TEMPLATE, takes=EPISODES | {PREF},
           record=always("train_on"), record_pref=lambda o: {"train_on": o.train_on} if o.train_on != "all" else {},
           check=_one_of("--train-on", TRAIN_ON), why="prepare-rl: a prompt trains no token",
           help="Assistant turns to train: all (except those the record marks weight 0 or train false), or last "
                "(the last of those only); the others stay in the episode as untrained context.",
           pairs_help="Of a completion's replies (a completion with tool calls and their results has several)."),
    Option("max_tokens", ("--max-tokens",), int, None, metavar="N", panel=SPLIT, takes=EPISODES, nullable=True,
           record=always("max_tokens"), check=_at_least("--max-tokens", 4, "at least 4"),
           why="pairs and prompts are cut by --max-length / --max-prompt-length (--truncation)",
           help="Length filter: system + first user/assistant pair must fit in N tokens, each later pair must fit "
                "alone; the first later pair that does not fit is dropped with the rest; a record whose first pair "
                "does not fit is rejected (too_long). Default: no filter."),
    Option("max_length", ("--max-length",), int, None, metavar="N", panel=SPLIT, takes=frozenset((PREF,)),
           nullable=True, field=False, record_pref=_truncation, check=_check_truncation,
           help="Prompt + each completion at most N tokens: both completions are cut to the same budget (never "
                "inside a run of special tokens, never to no trained token), per --truncation. Default: no limit."),
    Option("max_prompt_length", ("--max-prompt-length",), int, None, metavar="N", panel=SPLIT, takes=PAIRS,
           nullable=True, field=False, record_pref=_truncation,
           help="The prompt at most N tokens (default: --max-length - 1). prepare-rl: a longer prompt is rejected "
                "(prompt_too_long), never cut."),
    Option("truncation", ("--truncation",), str, "keep-end", metavar="|".join(TRUNCATION_POLICIES), panel=SPLIT,
           takes=frozenset((PREF,)), field=False, record_pref=_truncation,
           help="keep-end: a long prompt loses its start (cut where a turn begins), completions their end; "
                "keep-start: prompts are never cut (a long one drops the pair), completions lose their end; drop: "
                "nothing is cut, a pair over a budget is dropped. Counted in the summary."),
    Option("form", ("--format",), str, "auto", metavar="|".join(FORMS), panel=IO, takes=frozenset((PREF,)),
           record_pref=always("format", lambda o: o.form), check=_one_of("--format", FORMS, "got"),
           help="The record form (auto: by each record's keys; docs/PREFERENCE.md)."),
    # split and shards
    Option("val_split", ("--val-split",), float, 0.0, metavar="F", panel=SPLIT, record=always("val_split"),
           check=_fraction,
           help="Fraction of episodes for the val split: exactly round(F x episodes), chosen with --seed. 0 = no "
                "val split."),
    Option("seed", ("--seed",), int, DEFAULT_SEED, metavar="N", panel=SPLIT, record=always("seed"),
           help="Seed of the train/val split."),
    Option("shard_tokens", ("--shard-tokens",), int, DEFAULT_SHARD_TOKENS, metavar="N", panel=SPLIT,
           record=always("shard_tokens"), check=_at_least("--shard-tokens", 1, "positive"),
           help="Maximum tokens per shard (an episode never spans shards). A shard is a task of pack and verify; "
                "100000000 gives the fewer, larger shards of earlier versions."),
    # curation
    Option("dedup", ("--dedup",), str, "off", metavar="MODE", panel=CURATION,
           record=lambda o: {"dedup": o.dedup} if o.dedup != "off" else {}, record_pref=always("dedup"),
           check=_one_of("--dedup", DEDUP_MODES),
           help="Drop duplicate records, keeping the first in input order: exact (the same conversation, "
                "whitespace aside), near (MinHash of token shingles at --dedup-threshold; needs the dedup extra) or "
                "off. Exact duplicates are counted either way. Each drop is in rejects.jsonl as duplicate, naming the "
                "record kept."),
    Option("dedup_threshold", ("--dedup-threshold",), float, DEFAULT_THRESHOLD, metavar="J", panel=CURATION,
           record=lambda o: {"dedup_threshold": o.dedup_threshold} if o.dedup == "near" else {}, check=_threshold,
           help="--dedup near: the estimated Jaccard similarity of token 5-gram sets at which a record is a "
                "duplicate of an earlier one."),
    Option("decontaminate", ("--decontaminate",), list, (), metavar="EVAL", panel=CURATION, record=_decontaminate,
           record_pref=lambda o: {"decontaminate": list(o.decontaminate)}, show_default=False,
           help="Evaluation file (JSONL, JSON or Parquet; prompts, with or without answers); drop training records "
                "sharing a --decontaminate-ngram word sequence with any item, as contaminated. Repeatable."),
    Option("decontaminate_ngram", ("--decontaminate-ngram",), int, DEFAULT_NGRAM, metavar="N", panel=CURATION,
           record=_decontaminate, record_pref=always("decontaminate_ngram"),
           check=_at_least("--decontaminate-ngram", 1, "at least 1"),
           help="Words in the shared sequence that makes a record contaminated (13: GPT-3's contamination study)."),
    # run
    Option("workers", ("--workers", "-j"), int, 1, metavar="N", cli_default=None, nullable=True, why=NOTHING,
           check=_at_least("--workers", 1, "at least 1"),
           help="Worker processes (default: all cores; more than the cores are capped). The output is "
                "byte-identical for any value."),
    Option("memo_mb", ("--memo-mb",), float, DEFAULT_MEMO_MB, metavar="MB", check=_memo, why=NOTHING,
           help="Memory (MiB, all workers together) for the memo of encoded texts: a system prompt, tool schema or "
                "message text seen before is not tokenized again. The output is byte-identical with any value; 0 "
                "turns the memo off.", pairs_help="Pairs and prompts keep no memo: accepted, and unused."),
    Option("memo_policy", (), str, "frequency", takes=EPISODES, check=_one_of("memo_policy", POLICIES), why=NOTHING),
    *(o for o in SHARED if o.panel == RUN),
)
BY_NAME = {o.name: o for o in OPTIONS}


def taken_by(command: str) -> list[Option]:
    """The options ``command`` takes, in declaration order."""
    return [o for o in OPTIONS if command in o.takes]


def family_options(family: str) -> list[Option]:
    """The options of a family's class (chat and tool: prepare; pref and rl: pref)."""
    return [o for o in OPTIONS if o.takes & {c for c, f in FAMILY.items() if f == family}]


class DeclaredOptions:
    """What a build command's options class (under ``@declared_fields``) gives from its
    family's declarations: ``validate`` (every check, in declaration order), ``recorded``
    (what reaches the metadata and the build key: each option's entries, module
    docstring), ``template_limits`` and ``policy``."""

    family = ""

    @property
    def policy(self) -> TurnPolicy:
        return TurnPolicy(self.reasoning, self.train_on)

    def validate(self) -> None:
        for o in family_options(self.family):
            if o.check is not None:
                o.check(getattr(self, o.name) if o.field else None, self)

    def template_limits(self) -> TemplateLimits:
        """What every render of a model's chat template runs under (docs/TOKENIZERS.md)."""
        return TemplateLimits(self.template_max_steps, self.max_record_bytes if self.template_max_output is None
                              else self.template_max_output)

    def recorded(self) -> dict:
        """The options that determine the output, recorded in the metadata and part of the
        build key (each option's ``record`` rule). The tokenizer, --chat-template and
        --tokenizer-engine are in the key through the tokenizer state too."""
        out: dict = {}
        seen: set = set()
        for o in family_options(self.family):
            rule = o.records(self.family)
            if rule is not None and rule not in seen:
                seen.add(rule)
                out.update(rule(self))
        return out


def declared_fields(family: str):
    """A class decorator (under ``@dataclass``): the family's fields, each with its declared
    type and default, before the class's own."""
    def deco(cls):
        declared = [o for o in family_options(family) if o.field]
        cls.__annotations__ = {**{o.name: _annotation(o) for o in declared}, **cls.__dict__.get("__annotations__", {})}
        for o in declared:
            setattr(cls, o.name, o.default)
        return cls
    return deco


def _annotation(o: Option) -> object:
    base = {SIZE: int, list: tuple, dict: dict}.get(o.type, o.type)
    return base | None if o.nullable else base

"""Options shared by several commands, as ``Annotated`` aliases defined once (the help
text is part of the CLI's contract: tests/contract/), and the checks of shared arguments."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated

import typer

from ..errors import DatasetError, UsageError
from ..store.format import TOKEN_DTYPES
from ..store.location import dataset_path

_SIZE = re.compile(r"^\s*(\d+)\s*([kmg]?)(i?b)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_size(text: str) -> int:
    """Bytes from ``67108864``, ``64M``, ``64MiB`` or ``1G`` (K, M, G are powers of 1024)."""
    m = _SIZE.match(str(text))
    if not m:
        raise typer.BadParameter(f"{text!r} is not a size: give bytes (67108864) or a number with K, M or G "
                                 f"(64M, 1G; powers of 1024)")
    return int(m.group(1)) * _UNITS[m.group(2).lower()]


def parse_template_vars(values: list[str] | None) -> dict | None:
    """``--template-var NAME=VALUE`` options as ``{NAME: value}``, each VALUE read as JSON."""
    out: dict = {}
    for item in values or ():
        name, sep, raw = item.partition("=")
        if not sep or not name.strip():
            raise UsageError(f"--template-var {item!r}: give NAME=VALUE, e.g. --template-var enable_thinking=false")
        try:
            out[name.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            raise UsageError(f"--template-var {item}: the value is not JSON; a string needs quotes, e.g. "
                             f"--template-var {name.strip()}='\"{raw}\"'") from None
    return out or None


def dataset_dir(path: Path) -> Path:
    """A command's dataset argument, checked before the library opens it, so that a file
    (often the input given by mistake) or a wrong path says what to give instead. A
    ``file://`` URL is the folder it names; an object-store URL (``s3://bucket/sft``) its
    copy in the local cache, fetched first when needed."""
    path = dataset_path(path)
    if path.is_file():
        raise DatasetError(f"{path} is a file, not a dataset folder: give the folder that `sftdata prepare-chat` / "
                           f"`prepare-tool` wrote (its --output-dir); to make one from this file: "
                           f"sftdata prepare-chat {path} --output-dir DIR")
    if not path.exists():
        raise DatasetError(f"dataset folder {path} does not exist; check the path, or make the dataset with "
                           f"`sftdata prepare-chat INPUT --output-dir {path}`")
    return path


def flat_token_dtype(value: str | None) -> str | None:
    """``--token-dtype`` of the older flat layout: uint16 or uint32 (numpy would take
    any dtype name, or fail with its own TypeError)."""
    if value is not None and value not in TOKEN_DTYPES:
        raise UsageError(f"--token-dtype must be {' or '.join(TOKEN_DTYPES)}, got {value!r}")
    return value


# metavar "": a flag takes no value, so help shows none (typer would show <bool>). Every command takes
# both, as parameters named as_json and quiet, which app.quiet_output reads (tests/cli/test_quiet_json.py).
JsonOpt = Annotated[bool, typer.Option("--json", metavar="", help="Print the result as "
                                       "one JSON document on stdout, and nothing else there (progress and warnings "
                                       "go to stderr).")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", metavar="", help="Print nothing "
                                        "but errors and the document --json or --csv asks for: no progress bar, "
                                        "table, note or warning.")]
OverwriteOpt = Annotated[bool, typer.Option("--overwrite", metavar="", help="Replace the dataset at --output-dir "
                                            "when it is not up to date (its build key differs), once the new one is "
                                            "complete (never a folder that is not a dataset).")]
ForceOpt = Annotated[bool, typer.Option("--force", metavar="", help="Rebuild even when --output-dir is up to date "
                                        "(its metadata holds this run's build key); it is replaced as --overwrite "
                                        "replaces it, with the same safety.")]
WaitOpt = Annotated[bool, typer.Option("--wait", metavar="", help="When another sftdata is writing the same "
                                       "--output-dir, wait for it to finish instead of stopping at once (then "
                                       "--overwrite decides whether its result may be replaced).")]
DatasetArg = Annotated[Path, typer.Argument(metavar="DATASET", show_default=False, help="Dataset folder (the "
                                           "--output-dir of prepare-chat, prepare-tool or pack).")]
DatasetOrMixtureArg = Annotated[Path, typer.Argument(metavar="DATASET", show_default=False, help="Dataset folder (the "
                                                     "--output-dir of prepare-chat, prepare-tool or pack), or a "
                                                     "mixture file (`sftdata mix`).")]
TokenDtypeOpt = Annotated[str | None, typer.Option("--token-dtype", metavar="DTYPE", help="Older flat layout only: "
                                                      "dtype of tokens.bin, uint16 or uint32 (default).")]
MaxRecordBytesOpt = Annotated[int, typer.Option(
    "--max-record-bytes", metavar="SIZE", parser=parse_size, show_default="64M",
    help="Longest record read: a longer JSONL line, JSON array item or Parquet row is read past (never held whole) "
         "and rejected as record_too_large. Bytes, or with K, M, G (powers of 1024). Bounds the memory a run needs "
         "(docs/CLI.md).")]
# prepare-chat / prepare-tool: what an assistant turn trains (docs/FORMAT.md, "Reasoning and per-turn training")
ReasoningOpt = Annotated[str, typer.Option("--reasoning", metavar="MODE", help="Reasoning of assistant turns "
                                           "(reasoning_content, reasoning or thinking fields or parts, a leading "
                                           "think-tag block), rendered between <|THINK|> and <|END_THINK|> (a chat "
                                           "template gets it as reasoning_content) and trained with the reply: keep "
                                           "every turn's, last (the final assistant turn's only), drop, or inline "
                                           "(written into the reply as a `<think>` block of text). Reasoning a chat "
                                           "template does not render is dropped and counted "
                                           "(reasoning_ignored_by_template) unless inline. Counted per turn.")]
TrainOnOpt = Annotated[str, typer.Option("--train-on", metavar="WHICH", help="Assistant turns to train: all (except "
                                         "those the record marks weight 0 or train false), or last (the last of those "
                                         "only); the others stay in the episode as untrained context.")]
AllowPadAsStopOpt = Annotated[bool, typer.Option(
    "--allow-pad-as-stop", metavar="", help="With a model's own tokenizer: silence the warning given when its pad "
    "token is also the end-of-turn token the model learns to stop with (accepted either way: the data carries its "
    "labels; a trainer that masks labels equal to the pad id would never train the stop token).")]
ChatTemplateOpt = Annotated[str | None, typer.Option(
    "--chat-template", metavar="TEMPLATE", help="With a model's own tokenizer (--tokenizer tokenizer.json, "
    "its folder, or a Hub model id): the chat template to render with. `model` = the folder's own "
    "(chat_template.jinja or tokenizer_config.json; `model:NAME` for one of several: additional_chat_templates/"
    "NAME.jinja or a named entry), a preset (llama3, chatml, qwen3, mistral, gemma), or a .jinja file. "
    "Default: the folder's own template; a tokenizer that ships none needs this option.")]
TemplateVarOpt = Annotated[list[str] | None, typer.Option(
    "--template-var", metavar="NAME=VALUE", help="With a model's chat template: a variable it renders with, the "
    "VALUE read as JSON (repeatable): --template-var enable_thinking=false, --template-var "
    "date_string='\"26 Jul 2024\"'. A record's own chat_template_kwargs object overrides them for that record. "
    "Recorded in tokenizer_state.json; verify re-derives the mask rule with them.")]
PerReplyOpt = Annotated[bool, typer.Option(
    "--per-reply", metavar="", help="With a model's chat template: serve every record one episode per assistant "
    "reply (the conversation up to it, only that reply trained), for templates that render earlier turns "
    "differently once later ones follow (Qwen3 drops the reasoning of earlier replies).")]
# prepare-chat / prepare-tool: duplicates and evaluation contamination (docs/CURATION.md)
DedupOpt = Annotated[str, typer.Option("--dedup", metavar="MODE", help="Drop duplicate records, keeping the first in "
                                       "input order: exact (the same conversation, whitespace aside), near (MinHash "
                                       "of token shingles at --dedup-threshold; needs the dedup extra) or off. "
                                       "Exact duplicates are counted either way. Each drop is in rejects.jsonl as "
                                       "duplicate, naming the record kept.")]
DedupThresholdOpt = Annotated[float, typer.Option("--dedup-threshold", metavar="J", help="--dedup near: the "
                                                  "estimated Jaccard similarity of token 5-gram sets at which a "
                                                  "record is a duplicate of an earlier one.")]
DecontaminateOpt = Annotated[list[str] | None, typer.Option(
    "--decontaminate", metavar="EVAL", help="Evaluation file (JSONL, JSON or Parquet; prompts, with or without "
                                            "answers); drop training records sharing a --decontaminate-ngram word "
                                            "sequence with any item, as contaminated. Repeatable.")]
DecontaminateNgramOpt = Annotated[int, typer.Option("--decontaminate-ngram", metavar="N", help="Words in the shared "
                                                    "sequence that makes a record contaminated (13: GPT-3's "
                                                    "contamination study).")]
TokenizerEngineOpt = Annotated[str, typer.Option(
    "--tokenizer-engine", metavar="ENGINE", help="With a model's own tokenizer: what encodes the text. auto = "
    "tiktoken's BPE core when the tokenizer.json is byte-level BPE with one split regex (Llama 3, Qwen2/2.5/3) "
    "and a self-check at load gives the tokenizers library's ids, else the tokenizers library; tiktoken = insist "
    "(an error says why it cannot); hf = always the tokenizers library. The ids are the same either way; the "
    "summary says which engine ran and why.")]
# prepare-chat / prepare-tool (and pack, verify): where the work runs (docs/SCALE.md)
EngineOpt = Annotated[str, typer.Option("--engine", metavar="ENGINE", help="local (this machine: --workers "
                                        "processes) or ray (tasks on a Ray cluster; needs the ray extra). The "
                                        "result is byte-identical either way.")]
RayAddressOpt = Annotated[str | None, typer.Option("--ray-address", metavar="ADDRESS", help="With --engine ray: "
                                                   "the cluster to use (default: RAY_ADDRESS, else a local cluster "
                                                   "started for the run).")]

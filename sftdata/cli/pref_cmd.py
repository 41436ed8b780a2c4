"""``sftdata prepare-pref`` and ``sftdata prepare-rl``: thin commands over ``pref.prepare_pref``,
their options derived from the declaration (``sftdata.options``)."""

from __future__ import annotations

from rich.table import Table

from ..options.option import PREF, RL
from ..pref import PrefOptions, PrefSummary, Truncation
from ..prepare import prepare_pref
from .app import app, handle_errors
from .declared import declared_command
from .prepare_cmd import curation_rows, new_summary_table, reject_rows, run_build


def _table(s: PrefSummary) -> Table:
    what = {"pairs": "pairs", "kto": "rows", "prompts": "prompts"}[s.kind]
    t = new_summary_table(s, f"Prepared {s.output_dir} ({s.kind})", what, s.rows)
    for form, n in s.forms.items():
        t.add_row(f"  form: {form}", f"{n:,}")
    for label, n in s.labels.items():
        t.add_row(f"  {label}", f"{n:,}")
    if s.kind != "prompts":
        t.add_row("prompts cut (--max-prompt-length)", f"{s.truncated.get('prompts_cut', 0):,}")
        t.add_row("completions cut (--max-length)", f"{s.truncated.get('completions_cut', 0):,}")
    curation_rows(t, s)
    reject_rows(t, s.rejected, s.repaired)
    t.add_row("time", f"{s.seconds:.2f} s")
    return t


def _options(values: dict) -> PrefOptions:
    """The run's options from the command's: --max-length, --max-prompt-length and
    --truncation as one policy (prepare-rl: a long prompt dropped); run_build caps --workers."""
    truncation = Truncation(values.pop("max_length", None), values.pop("max_prompt_length", None),
                            values.pop("truncation", "drop"))
    return PrefOptions(**values, truncation=truncation)


def _run_declared(command: str, values: dict, inputs, output_dir, as_json: bool, quiet: bool) -> None:
    engine, ray_address = values.pop("engine"), values.pop("ray_address")
    # prepare_pref counts records as it goes, not tokens
    run_build(command, prepare_pref, _table, _options(values), inputs, output_dir, engine, ray_address,
              as_json, quiet, tokens=False, rl=command == RL)


PREF_HELP = """Prepare preference records (DPO/ORPO pairs, KTO rows) into a pair dataset, split in token space.

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

RL_HELP = """Prepare RL prompts (GRPO) rendered with the generation prompt, every other column kept byte-exact.

Each row's prompt (`prompt`: a string or messages; else `messages`) is rendered as
`apply_chat_template(prompt, tools=..., add_generation_prompt=True)` and tokenized
(a "prompts" dataset, nothing trained); every other column (ground truth, metadata) is
written to columns.jsonl beside it as the input's own JSON text, keyed by row and input
record. A prompt over --max-prompt-length is rejected, never cut. docs/PREFERENCE.md.

Examples:

* `sftdata prepare-rl gsm8k.jsonl -o data/grpo --tokenizer qwen3/ --max-prompt-length 1024`
* `sftdata prepare-rl prompts/ -o data/grpo --val-split 0.05 --json` (a folder; a JSON summary)
"""

prepare_pref_cmd = app.command(PREF)(handle_errors(declared_command(PREF, PREF_HELP, _run_declared)))
prepare_rl_cmd = app.command(RL)(handle_errors(declared_command(RL, RL_HELP, _run_declared)))

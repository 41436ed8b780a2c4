"""Each option declared once (sftdata/options/declared.py): what reaches the build key of
each kind is derived from the declaration, exactly as the options classes recorded it before
they were derived from it, and no byte-changing option can miss a command or the key."""

from __future__ import annotations

import dataclasses

import pytest

from sftdata.errors import UsageError
from sftdata.options.declared import OPTIONS, family_options, taken_by
from sftdata.options.option import CHAT, FAMILY, PREF, RL, TOOL
from sftdata.pref import PrefOptions, Truncation
from sftdata.prepare import PrepareOptions

# a value other than the default for every declared option (a new option must add its own
# here), and what its record rule needs besides to fire
CHANGED = {"mode": "tool", "max_record_bytes": 1 << 20, "source_sha256": True, "strict": True, "overwrite": True,
           "force": True, "wait": True, "tokenizer": "org/model", "chat_template": "chatml",
           "template_vars": {"x": 1}, "per_reply": True, "template_max_steps": 50, "template_max_output": 4096,
           "tokenizer_engine": "hf", "allow_pad_as_stop": True, "reasoning": "drop", "train_on": "last",
           "max_tokens": 99, "max_length": 100, "max_prompt_length": 50, "truncation": "drop", "form": "kto",
           "val_split": 0.25, "seed": 7, "shard_tokens": 1000, "dedup": "exact", "dedup_threshold": 0.5,
           "decontaminate": ("e.jsonl",), "decontaminate_ngram": 5, "workers": 3, "memo_mb": 1.0,
           "memo_policy": "lru", "engine": "ray", "ray_address": "auto", "media_root": "images"}
NEEDS = {"dedup_threshold": {"dedup": "near"}, "decontaminate_ngram": {"decontaminate": ("e.jsonl",)},
         "template_max_steps": {"tokenizer": "org/model"}, "template_max_output": {"tokenizer": "org/model"}}
CLASSES = {"prepare": PrepareOptions, "pref": PrefOptions}
TRUNCATION = ("max_length", "max_prompt_length", "truncation")


def _options(family: str, **values):
    """The family's options object from option values (pref: the three truncation options as one policy)."""
    if family == "pref":
        t = Truncation(values.pop("max_length", None), values.pop("max_prompt_length", None),
                       values.pop("truncation", "keep-end"))
        values["truncation"] = t
    return CLASSES[family](**values)


def test_every_declared_option_has_a_changed_value_here():
    assert sorted(CHANGED) == sorted(o.name for o in OPTIONS)


@pytest.mark.parametrize("command", [CHAT, TOOL, PREF, RL])
def test_each_byte_changing_option_reaches_the_recorded_options_of_every_command_that_takes_it(command):
    family = FAMILY[command]
    recorded = [o for o in taken_by(command) if o.records(family) is not None]
    assert recorded  # the derived list is not empty: the test below checks something
    for o in recorded:
        base = NEEDS.get(o.name, {})
        before = _options(family, **base).recorded()
        after = _options(family, **{**base, o.name: CHANGED[o.name]}).recorded()
        assert after != before, f"{command}: {o.flags[0]} does not reach the build key"


@pytest.mark.parametrize("command", [CHAT, TOOL, PREF, RL])
def test_an_option_that_records_nothing_says_why(command):
    for o in taken_by(command):
        if o.records(FAMILY[command]) is None and o.name not in TRUNCATION:
            assert o.why, f"{command}: {o.name} records nothing and does not say why"
            before = _options(FAMILY[command]).recorded()
            if o.field and o.name != "tokenizer":  # the tokenizer: in the key as the opened tokenizer and its state
                assert _options(FAMILY[command], **{o.name: CHANGED[o.name]}).recorded() == before


@pytest.mark.parametrize("command", [PREF, RL])
def test_every_byte_changing_option_of_prepare_chat_is_taken_by_pairs_or_said_meaningless(command):
    changing = [o for o in taken_by(CHAT) if o.records("prepare") is not None]
    left = [o.name for o in changing if command not in o.takes]
    assert left == {PREF: ["mode", "media_root", "per_reply", "max_tokens"],
                    RL: ["mode", "media_root", "per_reply", "train_on", "max_tokens"]}[command]
    for name in left:
        assert next(o for o in OPTIONS if o.name == name).why


def test_the_pairs_commands_take_every_option_prepare_chat_lacked_them_before():
    for command in (PREF, RL):
        names = {o.name for o in taken_by(command)}
        assert {"template_max_steps", "template_max_output", "tokenizer_engine", "memo_mb", "source_sha256"} <= names
    assert "train_on" in {o.name for o in taken_by(PREF)}


def test_the_classes_fields_are_the_declared_ones():
    assert [f.name for f in dataclasses.fields(PrepareOptions)] == [o.name for o in family_options("prepare") if o.field]
    assert [f.name for f in dataclasses.fields(PrefOptions)] == \
        [o.name for o in family_options("pref") if o.field] + ["truncation"]


def test_recorded_is_byte_for_byte_what_the_classes_recorded_before_the_declaration():
    """The dicts below are what PrepareOptions / PrefOptions.recorded() gave before they
    were derived (the build key and metadata of every existing dataset)."""
    assert PrepareOptions().recorded() == {"mode": "chat", "val_split": 0.0, "seed": 1337, "max_tokens": None,
                                           "shard_tokens": 16000000, "strict": False, "max_record_bytes": 67108864,
                                           "reasoning": "keep", "train_on": "all"}
    full = {k: v for k, v in CHANGED.items() if k in PrepareOptions.__dataclass_fields__}
    limits = {"max_steps": 50, "steps_per_char": 8, "write_chars_per_step": 4, "build_chars_per_step": 256,
              "item_chars": 16, "max_depth": 48, "max_output": 4096, "max_built": 32768}
    assert PrepareOptions(**{**full, "dedup": "near"}).recorded() == {
        "mode": "tool", "max_record_bytes": 1048576, "source_sha256": True, "strict": True, "chat_template": "chatml",
        "template_vars": {"x": 1}, "per_reply": True, "template_limits": limits, "allow_pad_as_stop": True,
        "reasoning": "drop", "train_on": "last", "max_tokens": 99, "val_split": 0.25, "seed": 7,
        "shard_tokens": 1000, "dedup": "near", "dedup_threshold": 0.5, "decontaminate": ["e.jsonl"],
        "decontaminate_ngram": 5, "media_root": "images"}  # --media-root: recorded only when given (issue 43)
    assert PrefOptions().recorded() == {
        "tokenizer": None, "chat_template": None, "template_vars": None, "format": "auto",
        "truncation": {"max_length": None, "max_prompt_length": None, "policy": "keep-end"}, "val_split": 0.0,
        "seed": 1337, "shard_tokens": 16000000, "reasoning": "keep", "max_record_bytes": 67108864,
        "allow_pad_as_stop": False, "dedup": "off", "decontaminate": [], "decontaminate_ngram": 13}
    old = {"tokenizer": "org/model", "chat_template": "chatml", "template_vars": {"x": 1}, "form": "kto",
           "truncation": Truncation(100, 50, "drop"), "val_split": 0.25, "seed": 7, "shard_tokens": 1000,
           "strict": True, "max_record_bytes": 1 << 20, "reasoning": "drop", "allow_pad_as_stop": True,
           "dedup": "near", "dedup_threshold": 0.5, "decontaminate": ("e.jsonl",), "decontaminate_ngram": 5}
    assert PrefOptions(**old).recorded() == {
        "max_record_bytes": 1048576, "tokenizer": "org/model", "chat_template": "chatml", "template_vars": {"x": 1},
        "allow_pad_as_stop": True, "reasoning": "drop", "format": "kto",
        "truncation": {"max_length": 100, "max_prompt_length": 50, "policy": "drop"}, "val_split": 0.25, "seed": 7,
        "shard_tokens": 1000, "dedup": "near", "dedup_threshold": 0.5, "decontaminate": ["e.jsonl"],
        "decontaminate_ngram": 5}


def test_the_new_pair_options_are_recorded_only_when_given():
    assert PrefOptions(train_on="last", source_sha256=True, template_max_steps=50).recorded() == {
        **PrefOptions().recorded(), "train_on": "last", "source_sha256": True,
        "template_limits": PrefOptions(template_max_steps=50).template_limits().recorded()}
    assert PrefOptions(tokenizer_engine="tiktoken", memo_mb=0.0).recorded() == PrefOptions().recorded()


def test_verify_reads_back_the_options_a_pair_dataset_records():
    opts = PrefOptions(tokenizer="org/model", chat_template="chatml", template_vars={"x": 1}, form="kto",
                       truncation=Truncation(100, 50, "drop"), reasoning="drop", train_on="last",
                       template_max_steps=50, template_max_output=4096, max_record_bytes=1 << 20)
    assert PrefOptions.from_recorded(opts.recorded()).recorded() == opts.recorded()


@pytest.mark.parametrize("family, values, message", [
    ("prepare", {"val_split": 1.0}, r"^--val-split must be a fraction in \[0, 1\), got 1.0$"),
    ("pref", {"val_split": 1.0}, r"^--val-split must be a fraction in \[0, 1\), got 1.0$"),
    ("pref", {"form": "csv"}, r"^--format must be one of auto, trl, kto, ultrafeedback, llamafactory, got 'csv'$"),
    ("pref", {"train_on": "first"}, r"^--train-on must be one of all, last, not 'first'$"),
    ("pref", {"template_max_steps": 0}, r"^--template-max-steps must be positive, got 0$"),
    ("pref", {"tokenizer_engine": "hf"}, r"^--tokenizer-engine hf needs a model's own tokenizer \(a tokenizer.json or "
                                         r"its folder\); the default tokenizer is a tiktoken encoding$"),
    ("pref", {"max_length": 1}, r"^--max-length must be at least 2, got 1$"),
    ("prepare", {"mode": "pairs"}, r"^mode must be one of chat, tool, not 'pairs'$"),
    ("prepare", {"media_root": "/no/such/folder"}, r"^--media-root /no/such/folder: no such folder; give the folder "
                                                   r"that relative image and video paths in the records are read from$"),
    ("prepare", {"media_root": __file__}, r"^--media-root .*test_declared.py: not a folder; give the folder that "
                                          r"relative image and video paths in the records are read from$"),
])
def test_the_checks_are_the_declared_ones_for_every_kind(family, values, message):
    with pytest.raises(UsageError, match=message):
        _options(family, **values).validate()

"""``--config FILE``: a TOML or YAML file of option values, keyed by the declared names;
each error one line naming the file, the key and what is allowed."""

from __future__ import annotations

import sys

import pytest

from sftdata.errors import UsageError
from sftdata.options.config import read_config
from sftdata.options.option import CHAT, PREF, RL


def _toml(tmp_path, text: str):
    path = tmp_path / "run.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_keys_are_the_declared_names_with_dashes_or_underscores_or_the_flag_name(tmp_path):
    path = _toml(tmp_path, 'val_split = 0.25\nmax-record-bytes = "1M"\nformat = "kto"\ntemplate-var = {x = 1}\n'
                           'decontaminate = "evals.jsonl"\nseed = 3\nstrict = true\nmax_length = 100\n')
    assert read_config(path, PREF) == {"val_split": 0.25, "max_record_bytes": 1 << 20, "form": "kto",
                                       "template_vars": {"x": 1}, "decontaminate": ("evals.jsonl",), "seed": 3,
                                       "strict": True, "max_length": 100}


def test_a_whole_number_is_a_float_option_and_template_vars_may_be_name_value_strings(tmp_path):
    path = _toml(tmp_path, 'val_split = 0\ntemplate_vars = ["enable_thinking=false"]\n')
    assert read_config(path, CHAT) == {"val_split": 0.0, "template_vars": {"enable_thinking": False}}


@pytest.mark.parametrize("text, command, message", [
    ("val_splt = 0.1\n", CHAT, "prepare-chat takes no option 'val_splt'; it takes max_record_bytes, source_sha256, "
                               "strict, media_root, overwrite, force, wait, tokenizer, chat_template, template_vars, per_reply, "
                               "template_max_steps, template_max_output, tokenizer_engine, allow_pad_as_stop, "
                               "reasoning, train_on, max_tokens, val_split, seed, shard_tokens, dedup, "
                               "dedup_threshold, decontaminate, decontaminate_ngram, workers, memo_mb, engine, "
                               "ray_address"),
    ("max_length = 10\n", RL, "prepare-rl takes no option 'max_length'; it takes"),
    ("mode = 'tool'\n", CHAT, "prepare-chat takes no option 'mode'"),
    ('val_split = "0.1"\n', CHAT, 'val_split takes a number, not str "0.1"'),
    ("seed = 1.5\n", CHAT, "seed takes a whole number, not float 1.5"),
    ("strict = 1\n", CHAT, "strict takes true or false, not int 1"),
    ('max_record_bytes = "lots"\n', CHAT, "max_record_bytes 'lots' is not a size: give bytes (67108864) or a number "
                                          "with K, M or G (64M, 1G; powers of 1024)"),
    ("decontaminate = [1]\n", CHAT, "decontaminate takes a list of strings (or one string), not list [1]"),
    ("seed = 1\nseed-x = 2\n", CHAT, "prepare-chat takes no option 'seed-x'"),
    ("val_split = 0.1\nval-split = 0.2\n", CHAT, "'val-split' gives val_split a second time"),
    ("val_split = \n", CHAT, "not valid TOML (Invalid value (at line 1, column 13))"),
])
def test_a_bad_key_type_or_file_is_one_line_naming_the_file_and_the_key(tmp_path, text, command, message):
    path = _toml(tmp_path, text)
    with pytest.raises(UsageError) as e:
        read_config(path, command)
    assert str(e.value).startswith(f"--config {path}: {message}") and "\n" not in str(e.value)


def test_a_file_that_is_not_toml_or_yaml_or_missing(tmp_path):
    with pytest.raises(UsageError, match=r"^--config .*run\.json: give a \.toml, \.yaml or \.yml file$"):
        read_config(tmp_path / "run.json", CHAT)
    with pytest.raises(UsageError, match=r"^--config .*gone\.toml: cannot read it \(No such file or directory\)$"):
        read_config(tmp_path / "gone.toml", CHAT)


def test_yaml_needs_pyyaml_and_says_how_to_install_it(tmp_path, monkeypatch):
    path = tmp_path / "run.yaml"
    path.write_text("val_split: 0.1\n", encoding="utf-8")
    monkeypatch.setitem(sys.modules, "yaml", None)  # as if PyYAML were not installed
    with pytest.raises(UsageError) as e:
        read_config(path, CHAT)
    assert str(e.value) == (f"--config {path}: reading YAML needs PyYAML: pip install 'sftdata[yaml]' (or write the "
                            f"file as TOML)")


def test_yaml_gives_the_same_values_as_toml(tmp_path):
    pytest.importorskip("yaml", reason="PyYAML (the yaml extra) is not installed here (the floors run has none)")
    y = tmp_path / "run.yml"
    y.write_text("val-split: 0.25\ntemplate_var:\n  enable_thinking: false\ndecontaminate: [a.jsonl, b.jsonl]\n"
                 "template_max_output: 4K\nmax_tokens: null\n", encoding="utf-8")
    assert read_config(y, CHAT) == {"val_split": 0.25, "template_vars": {"enable_thinking": False},
                                    "decontaminate": ("a.jsonl", "b.jsonl"), "template_max_output": 4096,
                                    "max_tokens": None}
    (tmp_path / "bad.yaml").write_text("- 1\n- 2\n", encoding="utf-8")
    with pytest.raises(UsageError, match=r"^--config .*bad\.yaml: give a table of option = value, not a list$"):
        read_config(tmp_path / "bad.yaml", CHAT)

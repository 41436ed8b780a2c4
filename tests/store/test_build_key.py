"""The build key's pure parts: components hashed, what changed named in words, the code
version, a dataset's files against its metadata."""

from __future__ import annotations

import shutil

import pytest

from sftdata.errors import OutputExistsError
from sftdata.store import build_key as bk

SHA_A, SHA_B = "a" * 64, "b" * 64


def comps(**over) -> dict:
    base = {"kind": "episodes", "format_version": 1, "sftdata": "0.1.0", "code": "c" * 64,
            "inputs": [{"path": "in.jsonl", "sha256": SHA_A}],
            "tokenizer": bk.tokenizer_component({"name": "cl100k_base", "ranks_sha256": SHA_A, "eos_id": 100257}),
            "options": {"seed": 1337, "max_tokens": None}}
    return {**base, **over}


def test_the_key_is_the_sha256_of_the_canonical_components_and_any_change_changes_it():
    a = comps()
    assert bk.build_key(a) == bk.sha256_json(a) == bk.build_key(dict(reversed(list(a.items()))))
    assert bk.build_key(a) != bk.build_key(comps(options={"seed": 7, "max_tokens": None}))


def test_an_unchanged_build_names_nothing_and_a_missing_key_says_so():
    assert bk.describe_changes(comps(), comps()) == []
    assert bk.describe_changes(None, comps()) == ["no build key recorded (the dataset was made by an earlier sftdata)"]


def test_an_input_byte_is_named_with_both_hashes():
    new = comps(inputs=[{"path": "in.jsonl", "sha256": SHA_B}])
    assert bk.describe_changes(comps(), new) == ["the input in.jsonl changed (sha256 aaaaaaaaaaaa... -> bbbbbbbbbbbb...)"]


def test_inputs_added_gone_or_reordered_are_named():
    two = [{"path": "a.jsonl", "sha256": SHA_A}, {"path": "b.jsonl", "sha256": SHA_B}]
    assert bk.describe_changes(comps(inputs=two), comps(inputs=two[:1])) == ["the input b.jsonl is no longer given"]
    assert bk.describe_changes(comps(inputs=two[:1]), comps(inputs=two)) == ["the input b.jsonl is new"]
    assert bk.describe_changes(comps(inputs=two), comps(inputs=two[::-1])) == ["the inputs are given in another order"]


def test_a_hub_input_is_named_by_its_commit():
    old = comps(inputs=[{"path": "hf://datasets/o/n@main/a.jsonl", "commit": "1" * 40}])
    new = comps(inputs=[{"path": "hf://datasets/o/n@main/a.jsonl", "commit": "2" * 40}])
    assert bk.describe_changes(old, new) == [
        "the input hf://datasets/o/n@main/a.jsonl changed (commit 111111111111... -> 222222222222...)"]


def test_the_tokenizer_file_is_named_with_both_hashes_and_explains_the_rest_of_the_state():
    state = {"name": "x", "ranks_sha256": SHA_A, "vocab_size": 10}
    other = {"name": "x", "ranks_sha256": SHA_B, "vocab_size": 11}
    new = comps(tokenizer=bk.tokenizer_component(other))
    assert bk.describe_changes(comps(tokenizer=bk.tokenizer_component(state)), new, state, other) == [
        "the tokenizer file changed (sha256 aaaaaaaaaaaa... -> bbbbbbbbbbbb...)"]


def _template_state(text_sha: str, **extra) -> dict:
    return {"kind": "hf-tokenizers", "file_sha256": SHA_A,
            "chat_template": {"name": "model", "sha256": text_sha, "text": "{{ x }}", **extra}}


def test_the_template_text_and_a_template_variable_are_named():
    a, b = _template_state(SHA_A), _template_state(SHA_B)
    assert bk.describe_changes(comps(tokenizer=bk.tokenizer_component(a)), comps(tokenizer=bk.tokenizer_component(b)),
                               a, b) == ["the chat template text changed (sha256 aaaaaaaaaaaa... -> bbbbbbbbbbbb...)"]
    # wherever the state records a template's variables, their change is in the key and named with its values
    v1 = _template_state(SHA_A, variables={"enable_thinking": True})
    v2 = _template_state(SHA_A, variables={"enable_thinking": False})
    old, new = comps(tokenizer=bk.tokenizer_component(v1)), comps(tokenizer=bk.tokenizer_component(v2))
    assert bk.build_key(old) != bk.build_key(new)
    assert bk.describe_changes(old, new, v1, v2) == [
        "a template variable changed (chat_template.variables: enable_thinking true -> false)"]
    assert bk.describe_changes(old, new) == ["a template variable changed (chat_template.variables)"]
    # or as an option
    assert bk.describe_changes(comps(options={"template_vars": {"x": 1}}), comps(options={"template_vars": {"x": 2}})) \
        == ['a template variable changed ({"x":1} -> {"x":2})']


def test_another_part_of_the_tokenizer_state_is_named_by_its_key():
    a = {"name": "x", "ranks_sha256": SHA_A, "engine": {"engine": "tiktoken"}}
    b = {"name": "x", "ranks_sha256": SHA_A, "engine": {"engine": "hf"}}
    old, new = comps(tokenizer=bk.tokenizer_component(a)), comps(tokenizer=bk.tokenizer_component(b))
    assert bk.describe_changes(old, new, a, b) == ['the tokenizer state changed (engine: engine "tiktoken" -> "hf")']


def test_options_are_named_as_their_flags():
    old, new = comps(options={"max_tokens": None, "dedup": "exact"}), comps(options={"max_tokens": 512})
    assert bk.describe_changes(old, new) == ['the option --dedup changed ("exact" -> not given)',
                                             "the option --max-tokens changed (none -> 512)"]


def test_the_template_limits_are_named_by_their_flags_and_the_fields_that_changed():
    old = comps(options={"template_limits": {"max_steps": 100000, "max_output": 64, "max_depth": 50}})
    new = comps(options={"template_limits": {"max_steps": 500, "max_output": 64, "max_depth": 50}})
    assert bk.describe_changes(old, new) == ["the template limits (--template-max-steps, --template-max-output) "
                                             "changed (max_steps 100000 -> 500)"]
    assert bk.describe_changes(comps(options={}), new) == [
        'the template limits (--template-max-steps, --template-max-output) changed '
        '(not given -> {"max_depth":50,"max_output":64,"max_steps":500})']


def test_the_format_and_the_code_version_are_named():
    assert bk.describe_changes(comps(), comps(format_version=2)) == ["the format version changed (1 -> 2)"]
    assert bk.describe_changes(comps(), comps(code="d" * 64)) == [
        "the rendering and masking code changed (source sha256 cccccccccccc... -> dddddddddddd...)"]
    assert bk.describe_changes(comps(), comps(code="d" * 64, sftdata="0.2.0")) == [
        "the rendering and masking code changed (sftdata 0.1.0 -> 0.2.0, source sha256 cccccccccccc... -> "
        "dddddddddddd...)"]


def test_the_code_version_follows_the_source_text_even_a_comment(tmp_path):
    pkg = tmp_path / "sftdata"
    shutil.copytree(bk.Path(bk.__file__).resolve().parent.parent, pkg,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    first = bk.code_version(pkg)
    assert first == bk.code_version(pkg) and len(first) == 64
    with open(pkg / "chat" / "masking.py", "a", encoding="utf-8") as f:
        f.write("# a comment\n")
    assert bk.code_version.__wrapped__(pkg) != first
    (pkg / "report" / "overview.py").write_text("# not a module that decides bytes\n")
    (pkg / "chat" / "masking.py").write_bytes((bk.Path(bk.__file__).parent.parent / "chat" / "masking.py").read_bytes())
    assert bk.code_version.__wrapped__(pkg) == first


def test_library_versions_are_recorded_and_their_changes_listed():
    now = bk.library_versions()
    assert set(now) == {"sftdata", "tiktoken", "tokenizers", "jinja2"} and now["sftdata"] == "0.1.0"
    meta = {"build": {"version": 1, "key": "k", "components": {}, "libraries": {**now, "tiktoken": "0.1"}}}
    assert bk.library_changes(meta) == [f"tiktoken 0.1 -> {now['tiktoken']}"]
    assert bk.library_changes({}) == []


def test_a_target_that_is_not_up_to_date_is_refused_without_overwrite_naming_what_changed(tmp_path):
    check = bk.BuildCheck("k", bk.Target(str(tmp_path), True, {"format": "sftdata"}), False,
                          ["the option --seed changed (1 -> 2)", "the input a changed (...)"])
    with pytest.raises(OutputExistsError, match=r"^.* already exists and is not up to date: the option --seed changed "
                                                r"\(1 -> 2\); the input a changed \(\.\.\.\)\. Pass --overwrite to "
                                                r"rebuild it, or choose another --output-dir$"):
        check.refuse_unless(False)
    check.refuse_unless(True)
    bk.BuildCheck("k", bk.Target(str(tmp_path), True, None)).refuse_unless(False)  # not a dataset: the writer's call


def test_a_dataset_missing_a_file_or_of_another_size_is_damaged(tmp_path):
    (tmp_path / "train" / "shard_00000").mkdir(parents=True)
    (tmp_path / "dataset_metadata.json").write_text("{}")
    (tmp_path / "tokenizer_state.json").write_text("{}")
    (tmp_path / "train" / "shard_00000" / "tokens.bin").write_bytes(b"1234")
    meta = {"format": "sftdata", "files": {"tokenizer_state.json": {"bytes": 2}},
            "splits": {"train": {"shards": [{"name": "shard_00000", "files": {"tokens.bin": {"bytes": 4},
                                                                              "mask.bin": {"bytes": 2}}}]}}}
    assert bk.damaged(tmp_path, meta) == "train/shard_00000/mask.bin is missing"
    (tmp_path / "train" / "shard_00000" / "mask.bin").write_bytes(b"123")
    assert bk.damaged(tmp_path, meta) == "train/shard_00000/mask.bin is 3 bytes, not the 2 recorded"
    (tmp_path / "train" / "shard_00000" / "mask.bin").write_bytes(b"12")
    assert bk.damaged(tmp_path, meta) is None
    assert bk.damaged(tmp_path, {"format": "sftdata"}) == "its dataset_metadata.json does not list its files"

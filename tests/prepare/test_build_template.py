"""prepare's build key under a model's own tokenizer and chat template: the tokenizer.json,
the template's text and a template variable each rebuild and are named."""

from __future__ import annotations

import pytest

from sftdata.errors import OutputExistsError
from sftdata.prepare import PrepareOptions, prepare
from sftdata.template import PRESETS
from sftdata.template import profile as template_profile
from sftdata.util.hashing import sha256_file
from tests.helpers.data import chat, write_jsonl
from tests.helpers.templates import TOKENS, train_tokenizer

PAD = {"pad_token": "<|endoftext|>"}


@pytest.fixture
def setup(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [chat(f"Hello {i}!", f"It is 18C and sunny in Paris {i}.")
                                              for i in range(6)])
    specials, bos, eos, extra = TOKENS["chatml"]
    folder = train_tokenizer(tmp_path / "tok", specials, bos, eos, extra, PAD)
    template = tmp_path / "chat.jinja"
    template.write_text(PRESETS["chatml"], encoding="utf-8")
    return src, folder, template


def _rebuild(src, out, opts) -> list[str]:
    with pytest.raises(OutputExistsError, match="already exists and is not up to date: "):
        prepare([src], out, opts)
    s = prepare([src], out, PrepareOptions(**{**opts.__dict__, "overwrite": True}))
    assert not s.up_to_date and prepare([src], out, opts).up_to_date
    return s.changed


def test_an_unchanged_template_build_is_up_to_date(tmp_path, setup):
    src, folder, template = setup
    opts = PrepareOptions(tokenizer=str(folder), chat_template=str(template))
    first = prepare([src], tmp_path / "ds", opts)
    again = prepare([src], tmp_path / "ds", opts)
    assert again.up_to_date and again.build_key == first.build_key


def test_the_tokenizer_json_rebuilds_and_is_named(tmp_path, setup):
    src, folder, template = setup
    opts = PrepareOptions(tokenizer=str(folder), chat_template=str(template))
    prepare([src], tmp_path / "ds", opts)
    a = sha256_file(folder / "tokenizer.json")
    specials, bos, eos, extra = TOKENS["chatml"]
    train_tokenizer(folder, specials, bos, eos, extra, PAD, vocab_size=300)
    b = sha256_file(folder / "tokenizer.json")
    assert _rebuild(src, tmp_path / "ds", opts) == [f"the tokenizer file changed (sha256 {a[:12]}... -> {b[:12]}...)"]


def test_the_template_text_rebuilds_and_is_named(tmp_path, setup):
    src, folder, template = setup
    opts = PrepareOptions(tokenizer=str(folder), chat_template=str(template))
    first = prepare([src], tmp_path / "ds", opts)
    a = sha256_file(template)
    template.write_text("{#- the same render, another text -#}\n" + PRESETS["chatml"], encoding="utf-8")
    b = sha256_file(template)
    assert _rebuild(src, tmp_path / "ds", opts) == [
        f"the chat template text changed (sha256 {a[:12]}... -> {b[:12]}...)"]
    assert first.tokens == prepare([src], tmp_path / "ds", opts).tokens


def test_a_template_variable_recorded_in_the_tokenizer_state_rebuilds_and_is_named(tmp_path, setup, monkeypatch):
    """Template variables (``--template-var``, chat_template_kwargs) are recorded in the
    tokenizer state: whatever it records is in the key, and a change names its values."""
    src, folder, template = setup
    opts = PrepareOptions(tokenizer=str(folder), chat_template=str(template))
    real = template_profile.TemplateProfile.state
    variables = {"enable_thinking": True}

    def state(self):
        out = real(self)
        out["chat_template"] = {**out["chat_template"], "variables": dict(variables)}
        return out

    monkeypatch.setattr(template_profile.TemplateProfile, "state", state)
    prepare([src], tmp_path / "ds", opts)
    variables["enable_thinking"] = False
    assert _rebuild(src, tmp_path / "ds", opts) == [
        "a template variable changed (chat_template.variables: enable_thinking true -> false)"]

"""make_loader(..., tokenizer=...) and SFTDataset(..., tokenizer=...): a dataset made with
another tokenizer than the model's is refused naming both hashes; the same tokenizer (even
saved again) is accepted; no tokenizer, no check; the check loads no tokenizer library."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from sftdata.errors import TokenizerError
from sftdata.interop import SFTDataset
from sftdata.loader import LoaderConfig, make_loader
from sftdata.pack import PackOptions, pack
from sftdata.prepare import PrepareOptions, prepare
from sftdata.template import PRESETS
from sftdata.tokenize import identity
from tests.helpers.data import chat, write_jsonl
from tests.helpers.templates import TOKENS, train_tokenizer

CFG = LoaderConfig(batch_size=2, block_size=16)
PAD = {"pad_token": "<|endoftext|>"}


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """A dataset made with a model's tokenizer and its own chat template, that tokenizer's
    folder, and another model's."""
    d = tmp_path_factory.mktemp("tokcheck")
    specials, bos, eos, extra = TOKENS["chatml"]
    mine = train_tokenizer(d / "mine", specials, bos, eos, extra, {**PAD, "chat_template": PRESETS["chatml"]})
    other = train_tokenizer(d / "other", specials, bos, eos, extra, {**PAD, "chat_template": PRESETS["chatml"]},
                            vocab_size=300)
    src = write_jsonl(d / "in.jsonl", [chat(f"Hello {i}!", f"It is 18C in Paris {i}.") for i in range(8)])
    prepare([src], d / "ds", PrepareOptions(tokenizer=str(mine)))
    return d / "ds", mine, other


def test_the_models_own_tokenizer_is_accepted_and_none_checks_nothing(made):
    ds, mine, _ = made
    assert make_loader(CFG, ds, backend="numpy", tokenizer=mine).get_batch("train").x.shape == (2, 16)
    assert make_loader(CFG, ds, backend="numpy", tokenizer=mine / "tokenizer.json") is not None
    assert make_loader(CFG, ds, backend="numpy") is not None


def test_another_models_tokenizer_is_refused_naming_both_hashes(made):
    ds, mine, other = made
    a, b = identity.identity_of(mine), identity.identity_of(other)
    differ = identity.differences(a, b)
    assert differ[0] == f"the vocabulary differs (sha256 {a.vocabulary[:12]}... vs {b.vocabulary[:12]}...)"
    assert differ[1].startswith("special ids differ (</tool_call> ") and len(differ) == 2
    want = (f"{ds} was made with another tokenizer than {other}: {'; '.join(differ)}. Its tokenizer is sha256 "
            f"{a.sha256[:16]}..., {other}'s is sha256 {b.sha256[:16]}...: the same ids would mean other text. Train "
            f"with the tokenizer the dataset was made with ({mine / 'tokenizer.json'}), or prepare it again with "
            f"--tokenizer {other}")
    with pytest.raises(TokenizerError, match=f"^{re.escape(want)}$"):
        make_loader(CFG, ds, backend="numpy", tokenizer=other)
    with pytest.raises(TokenizerError, match=f"^{re.escape(want)}$"):
        SFTDataset(ds, tokenizer=other)
    with pytest.raises(TokenizerError, match="the encoding differs|the dataset's is a hf tokenizer"):
        make_loader(CFG, ds, backend="numpy", tokenizer="cl100k_base")


def test_the_same_tokenizer_with_another_chat_template_is_refused(made, tmp_path):
    ds, mine, _ = made
    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer.json").write_bytes((mine / "tokenizer.json").read_bytes())
    config = json.loads((mine / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": "{{ messages }}"}))
    with pytest.raises(TokenizerError, match=r"was made with another tokenizer than .*: the chat template differs "
                                             r"\(the dataset's 'default': sha256 "):
        make_loader(CFG, ds, backend="numpy", tokenizer=model)


def test_a_hub_id_is_checked_by_the_files_it_names(made, monkeypatch):
    ds, mine, other = made
    monkeypatch.setattr(identity, "hub_folder", lambda spec: {"org/mine": mine, "org/other@v2": other}[spec])
    assert make_loader(CFG, ds, backend="numpy", tokenizer="org/mine") is not None
    with pytest.raises(TokenizerError, match="was made with another tokenizer than org/other@v2: the vocabulary"):
        make_loader(CFG, ds, backend="numpy", tokenizer="org/other@v2")


def test_a_markers_dataset_and_its_pack_are_checked_by_their_tiktoken_encoding(source, tmp_path, each_kind):
    pack(source, tmp_path / "packed", PackOptions(block_size=64))
    for ds in (source, tmp_path / "packed"):
        assert make_loader(LoaderConfig(batch_size=2, block_size=64), ds, backend="numpy",
                           tokenizer="cl100k_base") is not None
        with pytest.raises(TokenizerError, match=r"the encoding differs \(cl100k_base vs o200k_base\)"):
            make_loader(LoaderConfig(batch_size=2, block_size=64), ds, backend="numpy", tokenizer="o200k_base")
    with pytest.raises(TokenizerError, match=r"records no tokenizer \(no tokenizer_state.json\), so it cannot be "
                                             r"checked against cl100k_base; leave the tokenizer out"):
        make_loader(CFG, each_kind["windows"], backend="numpy", tokenizer="cl100k_base")


def test_the_check_loads_no_tokenizer_library(made):
    ds, mine, _ = made
    code = (f"import sys; from sftdata.loader import LoaderConfig, make_loader; "
            f"make_loader(LoaderConfig(batch_size=2, block_size=16), {str(ds)!r}, backend='numpy', "
            f"tokenizer={str(mine)!r}); "
            f"print([m for m in ('tokenizers', 'tiktoken', 'jinja2', 'sftdata.tokenize.hf') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

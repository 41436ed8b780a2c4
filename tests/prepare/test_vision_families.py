"""prepare-chat on image records for the families beyond Qwen (Gemma 3, Idefics3, SmolVLM),
each model folder built offline: every kept episode's ids are transformers'
``processor.apply_chat_template(messages, tokenize=True)``, no media token is trained, the
mask is the stored rule's, and ``verify`` passes, its media check walking each item's tokens
in order (a tiled image's tokens have row and column marks between them). LLaVA-1.5's and
LLaVA-NeXT's chat templates are refused by name: their replies end in no token a rule over
ids can find (their images are expanded as their processors do: tests/media/test_expand.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sftdata.chat.loss_rule import rule_from_state
from sftdata.errors import TemplateError
from sftdata.media import read_processor_settings
from sftdata.media.expand import item_token
from sftdata.prepare import PrepareOptions, prepare
from sftdata.verify import verify
from tests.helpers.data import write_jsonl
from tests.helpers.vision import loaded, write_images
from tests.helpers.vision_families import family_folder, reference_processor


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    names = write_images(root / "data")
    records = [{"messages": [{"role": "user", "content": [{"type": "image", "image": n},
                                                          {"type": "text", "text": f"What is {k}?"}]},
                             {"role": "assistant", "content": [{"type": "text", "text": f"It is {k}."}]}]}
               for k, n in enumerate(names)]
    records.append({"messages": [
        {"role": "user", "content": [{"type": "text", "text": "Compare "}, {"type": "image", "image": names[1]},
                                     {"type": "text", "text": " and "}, {"type": "image", "image": names[4]}]},
        {"role": "assistant", "content": [{"type": "text", "text": "They differ."}]}]})
    return root, write_jsonl(root / "data" / "records.jsonl", records), records


def _reference(processor, record: dict, base) -> list[int]:
    given = [{**m, "content": [{"type": "image", "image": loaded(base / p["image"])} if p["type"] == "image" else p
                               for p in m["content"]]} for m in record["messages"]]
    out = processor.apply_chat_template(given, tokenize=True)
    return list(out[0] if out and isinstance(out[0], list) else out)


@pytest.mark.parametrize("family", ["gemma3", "idefics3", "smolvlm"])
def test_every_episode_is_the_processors_and_verify_passes(data, family, tmp_path):
    root, src, records = data
    folder = family_folder(tmp_path / family, family)
    out = tmp_path / "ds"
    summary = prepare([src], out, PrepareOptions(tokenizer=str(folder), allow_pad_as_stop=True))
    assert summary.rejected == {} and summary.episodes == {"train": len(records)}
    processor = reference_processor(folder, family)
    meta = json.loads((out / "dataset_metadata.json").read_text())
    state = json.loads((out / "tokenizer_state.json").read_text())
    media_ids = state["mask_rule"]["media_ids"]
    token = {"gemma3": "<image_soft_token>"}.get(family, "<image>")  # what the model puts vision features at
    assert item_token(read_processor_settings(folder), "image") == token
    assert media_ids == [processor.tokenizer.convert_tokens_to_ids(token)]
    rule = rule_from_state(state)
    (shard,) = meta["splits"]["train"]["shards"]
    folder_of = out / "train" / shard["name"]
    tokens = np.fromfile(folder_of / "tokens.bin", dtype=np.dtype(meta["token_dtype"]))
    mask = np.fromfile(folder_of / "mask.bin", dtype=np.uint8)
    index = np.fromfile(folder_of / "episodes.idx", dtype="<u8").reshape(-1, 2)
    sources = np.fromfile(folder_of / "sources.idx", dtype="<u8")
    for e, (start, length) in enumerate(index.tolist()):
        ids, m = tokens[start:start + length], mask[start:start + length]
        assert ids.tolist() == _reference(processor, records[int(sources[e])], root / "data"), (family, e)
        assert m[np.isin(ids, media_ids)].sum() == 0 and m.sum() > 0
        assert np.array_equal(rule.masks(ids, np.array([ids.size])), m)
    assert meta["media"]["items"] == len(records) + 1
    assert meta["media"]["tokens"] == int(np.isin(tokens, media_ids).sum())
    report = verify(out)
    assert report.ok, [str(p) for p in report.problems]
    assert next(c for c in report.checks if c.name == "media").status == "ok"


@pytest.mark.parametrize("family, message", [
    ("llava", "chat template model: its end-of-turn text ' ' (no special token) is not on token boundaries with "
              "this tokenizer, so no rule over token ids can find where a reply stops"),
    ("llava_next", "chat template model writes no assistant header and no special token before a reply; a reply's "
                   "start cannot be told from the token ids")])
def test_llava_templates_are_refused_by_name(data, family, message, tmp_path):
    _, src, _ = data
    folder = family_folder(tmp_path / family, family)
    with pytest.raises(TemplateError) as e:
        prepare([src], tmp_path / "ds", PrepareOptions(tokenizer=str(folder)))
    assert str(e.value).startswith(message)
    assert not (tmp_path / "ds").exists()

"""Media under a vision model's template: each episode's ids equal transformers'
``processor.apply_chat_template(messages, tokenize=True)``, every media token is masked 0 by
the rule, each item's span is where its placeholders are, and the length filter never cuts
a media item (conversations made by hand: the records' media parsing is tested in records/)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sftdata.chat.template_rule import MaskRule, rule_mask
from sftdata.errors import ConfigError, RecordError
from sftdata.media import settings_from_dicts
from sftdata.prepare.media import MediaStep
from sftdata.records.turns import MEDIA_MARK, Conversation, MediaRef, Turn
from sftdata.template import choose_tokenizer, records_episodes, render_within, tokenizer_state
from sftdata.template.messages import media_parts
from sftdata.template.vision import with_processor
from tests.helpers.vision import IMAGES, MODELS, model_folder, reference_ids, reference_processor, write_images


def _conv(*turns: Turn) -> Conversation:
    return Conversation(turns=tuple(turns))


def _user(text: str, *refs: str) -> Turn:
    return Turn(role="user", text=text, media=tuple(MediaRef("image", r) for r in refs))


def _messages(conv: Conversation) -> list[dict]:
    """The conversation as a user of transformers writes it: image parts naming their files."""
    out = []
    for t in conv.turns:
        if t.media:
            parts = media_parts(t)
            refs = iter(t.media)
            out.append({"role": t.role, "content": [{"type": "image", "image": next(refs).ref}
                                                    if p["type"] == "image" else p for p in parts]})
        else:
            out.append({"role": t.role, "content": t.text})
    return out


@pytest.fixture(scope="module")
def qwen25(tmp_path_factory):
    root = tmp_path_factory.mktemp("qwen25")
    folder = model_folder(root / "model", "qwen2_5_vl")
    write_images(root / "data")
    tok, profile = choose_tokenizer(str(folder), None)
    return root, folder, tok, profile


def _render(qwen, conv: Conversation, max_tokens=None, where=None):
    root, _, tok, profile = qwen
    where = where or f"{root / 'data' / 'records.jsonl'}:line 1"
    media = MediaStep(profile.processor).record_media(conv, where)
    (out,) = records_episodes([(conv, where)], profile, tok, max_tokens, [media])
    return out


def test_the_profile_pins_the_processor_and_never_trains_media(qwen25):
    _, _, tok, profile = qwen25
    pad, video = tok.token_id("<|image_pad|>"), tok.token_id("<|video_pad|>")
    assert profile.media_ids == {"image": pad, "video": video}
    assert profile.rule.media_ids == tuple(sorted((pad, video)))
    state = tokenizer_state(tok, profile)
    assert state["processor"] == profile.processor
    assert state["processor"]["family"] == "qwen2_5_vl"
    assert state["mask_rule"]["media_ids"] == sorted((pad, video))
    assert MaskRule.from_state(state["mask_rule"]) == profile.rule


@pytest.fixture(scope="module", params=sorted(MODELS))
def family(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    folder = model_folder(root / "model", request.param)
    write_images(root / "data")
    tok, profile = choose_tokenizer(str(folder), None)
    return root, folder, tok, profile, request.param


def test_every_episode_equals_the_processors_ids(family):
    root, folder, tok, profile, name = family
    assert profile.processor["family"] == name
    processor = reference_processor(folder, name)
    qwen = family[:4]
    names = [name for name, *_ in IMAGES]
    for k, name in enumerate(names):
        other = names[(k + 3) % len(names)]
        conv = _conv(_user(f"{MEDIA_MARK}What is this?", name), Turn("assistant", "A picture."),
                     _user(f"And these: {MEDIA_MARK} and {MEDIA_MARK}.", other, name), Turn("assistant", "Two more."))
        out = _render(qwen, conv)
        assert not isinstance(out, RecordError), out
        (ep,) = out.episodes
        assert ep.ids.tolist() == reference_ids(processor, _messages(conv), root / "data")
        media = np.isin(ep.ids, list(profile.media_ids.values()))
        assert ep.mask[media].tolist() == [0] * int(media.sum())
        assert np.array_equal(rule_mask(ep.ids, profile.rule), ep.mask)
        assert [s.item.uri for s in ep.media] == [str(root / "data" / n) for n in (name, other, name)]
        pad = profile.media_ids["image"]
        start, end = tok.token_id("<|vision_start|>"), tok.token_id("<|vision_end|>")
        for s in ep.media:
            n = s.item.count.tokens
            assert ep.ids[s.offset - 1:s.offset + n + 1].tolist() == [start] + [pad] * n + [end]


def test_a_media_token_in_a_reply_is_not_trained_by_the_rule():
    rule = MaskRule(headers=((1,),), end_ids=(2,), media_ids=(7,))
    ids = np.array([5, 1, 3, 7, 7, 3, 2, 5])
    assert rule_mask(ids, rule).tolist() == [0, 0, 1, 0, 0, 1, 1, 0]
    assert rule_mask(ids, MaskRule(headers=((1,),), end_ids=(2,))).tolist() == [0, 0, 1, 1, 1, 1, 1, 0]
    assert MaskRule.from_state(rule.state()) == rule
    assert "media_ids" not in MaskRule(headers=((1,),), end_ids=(2,)).state()


def test_a_record_whose_first_pair_cannot_fit_with_its_image_is_media_truncated(qwen25):
    conv = _conv(_user(f"{MEDIA_MARK}What is this?", "portrait.jpg"), Turn("assistant", "A picture."))
    whole = _render(qwen25, conv).episodes[0]
    out = _render(qwen25, conv, max_tokens=len(whole.ids) - 1)
    assert isinstance(out, RecordError) and out.reason == "media_truncated"
    assert f"renders to {len(whole.ids)} tokens" in out.detail and "never cut" in out.detail
    assert _render(qwen25, conv, max_tokens=len(whole.ids)).episodes[0].ids.tolist() == whole.ids.tolist()


def test_a_later_pair_with_an_image_is_dropped_whole(qwen25):
    first = _render(qwen25, _conv(_user("Hello", ), Turn("assistant", "Hi."))).episodes[0]
    conv = _conv(_user("Hello"), Turn("assistant", "Hi."), _user(f"{MEDIA_MARK}And this?", "portrait.jpg"),
                 Turn("assistant", "A picture."))
    out = _render(qwen25, conv, max_tokens=len(first.ids) + 20)
    assert out.pairs_dropped == 1
    (ep,) = out.episodes
    assert ep.ids.tolist() == first.ids.tolist() and ep.media == ()


def test_a_folder_whose_placeholder_is_no_token_is_refused(qwen25):
    _, _, tok, profile = qwen25
    gemma = settings_from_dicts({"image_processor_type": "Gemma3ImageProcessor", "processor_class": "Gemma3Processor"})
    with pytest.raises(ConfigError, match=r"^the tokenizer model has no special token '<image_soft_token>', the image "
                                          r"token of its processor \(gemma3\); give the model's own tokenizer folder$"):
        with_processor(profile, gemma, tok)


def test_render_within_keeps_a_text_record_as_it_was(qwen25):
    _, _, tok, profile = qwen25
    conv = _conv(Turn("user", "Hello"), Turn("assistant", "Hi."))
    out, dropped = render_within(conv, profile, tok, None)
    assert dropped == 0 and out.episodes[0].media == ()


def test_per_reply_episodes_carry_the_spans_of_the_items_they_hold(qwen25):
    root, folder, _, _ = qwen25
    tok, profile = choose_tokenizer(str(folder), None, per_reply=True)
    processor = reference_processor(folder, "qwen2_5_vl")
    conv = _conv(_user(f"{MEDIA_MARK}What is this?", "gray.png"), Turn("assistant", "Gray."),
                 _user(f"And {MEDIA_MARK}?", "alpha.png"), Turn("assistant", "Clear."))
    out = _render((root, folder, tok, profile), conv)
    assert out.per_reply and len(out.episodes) == 2
    first, second = out.episodes
    assert first.ids.tolist() == reference_ids(processor, _messages(conv)[:2], root / "data")
    assert second.ids.tolist() == reference_ids(processor, _messages(conv), root / "data")
    assert [Path(s.item.uri).name for s in first.media] == ["gray.png"]
    assert [Path(s.item.uri).name for s in second.media] == ["gray.png", "alpha.png"]
    assert first.media[0] == second.media[0]  # the same prefix: the same place
    for ep in out.episodes:
        assert np.array_equal(rule_mask(ep.ids, profile.rule, ep.last_only), ep.mask)
        assert all(ep.mask[s.offset:s.offset + s.item.count.tokens].sum() == 0 for s in ep.media)


def test_a_template_that_drops_images_is_refused_by_name(qwen25):
    root, folder, tok, _ = qwen25
    text_only = root / "text_only.jinja"  # it reads content parts, but writes only their text
    text_only.write_text("{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.content is string %}{{ m.content }}"
                         "{% else %}{% for p in m.content %}{% if p.type == 'text' %}{{ p.text }}{% endif %}{% endfor %}"
                         "{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                         "{% endif %}")
    _, profile = choose_tokenizer(str(folder), str(text_only))
    conv = _conv(_user(f"{MEDIA_MARK}What is this?", "gray.png"), Turn("assistant", "Gray."))
    out = _render((root, folder, tok, profile), conv)
    assert isinstance(out, RecordError) and out.reason == "media_placeholder_mismatch"
    assert out.detail == ("chat template text_only.jinja renders 0 of the record's 1 media items (it writes no "
                          "<|image_pad|> for the others), so the model would learn replies to pictures it never "
                          "sees; use the vision model's own chat template")


def test_a_processor_sftdata_cannot_count_refuses_the_run_up_front(qwen25, tmp_path):
    _, folder, _, _ = qwen25
    other = tmp_path / "other"
    other.mkdir()
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (other / f).write_bytes((folder / f).read_bytes())
    (other / "preprocessor_config.json").write_text('{"processor_class": "FuyuProcessor"}')
    with pytest.raises(ConfigError, match="the model's processor is FuyuProcessor: sftdata counts image tokens for "
                                          "Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Gemma 3"):
        choose_tokenizer(str(other), None)

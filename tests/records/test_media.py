"""Images and videos in records: every spelling becomes exactly these turns (text with one
MEDIA_MARK where each item stands, and the items in order), and every refusal its message."""

import json
import random

import pytest

from sftdata.errors import RecordError
from sftdata.records.conversation import Turn, TurnPolicy, parse_record
from sftdata.records.turns import MEDIA_MARK, MediaRef

W = "f.jsonl:line 3"
M = MEDIA_MARK
A = {"role": "assistant", "content": "A cat."}


def img(ref):
    return MediaRef("image", ref)


def vid(ref):
    return MediaRef("video", ref)


def parsed(raw, mode="chat", policy=TurnPolicy()):
    return parse_record(json.dumps(raw).encode(), W, mode, policy, media=True)


def user(*parts):
    return {"messages": [{"role": "user", "content": list(parts)}, A]}


def refused(raw, mode="chat", media=True):
    with pytest.raises(RecordError) as e:
        parse_record(json.dumps(raw).encode(), W, mode, media=media)
    assert e.value.where == W and str(e.value) == f"{W}: {e.value.detail}"
    return e.value.reason, e.value.detail


# -- content parts -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("part, ref", [
    ({"type": "image_url", "image_url": {"url": "cat.png"}}, img("cat.png")),
    ({"type": "image_url", "image_url": {"url": "https://example.com/c.png", "detail": "high"}},
     img("https://example.com/c.png")),
    ({"type": "image_url", "image_url": "data:image/png;base64,iVBO"}, img("data:image/png;base64,iVBO")),
    ({"type": "image", "image": "photos/cat.jpg"}, img("photos/cat.jpg")),
    ({"type": "image", "url": "s3://bucket/cat.jpg"}, img("s3://bucket/cat.jpg")),
    ({"type": "image", "path": "/abs/cat.jpg"}, img("/abs/cat.jpg")),
    ({"type": "image", "base64": "iVBORw0KGgo="}, img("data:;base64,iVBORw0KGgo=")),
    ({"type": "image", "base64": "data:image/png;base64,iVBO"}, img("data:image/png;base64,iVBO")),
    ({"type": "image", "image": "a.png", "url": "a.png"}, img("a.png")),  # the same item twice is one
    ({"type": "image", "image": None, "url": "file:///x/a.png", "path": None, "text": None},  # a Parquet struct
     img("file:///x/a.png")),
    ({"type": "video", "video": "clips/a.mp4"}, vid("clips/a.mp4")),
    ({"type": "video", "url": "hf://datasets/o/n/a.mp4"}, vid("hf://datasets/o/n/a.mp4")),
    ({"type": "video", "path": "a.avi"}, vid("a.avi")),
    ({"type": "video_url", "video_url": {"url": "b.mp4"}}, vid("b.mp4")),
])
def test_each_media_part_spelling_is_one_item_where_it_stands(part, ref):
    c = parsed(user({"type": "text", "text": "What is "}, part, "this?"))
    assert c.turns == (Turn("user", f"What is {M}this?", media=(ref,)), Turn("assistant", "A cat."))
    assert c.repairs == () and c.given == ()


def test_items_keep_their_order_within_a_message_and_across_kinds():
    c = parsed(user({"type": "video", "video": "v.mp4"}, {"type": "text", "text": "then"},
                    {"type": "image_url", "image_url": {"url": "a.png"}}, {"type": "image", "image": "b.png"}))
    assert c.turns[0] == Turn("user", f"{M}then{M}{M}", media=(vid("v.mp4"), img("a.png"), img("b.png")))


def test_a_message_of_only_an_image_is_a_turn():
    c = parsed(user({"type": "image", "image": "a.png"}))
    assert c.turns[0] == Turn("user", M, media=(img("a.png"),)) and c.repairs == ()


def test_system_messages_hold_media_and_join_in_order():
    raw = {"system": "Top.", "messages": [
        {"role": "system", "content": [{"type": "image", "image": "logo.png"}, "Brand."]},
        {"role": "developer", "content": [{"type": "video", "video": "intro.mp4"}]},
        {"role": "user", "content": "Q"}, A]}
    c = parsed(raw)
    assert c.turns[0] == Turn("system", f"Top.\n\n{M}Brand.\n\n{M}", media=(img("logo.png"), vid("intro.mp4")))


def test_merged_user_turns_keep_their_media_in_order():
    raw = {"messages": [{"role": "user", "content": [{"type": "image", "image": "1.png"}, "first"]},
                        {"role": "user", "content": "  "},
                        {"role": "user", "content": ["second", {"type": "image", "image": "2.png"},
                                                     {"type": "video", "video": "3.mp4"}]}, A]}
    c = parsed(raw)
    assert c.turns[0] == Turn("user", f"{M}first\n\nsecond{M}{M}", media=(img("1.png"), img("2.png"), vid("3.mp4")))
    assert c.repairs == ("dropped_empty_turn", "merged_same_role")
    assert [t.media for t in c.given[:3]] == [(img("1.png"),), (img("2.png"), vid("3.mp4")), ()]


def test_a_tool_record_reads_media_in_its_user_messages():
    raw = {"tools": [{"name": "f"}], "messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "a.png"}}, "crop it"]},
        {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f",
                                                                                        "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "done"}, A]}
    c = parsed(raw, "tool")
    assert c.turns[0] == Turn("user", f"{M}crop it", media=(img("a.png"),))
    assert [t.media for t in c.turns[1:]] == [(), (), ()]


@pytest.mark.parametrize("part, message", [
    ({"type": "image", "image": ["a.png", "b.png"]}, "message 0 content part 1 is an 'image' part whose 'image' is "
     "a list, not a reference: give the image as its file's path or URL, a string (a data: URL for inline bytes), "
     "e.g. 'photos/cat.jpg'"),
    ({"type": "video", "video": ["f1.jpg", "f2.jpg"]}, "message 0 content part 1 is a 'video' part whose 'video' is "
     "a list (frames?), not a reference: give the video as its file's path or URL, a string (a data: URL for "
     "inline bytes), e.g. 'clips/intro.mp4'"),
    ({"type": "image", "image": {"bytes": None, "path": "a.png"}}, "message 0 content part 1 is an 'image' part "
     "whose 'image' is an object, not a reference: give the image as its file's path or URL, a string (a data: "
     "URL for inline bytes), e.g. 'photos/cat.jpg'"),
    ({"type": "image", "image": ""}, "message 0 content part 1 is an 'image' part whose 'image' is an empty "
     "string, not a reference: give the image as its file's path or URL, a string (a data: URL for inline bytes), "
     "e.g. 'photos/cat.jpg'"),
    ({"type": "image_url", "image_url": 7}, "message 0 content part 1 is an 'image_url' part whose 'image_url' is "
     "a number, not a reference: give the image as its file's path or URL, a string (a data: URL for inline "
     "bytes), e.g. 'photos/cat.jpg'"),
    ({"type": "video_url", "video_url": {"uri": "v.mp4"}}, "message 0 content part 1 is a 'video_url' part whose "
     "'video_url.url' is null, not a reference: give the video as its file's path or URL, a string (a data: URL "
     "for inline bytes), e.g. 'clips/intro.mp4'"),
    ({"type": "image", "image": "a.png", "path": "b.png"}, "message 0 content part 1 is an 'image' part giving "
     "'image' and 'path', different images; keep one"),
])
def test_a_part_naming_no_usable_reference_is_invalid_media(part, message):
    assert refused(user("Look: ", part)) == ("invalid_media", message)


def test_bytes_from_a_parquet_binary_field_are_named_as_bytes():
    raw = {"messages": [{"role": "user", "content": [{"type": "image", "image": b"\x89PNG"}]}, A]}
    with pytest.raises(RecordError) as e:
        parse_record(raw, W, media=True)
    assert (e.value.reason, e.value.detail) == (
        "invalid_media", "message 0 content part 0 is an 'image' part whose 'image' is bytes, not a reference: give "
        "the image as its file's path or URL, a string (a data: URL for inline bytes), e.g. 'photos/cat.jpg'")


@pytest.mark.parametrize("role, mode, article", [("assistant", "chat", "an"), ("tool", "tool", "a")])
def test_media_in_a_reply_or_a_tool_result_is_refused_by_name(role, mode, article):
    msgs = [{"role": "user", "content": "Q"}]
    if role == "tool":
        msgs.append({"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                                                          "function": {"name": "f", "arguments": {}}}]})
    msgs.append({"role": role, "content": ["Here: ", {"type": "image_url", "image_url": {"url": "out.png"}}]})
    if role == "tool":
        msgs.append(A)
    k = len(msgs) - (2 if role == "tool" else 1)
    assert refused({"messages": msgs}, mode) == ("media_in_reply", (
        f"message {k} content part 1 is an 'image_url' part in {article} {role} message; images and videos are "
        f"read in user and system messages only (a reply or tool result holds text): move it into the user message "
        f"before it, or drop it"))


# -- media lists: LLaMA-Factory's placeholders, TRL's bare parts ------------------------------------------------
def test_llamafactory_placeholders_take_the_list_in_order_over_the_messages():
    raw = {"messages": [{"role": "user", "content": "<image>Who are they?"},
                        {"role": "assistant", "content": "Kane and Gretzka."},
                        {"role": "user", "content": "What are they doing?<image>"},
                        {"role": "assistant", "content": "Celebrating."}],
           "images": ["demo/1.jpg", "demo/1.jpg"]}
    c = parsed(raw)
    assert c.turns == (Turn("user", f"{M}Who are they?", media=(img("demo/1.jpg"),)),
                       Turn("assistant", "Kane and Gretzka."),
                       Turn("user", f"What are they doing?{M}", media=(img("demo/1.jpg"),)),
                       Turn("assistant", "Celebrating."))


def test_sharegpt_records_with_images_and_videos_interleaved():
    raw = {"conversations": [{"from": "system", "value": "See <image>."},
                             {"from": "human", "value": "<video> and <image><image>?"},
                             {"from": "gpt", "value": "Both."}],
           "images": ["s.png", "a.png", "b.png"], "videos": ["v.mp4"]}
    c = parsed(raw)
    assert c.turns[:2] == (Turn("system", f"See {M}.", media=(img("s.png"),)),
                           Turn("user", f"{M} and {M}{M}?", media=(vid("v.mp4"), img("a.png"), img("b.png"))))


def test_a_llamafactory_tool_record_places_its_images_in_user_turns_only():
    raw = {"conversations": [{"from": "human", "value": "Crop <image> to the face."},
                             {"from": "function_call", "value": '{"name": "crop", "arguments": {"box": [1, 2]}}'},
                             {"from": "observation", "value": "cropped"},
                             {"from": "gpt", "value": "Done."}],
           "tools": '[{"name": "crop", "parameters": {"type": "object"}}]', "images": ["face.jpg"]}
    c = parsed(raw, "tool")
    assert [(t.role, t.text, t.media) for t in c.turns] == [
        ("user", f"Crop {M} to the face.", (img("face.jpg"),)), ("assistant", "", ()), ("tool", "cropped", ()),
        ("assistant", "Done.", ())]
    assert c.turns[1].tool_calls[0].arguments == {"box": [1, 2]}


def test_a_lone_string_is_a_list_of_one_and_placeholders_in_the_top_level_system_count():
    c = parsed({"system": "<video>", "messages": [{"role": "user", "content": "Q"}, A], "videos": "v.mp4"})
    assert c.turns[0] == Turn("system", M, media=(vid("v.mp4"),))


def test_placeholders_are_text_when_the_record_lists_no_media_of_their_kind():
    raw = {"messages": [{"role": "user", "content": "<image> and <video>"}, {"role": "assistant", "content": "<image>"}],
           "videos": ["v.mp4"]}
    c = parsed(raw)
    assert c.turns == (Turn("user", f"<image> and {M}", media=(vid("v.mp4"),)), Turn("assistant", "<image>"))
    no_list = {"messages": [{"role": "user", "content": "<image>"}, A], "images": None}
    assert parsed(no_list).turns[0] == Turn("user", "<image>")


def test_referenced_parts_and_placeholders_of_one_record_keep_their_places():
    raw = {"messages": [{"role": "user", "content": [{"type": "image", "image": "part.png"}, "then <image>"]}, A],
           "images": ["listed.png"]}
    assert parsed(raw).turns[0] == Turn("user", f"{M}then {M}", media=(img("part.png"), img("listed.png")))


def test_trl_bare_parts_take_the_list_and_leave_placeholder_text_alone():
    raw = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Is <image> a tag?"},
                                                     {"type": "image", "image": None}]},
                        A], "images": ["1.png", "2.png"]}
    assert parsed(raw).turns[0] == Turn("user", f"{M}Is <image> a tag?{M}", media=(img("1.png"), img("2.png")))


@pytest.mark.parametrize("raw, message", [
    ({"messages": [{"role": "user", "content": "Q"}, A], "images": ["a.png", "b.png"]},
     "'images' lists 2 images but the messages hold 0 <image> placeholders: put one <image> where each image "
     "stands (in a user or system message, in the order of the list), or list exactly one image per <image>"),
    ({"messages": [{"role": "user", "content": "<image><image>"}, A], "images": []},
     "'images' lists 0 images but the messages hold 2 <image> placeholders: put one <image> where each image "
     "stands (in a user or system message, in the order of the list), or list exactly one image per <image>"),
    ({"conversations": [{"from": "human", "value": "<video><video>"}, {"from": "gpt", "value": "a"}],
      "videos": ["v.mp4"]},
     "'videos' lists 1 video but the messages hold 2 <video> placeholders: put one <video> where each video "
     "stands (in a user or system message, in the order of the list), or list exactly one video per <video>"),
    ({"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "image"}]}, A], "images": ["a.png"]},
     "'images' lists 1 image but the messages hold 2 image parts naming no image ({\"type\": \"image\"}): give one "
     "such part per listed image, in the order of the list"),
])
def test_counts_that_differ_are_a_placeholder_mismatch_naming_both(raw, message):
    assert refused(raw) == ("media_placeholder_mismatch", message)


@pytest.mark.parametrize("raw, message", [
    ({"messages": [{"role": "user", "content": "<image>Q"}, {"role": "assistant", "content": "It is <image>."}],
      "images": ["a.png", "b.png"]},
     "message 1 is an assistant message holding <image>, a placeholder of the record's 'images'; images and videos "
     "are read in user and system messages only: move it into the user message before it, or remove it"),
    ({"conversations": [{"from": "human", "value": "Q"},
                        {"from": "function_call", "value": '{"name": "f", "arguments": {}}'},
                        {"from": "observation", "value": "<video>"}, {"from": "gpt", "value": "a"}],
      "videos": ["v.mp4"]},
     "message 2 is a tool message holding <video>, a placeholder of the record's 'videos'; images and videos are "
     "read in user and system messages only: move it into the user message before it, or remove it"),
])
def test_a_placeholder_in_a_reply_is_refused_by_name(raw, message):
    assert refused(raw, "tool") == ("media_in_reply", message)


@pytest.mark.parametrize("raw, reason, message", [
    ({"messages": [{"role": "user", "content": ["x", {"type": "image"}]}, A]}, "invalid_media",
     "message 0 has an 'image' part naming no image and the record has no 'images' list: give the part its image "
     "({\"type\": \"image\", \"image\": 'photos/cat.jpg'}), or list the record's images in 'images', in order"),
    ({"messages": [{"role": "user", "content": "<image>"}, A], "images": ["a.png", 3]}, "invalid_media",
     "'images' item 1 is a number, not a reference: give the image as its file's path or URL, a string (a data: "
     "URL for inline bytes), e.g. 'photos/cat.jpg'"),
    ({"messages": [{"role": "user", "content": "<video>"}, A], "videos": [["f1.jpg", "f2.jpg"]]}, "invalid_media",
     "'videos' item 0 is a list (frames?), not a reference: give the video as its file's path or URL, a string (a "
     "data: URL for inline bytes), e.g. 'clips/intro.mp4'"),
    ({"messages": [{"role": "user", "content": "<image>"}, A], "images": 1}, "invalid_media",
     "'images' is a number; give a list of image paths or URLs (strings), one per <image> in the messages"),
    ({"messages": [{"role": "user", "content": "<audio>"}, A], "audios": ["a.wav"]}, "non_text_content",
     "the record holds 'audios'; sftdata reads images and videos only (drop the audio, or the record)"),
])
def test_lists_and_bare_parts_that_cannot_be_read(raw, reason, message):
    assert refused(raw) == (reason, message)


# -- U+FFFC and callers that read no media --------------------------------------------------------------------
@pytest.mark.parametrize("raw, what", [
    ({"messages": [{"role": "user", "content": f"a{M}"}, A]}, "message 0 content"),
    ({"messages": [{"role": "user", "content": ["a", {"type": "text", "text": M}]}, A]}, "message 0 content part 1"),
    ({"messages": [{"role": "user", "content": [M]}, A]}, "message 0 content part 0"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": f"{M}"}]}, "message 1 content"),
    ({"messages": [{"role": "user", "content": "q"}, dict(A, reasoning_content=M)]}, "message 1 'reasoning_content'"),
    ({"messages": [{"role": "user", "content": "q"}, dict(A, content=None, refusal=M)]}, "message 1 'refusal'"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": [
        {"type": "thinking", "thinking": M}, "a"]}]}, "message 1 content part 0"),
    ({"system": M, "messages": [{"role": "user", "content": "q"}, A]}, "top-level 'system'"),
    ({"conversations": [{"from": "human", "value": "q"}, {"from": "function_call", "value": '{"name": "f", "arguments": {}}'},
                        {"from": "observation", "value": M}, {"from": "gpt", "value": "a"}]}, "message 2 content"),
])
@pytest.mark.parametrize("media", [True, False])
def test_the_mark_itself_in_any_text_is_a_reserved_character(raw, what, media):
    assert refused(raw, "tool", media) == ("reserved_character", f"{what} holds the character U+FFFC, which sftdata "
                                                                 f"uses to mark where an image or video stands; remove it")


def test_without_media_a_record_holding_media_is_refused_as_before_and_empty_lists_change_nothing():
    assert refused(user({"type": "image_url", "image_url": {"url": "a.png"}}), media=False) == (
        "non_text_content", "message 0 content part 0 is of type 'image_url'; only text parts are supported (drop or "
        "convert such parts)")
    assert refused({"messages": [{"role": "user", "content": "<image>"}, A], "images": ["a.png"]}, media=False) == (
        "non_text_content", "the record holds 'images', which this command does not read: images and videos are "
        "read by prepare-chat and prepare-tool, with a vision model's processor")
    empty = {"messages": [{"role": "user", "content": "Q"}, A], "images": [], "videos": None, "audios": []}
    assert parse_record(empty, W) == parse_record(empty, W, media=True) == parse_record(
        {"messages": empty["messages"]}, W)
    assert parse_record(empty, W).turns == (Turn("user", "Q"), Turn("assistant", "A cat."))
    null = {"messages": [{"role": "user", "content": "<image> is a tag"}, A], "images": None}
    assert parse_record(null, W).turns[0] == parse_record(null, W, media=True).turns[0] == Turn("user",
                                                                                                "<image> is a tag")


# -- every repair keeps one mark per item ---------------------------------------------------------------------
def _random_record(rng: random.Random) -> dict:
    parts = [lambda: {"type": "image", "image": f"{rng.randrange(9)}.png"}, lambda: "text ", lambda: "",
             lambda: {"type": "video_url", "video_url": {"url": "v.mp4"}}, lambda: "<image>", lambda: "  "]
    msgs = []
    for _ in range(rng.randint(1, 7)):
        role = rng.choice(["user", "user", "assistant", "assistant", "system", "human"])
        if role in ("user", "human", "system") and rng.random() < 0.7:
            content = [rng.choice(parts)() for _ in range(rng.randint(0, 4))]
        else:
            content = rng.choice(["a", "", "  ", "<think>r</think>a", "b"])
        m = {"role": role, "content": content}
        if role == "assistant" and rng.random() < 0.2:
            m["weight"] = 0
        msgs.append(m)
    rec: dict = {"messages": msgs}
    placeholders = sum(p.count("<image>") for m in msgs if m["role"] != "assistant" and isinstance(m["content"], list)
                       for p in m["content"] if isinstance(p, str))
    if placeholders or rng.random() < 0.2:
        rec["images"] = [f"l{k}.png" for k in range(placeholders + (rng.random() < 0.1))]
    return rec


@pytest.mark.parametrize("policy", [TurnPolicy(), TurnPolicy("drop", "last")])
def test_every_repair_keeps_one_mark_per_item_and_every_item(policy):
    rng = random.Random(5)
    kept = 0
    for _ in range(3000):
        rec = _random_record(rng)
        try:
            c = parse_record(rec, W, "chat", policy, media=True)
        except RecordError:
            continue
        kept += 1
        for t in c.turns + c.given:
            assert t.text.count(M) == len(t.media)
            assert all(m.ref for m in t.media) and (not t.media or t.role in ("user", "system"))
        given = [m for t in c.given_turns for m in t.media]
        assert [m for t in c.turns for m in t.media] == given  # nothing lost, nothing reordered
        from_list = [m.ref for m in given if m.ref.startswith("l")]
        assert from_list == rec.get("images", [])[:len(from_list)]  # in the list's order (a dropped tail aside)
    assert kept > 300

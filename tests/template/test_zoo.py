"""The template zoo: real chat templates of many model families (tests/helpers/zoo.py), each
checked against transformers' ``apply_chat_template`` on a chat, a tool-calling and a
reasoning record. Each record is either kept, every episode token-identical to
transformers' render of the record (or of its per-reply prefixes; plus the one stop token
appended after a last reply the template leaves unclosed) with trained tokens exactly the
assistant replies through their end-of-turn, or refused by name for what the template
cannot carry, which transformers' own render (or its refusal) confirms.

``OUTCOMES`` is the table the zoo gives; a change to it is a change of behaviour.
"""

from __future__ import annotations

import io
import os
import tarfile

import numpy as np
import pytest

from sftdata.errors import RecordError
from sftdata.records.conversation import parse_record
from sftdata.template import model_profile, records_episodes
from sftdata.tokenize.open import load_hf_tokenizer
from tests.helpers.zoo import (
    RECORDS,
    ZOO,
    ZOO_MEMBERS,
    ZOO_SDIST,
    extract_templates,
    fetch_zoo,
    reference_messages,
    zoo_folder,
    zoo_missing,
    zoo_model,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers", reason="transformers is not installed (the proof extra)")

EXACT, STOP = "exact", "exact+stop"  # token-identical; identical but for the appended stop token
# (template, record) -> outcome; templates not named give EXACT for every record. A reason
# code: the record is refused by name; "per-reply": its whole render rewrites an earlier
# reply, so it is served one episode per reply without an option (each flagged to train its
# last reply only), exact, as with --per-reply.
NO_TOOLS = "template_cannot_render_tools"
OUTCOMES = {
    ("hermes-3", "chat"): "template_error",  # its tool_use template renders nothing without tools
    ("hermes-3", "reasoning"): "template_error",
    ("qwen3", "reasoning"): "per-reply",  # it drops the reasoning of replies before the last user message
    ("glm-4.6", "reasoning"): "per-reply",
    ("minimax-m2", "reasoning"): "per-reply",
    ("gpt-oss", "reasoning"): "per-reply",  # it renders the reasoning of the last reply only (its analysis channel)
    ("gemma-2", "chat"): "template_cannot_render_system",  # "System role not supported"
    ("mistral-nemo", "chat"): "template_cannot_render_system",  # it prints the system text only before a last user turn
    ("gemma-2", "tool"): NO_TOOLS,  # roles must alternate: no tool role
    ("smollm3", "tool"): NO_TOOLS,  # these render an empty assistant turn for a call
    ("phi-3.5", "tool"): NO_TOOLS,
    ("granite-3.3", "tool"): NO_TOOLS,
    ("lfm2", "tool"): NO_TOOLS,
    ("deepseek-r1-qwen", "tool"): NO_TOOLS,  # it writes an empty assistant turn before tool outputs
}
RENDER_REASONING = {"qwen3", "glm-4.6", "minimax-m2", "gpt-oss"}  # the templates that render reasoning_content
APPEND_STOP = {"glm-4.6"}  # it ends a reply with the next role's token: the last reply gets EOS appended


def outcome(name: str, kind: str) -> str:
    return OUTCOMES.get((name, kind), STOP if name in APPEND_STOP else EXACT)


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    """Each zoo template's model folder, tokenizer, profiles and transformers tokenizer, made once."""
    made: dict = {}

    def get(name: str, per_reply: bool = False):
        key = (name, per_reply)
        if key not in made:
            model = zoo_model(tmp_path_factory.mktemp("zoo"), name)
            tok = load_hf_tokenizer(model.folder)
            profile = model_profile(tok, "model", model.entry.variables, per_reply=per_reply)
            made[key] = (model, tok, profile, transformers.AutoTokenizer.from_pretrained(str(model.folder)))
        return made[key]
    return get


def hf_ids(hf, messages, tools, variables) -> list[int]:
    return list(hf.apply_chat_template(messages, tools=tools, tokenize=True, return_dict=False, **variables))


def hf_text(hf, messages, tools, variables) -> str | None:
    try:
        return hf.apply_chat_template(messages, tools=tools, tokenize=False, **variables)
    except Exception:  # noqa: BLE001 - transformers raises the template's own errors as they come
        return None


def check_kept(result, record: dict, tok, profile, hf) -> str:
    """Every episode equals transformers' render (of the record, or of each per-reply
    prefix), and its trained tokens are the replies through their end-of-turn. Returns
    EXACT or STOP."""
    ignored = "reasoning_ignored_by_template" in result.counts
    messages, tools = reference_messages(record, profile.arguments, reasoning=not ignored)
    replies = [k for k, m in enumerate(messages) if m["role"] == "assistant"]
    stop_id = tok.token_id(profile.appended_stop) if profile.appended_stop else None
    stopped = set()
    for j, ep in enumerate(result.episodes):
        upto = messages if len(result.episodes) == 1 else messages[:replies[j] + 1]
        theirs = hf_ids(hf, upto, tools, profile.user_variables)
        ours = ep.ids.tolist()
        if stop_id is not None and ours == theirs + [stop_id]:
            stopped.add(j)
        else:
            assert ours == theirs
        trained = [k for k in replies if k < len(upto)] if len(result.episodes) == 1 else [replies[j]]
        mask = ep.mask.astype(bool)
        runs = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))).reshape(-1, 2).tolist()
        # a reply whose reasoning the template writes as a message of its own (gpt-oss's
        # analysis channel) is two runs, only a header between them
        for r in range(len(runs) - 1, 0, -1):
            if tok.decode(ep.ids[runs[r - 1][1]:runs[r][0]].tolist()) in profile.layout.header_texts:
                runs[r - 1:r + 1] = [[runs[r - 1][0], runs[r][1]]]
        assert len(runs) == len(trained), "one trained run per reply"
        for (a, b), k in zip(runs, trained):
            assert int(ep.ids[b - 1]) in profile.rule.end_ids, "each run ends with an end-of-turn token"
            text = tok.decode(ep.ids[a:b].tolist())
            m = messages[k]
            assert m["content"].strip() in text
            for call in m.get("tool_calls", ()):
                assert call["function"]["name"] in text
            if not ignored and m.get("reasoning_content"):
                assert m["reasoning_content"] in text
        trained_text = tok.decode(ep.ids[mask].tolist())
        for m in upto:
            if m["role"] in ("user", "system", "tool"):
                assert m["content"] not in trained_text, "no user, system or tool text is trained"
    return STOP if stopped else EXACT


def check_refused(reason: str, name: str, kind: str, record: dict, profile, hf) -> None:
    """transformers confirms the refusal: it fails on the record too, or its render lacks
    what the reason names."""
    messages, tools = reference_messages(record, profile.arguments)
    text = hf_text(hf, messages, tools, profile.user_variables)
    if reason == "template_error":
        assert text is None
    elif reason == "template_cannot_render_system":
        assert text is None or messages[0]["content"] not in text
    elif reason == "template_drops_tools":
        assert tools[0]["function"]["description"] not in text
    elif reason == NO_TOOLS and name != "deepseek-r1-qwen":
        assert text is None or messages[1]["tool_calls"][0]["function"]["name"] not in text.split(
            messages[0]["content"])[-1]


@pytest.mark.parametrize("kind", sorted(RECORDS))
@pytest.mark.parametrize("name", sorted(ZOO))
def test_each_zoo_template_renders_each_record_exactly_or_refuses_it_by_name(zoo, name, kind):
    model, tok, profile, hf = zoo(name)
    record = RECORDS[kind]
    (result,) = records_episodes([(parse_record(record, "r", "tool"), "r")], profile, tok, None)
    want = outcome(name, kind)
    if want == "per-reply":
        assert not isinstance(result, RecordError), result.detail
        for per_reply in (False, True):  # automatically, and with --per-reply: the same episodes
            _, tok, profile, hf = zoo(name, per_reply=per_reply)
            (result,) = records_episodes([(parse_record(record, "r", "tool"), "r")], profile, tok, None)
            assert not isinstance(result, RecordError), result.detail
            assert len(result.episodes) == 2 and result.per_reply
            assert result.automatic == (not profile.rule.last_reply_only)
            assert check_kept(result, record, tok, profile, hf) == (STOP if name in APPEND_STOP else EXACT)
        return
    if isinstance(result, RecordError):
        assert result.reason == want, result.detail
        check_refused(result.reason, name, kind, record, profile, hf)
        return
    assert check_kept(result, record, tok, profile, hf) == want
    ignored = result.counts.count("reasoning_ignored_by_template")
    assert ignored == (2 if kind == "reasoning" and name not in RENDER_REASONING else 0)


def test_prepare_tool_refuses_a_template_that_renders_no_tool_call(zoo):
    _, _, profile, _ = zoo("smollm3")
    assert not profile.renders_tool_calls and not profile.tools_supported
    assert zoo("qwen2.5")[2].renders_tool_calls


def _tarball(path, files: dict[str, bytes]):
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_the_zoo_is_the_sdist_s_own_templates_extracted_whole(tmp_path):
    """What a fresh clone's first zoo test does: the templates folder of llama-cpp-python's
    sdist, nothing else, made beside the target and renamed (never half there)."""
    sdist = _tarball(tmp_path / ZOO_SDIST, {
        f"{ZOO_MEMBERS}a.jinja": b"{{ messages }}",
        f"{ZOO_MEMBERS}b.jinja": b"{% for m in messages %}{{ m.content }}{% endfor %}",
        f"{ZOO_MEMBERS}README.md": b"not a template",
        f"{ZOO_MEMBERS}nested/c.jinja": b"below the folder",
        "llama_cpp_python-0.3.36/other/d.jinja": b"elsewhere"})
    assert extract_templates(sdist, tmp_path / "zoo" / "templates") == 2
    assert sorted(p.name for p in (tmp_path / "zoo").iterdir()) == ["templates"]
    assert {p.name: p.read_bytes() for p in (tmp_path / "zoo" / "templates").iterdir()} == \
        {"a.jinja": b"{{ messages }}", "b.jinja": b"{% for m in messages %}{{ m.content }}{% endfor %}"}
    # a second extraction (another session that found none) leaves the first one's folder as it is
    assert extract_templates(sdist, tmp_path / "zoo" / "templates") == 2
    assert sorted(p.name for p in (tmp_path / "zoo").iterdir()) == ["templates"]
    (sdist_root := tmp_path / "root" / "sdist").mkdir(parents=True)
    sdist.rename(sdist_root / ZOO_SDIST)  # fetch_zoo downloads only what is not there
    assert fetch_zoo(tmp_path / "root") == tmp_path / "root" / "templates"
    assert sorted(p.name for p in (tmp_path / "root" / "templates").iterdir()) == ["a.jinja", "b.jinja"]


def test_the_zoo_holds_every_template_the_tests_name():
    """The zoo's templates are here (fetched by the tests themselves on a fresh clone), each
    one ZOO names (offline: skipped with the reason, which fails a CI run)."""
    folder = zoo_folder()
    if folder is None:
        pytest.skip(zoo_missing())
    assert {f"{e.file}.jinja" for e in ZOO.values()} <= {p.name for p in folder.glob("*.jinja")}

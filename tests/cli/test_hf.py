"""A model's own tokenizer and chat template through every command, as a user runs them:
prepare -> verify -> pack -> verify -> loader -> inspect, for each preset with a tiny
tokenizer trained here, and with Meta Llama 3's own tokenizer.json; the tokens equal the
template's render and ``apply_chat_template``'s; bad inputs are clear errors."""

from __future__ import annotations

import json
import os
import re
import shutil

import numpy as np
import orjson
import pytest
from typer.testing import CliRunner

from sftdata.cli import app
from sftdata.loader import make_loader
from sftdata.order.config import LoaderConfig
from sftdata.records.conversation import parse_record
from sftdata.store import open_dataset
from sftdata.template import PRESETS, conversation_messages, model_profile, render_conversation, tool_schemas
from sftdata.tokenize.open import load_hf_tokenizer
from tests.helpers.data import chat, write_jsonl
from tests.helpers.templates import TOKENS, WEATHER_TOOL, llama3_folder, train_tokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")
runner = CliRunner()

RECORDS = [chat("Hi", "Hello!"), chat("What is 2+2?", "4.", "And 3+3?", "6.", system="Be brief."),
           chat("Name a colour", "Blue"), chat("Weather in Paris?", "It is 18C and sunny in Paris.")] * 3
TOOL_RECORDS = [{
    "tools": [WEATHER_TOOL],
    "messages": [{"role": "user", "content": "Weather in Paris?"},
                 {"role": "assistant", "content": None, "tool_calls": [
                     {"id": "c1", "type": "function", "function": {"name": "get_weather",
                                                                   "arguments": '{"city": "Paris"}'}}]},
                 {"role": "tool", "tool_call_id": "c1", "content": "18C"},
                 {"role": "assistant", "content": "It is 18C."}]}] * 6


def run(*args):
    r = runner.invoke(app, [str(a) for a in args])
    assert "Traceback" not in r.output
    return r


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("tok")
    out = {}
    for name, (specials, bos, eos, extra) in TOKENS.items():
        pad = {"chatml": "<|endoftext|>", "qwen3": "<|endoftext|>", "gemma": "<pad>", "mistral": "<unk>"}.get(name)
        out[name] = train_tokenizer(root / name, specials, bos, eos, extra, {"pad_token": pad} if pad else None)
    return out


def episodes(ds):
    sp = open_dataset(ds).split("train")
    return [tuple(np.asarray(a).tolist() for a in sp.episode(i)) for i in range(sp.num_episodes)]


def trained_runs(ids, mask):
    edges = np.flatnonzero(np.diff(np.concatenate([[0], mask, [0]])))
    return [ids[a:b] for a, b in zip(edges[::2], edges[1::2])]


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_each_preset_end_to_end(tmp_path, folders, preset):
    transformers = pytest.importorskip("transformers", reason="transformers is not installed (the proof extra)")
    folder = folders[preset]
    src = write_jsonl(tmp_path / "chats.jsonl", RECORDS)
    ds, packed = tmp_path / "ds", tmp_path / "packed"
    r = run("prepare-chat", src, "-o", ds, "--tokenizer", folder, "--chat-template", preset, "-j", "1", "--json")
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert summary["episodes"] == {"train": 12} and summary["rejected_total"] == 0
    assert summary["per_reply_records"] == 0 and summary["rule_mismatch"] == []
    state = orjson.loads((ds / "tokenizer_state.json").read_bytes())
    assert state["kind"] == "hf-tokenizers" and state["chat_template"]["name"] == preset
    assert state["mask_rule"]["kind"] == "template-headers"
    meta = orjson.loads((ds / "dataset_metadata.json").read_bytes())
    assert meta["token_dtype"] == "uint16" and meta["tokenizer"]["template"]["source"] == "preset"
    # the stored episodes are the template's render, token for token, and apply_chat_template's
    tok = load_hf_tokenizer(folder)
    profile = model_profile(tok, preset)
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    for (ids, mask), rec in zip(episodes(ds), RECORDS):
        conv = parse_record(rec, "t", "chat")
        ep = render_conversation(conv, profile, tok).episodes[0]
        assert ids == ep.ids.tolist() and mask == ep.mask.tolist()
        theirs = hf.apply_chat_template(conversation_messages(conv, profile.arguments), chat_template=PRESETS[preset],
                                        tokenize=True, return_dict=False)
        assert ids == list(theirs)
    assert run("verify", ds).exit_code == 0
    r = run("pack", ds, "-o", packed, "--block-size", "96")
    assert r.exit_code == 0, r.output
    r = run("verify", packed)
    assert r.exit_code == 0, r.output
    # the loader: rows with the dataset's mask; padded with the tokenizer's pad token
    for path in (ds, packed):
        loader = make_loader(LoaderConfig(batch_size=2, block_size=96, use_loss_mask=True), path, backend="numpy")
        batch = loader.get_batch("train")
        assert batch.x.shape == (2, 96) and 0 < batch.mask.sum() < batch.mask.size
        assert loader.vocab_size == tok.vocab_size == state["vocab_size"]
        assert loader.pad_id == (tok.pad_id if path == ds else state["pad_id"])
    r = run("inspect", ds, "--episode", "3")
    assert r.exit_code == 0, r.output
    # the reply is trained, through its end-of-turn token (Qwen3 writes an empty think block before it)
    eot = {"llama3": "<|eot_id|>", "chatml": "<|im_end|>", "qwen3": "<|im_end|>", "mistral": "</s>",
           "gemma": "<end_of_turn>"}[preset]
    assert re.search(r"⟦[^⟧]*It is 18C and sunny in Paris\." + re.escape(eot) + "⟧", r.output), r.output


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    """Meta Llama 3's tokenizer.json in a folder whose config carries the template."""
    folder = llama3_folder(tmp_path_factory.mktemp("l3") / "Llama-3-8B-Instruct", {
        "bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "chat_template": PRESETS["llama3"]})
    src = write_jsonl(tmp_path_factory.mktemp("in") / "chats.jsonl", RECORDS)
    ds = tmp_path_factory.mktemp("ds") / "llama"
    # Llama 3 names no pad token: its first reserved special token pads, never its EOS <|eot_id|>
    r = run("prepare-chat", src, "-o", ds, "--tokenizer", folder, "-j", "1", "--val-split", "0.25")
    assert r.exit_code == 0, r.output
    return folder, ds


def test_llama3_pads_with_a_reserved_token_and_a_pad_named_as_its_terminator_is_warned(llama, tmp_path):
    folder, ds = llama
    state = orjson.loads((ds / "tokenizer_state.json").read_bytes())
    serving = orjson.loads((ds / "serving.json").read_bytes())
    assert (state["pad_id"], serving["pad_id"], serving["pad_string"], serving["stop_ids"]) == (
        128002, 128002, "<|reserved_special_token_0|>", [128009])
    cfg = orjson.loads((folder / "tokenizer_config.json").read_bytes())
    eot = llama3_folder(tmp_path / "eot-pad", {**cfg, "pad_token": "<|eot_id|>"})
    src = write_jsonl(tmp_path / "in.jsonl", RECORDS)
    r = run("prepare-chat", src, "-o", tmp_path / "warned", "--tokenizer", eot, "-j", "1")
    assert r.exit_code == 0 and "warning: the pad id 128009 (<|eot_id|>) is also the end-of-turn token" in r.output
    assert "--allow-pad-as-stop silences this warning" in r.output
    r = run("prepare-chat", src, "-o", tmp_path / "accepted", "--tokenizer", eot, "-j", "1", "--allow-pad-as-stop")
    assert r.exit_code == 0, r.output
    assert orjson.loads((tmp_path / "accepted" / "serving.json").read_bytes())["pad_is_stop"] is True


def test_llama3_folder_uses_its_own_template_one_bos_uint32(llama):
    transformers = pytest.importorskip("transformers", reason="transformers is not installed (the proof extra)")
    folder, ds = llama
    meta = orjson.loads((ds / "dataset_metadata.json").read_bytes())
    assert meta["token_dtype"] == "uint32" and meta["tokenizer"]["template"]["name"] == "model"
    assert meta["tokenizer"]["vocab_size"] == 128256 and meta["options"]["tokenizer"] == str(folder / "tokenizer.json")
    ids, mask = episodes(ds)[0]
    assert ids[0] == 128000 and ids.count(128000) == 1  # exactly the BOS the template writes
    hf = transformers.AutoTokenizer.from_pretrained(str(folder))
    src = RECORDS[int(open_dataset(ds).split("train").sources[0])]
    assert ids == list(hf.apply_chat_template(src["messages"], tokenize=True, return_dict=False))
    # each reply through <|eot_id|> (128009), never the header <|start_header_id|> assistant <|end_header_id|> \n\n
    assert all(run_[-1] == 128009 for run_ in trained_runs(np.array(ids), np.array(mask)))
    r = run("verify", ds)
    assert r.exit_code == 0 and "ok" in r.output


def test_llama3_pack_verify_loader_train_replay_inspect(llama, tmp_path):
    torch = pytest.importorskip("torch")  # noqa: F841
    import train

    folder, ds = llama
    packed = tmp_path / "packed"
    assert run("pack", ds, "-o", packed, "--block-size", "64", "--strategy", "stream").exit_code == 0
    r = run("verify", packed)
    assert r.exit_code == 0, r.output
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"batch_size": 2, "block_size": 32, "n_layer": 1, "n_head": 1, "n_embd": 8,
                               "max_iters": 2, "eval_interval": 0, "checkpoint_interval": 0, "use_loss_mask": True}))
    lines = []
    res = train.run(train.parse_args(["--dataset", str(ds), "--config", str(cfg), "--out-dir", str(tmp_path / "o"),
                                      "--no-audit"]), env={}, log=lines.append)
    assert res.steps == [1, 2] and "vocab 128,256" in lines[0]
    r = run("replay-order", ds, "--config", cfg, "--step", "1")
    assert r.exit_code == 0, r.output
    r = run("inspect", ds, "--episode", "0", "--tokens")
    assert r.exit_code == 0 and "<|start_header_id|>" in r.output and "header" in r.output
    r = run("inspect", packed, "--row", "0")
    assert r.exit_code == 0 and "⟦" in r.output
    for path in (ds, packed):  # the HTML page decodes with the model's tokenizer, compared with its rule
        pytest.importorskip("plotly", reason="the report extra (plotly) is not installed")
        r = run("report", path, "-o", tmp_path / "r.html", "--sample", "12")
        assert r.exit_code == 0, r.output
        page = (tmp_path / "r.html").read_text(encoding="utf-8")
        assert "&lt;|eot_id|&gt;" in page and " colour" in page


def test_a_template_dataset_without_the_mask_trains_real_targets_only(llama):
    """No EOS ends a template's episode (<|eot_id|> ends every turn): rows carry a mask of
    the real targets instead of relying on an end id."""
    _, ds = llama
    loader = make_loader(LoaderConfig(batch_size=2, block_size=64, use_loss_mask=False), ds, backend="numpy")
    assert loader.end_id is None and loader.pad_id == 128002
    b = loader.get_batch("train")
    lengths = open_dataset(ds).split("train").lengths
    ids = loader.batch_ids("train", 0)
    assert b.mask.sum(axis=1).tolist() == [min(int(lengths[i]), 65) - 1 for i in ids]
    with_pad = make_loader(LoaderConfig(batch_size=2, block_size=64, pad_token_id=0), ds, backend="numpy")
    assert with_pad.pad_id == 0


def test_prepare_tool_with_a_template_file(tmp_path, folders):
    template = tmp_path / "my_template.jinja"
    template.write_text(PRESETS["chatml"], encoding="utf-8")
    src = write_jsonl(tmp_path / "tools.jsonl", TOOL_RECORDS)
    ds = tmp_path / "t"
    r = run("prepare-tool", src, "-o", ds, "--tokenizer", folders["chatml"], "--chat-template", template, "-j", "1")
    assert r.exit_code == 0, r.output
    state = orjson.loads((ds / "tokenizer_state.json").read_bytes())
    assert state["chat_template"]["source"] == "file" and state["tool_arguments"]["style"] == "dict"
    assert run("verify", ds).exit_code == 0
    tok = load_hf_tokenizer(folders["chatml"])
    ids, mask = episodes(ds)[0]
    texts = [tok.decode(t) for t in trained_runs(np.array(ids), np.array(mask))]
    assert texts == ['<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>',
                     "It is 18C.<|im_end|>"]
    conv = parse_record(TOOL_RECORDS[0], "t", "tool")
    profile = model_profile(tok, str(template))
    assert tool_schemas(conv) == [WEATHER_TOOL] and ids == render_conversation(conv, profile, tok).episodes[0].ids.tolist()


def test_workers_give_the_same_bytes(tmp_path, folders):
    src = write_jsonl(tmp_path / "chats.jsonl", RECORDS * 50)
    for j in ("1", "2"):
        r = run("prepare-chat", src, "-o", tmp_path / j, "--tokenizer", folders["llama3"], "--chat-template", "llama3",
                "-j", j, "-q")
        assert r.exit_code == 0, r.output
    for name in ("tokens.bin", "mask.bin", "episodes.idx", "sources.idx"):
        a, b = (tmp_path / j / "train" / "shard_00000" / name for j in ("1", "2"))
        assert a.read_bytes() == b.read_bytes()


def test_a_tampered_mask_is_caught(tmp_path, llama):
    _, ds = llama
    bad = tmp_path / "bad"
    shutil.copytree(ds, bad)
    mask_file = bad / "train" / "shard_00000" / "mask.bin"
    m = np.fromfile(mask_file, dtype=np.uint8)
    ids = np.fromfile(bad / "train" / "shard_00000" / "tokens.bin", dtype="<u4")
    p = int(np.flatnonzero(ids == 78191)[0])  # "assistant" in the first assistant header
    m[p] = 1
    m.tofile(mask_file)
    r = run("verify", bad, "--quick")
    assert r.exit_code == 1
    assert (f"the mask of episode 0 trains 1 token(s) the mask rule leaves untrained (first: token {p}, in an "
            "assistant header)") in " ".join(r.output.split())


def test_verify_skips_the_hash_of_a_moved_tokenizer_and_refuses_a_changed_one(tmp_path, folders):
    folder = tmp_path / "tok"
    shutil.copytree(folders["gemma"], folder)
    src = write_jsonl(tmp_path / "chats.jsonl", RECORDS)
    ds = tmp_path / "ds"
    assert run("prepare-chat", src, "-o", ds, "--tokenizer", folder, "--chat-template", "gemma", "-q").exit_code == 0
    data = (folder / "tokenizer.json").read_bytes()
    (folder / "tokenizer.json").write_bytes(data + b"\n")
    r = run("verify", ds)
    assert r.exit_code == 1 and "token ids would mean other text" in " ".join(r.output.split())
    shutil.move(folder, tmp_path / "moved")
    r = run("verify", ds)
    assert r.exit_code == 0, r.output
    assert "skipped (tokenizer file not here)" in r.output
    r = run("inspect", ds, "--episode", "0")
    assert r.exit_code == 1 and "is gone; pass the tokenizer.json" in " ".join(r.output.split())
    (tmp_path / "moved" / "tokenizer.json").write_bytes(data)
    r = run("inspect", ds, "--episode", "0", "--tokenizer", tmp_path / "moved")
    assert r.exit_code == 0 and "⟦Hello!<end_of_turn>" in r.output


def test_rule_mismatch_is_rejected_by_name_and_per_reply_records_counted(tmp_path, folders):
    """A reply that opens with blank lines merges with ChatML's header newline: the token ids
    no longer show the header, so the rule cannot re-derive its mask; it is rejected and
    named. Mistral's template gives a leading assistant message no header: that message is
    dropped (a counted repair), and the rest rendered exactly."""
    blank = chat("Hi", "\n\nHello.")
    src = write_jsonl(tmp_path / "in.jsonl", [chat("Hi", "Hello!"), blank, chat("Bye", "Bye!")])
    ds = tmp_path / "ds"
    r = run("prepare-chat", src, "-o", ds, "--tokenizer", folders["chatml"], "--chat-template", "chatml", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["rejected"] == {"rule_mismatch": 1} and out["episodes"] == {"train": 2}
    assert out["rule_mismatch"] == [{"record": 1, "where": f"{src}:line 2"}]
    assert orjson.loads((ds / "dataset_metadata.json").read_bytes())["rule_mismatch"] == out["rule_mismatch"]
    reject = orjson.loads((ds / "rejects.jsonl").read_bytes().splitlines()[0])
    assert reject["reason"] == "rule_mismatch" and reject["message"] == (
        "token 11 ('\\n\\n'): the template's render trains it, the mask rule learned from chat template chatml does "
        "not; verify and pack re-derive masks with that rule, so this record cannot be proven and is not written; the "
        "reply opens with whitespace that the tokenizer joins with the end of the assistant header into one token, so "
        "the header is not in the token ids: remove the reply's leading whitespace in the record")
    lead = {"messages": [{"role": "assistant", "content": "Welcome."}, {"role": "user", "content": "Hi"},
                         {"role": "assistant", "content": "Hello!"}]}
    src = write_jsonl(tmp_path / "lead.jsonl", [chat("Hi", "Hello!"), lead])
    r = run("prepare-chat", src, "-o", tmp_path / "m", "--tokenizer", folders["mistral"], "--chat-template", "mistral",
            "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["rejected"] == {} and out["repaired"] == {"dropped_leading_assistant": 1, "leading_assistant_untrained": 1}
    ids = episodes(tmp_path / "m")[1][0]
    assert ids == episodes(tmp_path / "m")[0][0]  # the record without its leading message: the first one
    # a template that replaces earlier replies: every record one episode per reply, and they verify
    drops = tmp_path / "drops.jinja"
    drops.write_text(
        "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' }}"
        "{%- if m.role == 'assistant' and not loop.last %}{{- '(earlier reply)' }}{%- else %}{{- m.content }}"
        "{%- endif %}{{- '<|im_end|>\\n' }}{%- endfor %}"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}", encoding="utf-8")
    src = write_jsonl(tmp_path / "two.jsonl", [chat("Hi", "Hello!", "And?", "Bye.")] * 3)
    r = run("prepare-chat", src, "-o", tmp_path / "pr", "--tokenizer", folders["chatml"], "--chat-template", drops,
            "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert (out["per_reply_records"], out["per_reply_episodes"], out["episodes"]) == (3, 6, {"train": 6})
    assert run("verify", tmp_path / "pr").exit_code == 0
    r = run("prepare-chat", src, "-o", tmp_path / "pr2", "--tokenizer", folders["chatml"], "--chat-template", drops)
    assert "one episode per reply" in r.output and "3 records, 6 episodes" in r.output
    # such a rule trains each episode's last reply: pack never cuts its episodes
    assert orjson.loads((tmp_path / "pr" / "tokenizer_state.json").read_bytes())["mask_rule"]["last_reply_only"]
    r = run("pack", tmp_path / "pr", "-o", tmp_path / "p1", "--strategy", "stream", "--block-size", "64")
    assert r.exit_code == 2 and "trains only the last reply of each episode, and stream packing cuts episodes" in \
        " ".join(r.output.split())
    r = run("pack", tmp_path / "pr", "-o", tmp_path / "p2", "--block-size", "8")
    assert r.exit_code == 2 and "Use --overlong drop, or a --block-size of at least" in " ".join(r.output.split())
    r = run("pack", tmp_path / "pr", "-o", tmp_path / "p3", "--block-size", "64")
    assert r.exit_code == 0, r.output
    assert run("verify", tmp_path / "p3").exit_code == 0


def test_bad_inputs_are_clear_errors(tmp_path, folders):
    src = write_jsonl(tmp_path / "in.jsonl", [chat("Hi", "Hello!"), chat("boom", "x")])
    out = tmp_path / "ds"
    # a template that raises on a record: that record is a counted rejection
    raising = tmp_path / "raising.jinja"
    raising.write_text(PRESETS["chatml"].replace(
        "{%- for message in messages %}",
        "{%- for message in messages %}{%- if message.content == 'boom' %}{{- raise_exception('no booms') }}"
        "{%- endif %}", 1), encoding="utf-8")
    assert "{%- for message in messages %}" in PRESETS["chatml"]
    r = run("prepare-chat", src, "-o", out, "--tokenizer", folders["chatml"], "--chat-template", raising, "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["rejected"] == {"template_error": 1}
    line = orjson.loads((out / "rejects.jsonl").read_bytes())
    assert line["message"] == ("chat template raising.jinja refused the conversation: no booms. Fix the record so "
                               "that the template accepts it, or use a template that does (--chat-template)")
    # a template with no assistant output: an error naming the template
    silent = tmp_path / "silent.jinja"
    silent.write_text("{%- for m in messages %}{%- if m.role != 'assistant' %}{{ m.content }}<|im_end|>{%- endif %}"
                      "{%- endfor %}", encoding="utf-8")
    r = run("prepare-chat", src, "-o", tmp_path / "s", "--tokenizer", folders["chatml"], "--chat-template", silent)
    assert r.exit_code == 1
    assert "error: chat template silent.jinja renders no assistant reply's text in a probe conversation" in \
        " ".join(r.output.split())
    # a tokenizer.json that is not one
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "tokenizer.json").write_text('{"version": "1.0"}')
    r = run("prepare-chat", src, "-o", tmp_path / "b", "--tokenizer", tmp_path / "bad")
    assert r.exit_code == 1
    assert "is not a Hugging Face tokenizer.json (no 'model' with a 'type'; keys: version)" in r.output.replace("\n", "")
    # --chat-template without a model's tokenizer: a usage error
    r = run("prepare-chat", src, "-o", tmp_path / "c", "--chat-template", "llama3")
    assert r.exit_code == 2
    assert ("--chat-template llama3 needs a model's own tokenizer: --tokenizer path/to/tokenizer.json, the model "
            "folder holding it, or a Hub model id (org/name)") in " ".join(r.output.split())
    # a tokenizer that ships no template, and no --chat-template: names the presets
    r = run("prepare-chat", src, "-o", tmp_path / "d", "--tokenizer", folders["gemma"])
    assert r.exit_code == 1
    assert "ships no chat template; pass --chat-template with a preset (chatml, gemma, llama3, mistral, qwen3) or a " \
           ".jinja file" in " ".join(r.output.split())
    assert not any((tmp_path / d).exists() for d in ("s", "b", "c", "d"))


def test_max_tokens_with_a_template(tmp_path, folders):
    long = chat("Hi", "Hello!", "Tell me more " * 20, "Sure " * 30)
    src = write_jsonl(tmp_path / "in.jsonl", [long, chat("What is the weather in Paris? " * 10, "x")])
    r = run("prepare-chat", src, "-o", tmp_path / "ds", "--tokenizer", folders["llama3"], "--chat-template", "llama3",
            "--max-tokens", "40", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["rejected"] == {"too_long": 1} and out["records_truncated"] == 1 and out["pairs_dropped"] == 1
    tok = load_hf_tokenizer(folders["llama3"])
    ids, _ = episodes(tmp_path / "ds")[0]
    assert tok.decode(ids).endswith("<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>")
    assert run("verify", tmp_path / "ds").exit_code == 0


def test_reasoning_and_train_on_with_a_template(tmp_path, folders):
    """Reasoning goes to the template as reasoning_content. Qwen3 renders it for replies after
    the last user message only: a record whose earlier reply has reasoning is served one
    episode per reply without an option (per_reply_automatic), as --per-reply serves every
    record, each reply the last of its episode, its reasoning rendered and trained;
    --reasoning last keeps one episode. --train-on last
    trains each record's last reply, and its rule says so; a weight-0 turn cannot be told
    by a template's rule."""
    think = {"messages": [{"role": "user", "content": "2+2?"},
                          {"role": "assistant", "content": "4.", "reasoning_content": "add them"},
                          {"role": "user", "content": "3+3?"},
                          {"role": "assistant", "content": "6.", "reasoning_content": "add again"}]}
    src = write_jsonl(tmp_path / "think.jsonl", [think] * 3)
    tok = load_hf_tokenizer(folders["qwen3"])
    for option, automatic in (((), 3), (("--per-reply",), 0)):
        r = run("prepare-chat", src, "-o", tmp_path / "q", "--tokenizer", folders["qwen3"], "--chat-template", "qwen3",
                *option, "--json", "--overwrite")
        assert r.exit_code == 0, r.output
        out = json.loads(r.stdout)
        assert out["turns"]["reasoning_kept"] == 6 and out["episodes"] == {"train": 6}
        assert (out["per_reply_records"], out["per_reply_automatic"]) == (3, automatic)
        assert [[tok.decode(t) for t in trained_runs(np.array(ids), np.array(mask))] for ids, mask in
                episodes(tmp_path / "q")[:2]] == [["<think>\nadd them\n</think>\n\n4.<|im_end|>"],
                                                   ["<think>\nadd again\n</think>\n\n6.<|im_end|>"]]
        assert run("verify", tmp_path / "q").exit_code == 0
    r = run("prepare-chat", src, "-o", tmp_path / "q1", "--tokenizer", folders["qwen3"], "--chat-template", "qwen3",
            "--reasoning", "last", "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["episodes"] == {"train": 3} and out["turns"]["reasoning_dropped"] == 3
    r = run("prepare-chat", src, "-o", tmp_path / "last", "--tokenizer", folders["llama3"], "--chat-template",
            "llama3", "--train-on", "last", "--reasoning", "drop")
    assert r.exit_code == 0, r.output
    state = orjson.loads((tmp_path / "last" / "tokenizer_state.json").read_bytes())
    assert state["mask_rule"]["last_reply_only"] is True
    tok = load_hf_tokenizer(folders["llama3"])
    ids, mask = episodes(tmp_path / "last")[0]
    assert [tok.decode(t) for t in trained_runs(np.array(ids), np.array(mask))] == ["6.<|eot_id|>"]
    assert "<|start_header_id|>assistant<|end_header_id|>\n\n4.<|eot_id|>" in tok.decode(ids)  # context
    assert run("verify", tmp_path / "last").exit_code == 0
    weight0 = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "x", "weight": 0},
                            {"role": "user", "content": "Again"}, {"role": "assistant", "content": "Hello!"}]}
    src = write_jsonl(tmp_path / "w.jsonl", [weight0, chat("Hi", "Hello!")])
    r = run("prepare-chat", src, "-o", tmp_path / "w", "--tokenizer", folders["llama3"], "--chat-template", "llama3",
            "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["rejected"] == {"untrained_turn": 1}
    line = orjson.loads((tmp_path / "w" / "rejects.jsonl").read_bytes())
    assert line["message"].startswith("assistant message 1 is context (weight 0 or train false), but a chat "
                                      "template's mask rule finds every reply by its header")

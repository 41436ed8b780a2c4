"""prepare-pref / prepare-rl: the pair layout on disk, exact ids and masks, truncation, KTO
labels, RL columns, and verify re-deriving every row."""

from __future__ import annotations

import json

import numpy as np
import orjson
import pytest

from sftdata.chat.tokenizer import open_tokenizer
from sftdata.errors import AllRecordsRejectedError, UsageError
from sftdata.pref import PrefOptions, Truncation
from sftdata.prepare import prepare_pref
from tests.helpers.data import write_jsonl
from tests.helpers.pairs import verify_every_row

U = {"role": "user", "content": "What color is the sky?"}
PAIR = {"prompt": [U], "chosen": [{"role": "assistant", "content": "It is blue."}],
        "rejected": [{"role": "assistant", "content": "It is green, surely."}]}


def _shard(ds, split="train"):
    d = ds / split / "shard_00000"
    ids = np.fromfile(d / "tokens.bin", dtype=np.uint32 if (ds / "x").exists() else
                      np.dtype(json.loads((ds / "dataset_metadata.json").read_text())["token_dtype"]))
    mask = np.fromfile(d / "mask.bin", dtype=np.uint8)
    idx = np.fromfile(d / "episodes.idx", dtype="<u8").reshape(-1, 2)
    src = np.fromfile(d / "sources.idx", dtype="<u8")
    return d, ids, mask, idx, src


def test_a_pair_is_the_prompt_once_then_both_completions_with_sftdatas_markers(tmp_path):
    inp = write_jsonl(tmp_path / "pairs.jsonl", [PAIR, {"bad": 1}, PAIR])
    s = prepare_pref([inp], tmp_path / "ds", PrefOptions())
    assert (s.kind, s.rows, s.rejected, s.forms) == ("pairs", {"train": 2}, {"not_preference_record": 1}, {"trl": 2})
    meta = json.loads((tmp_path / "ds" / "dataset_metadata.json").read_text())
    assert (meta["format_version"], meta["kind"], meta["pairs"], meta["entries_per_row"]) == (2, "pairs", {"train": 2}, 3)
    _, ids, mask, idx, src = _shard(tmp_path / "ds")
    tok = open_tokenizer(None, "auto")
    m = tok.ids
    prompt = [m.user, *tok.encode("What color is the sky?"), m.end, m.assistant]
    chosen = [*tok.encode("It is blue."), m.end, m.eos]
    rejected = [*tok.encode("It is green, surely."), m.end, m.eos]
    one = prompt + chosen + rejected
    assert ids.tolist() == one + one
    assert idx.tolist() == [[0, len(prompt)], [len(prompt), len(chosen)], [len(prompt) + len(chosen), len(rejected)],
                            [len(one), len(prompt)], [len(one) + len(prompt), len(chosen)],
                            [len(one) + len(prompt) + len(chosen), len(rejected)]]
    assert src.tolist() == [0, 2]  # one input record number per pair
    # trained: each completion through its <|END|>, never the prompt, never EOS
    want = [0] * len(prompt) + [1] * (len(chosen) - 1) + [0] + [1] * (len(rejected) - 1) + [0]
    assert mask.tolist() == want + want
    assert verify_every_row(tmp_path / "ds").ok


def test_under_a_model_template_the_prompt_is_the_render_with_the_generation_prompt(tmp_path):
    pytest.importorskip("tokenizers")
    from sftdata.template import PRESETS
    from tests.helpers.templates import TOKENS, train_tokenizer

    specials, bos, eos, extra = TOKENS["chatml"]
    folder = train_tokenizer(tmp_path / "chatml", specials, bos, eos, extra, {"chat_template": PRESETS["chatml"],
                                                                                  "pad_token": "<|endoftext|>"})
    inp = write_jsonl(tmp_path / "pairs.jsonl", [PAIR])
    prepare_pref([inp], tmp_path / "ds", PrefOptions(tokenizer=str(folder)))
    from sftdata.tokenize.open import load_hf_tokenizer

    tok = load_hf_tokenizer(folder)
    text = "<|im_start|>user\nWhat color is the sky?<|im_end|>\n<|im_start|>assistant\n"
    prompt = tok.encode_rendered(text).ids.tolist()
    whole = tok.encode_rendered(text + "It is blue.<|im_end|>\n").ids.tolist()
    _, ids, mask, idx, _ = _shard(tmp_path / "ds")
    p, c = int(idx[0, 1]), int(idx[1, 1])  # Python ints: NumPy 1.x turns uint64 - int into float64
    assert ids[:p].tolist() == prompt and ids[p:p + c].tolist() == whole[len(prompt):]
    im_end = tok.special_tokens["<|im_end|>"]
    # trained through <|im_end|>, the newline after it not
    assert mask[p:p + c].tolist() == [1] * (c - 2) + [1, 0] and ids[p + c - 2] == im_end
    assert verify_every_row(tmp_path / "ds").ok


def test_a_prompt_the_template_renders_differently_alone_is_rejected_by_name(tmp_path):
    """The trl#6960 kind: the generation prompt opens a think block the whole render lacks,
    so prompt + chosen does not begin with the prompt; TRL cuts the prompt short silently."""
    pytest.importorskip("tokenizers")
    from tests.helpers.templates import TOKENS, train_tokenizer

    template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}")
    specials, bos, eos, extra = TOKENS["qwen3"]
    folder = train_tokenizer(tmp_path / "q", specials, bos, eos, extra, {"chat_template": template,
                                                                              "pad_token": "<|endoftext|>"})
    inp = write_jsonl(tmp_path / "pairs.jsonl", [PAIR])
    with pytest.raises(AllRecordsRejectedError) as e:
        prepare_pref([inp], tmp_path / "ds", PrefOptions(tokenizer=str(folder)))
    line = orjson.loads(open(e.value.rejects_path, "rb").readline())
    assert line["reason"] == "prompt_not_prefix"
    assert line["message"].startswith("the chosen render does not begin with the prompt rendered alone with the "
                                      "generation prompt: token ")


def test_one_budget_cuts_both_completions_and_a_pair_is_never_emptied(tmp_path):
    long = {"prompt": [U], "chosen": [{"role": "assistant", "content": "blue " * 40}],
            "rejected": [{"role": "assistant", "content": "green " * 40}]}
    inp = write_jsonl(tmp_path / "pairs.jsonl", [long, PAIR])
    s = prepare_pref([inp], tmp_path / "ds", PrefOptions(truncation=Truncation(max_length=20)))
    assert s.truncated == {"prompts_cut": 0, "completions_cut": 1} and s.rows == {"train": 2}
    _, ids, mask, idx, _ = _shard(tmp_path / "ds")
    assert idx[:3, 1].tolist() == [9, 11, 11]  # prompt 9 tokens; both completions cut to the same 11
    assert mask[9:31].all()  # a cut completion is trained to its end
    assert verify_every_row(tmp_path / "ds").ok
    s = prepare_pref([inp], tmp_path / "drop", PrefOptions(truncation=Truncation(max_length=20, policy="drop")))
    assert s.rejected == {"too_long": 1} and s.rows == {"train": 1}


def test_truncation_options_are_checked():
    with pytest.raises(UsageError, match="--max-prompt-length 10 leaves no token of --max-length 10"):
        PrefOptions(truncation=Truncation(10, 10)).validate()
    with pytest.raises(UsageError, match="--truncation must be one of keep-end, keep-start, drop, got 'middle'"):
        PrefOptions(truncation=Truncation(policy="middle")).validate()


def test_kto_rows_carry_their_labels(tmp_path):
    rows = [{"prompt": [U], "completion": [{"role": "assistant", "content": "Blue."}], "label": True},
            {"messages": [U, {"role": "assistant", "content": "Green."}], "label": False}]
    inp = write_jsonl(tmp_path / "kto.jsonl", rows)
    s = prepare_pref([inp], tmp_path / "ds", PrefOptions())
    assert (s.kind, s.labels) == ("kto", {"desirable": 1, "undesirable": 1})
    d, _, _, idx, src = _shard(tmp_path / "ds")
    assert np.fromfile(d / "labels.bin", dtype=np.uint8).tolist() == [1, 0] and idx.shape == (4, 2)
    assert src.tolist() == [0, 1]
    assert verify_every_row(tmp_path / "ds").ok


def test_rl_prompts_keep_every_other_column_byte_exact(tmp_path):
    inp = tmp_path / "rl.jsonl"
    inp.write_bytes(b'{"prompt": "2+2?", "answer": 4.00, "meta": {"id": "q1",  "tags": ["x"]}}\n'
                    b'{"prompt": "' + b"word " * 200 + b'", "answer": 1}\n')
    s = prepare_pref([inp], tmp_path / "ds", PrefOptions(truncation=Truncation(None, 100, "drop")), rl=True)
    assert (s.kind, s.rows, s.rejected) == ("prompts", {"train": 1}, {"prompt_too_long": 1})
    d, ids, mask, idx, src = _shard(tmp_path / "ds")
    m = open_tokenizer(None, "auto").ids
    assert ids.tolist()[-1] == m.assistant and not mask.any() and idx.shape == (1, 2)
    line = (d / "columns.jsonl").read_bytes()
    assert line == b'{"row": 0, "record": 0, "columns": {"answer": "4.00", "meta": "{\\"id\\": \\"q1\\",  ' \
                   b'\\"tags\\": [\\"x\\"]}"}}\n'
    assert verify_every_row(tmp_path / "ds").ok


def test_exact_duplicates_and_contaminated_pairs_are_dropped_in_input_order(tmp_path):
    other = {**PAIR, "rejected": [{"role": "assistant", "content": "Purple, with the rings of saturn in view tonight."}]}
    spaced = {**PAIR, "prompt": [{"role": "user", "content": "What  color is the sky?"}]}  # whitespace aside: the same
    inp = write_jsonl(tmp_path / "pairs.jsonl", [PAIR, spaced, other])
    ev = write_jsonl(tmp_path / "eval.jsonl", [{"question": "purple with the rings of saturn in view"}])
    s = prepare_pref([inp], tmp_path / "ds", PrefOptions(dedup="exact", decontaminate=(str(ev),),
                                                         decontaminate_ngram=5))
    assert s.rows == {"train": 1} and s.rejected == {"contaminated": 1, "duplicate": 1}
    assert s.dedup == {"mode": "exact", "exact_duplicates": 1}
    assert s.decontamination["files"][0]["contaminated"] == 1
    lines = [orjson.loads(x) for x in (tmp_path / "ds" / "rejects.jsonl").read_bytes().splitlines()]
    assert [(x["record"], x["reason"]) for x in lines] == [(1, "duplicate"), (2, "contaminated")]
    assert lines[0]["message"].startswith("the same prompt and completions as record 0 (")
    # the completion is what matched: decontamination reads completions, not only prompts
    assert lines[1]["message"].startswith('shares the 5-word sequence "purple with the rings of" with item')
    with pytest.raises(UsageError, match="^--dedup must be one of off, exact, near, not 'fuzzy'$"):
        prepare_pref([inp], tmp_path / "fuzzy", PrefOptions(dedup="fuzzy"))


def test_the_episode_reader_refuses_a_pairs_dataset_by_name(tmp_path):
    """The store reads every kind; what reads episodes (the SFT loader, SFTDataset, pack)
    refuses a pairs dataset by name and says what reads it (tests/loader/test_pairs.py)."""
    from sftdata.errors import DatasetError
    from sftdata.loader import LoaderConfig, make_loader
    from sftdata.store import open_dataset

    inp = write_jsonl(tmp_path / "pairs.jsonl", [PAIR])
    prepare_pref([inp], tmp_path / "ds", PrefOptions())
    assert open_dataset(tmp_path / "ds").kind == "pairs"
    with pytest.raises(DatasetError, match=r"ds is a pairs dataset \(preference pairs \(prompt, chosen, rejected\)\), "
                                           r"not SFT episodes: the SFT loader \(make_loader\) reads episodes or packed "
                                           r"rows; read it with sftdata.loader.make_pair_loader"):
        make_loader(LoaderConfig(batch_size=1, block_size=64), tmp_path / "ds", backend="numpy")


def test_train_on_last_trains_only_the_last_reply_of_a_completion_of_several(tmp_path):
    """--train-on means for a pair what it means for an episode, over the completion's replies:
    last leaves the earlier ones untrained context; verify re-derives it from the metadata."""
    two = {"prompt": [U], "chosen": [{"role": "assistant", "content": "Let me look."}, {"role": "user", "content": "ok"},
                                     {"role": "assistant", "content": "It is blue."}],
           "rejected": [{"role": "assistant", "content": "Hmm."}, {"role": "user", "content": "ok"},
                        {"role": "assistant", "content": "Green."}]}
    inp = write_jsonl(tmp_path / "pairs.jsonl", [two])
    tok = open_tokenizer(None, "auto")
    m = tok.ids
    first, second = [*tok.encode("Let me look."), m.end], [*tok.encode("It is blue."), m.end]
    middle = [m.user, *tok.encode("ok"), m.end]
    for train_on, first_open, first_mask in (("all", m.assistant, 1), ("last", m.assistant_context, 0)):
        ds = tmp_path / train_on
        prepare_pref([inp], ds, PrefOptions(train_on=train_on))
        _, ids, mask, idx, _ = _shard(ds)
        p, c = int(idx[0, 1]), int(idx[1, 1])
        assert ids[p:p + c].tolist() == [*first, *middle, m.assistant, *second, m.eos] and ids[p - 1] == first_open
        # the second reply's <|ASSISTANT|> is trained as the rule trains it in an episode, EOS never
        assert mask[p:p + c].tolist() == [first_mask] * len(first) + [0] * len(middle) + [1] * (1 + len(second)) + [0]
        meta = json.loads((ds / "dataset_metadata.json").read_text())
        assert meta["options"].get("train_on") == (None if train_on == "all" else "last")
        assert verify_every_row(ds).ok


def test_the_template_limits_reach_pairs(tmp_path):
    pytest.importorskip("tokenizers")
    from sftdata.template import PRESETS
    from tests.helpers.templates import TOKENS, train_tokenizer

    specials, bos, eos, extra = TOKENS["chatml"]
    folder = train_tokenizer(tmp_path / "chatml", specials, bos, eos, extra, {"chat_template": PRESETS["chatml"],
                                                                                  "pad_token": "<|endoftext|>"})
    long = {**PAIR, "chosen": [{"role": "assistant", "content": "blue " * 400}]}
    inp = write_jsonl(tmp_path / "pairs.jsonl", [PAIR, long])
    s = prepare_pref([inp], tmp_path / "ds", PrefOptions(tokenizer=str(folder), template_max_output=1500))
    assert (s.rows, s.rejected) == ({"train": 1}, {"template_limit": 1})
    meta = json.loads((tmp_path / "ds" / "dataset_metadata.json").read_text())
    assert (meta["options"]["template_limits"]["max_output"], meta["options"]["template_limits"]["max_steps"]) == \
        (1500, 100_000)
    assert verify_every_row(tmp_path / "ds").ok

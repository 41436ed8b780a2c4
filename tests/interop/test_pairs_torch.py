"""``sftdata.torch`` for pairs, KTO rows and RL prompts: ``PairDataset`` items, the DPO and
KTO collators (the dataset's masks, not "every completion token"), and TRL's
``DPOTrainer``, ``KTOTrainer`` and ``GRPOTrainer`` each running 2 CPU steps on a tiny
model from our data."""

from __future__ import annotations

import os
import pickle
import re

import orjson
import pytest

from sftdata.errors import ConfigError, DatasetError
from sftdata.interop.export import export
from sftdata.loader import LoaderConfig
from sftdata.pref import PrefOptions
from sftdata.prepare import prepare_pref
from sftdata.replay.dataset import replay_order
from sftdata.template import PRESETS
from sftdata.torch import (
    PairDataset,
    PreferenceCollator,
    SFTDataset,
    SFTSampler,
    UnpairedPreferenceCollator,
    pretokenized,
)
from tests.helpers.data import write_jsonl
from tests.helpers.loader import make_dataset
from tests.helpers.pairs import PAIR_LENGTHS, part_mask, part_tokens, write_rows
from tests.helpers.templates import TOKENS, train_tokenizer

os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    return write_rows(tmp_path_factory.mktemp("p") / "pairs", "pairs", PAIR_LENGTHS, rows_per_shard=4)


def test_a_pair_item_has_trls_keys_and_the_prepared_masks(pairs):
    ds = PairDataset(pairs)
    assert len(ds) == 9 and ds.kind == "pairs"
    p, c, r = PAIR_LENGTHS[5]
    assert ds[5] == {"record": 20, "prompt_ids": part_tokens(5, 0, p).tolist(),
                     "chosen_ids": part_tokens(5, 1, c).tolist(), "chosen_mask": part_mask(1, c).tolist(),
                     "rejected_ids": part_tokens(5, 2, r).tolist(), "rejected_mask": part_mask(2, r).tolist()}
    assert pickle.loads(pickle.dumps(ds))[5] == ds[5]
    with pytest.raises(IndexError, match=r"^row 9 is outside the 9 rows of split 'train' of "):
        ds[9]


def test_the_dpo_collator_puts_chosen_rows_then_rejected_rows_with_the_completion_masks():
    items = [{"prompt_ids": [1, 2], "chosen_ids": [3, 4, 5], "chosen_mask": [1, 1, 0],
              "rejected_ids": [6], "rejected_mask": [1]},
             {"prompt_ids": [7], "chosen_ids": [8], "chosen_mask": [1], "rejected_ids": [9, 10], "rejected_mask": [1, 0]}]
    out = PreferenceCollator(pad_id=0).numpy(items)
    assert out["input_ids"].tolist() == [[1, 2, 3, 4, 5], [7, 8, 0, 0, 0], [1, 2, 6, 0, 0], [7, 9, 10, 0, 0]]
    assert out["attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 0, 0]]
    assert out["completion_mask"].tolist() == [[0, 0, 1, 1, 0], [0, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 1, 0, 0, 0]]
    assert PreferenceCollator(0, pad_to_multiple_of=4).numpy(items)["input_ids"].shape == (4, 8)


def test_the_dpo_collator_reads_exported_rows_and_trls_own_columns():
    exported = {"prompt_input_ids": [1], "chosen_input_ids": [2, 3], "rejected_input_ids": [4],
                "chosen_loss_mask": [1, 0], "rejected_loss_mask": [1]}
    assert PreferenceCollator(0).numpy([exported])["completion_mask"].tolist() == [[0, 1, 0], [0, 1, 0]]
    trl_row = {"prompt_ids": [1], "chosen_ids": [2, 3], "rejected_ids": [4]}  # no mask: every completion token
    assert PreferenceCollator(0).numpy([trl_row])["completion_mask"].tolist() == [[0, 1, 1], [0, 1, 0]]
    with pytest.raises(ConfigError, match=re.escape("a preference item needs prompt_ids and chosen_ids (or "
                                                    "prompt_input_ids and chosen_input_ids); got keys ['chosen']. "
                                                    "A trainer with remove_unused_columns=True (TRL's default) drops "
                                                    "the columns it does not know: give it PairDataset(...).to_hf() "
                                                    "or the Parquet of `sftdata export` (TRL's names), or set "
                                                    "remove_unused_columns=False for a file with other names")):
        PreferenceCollator(0).numpy([{"chosen": "text"}])


def test_the_kto_collator_adds_the_label_and_trls_mismatched_kl_pairs():
    items = [{"prompt_ids": [1], "completion_ids": [2, 3], "completion_mask": [1, 0], "label": True},
             {"prompt_ids": [4, 5], "completion_ids": [6], "completion_mask": [1], "label": False}]
    out = UnpairedPreferenceCollator(pad_id=0).numpy(items)
    assert out["input_ids"].tolist() == [[1, 2, 3], [4, 5, 6]]
    assert out["completion_mask"].tolist() == [[0, 1, 0], [0, 0, 1]]
    assert out["label"].tolist() == [True, False]
    assert out["KL_input_ids"].tolist() == [[1, 6, 0, 0], [4, 5, 2, 3]]  # each prompt with the previous completion
    assert out["KL_completion_mask"].tolist() == [[0, 1, 0, 0], [0, 0, 1, 0]]
    assert "KL_input_ids" not in UnpairedPreferenceCollator(0, kl=False).numpy(items)


def test_the_sampler_hands_out_the_pairs_replay_order_lists(pairs):
    cfg = LoaderConfig(batch_size=2, block_size=12, epoch_seed=9)
    sampler = SFTSampler(PairDataset(pairs), cfg)
    ids = list(sampler)
    assert len(ids) == 8  # 4 steps of 2: the ninth pair is dropped (epoch_drop_last)
    for step in range(4):
        assert ids[2 * step:2 * step + 2] == replay_order(pairs, cfg, step=step).columns["pair"].tolist()
    with pytest.raises(ConfigError, match=r"^SFTSampler orders an SFTDataset or a PairDataset, got list$"):
        SFTSampler([], cfg)


def test_sft_readers_refuse_a_pairs_dataset_and_the_pair_dataset_an_sft_one(pairs, tmp_path):
    with pytest.raises(DatasetError, match=r"is a pairs dataset .*: SFTDataset reads episodes or packed rows; read it "
                                           r"with sftdata.loader.make_pair_loader"):
        SFTDataset(pairs)
    with pytest.raises(DatasetError, match=r"is a episodes dataset: PairDataset reads pairs or kto or prompts"):
        PairDataset(make_dataset(tmp_path / "sft", [3, 4]))


# ------------------------------------------------------------- TRL's trainers, 2 CPU steps each
torch = pytest.importorskip("torch", reason="TRL's trainers need torch")
transformers = pytest.importorskip("transformers", reason="TRL's trainers need transformers")
trl = pytest.importorskip("trl", reason="TRL is not installed")
datasets = pytest.importorskip("datasets", reason="TRL's trainers take a datasets.Dataset")


WORDS = "sky blue green red sun rain cloud wind snow day night".split()


def chat_pair(i: int) -> dict:
    w = WORDS[i % len(WORDS)], WORDS[(3 * i + 1) % len(WORDS)]
    return {"prompt": [{"role": "user", "content": f"What about the {w[0]}?"}],
            "chosen": [{"role": "assistant", "content": f"The {w[0]} is {w[1]}."}],
            "rejected": [{"role": "assistant", "content": f"No {w[1]}."}]}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tokenizer folder with ChatML's template (trained offline on the tests' corpus)."""
    specials, bos, eos, extra = TOKENS["chatml"]
    return train_tokenizer(tmp_path_factory.mktemp("tok") / "chatml", specials, bos, eos, extra,
                           {"chat_template": PRESETS["chatml"], "pad_token": "<|endoftext|>"})


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return transformers.AutoTokenizer.from_pretrained(str(model_dir))


def prepared(tmp_path, model_dir, records, rl=False):
    """``records`` prepared by ``prepare_pref`` (``rl``: prepare-rl) under the model's template."""
    inp = write_jsonl(tmp_path / "in.jsonl", records)
    prepare_pref([inp], tmp_path / "ds", PrefOptions(tokenizer=str(model_dir)), rl=rl)
    return tmp_path / "ds"


def tiny_model(tokenizer):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                   pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                                   bos_token_id=None)
    return transformers.LlamaForCausalLM(cfg)


def args(cls, tmp_path, **kw):
    return cls(output_dir=str(tmp_path / "run"), max_steps=2, per_device_train_batch_size=2, report_to="none",
               use_cpu=True, save_strategy="no", logging_strategy="no", disable_tqdm=True, learning_rate=1e-2, **kw)


class Spy:
    """A collator that records what it was given and what it returned."""

    def __init__(self, inner):
        self.inner, self.items, self.batches = inner, [], []

    def __call__(self, items):
        self.items.append([dict(it) for it in items])
        out = self.inner(items)
        self.batches.append(out)
        return out


def trained(model, before) -> bool:
    return any(not torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_dpo_trainer_runs_2_steps_on_prepared_pairs_with_their_masks(model_dir, tokenizer, tmp_path):
    ds = PairDataset(prepared(tmp_path, model_dir, [chat_pair(i) for i in range(6)]))
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert ds[0]["chosen_ids"][-2] == im_end and ds[0]["chosen_mask"][-2:] == [1, 0]  # the newline after: not trained
    model = tiny_model(tokenizer)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    spy = Spy(PreferenceCollator(pad_id=ds.pad_id))
    trainer = pretokenized(trl.DPOTrainer)(model=model, ref_model=tiny_model(tokenizer), args=args(trl.DPOConfig, tmp_path),
                                           train_dataset=ds.to_hf(tmp_path / "hf"), processing_class=tokenizer,
                                           data_collator=spy)
    trainer.train()
    assert trainer.state.global_step == 2 and len(spy.items) >= 2 and trained(model, before)  # (a batch may be prefetched)
    for items, batch in zip(spy.items, spy.batches):
        for it in items:  # every item is the dataset's row (record = row: no val split), masks included
            assert {k: it[k] for k in ds[it["record"]]} == ds[it["record"]]
        want = PreferenceCollator(ds.pad_id).numpy(items)
        assert {k: v.tolist() for k, v in batch.items()} == {k: v.tolist() for k, v in want.items()}


def test_kto_trainer_runs_2_steps_on_prepared_rows(model_dir, tokenizer, tmp_path):
    rows = [{"prompt": p["prompt"], "completion": p["chosen" if i % 2 else "rejected"], "label": bool(i % 2)}
            for i, p in enumerate(chat_pair(i) for i in range(4))]
    ds = PairDataset(prepared(tmp_path, model_dir, rows))
    assert ds.kind == "kto"
    model = tiny_model(tokenizer)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    spy = Spy(UnpairedPreferenceCollator(pad_id=ds.pad_id))
    trainer = pretokenized(trl.KTOTrainer)(model=model, ref_model=tiny_model(tokenizer),
                                           args=args(trl.KTOConfig, tmp_path, train_sampling_strategy="sequential"),
                                           train_dataset=ds.to_hf(tmp_path / "hf"), processing_class=tokenizer,
                                           data_collator=spy)
    trainer.train()
    assert trainer.state.global_step == 2 and trained(model, before)
    assert [[it["record"] for it in items] for items in spy.items[:2]] == [[0, 1], [2, 3]]
    assert spy.batches[0]["label"].tolist() == [False, True]


def test_grpo_trainer_runs_2_steps_on_prepared_prompts_and_rewards_see_the_columns(model_dir, tokenizer, tmp_path):
    records = [{"prompt": chat_pair(i)["prompt"], "answer": i * 1.5, "meta": {"id": f"q{i}"}} for i in range(4)]
    ds = PairDataset(prepared(tmp_path, model_dir, records, rl=True))
    assert ds[1]["answer"] == "1.5" and ds[1]["meta"] == '{"id": "q1"}'  # the input's JSON text, byte for byte
    seen = []

    def reward(prompts, completions, answer, **kw):
        seen.append((prompts, answer))
        return [float(len(c)) for c in completions]

    model = tiny_model(tokenizer)
    trainer = pretokenized(trl.GRPOTrainer)(model=model, reward_funcs=reward,
                                            args=args(trl.GRPOConfig, tmp_path, num_generations=2,
                                                      max_completion_length=4),
                                            train_dataset=ds.to_hf(tmp_path / "hf"), processing_class=tokenizer)
    trainer.train()
    assert trainer.state.global_step == 2 and len(seen) == 2
    by_answer = {ds[i]["answer"]: ds[i]["prompt"] for i in range(len(ds))}
    for prompts, answers in seen:  # the reward sees each prompt's ids with its own row's column
        assert [by_answer[a] for a in answers] == prompts
    want = tokenizer.apply_chat_template(records[0]["prompt"], add_generation_prompt=True, tokenize=True,
                                         return_dict=True)["input_ids"]
    assert ds[0]["prompt"] == list(want)  # the prompt is the model template's render with the generation prompt


# ---------------------------------------- the same trainers from `sftdata export`, default configs
def exported(ds_path, tmp_path):
    """``sftdata export`` of the dataset, as `datasets` reads its Parquet back."""
    export(ds_path, tmp_path / "export")
    return datasets.load_dataset("parquet", data_dir=str(tmp_path / "export"), split="train",
                                 cache_dir=str(tmp_path / "hf_export"))


@pytest.mark.parametrize("ours", [True, False])
def test_dpo_trainer_with_a_default_config_trains_from_the_export(model_dir, tokenizer, ours, tmp_path):
    path = prepared(tmp_path, model_dir, [chat_pair(i) for i in range(6)])
    ds, train = PairDataset(path), exported(path, tmp_path)
    model = tiny_model(tokenizer)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = args(trl.DPOConfig, tmp_path)
    assert cfg.remove_unused_columns is True  # TRL's default: columns it does not know are dropped
    trainer = pretokenized(trl.DPOTrainer)(model=model, ref_model=tiny_model(tokenizer), args=cfg, train_dataset=train,
                                           processing_class=tokenizer,
                                           **({"data_collator": PreferenceCollator(ds.pad_id)} if ours else {}))
    spy = trainer.data_collator = Spy(trainer.data_collator)
    trainer.train()
    assert trainer.state.global_step == 2 and len(spy.items) >= 2 and trained(model, before)
    for items, batch in zip(spy.items, spy.batches):
        for it in items:  # TRL kept our columns: each item is the dataset's row, masks included ("row" dropped)
            assert it == ds[it["record"]]
        if ours:  # the prepared masks, not every completion token
            want = PreferenceCollator(ds.pad_id).numpy(items)
            assert {k: v.tolist() for k, v in batch.items()} == {k: v.tolist() for k, v in want.items()}
        else:  # TRL's own collator reads the same ids (and trains every completion token)
            assert type(spy.inner).__name__ == "DataCollatorForPreference"
            want = PreferenceCollator(ds.pad_id).numpy([{k: it[k] for k in ("prompt_ids", "chosen_ids", "rejected_ids")}
                                                        for it in items])
            assert batch["input_ids"].tolist() == want["input_ids"].tolist()
            assert batch["completion_mask"].tolist() == want["completion_mask"].tolist()


def test_kto_trainer_with_a_default_config_trains_from_the_export(model_dir, tokenizer, tmp_path):
    rows = [{"prompt": p["prompt"], "completion": p["chosen" if i % 2 else "rejected"], "label": bool(i % 2)}
            for i, p in enumerate(chat_pair(i) for i in range(4))]
    path = prepared(tmp_path, model_dir, rows)
    ds, train = PairDataset(path), exported(path, tmp_path)
    model = tiny_model(tokenizer)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    spy = Spy(UnpairedPreferenceCollator(pad_id=ds.pad_id))
    cfg = args(trl.KTOConfig, tmp_path, train_sampling_strategy="sequential")
    assert cfg.remove_unused_columns is True
    trainer = pretokenized(trl.KTOTrainer)(model=model, ref_model=tiny_model(tokenizer), args=cfg, train_dataset=train,
                                           processing_class=tokenizer, data_collator=spy)
    trainer.train()
    assert trainer.state.global_step == 2 and trained(model, before)
    assert [[it["record"] for it in items] for items in spy.items[:2]] == [[0, 1], [2, 3]]
    for items in spy.items[:2]:
        assert [it == ds[it["record"]] for it in items] == [True, True]  # ids, mask and label kept
    assert spy.batches[0]["label"].tolist() == [False, True]


def test_grpo_trainer_with_a_default_config_trains_from_the_export(model_dir, tokenizer, tmp_path):
    records = [{"prompt": chat_pair(i)["prompt"], "answer": i * 1.5} for i in range(4)]
    path = prepared(tmp_path, model_dir, records, rl=True)
    ds, train = PairDataset(path), exported(path, tmp_path)
    seen = []

    def reward(prompts, completions, record, columns, **kw):
        seen.append((prompts, record, columns))
        return [float(len(c)) for c in completions]

    trainer = pretokenized(trl.GRPOTrainer)(model=tiny_model(tokenizer), reward_funcs=reward,
                                            args=args(trl.GRPOConfig, tmp_path, num_generations=2,
                                                      max_completion_length=4),
                                            train_dataset=train, processing_class=tokenizer)
    trainer.train()
    assert trainer.state.global_step == 2 and len(seen) == 2
    for prompts, recs, cols in seen:  # each prompt's ids with its own row's columns
        assert prompts == [ds[r]["prompt"] for r in recs]
        assert [orjson.loads(c)["answer"] for c in cols] == [ds[r]["answer"] for r in recs]

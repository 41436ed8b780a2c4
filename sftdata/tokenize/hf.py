"""A model's own Hugging Face tokenizer (``tokenizer.json``), loaded with the ``tokenizers``
library: no torch, no transformers, no network.

    >>> tok = load_hf_tokenizer("Llama-3-8B-Instruct/")    # or .../tokenizer.json (``open``)
    >>> tok.special_tokens["<|eot_id|>"], tok.bos_id, tok.vocab_size
    (128009, 128000, 128256)

Two encodings, on purpose:

* ``encode(text)`` encodes message text as ORDINARY text: a special token's string typed
  by a user stays those characters (the same promise ``ChatTokenizer.encode`` makes).
* ``encode_rendered(text)`` encodes what a chat template rendered, once, exactly as
  ``apply_chat_template(..., tokenize=True)`` does: added tokens are recognised, no BOS
  or EOS is added again (the template writes exactly the BOS it wants), and each token
  comes with its character offsets for span finding.

A folder may hold ``tokenizer_config.json`` (``bos_token``, ``eos_token``, ``pad_token``,
``chat_template`` as a string or a list of ``{"name", "template"}``),
``special_tokens_map.json``, and the chat templates as files (``chat_template.jinja``,
``additional_chat_templates/NAME.jinja``: ``folder_templates``); all are optional.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import orjson

from ..errors import TokenizerError
from ..util.collector import paused
from . import HF_KIND, STATE_FORMAT
from .encoded import Encoded, token_ranges_many
from .engine import EngineChoice, choose_engine
from .guard import check_document, document_sizes, library_call, present, read_limited
from .identity import facts_identity, vocabulary_sha256

HF_STATE_VERSION = 2  # the tiktoken kind is version 1; an older sftdata then says "upgrade"
MAX_TOKEN_ID = 2**32 - 1
INSTALL_HINT = "pip install 'sftdata[hf]'"
_TOKEN_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token")


def _require_tokenizers():
    try:
        import tokenizers
    except ImportError:
        raise TokenizerError(f"a Hugging Face tokenizer needs the 'tokenizers' library: {INSTALL_HINT}") from None
    return tokenizers


def _token_string(value) -> str | None:
    """A special token as written in a config: a string or an AddedToken-like dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _read_json(path: Path) -> dict:
    try:
        value = orjson.loads(read_limited(path))
    except orjson.JSONDecodeError as e:
        raise TokenizerError(f"{path} is not valid JSON ({e}); it should be the file the model ships") from None
    if not isinstance(value, dict):
        raise TokenizerError(f"{path} holds a JSON {type(value).__name__}, not an object")
    return value


def _templates_of(config: dict, where: Path) -> dict[str, str]:
    """``chat_template`` as ``{name: text}``: a string is named ``default``."""
    value = config.get("chat_template")
    if value is None:
        return {}
    if isinstance(value, str):
        return {"default": value}
    if isinstance(value, list) and all(isinstance(t, dict) and isinstance(t.get("name"), str)
                                       and isinstance(t.get("template"), str) for t in value):
        return {t["name"]: t["template"] for t in value}
    raise TokenizerError(f"{where}: chat_template must be a string or a list of {{'name', 'template'}} objects")


TEMPLATE_FILE = "chat_template.jinja"  # a folder's template as current transformers saves it
TEMPLATE_DIRS = ("additional_chat_templates", "chat_templates")  # its named templates, NAME.jinja
LEGACY_TEMPLATE_FILE = "chat_template.json"  # {"chat_template": ...}, as processors saved it


def _read_template(path: Path) -> str:
    try:
        return read_limited(path).decode("utf-8")  # a regular file only: a FIFO is refused, never opened
    except UnicodeDecodeError as e:
        raise TokenizerError(f"cannot read the chat template {path}: {e}") from None


def folder_templates(folder: Path, config: dict) -> dict[str, str]:
    """A model folder's chat templates as ``{name: text}`` (``default`` the folder's own),
    where transformers finds them: ``chat_template.jinja`` and ``additional_chat_templates/``
    (or ``chat_templates/``) ``NAME.jinja`` files, which take priority over
    ``tokenizer_config.json``'s ``chat_template`` (a string, or a list of ``{"name",
    "template"}``), else a processor's ``chat_template.json``."""
    found: dict[str, str] = {}
    if present(folder / TEMPLATE_FILE):
        found["default"] = _read_template(folder / TEMPLATE_FILE)
    for sub in TEMPLATE_DIRS:
        for path in sorted((folder / sub).glob("*.jinja")) if (folder / sub).is_dir() else ():
            found.setdefault(path.stem, _read_template(path))
    if found:
        return found
    own = _templates_of(config, folder / "tokenizer_config.json")
    if not own and present(folder / LEGACY_TEMPLATE_FILE):
        own = _templates_of(_read_json(folder / LEGACY_TEMPLATE_FILE), folder / LEGACY_TEMPLATE_FILE)
    return own


def _check_ids(doc: dict, path: Path) -> int:
    """The highest token id; refuse a file that is not a tokenizer.json, or whose ids do not fit uint32."""
    model = doc.get("model")
    if not isinstance(model, dict) or not isinstance(model.get("type"), str):
        keys = ", ".join(sorted(doc)[:6]) or "none"
        raise TokenizerError(f"{path} is not a Hugging Face tokenizer.json (no 'model' with a 'type'; keys: {keys})")
    vocab = model.get("vocab")
    ids: list = []
    if isinstance(vocab, dict):
        ids.extend(vocab.values())
    elif isinstance(vocab, list):  # Unigram: [[piece, score], ...]; ids are positions
        ids.append(len(vocab) - 1)
    ids.extend(t.get("id") for t in doc.get("added_tokens") or () if isinstance(t, dict))
    if not set(map(type, ids)) <= {int} or (ids and min(ids) < 0):  # a bool is not an id
        raise TokenizerError(f"{path}: token ids must be non-negative integers")
    top = max(ids, default=-1)
    if top > MAX_TOKEN_ID:
        raise TokenizerError(f"{path}: token id {top} is beyond uint32 (max {MAX_TOKEN_ID}); sftdata stores "
                             f"tokens as uint32 and cannot hold this vocabulary")
    return top


def document_facts(doc: dict, path: Path) -> dict:
    """What loading a ``tokenizer.json`` takes from the parsed file besides the fast engine's
    conversion, derived at every load (a cached copy would be trusted on its word: it is
    not kept): the highest id, the added tokens ``[id, content, special]``,
    whether the vocabulary is a dict (BPE, WordPiece) or a list (Unigram), the number of
    merges and vocabulary entries (checked against the limits again at every load:
    ``guard.check_sizes``), and the vocabulary's identity hash. Refuses a file that is not
    a tokenizer.json (``_check_ids``)."""
    max_id = _check_ids(doc, path)
    return {"max_id": max_id, "dict_vocab": isinstance(doc["model"].get("vocab"), dict), "sizes": document_sizes(doc),
            "added": [[int(t["id"]), str(t.get("content")), bool(t.get("special"))]
                      for t in doc.get("added_tokens") or () if isinstance(t, dict)],
            "vocabulary": vocabulary_sha256(doc)}


def default_pad(named: int | None, special: dict[str, int], eos_id: int | None, bos_id: int | None
                ) -> tuple[int | None, str]:
    """The pad id and where it comes from. The config's ``pad_token`` when it names one;
    else a special token named for padding (Llama 3.1's ``<|finetune_right_pad_id|>``,
    ``<pad>``, ``[PAD]``); else the first reserved special token (Llama 3's
    ``<|reserved_special_token_0|>``): tokens a chat template never writes, so the pad id
    is not the end-of-turn token the model must learn to stop with. Else EOS (prepare then
    refuses it where EOS ends a turn: ``serving.check_pad_not_stop``)."""
    if named is not None:
        return named, "pad_token"
    free = sorted((i, t) for t, i in special.items() if i not in (eos_id, bos_id))
    for i, t in free:
        if "pad" in t.lower():
            return i, "named for padding"
    for i, t in free:
        if "reserved" in t.lower():
            return i, "reserved"
    return eos_id, "eos"


@dataclass(frozen=True)
class FastBatch:
    """Texts joined for one call of the fast engine's core: ``texts`` (those it handles),
    ``at`` (their places among the texts given), ``joined`` by the separator ``sep``."""

    texts: list[str]
    at: list[int]
    joined: str
    sep: str


class HFTokenizer:
    """A ``tokenizer.json`` with its config. Build it with ``open.load_hf_tokenizer`` (or ``load_hf_file``)."""

    kind = HF_KIND

    def __init__(self, *, path: Path, data: bytes, facts: dict, config: dict, special_map: dict,
                 engine: str = "auto", doc: dict | None = None, file_sha256: str | None = None):
        _require_tokenizers()
        max_id = facts["max_id"]
        self._data: bytes | None = data  # the library loads it on first use (a proven fast engine may never)
        self._doc = doc  # the parsed file, when it was parsed (``_document``: parsed when first needed)
        self._doc_data = data
        self._lib = None
        self._data_path = path
        self.path = str(path.resolve())
        self.name = path.parent.name if path.name == "tokenizer.json" else path.name
        self.source = "file"
        self.hub: dict | None = None  # a Hub model id's repo_id, revision and resolved commit (``hub``)
        self.identity = None  # its ``TokenizerIdentity`` (``load_hf_file`` sets it)
        self.file_sha256 = file_sha256 or hashlib.sha256(data).hexdigest()
        self._dict_vocab = facts["dict_vocab"]
        if not self._dict_vocab:
            self._library()  # a Unigram vocabulary: ids by position, as the library reads them
        added = sorted((i, c, special) for i, c, special in facts["added"])
        self.added_tokens: dict[str, int] = {c: i for i, c, _ in added}
        self.special_tokens: dict[str, int] = {c: i for i, c, special in added if special}
        self.vocab_size = max([max_id, *self.added_tokens.values()]) + 1
        if self.vocab_size == 0:
            raise TokenizerError(f"{path} has an empty vocabulary")
        named = {k: _token_string(special_map.get(k)) for k in _TOKEN_KEYS}
        named.update({k: _token_string(config[k]) for k in _TOKEN_KEYS if _token_string(config.get(k))})
        self.token_strings: dict[str, str] = {k: v for k, v in named.items() if v is not None}
        ids = {k: self.token_id(v) for k, v in self.token_strings.items()}
        for key, tid in ids.items():
            if tid is None:
                raise TokenizerError(f"{path.parent}: {key} {self.token_strings[key]!r} from the config is not in "
                                     f"the vocabulary of {path.name}")
        self.bos_id: int | None = ids.get("bos_token")
        self.eos_id: int | None = ids.get("eos_token")
        self.pad_id, self.pad_source = default_pad(ids.get("pad_token"), self.special_tokens, self.eos_id,
                                                   self.bos_id)
        self.chat_templates: dict[str, str] = folder_templates(path.parent, config)
        self.dtype = np.uint16 if self.vocab_size <= 2**16 else np.uint32
        # tiktoken's core where it is proven to give the library's ids (``tokenizer_engine``)
        self.engine_choice: EngineChoice = choose_engine(engine, self._document, self.file_sha256, self._library,
                                                         list(self.added_tokens), self.name)
        self._fast = self.engine_choice.fast
        if self._fast is None:
            self._library()  # a file the library cannot load is an error now, not at the first encode
        if self._doc is not None and self._dict_vocab and "_vocab" not in self.__dict__:
            self.__dict__["_vocab"] = self._doc["model"]["vocab"]  # parsed already: kept, the rest let go
        if "_vocab" in self.__dict__ or not self._dict_vocab:
            self._doc_data = None
        self._doc = None

    def _document(self) -> dict:
        """The parsed ``tokenizer.json`` while the load needs it (parsed again here once it
        was let go)."""
        if self._doc is None:
            self._doc = orjson.loads(self._doc_data)
        return self._doc

    @functools.cached_property
    def _vocab(self) -> dict | None:
        """The model's vocabulary (token string -> id), None for a Unigram list; read from the
        file the first time a token that is not an added token is looked up (the file's bytes
        are let go then: the vocabulary alone is kept)."""
        if not self._dict_vocab:
            return None
        vocab = (self._doc if self._doc is not None else orjson.loads(self._doc_data))["model"]["vocab"]
        self._doc_data = None
        return vocab

    @library_call("loading it")
    def _library(self):
        """The ``tokenizers`` library's Tokenizer of this file, loaded on first use."""
        if self._lib is None:
            tokenizers = _require_tokenizers()
            try:
                lib = tokenizers.Tokenizer.from_str(self._data.decode("utf-8"))
            except Exception as e:  # the Rust side raises a bare Exception
                raise TokenizerError(f"{self._data_path} is not a tokenizer.json the 'tokenizers' library can "
                                     f"load: {e}") from None
            # Offsets must cover the text as written: a ByteLevel post-processor with trim_offsets would
            # move them off the whitespace, and we never add BOS/EOS, so no post-processor is needed.
            lib.post_processor = None
            lib.no_truncation()
            lib.no_padding()
            self._lib, self._data = lib, None
        return self._lib

    @property
    def _tok(self):
        return self._library()

    @property
    def engine(self) -> str:
        """``tiktoken`` (the fast path) or ``hf`` (the tokenizers library)."""
        return self.engine_choice.engine

    # -- encoding -----------------------------------------------------------------
    def _encode_plain(self, texts: list[str]):
        # one Tokenizer (a second copy costs as much memory and load time again); special
        # strings in message text stay text while the flag is set
        self._tok.encode_special_tokens = True
        try:
            return self._tok.encode_batch(texts, add_special_tokens=False)
        finally:
            self._tok.encode_special_tokens = False

    def encode(self, text: str) -> list[int]:
        """Encode message text as ordinary text: special strings are not special, and no
        BOS/EOS is added."""
        return self.encode_batch([text])[0]

    @library_call("encoding a text")
    def encode_batch(self, texts: Sequence[str], num_threads: int = 1) -> list[list[int]]:
        """Encode many texts as ordinary text (``num_threads`` is accepted for the shape of
        ``ChatTokenizer.encode_batch``; the library decides its own parallelism)."""
        texts = list(texts)
        fast = self._fast
        out: list = [None] * len(texts)
        rest = []
        for i, text in enumerate(texts):
            if fast is not None and fast.handles(text):
                try:
                    out[i] = fast.encode(text).tolist()
                    continue
                except UnicodeEncodeError:  # a lone surrogate: the library's error or result
                    pass
            rest.append(i)
        if rest:
            for i, e in zip(rest, self._encode_plain([texts[i] for i in rest])):
                out[i] = e.ids
        return out

    @library_call("encoding a rendered text")
    def encode_rendered(self, text: str) -> Encoded:
        """Encode a template's rendered text once: added tokens recognised, nothing added."""
        fast = self._fast
        if fast is not None and fast.handles(text):
            try:
                ids, ranks = fast.encode_rendered(text)
            except UnicodeEncodeError:  # a lone surrogate: the library's error or result
                pass
            else:
                return Encoded(ids, text_len=len(text), make_offsets=lambda: fast.offsets(text, ranks), ranks=ranks)
        enc = self._tok.encode(text, add_special_tokens=False)
        return Encoded(np.array(enc.ids, dtype=np.uint32), encoding=enc, text_len=len(text))

    @library_call("encoding rendered texts")
    def encode_rendered_many(self, texts: Sequence[str]) -> list[Encoded]:
        """``encode_rendered`` of each text; the fast engine's in one call (what the core
        costs per call, mostly taking in the set of special tokens, is paid once)."""
        batch = self.fast_batch(texts)
        ranks = None if batch is None else self.encode_fast_batch(batch)
        return self.encode_rendered_rest(texts, self.fast_batch_results(batch, ranks, len(texts)))

    @property
    def encodes_apart(self) -> bool:
        """True when texts can be encoded on a second thread (``fast_batch``)."""
        return self._fast is not None

    def fast_batch(self, texts: Sequence[str]) -> FastBatch | None:
        """The texts the fast engine handles joined for one call of its core
        (``encode_fast_batch``, which may run on another thread); None: no fast engine, or
        the texts cannot be joined (they are then encoded one by one)."""
        fast = self._fast
        if fast is None:
            return None
        mine = [i for i, t in enumerate(texts) if fast.handles(t)]
        chosen = [texts[i] for i in mine]
        joined = fast.join_rendered(chosen)
        return None if joined is None else FastBatch(chosen, mine, *joined)

    @library_call("encoding rendered texts", hold_stderr=False)
    def encode_fast_batch(self, batch: FastBatch) -> np.ndarray | None:
        """The core's ranks of a ``fast_batch`` (None: it holds a lone surrogate). Nothing
        here touches the library or Python objects another thread uses, and the core lets
        go of the interpreter while it encodes: run it on a second thread while this one
        renders (standard error is left alone meanwhile: ``library_call``)."""
        return self._fast.encode_joined(batch.joined)

    def fast_batch_results(self, batch: FastBatch | None, ranks: np.ndarray | None, n: int) -> list[Encoded | None]:
        """Each of the ``n`` texts' ``Encoded`` from a batch's ranks; None where the fast
        engine did not encode it (``encode_rendered_rest`` does)."""
        out: list = [None] * n
        fast = self._fast
        cut = None if batch is None else fast.cut_joined(ranks, len(batch.texts), batch.sep)
        if cut is None:
            return out
        for i, text, (ids, r) in zip(batch.at, batch.texts, cut):
            out[i] = Encoded(ids, text_len=len(text), ranks=r,
                             make_offsets=lambda text=text, ranks=r: fast.offsets(text, ranks))
        return out

    @library_call("encoding rendered texts")
    def encode_rendered_rest(self, texts: Sequence[str], done: Sequence[Encoded | None]) -> list[Encoded]:
        """``done`` (``fast_batch_results``) with each None encoded by ``encode_rendered``."""
        return [e if e is not None else self.encode_rendered(t) for e, t in zip(done, texts)]

    @library_call("locating tokens")
    def token_ranges_many(self, texts: Sequence[str], encoded: Sequence[Encoded],
                          spans: Sequence[Sequence[tuple[int, int]]]) -> tuple[np.ndarray, np.ndarray]:
        """``encoded[i].token_ranges(spans[i])`` of every text, concatenated (``encoded.token_ranges_many``)."""
        return token_ranges_many(self._fast, texts, encoded, spans)

    @library_call("encoding a rendered text")
    def encode_rendered_by_library(self, text: str) -> np.ndarray:
        """``encode_rendered``'s ids from the tokenizers library, whatever the engine (the
        reference ``verify --retokenize`` compares with)."""
        return np.array(self._tok.encode(text, add_special_tokens=False).ids, dtype=np.int64)

    @library_call("encoding a text")
    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Ordinary-text encoding with the character offsets of each token."""
        enc = self._encode_plain([text])[0]
        return enc.ids, enc.offsets

    @library_call("looking up a token")
    def token_id(self, token: str) -> int | None:
        """The id of a token string (an added token's content, else a vocabulary entry as
        written in the file), or None."""
        if token in self.added_tokens:
            return self.added_tokens[token]
        if self._vocab is not None:
            return self._vocab.get(token)
        return self._tok.token_to_id(token)

    # -- decoding -----------------------------------------------------------------
    @library_call("decoding a token")
    def token_text(self, token_id: int) -> str:
        """One token's text (special tokens as their strings)."""
        t = int(token_id)
        if not 0 <= t < self.vocab_size:
            return f"<|invalid:{t}|>"
        text = self._tok.decode([t], skip_special_tokens=False)
        return text if text or self._tok.id_to_token(t) is not None else f"<|unused:{t}|>"

    @library_call("decoding")
    def decode(self, ids: Sequence[int]) -> str:
        """Decode ids, special tokens included as their strings."""
        ints = [int(t) for t in ids]
        bad = [t for t in ints if not 0 <= t < self.vocab_size]
        if not bad:
            return self._tok.decode(ints, skip_special_tokens=False)
        out: list[str] = []
        run: list[int] = []
        for t in ints + [-1]:
            if 0 <= t < self.vocab_size:
                run.append(t)
                continue
            if run:
                out.append(self._tok.decode(run, skip_special_tokens=False))
                run = []
            if t != -1:
                out.append(f"<|invalid:{t}|>")
        return "".join(out)

    # -- persistence --------------------------------------------------------------
    def state(self) -> dict:
        """What ``tokenizer_state.json`` records about the tokenizer itself (the template
        and its mask rule are added by ``template.tokenizer_state``)."""
        return {
            "format": STATE_FORMAT,
            "version": HF_STATE_VERSION,
            "kind": self.kind,
            "name": self.name,
            "source": self.source,
            "path": self.path,
            "file_sha256": self.file_sha256,
            "vocab_size": self.vocab_size,
            "special_tokens": self.special_tokens,
            "added_tokens": self.added_tokens,
            "token_strings": self.token_strings,
            "bos_id": self.bos_id,
            "eos_id": self.eos_id,
            "pad_id": self.pad_id,
            "model_chat_templates": {name: hashlib.sha256(text.encode()).hexdigest()
                                     for name, text in self.chat_templates.items()},
            "engine": self.engine_choice.record(),
            **({"hub": self.hub} if self.hub else {}),
        }

    def summary(self) -> dict:
        return {"name": self.name, "kind": self.kind, "file_sha256": self.file_sha256,
                "vocab_size": self.vocab_size, "eos_id": self.eos_id}

    def __getstate__(self):
        return {"path": self.path, "file_sha256": self.file_sha256, "engine": self.engine_choice.requested,
                "hub": self.hub}

    def __setstate__(self, state):
        other = load_hf_file(Path(state["path"]), engine=state.get("engine", "auto"), identity=False)
        if other.file_sha256 != state["file_sha256"]:
            raise TokenizerError(f"{state['path']} changed since this tokenizer was loaded (sha256 differs)")
        self.__dict__.update(other.__dict__)
        if state.get("hub"):
            self.hub, self.source = state["hub"], "hub"


def load_hf_file(file: Path, engine: str = "auto", *, identity: bool = True) -> HFTokenizer:
    """Load the ``tokenizer.json`` ``file`` and, when present, the ``tokenizer_config.json``
    and ``special_tokens_map.json`` of its folder (which file a ``--tokenizer`` spec names:
    ``open.load_hf_tokenizer``). ``engine``: ``auto``, ``tiktoken`` or ``hf``
    (``tokenizer_engine``). ``identity``: take its ``TokenizerIdentity`` from the bytes read
    (hashing the vocabulary: about a tenth of the load; a worker's copy, rebuilt from a
    pickle, needs none)."""
    data = read_limited(file)  # refused by its size before it is read
    with paused():  # the parse and the checks make 150,000+ objects and no cycle: nothing to collect
        return _load_file(file, file.parent, data, engine, identity)


def _load_file(file: Path, folder: Path, data: bytes, engine: str, identity: bool) -> HFTokenizer:
    """``load_hf_tokenizer`` of the bytes ``data`` read from ``file``, in ``folder``."""
    sha256 = hashlib.sha256(data).hexdigest()
    # parsed at every load: what a load takes from the file (its facts, the fast engine's
    # table) is derived from these bytes or checked against them, never the cache's word alone
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as e:
        raise TokenizerError(f"{file} is not a tokenizer.json: not valid JSON ({e})") from None
    if not isinstance(doc, dict):
        raise TokenizerError(f"{file} is not a tokenizer.json: it holds a JSON {type(doc).__name__}, not an "
                             f"object")
    check_document(doc, file)  # merges, vocabulary and regexes, before the library reads it
    config_path, map_path = folder / "tokenizer_config.json", folder / "special_tokens_map.json"
    config = _read_json(config_path) if present(config_path) else {}
    special_map = _read_json(map_path) if present(map_path) else {}
    facts = document_facts(doc, file)
    tok = HFTokenizer(path=file, data=data, facts=facts, config=config, special_map=special_map, engine=engine,
                      doc=doc, file_sha256=sha256)
    if identity:  # what a dataset records: from these bytes, not read again
        tok.identity = facts_identity(file, sha256, facts, lambda text: tok._vocab.get(text) if tok._dict_vocab else None)
    return tok

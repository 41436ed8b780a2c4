"""A model folder's tokenizer files are untrusted: checked before the ``tokenizers`` library
reads them, and every failure of the library (a Rust panic included) made one
``TokenizerError`` naming the file.

Before loading:

* every file read from the folder is at most ``SFTDATA_MAX_TOKENIZER_MB`` MiB (default
  48: the largest real tokenizer.json files, Gemma 3's and Llama 4's, are about 33 MB),
  checked by its size before it is read, and opened only when it is a regular file (a FIFO
  in ``additional_chat_templates/`` would make the load wait forever: ``present``);
* ``tokenizer.json`` holds at most ``SFTDATA_MAX_TOKENIZER_MERGES`` merges and as many
  vocabulary entries (default 1,000,000; real models have up to about 500,000);
* its normalizer makes at most ``SFTDATA_MAX_NORMALIZER_EXPANSION`` characters (default
  128; real ones at most about 66) of each character of a text, bounded from the file
  (``normalizer_expansion``): a ``Replace`` of one character with 100 KB would make the
  library allocate gigabytes for one record, and a process past its memory dies by SIGABRT;
* no regular expression in it (a ``Split`` pre-tokenizer's, a ``Replace`` normalizer's or
  decoder's) repeats a group that itself holds an unbounded repetition: ``(a+)+$`` on
  ``aaa...ab`` tries every way to split the run, the textbook catastrophic backtracking.
  Patterns the check lets through are still bounded by Oniguruma's retry limit: a search
  past it makes the library panic, which ``library_call`` turns into a ``TokenizerFailure``
  (a record's ``tokenizer_error``).

A panic is a ``BaseException`` (``pyo3_runtime.PanicException``), caught by its type's
name and module, never as a bare ``BaseException``. Rust also prints a report of it on
standard error (a backtrace of hundreds of lines under ``RUST_BACKTRACE=1``): calls into
the library write standard error to a buffer that is passed on as it was, less the
report of a panic that was caught.
"""

from __future__ import annotations

import base64
import functools
import math
import os
import re
import stat
import tempfile
import threading
from pathlib import Path

from ..errors import TokenizerError, TokenizerFailure, UsageError

MAX_MB_ENV = "SFTDATA_MAX_TOKENIZER_MB"
MAX_MERGES_ENV = "SFTDATA_MAX_TOKENIZER_MERGES"
MAX_EXPANSION_ENV = "SFTDATA_MAX_NORMALIZER_EXPANSION"
DEFAULT_MAX_MB = 48
DEFAULT_MAX_MERGES = 1_000_000
DEFAULT_MAX_EXPANSION = 128  # real normalizers: at most about 66 (SentencePiece's NFKC map, then a Replace)


def _limit(name: str, default: float, what: str) -> float:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise UsageError(f"{name} must be a positive number ({what}), got {raw!r}")
    return value


def max_file_bytes() -> int:
    return int(_limit(MAX_MB_ENV, DEFAULT_MAX_MB, "MiB") * (1 << 20))


_KINDS = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))


def _not_regular(path: Path, mode: int) -> TokenizerError:
    kind = next((what for test, what in _KINDS if test(mode)), "not a regular file")
    return TokenizerError(f"{path} is {kind}, not a regular file: a model folder's files are read only when they "
                          f"are regular files (reading a pipe or device could wait forever or never end); replace it "
                          f"with the file itself")


def present(path: Path) -> bool:
    """Whether a model folder holds the optional file ``path``: False when nothing is
    there, True for a regular file (or a link to one); anything else (a FIFO, a device, a
    socket, a folder) is refused by name, never opened."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return False
    except OSError as e:
        raise TokenizerError(f"cannot read {path}: {e.strerror or e}") from None
    if not stat.S_ISREG(mode):
        raise _not_regular(path, mode)
    return True


def read_limited(path: Path) -> bytes:
    """The bytes of a tokenizer folder's file, refused by its size before it is read, and
    unopened unless it is a regular file (``present``; opened without waiting, and its kind
    checked again once open, should it be replaced in between)."""
    cap = max_file_bytes()
    try:
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            raise _not_regular(path, mode)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
        with open(fd, "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise _not_regular(path, info.st_mode)
            size = info.st_size
            data = f.read(cap + 1) if size <= cap else b""  # a file that grows while read: cap + 1 bytes
    except OSError as e:
        raise TokenizerError(f"cannot read {path}: {e.strerror or e}") from None
    size = max(size, len(data))
    if size > cap:
        raise TokenizerError(f"{path} is {size / (1 << 20):,.1f} MiB, more than the {cap / (1 << 20):,.1f} MiB a "
                             f"tokenizer file may be (real ones are at most about 33 MB); if you trust it, raise "
                             f"the limit: {MAX_MB_ENV}={size // (1 << 20) + 1}")
    return data


# -- tokenizer.json's content -----------------------------------------------------------------
def document_sizes(doc: dict) -> dict[str, int]:
    """How many merges and vocabulary entries a parsed tokenizer.json has (``check_sizes``)."""
    model = doc.get("model") if isinstance(doc.get("model"), dict) else {}
    return {key: len(model.get(key) or ()) for key in ("merges", "vocab")}


def check_sizes(sizes: dict[str, int], path: Path) -> None:
    """Refuse a tokenizer.json with more merges or vocabulary entries than the limit
    (``$SFTDATA_MAX_TOKENIZER_MERGES``, read now: a file loaded before is checked again)."""
    cap = int(_limit(MAX_MERGES_ENV, DEFAULT_MAX_MERGES, "merges and vocabulary entries"))
    for key in ("merges", "vocab"):
        n = sizes[key]
        if n > cap:
            raise TokenizerError(f"{path} has {n:,} {'merges' if key == 'merges' else 'vocabulary entries'}, more "
                                 f"than the {cap:,} a tokenizer may have (real ones have up to about 500,000); if "
                                 f"you trust it, raise the limit: {MAX_MERGES_ENV}={n}")


def check_document(doc: dict, path: Path) -> None:
    """Refuse a parsed tokenizer.json with too many merges or vocabulary entries
    (``check_sizes``), or a regular expression that backtracks without bound, before the
    library loads it."""
    check_sizes(document_sizes(doc), path)
    check_normalizer(doc.get("normalizer"), path)
    for where, pattern in _patterns({k: v for k, v in doc.items() if k != "model"}, "tokenizer.json"):
        why = backtracking(pattern)
        if why is not None:
            raise TokenizerError(f"{path}: the regular expression {pattern!r} at {where} {why}, so one long text "
                                 f"could take the tokenizers library minutes (catastrophic backtracking); a "
                                 f"tokenizer with it is refused")


# characters a library normalizer can make of one character (Unicode's bounds for the normal
# forms, in code points: NFC 3, NFD 4, NFKC and NFKD 18; lowercase: 3; BERT's: Chinese characters
# spaced, lowercased and accents stripped; bytes as characters: 4)
_FIXED_EXPANSION = {"NFC": 3, "NFD": 4, "NFKC": 18, "NFKD": 18, "Lowercase": 3, "BertNormalizer": 36,
                    "ByteLevel": 4, "Strip": 1, "StripAccents": 1, "Nmt": 1}


def normalizer_expansion(normalizer, where: str = "tokenizer.json.normalizer") -> tuple[float, str]:
    """An upper bound of the characters a ``tokenizer.json`` normalizer makes of one
    character of a text, and the step that expands most: a ``Sequence`` multiplies its
    steps' bounds; a ``Replace`` makes its content of at least its pattern's length (of one
    character for a regular expression, and between any two for one that matches nothing);
    a ``Prepend`` adds its text to a text of at least one character; ``Precompiled``
    (SentencePiece's map) makes at most its longest replacement of one character."""
    if not isinstance(normalizer, dict):
        return 1.0, ""
    kind = normalizer.get("type")
    if kind == "Sequence":
        total, worst, most = 1.0, "", 0.0
        for i, step in enumerate(normalizer.get("normalizers") or ()):
            bound, why = normalizer_expansion(step, f"{where}.normalizers[{i}]")
            total *= bound
            if bound > most:
                worst, most = why, bound
        return total, worst
    if kind == "Replace":
        content = normalizer.get("content")
        n = len(content) if isinstance(content, str) else 0
        pattern = normalizer.get("pattern") if isinstance(normalizer.get("pattern"), dict) else {}
        text = pattern.get("String")
        bound = n / len(text) if isinstance(text, str) and text else 1.0 + n
        return max(1.0, bound), f"a Replace with {n:,} characters at {where}"
    if kind == "Prepend":
        prepend = normalizer.get("prepend")
        n = len(prepend) if isinstance(prepend, str) else 0
        return 1.0 + n, f"a Prepend of {n:,} characters at {where}"
    if kind == "Precompiled":
        longest = _longest_replacement(normalizer.get("precompiled_charsmap"))
        return max(1.0, float(longest)), f"a Precompiled map with a replacement of {longest:,} bytes at {where}"
    return float(_FIXED_EXPANSION.get(kind, 18)), f"{kind} at {where}"


def _longest_replacement(charsmap) -> int:
    """The longest replacement in a SentencePiece charsmap (base64: a uint32 trie size, the
    trie, then the replacements, each ending in a NUL byte)."""
    if not isinstance(charsmap, str):
        return 1
    try:
        blob = base64.b64decode(charsmap)
    except (ValueError, TypeError):
        return 1
    size = int.from_bytes(blob[:4], "little") if len(blob) >= 4 else 0
    strings = blob[4 + size:] if 4 + size <= len(blob) else blob
    return max((len(s) for s in strings.split(b"\0")), default=1)


def check_normalizer(normalizer, path: Path) -> None:
    """Refuse a normalizer that could make more than ``$SFTDATA_MAX_NORMALIZER_EXPANSION``
    characters of each character of a text (``normalizer_expansion``): the tokenizers
    library would allocate that much for one record, and a process past its memory is
    killed outright (SIGABRT, nothing said)."""
    bound, why = normalizer_expansion(normalizer)
    cap = _limit(MAX_EXPANSION_ENV, DEFAULT_MAX_EXPANSION, "characters a normalizer may make of one")
    if bound > cap:
        raise TokenizerError(f"{path}: its normalizer can make up to {bound:,.0f} characters of each character of a "
                             f"text ({why}), more than the {cap:,.0f} a tokenizer may (real ones: at most about 66), so "
                             f"one record could take gigabytes to normalize; if you trust it, raise the limit: "
                             f"{MAX_EXPANSION_ENV}={math.ceil(bound)}")


def _patterns(value, where: str):
    """``(json path, pattern)`` of every ``{"pattern": {"Regex": ...}}`` in ``value``."""
    if isinstance(value, dict):
        pattern = value.get("pattern")
        if isinstance(pattern, dict) and isinstance(pattern.get("Regex"), str):
            yield f"{where}.pattern", pattern["Regex"]
        for k, v in value.items():
            yield from _patterns(v, f"{where}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _patterns(v, f"{where}[{i}]")


_QUANTIFIER = re.compile(r"\*|\+|\?|\{(\d*)(,?)(\d*)\}")


def backtracking(pattern: str) -> str | None:
    """Why ``pattern`` (Oniguruma syntax) can backtrack exponentially, or None: a group
    repeated more than once that holds an unbounded repetition not made possessive or
    atomic (``(a+)+``, ``(?:\\s*x)*``, ``(\\w+\\s?){2,}``)."""
    stack = [False]  # per open group: does it hold an unbounded repetition
    atomic = [False]
    last_group: bool | None = None  # the group just closed (whether it held one), else None
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            j = i + 2
            if pattern[i + 1:i + 2] in ("p", "P", "x", "k", "g", "o", "u") and pattern[j:j + 1] == "{":
                j = pattern.find("}", j) + 1 or n
            i, last_group = j, None
        elif c == "[":
            i, last_group = _class_end(pattern, i), None
        elif c == "(":
            stack.append(False)
            atomic.append(pattern.startswith("(?>", i))
            i, last_group = i + 1, None
        elif c == ")" and len(stack) > 1:
            held, was_atomic = stack.pop(), atomic.pop()
            last_group = held and not was_atomic
            stack[-1] = stack[-1] or last_group
            i += 1
        elif (m := _QUANTIFIER.match(pattern, i)) is not None and (c != "{" or m.group(1) or m.group(3)):
            end = m.end()
            possessive = pattern[end:end + 1] == "+"
            end += 1 if pattern[end:end + 1] in ("+", "?") else 0
            if c == "{":
                low, comma, high = m.groups()
                unbounded = bool(comma) and not high
                many = unbounded or int(high or low or 0) > 1
            else:
                unbounded = c in "*+"
                many = unbounded
            if last_group and many and not possessive:
                return "repeats a group that itself repeats without bound"
            if unbounded and not possessive:
                stack[-1] = True
            i, last_group = end, None
        else:
            i, last_group = i + 1, None
    return None


def _class_end(pattern: str, i: int) -> int:
    """The index after the character class opening at ``i`` (nested classes, escapes)."""
    depth, j = 0, i
    while j < len(pattern):
        c = pattern[j]
        if c == "\\":
            j += 2
            continue
        if c == "[":
            depth += 1
            j += 1
            if pattern[j:j + 1] == "^":
                j += 1
            if pattern[j:j + 1] == "]":  # a ] right after [ or [^ is a character
                j += 1
            continue
        if c == "]":
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return len(pattern)


# -- the library's failures ---------------------------------------------------------------------
def is_panic(e: BaseException) -> bool:
    """A Rust panic that crossed into Python (``pyo3_runtime.PanicException``)."""
    t = type(e)
    return t.__name__ == "PanicException" and t.__module__ == "pyo3_runtime"


_PANIC_REPORT = re.compile(rb"^thread '[^\n]*' [^\n]*panicked at ")


def _without_panic_reports(data: bytes) -> bytes:
    """Standard error as written, less Rust's report of each panic (an empty line, a line
    naming the thread, the message and backtrace, and a last ``note:`` about backtraces)."""
    out, skipping = [], False
    for line in data.splitlines(keepends=True):
        if _PANIC_REPORT.match(line):
            skipping = True
            if out and out[-1] in (b"\n", b"\r\n"):  # the report opens with an empty line
                out.pop()
        elif skipping and line.startswith(b"note: "):
            skipping = False
        elif not skipping:
            out.append(line)
    return b"".join(out)


class _Redirect:
    """File descriptor 2 is one per process: it is redirected to a buffer file while any
    thread runs a library call (the first call in redirects, the last call out restores
    it and passes the buffer on), never twice over. A forked worker starts afresh."""

    def __init__(self):
        self.lock = threading.Lock()
        self.pid = None

    def _fresh(self):
        if self.pid != os.getpid():
            self.pid, self.depth, self.saved, self.buffer, self.panicked = os.getpid(), 0, None, None, False

    def enter(self) -> None:
        with self.lock:
            self._fresh()
            self.depth += 1
            if self.depth > 1:
                return
            self.panicked = False
            try:
                self.saved = os.dup(2)
            except OSError:  # standard error is closed: nothing to keep clean
                self.saved = None
                return
            if self.buffer is None:
                self.buffer = tempfile.TemporaryFile()
            os.dup2(self.buffer.fileno(), 2)

    def exit(self) -> None:
        with self.lock:
            self.depth -= 1
            if self.depth > 0 or self.saved is None:
                return
            os.dup2(self.saved, 2)
            os.close(self.saved)
            self.saved = None
            self.buffer.seek(0)
            data = self.buffer.read()
            self.buffer.seek(0)
            self.buffer.truncate()
            if self.panicked:
                data = _without_panic_reports(data)
            if data:
                try:
                    os.write(2, data)
                except OSError:
                    pass


_stderr = _Redirect()


def library_call(action: str, *, hold_stderr: bool = True):
    """Decorate an ``HFTokenizer`` method: what the ``tokenizers`` library (or tiktoken's
    core) raises or panics with in it becomes a ``TokenizerFailure`` naming the tokenizer
    file and ``action``. ``hold_stderr`` False: standard error is not redirected around the
    call (a call made on a second thread for most of a run, while this one reports
    progress: the process's standard error must stay the terminal)."""
    def wrap(method):
        @functools.wraps(method)
        def guarded(self, *args, **kwargs):
            if hold_stderr:
                _stderr.enter()
            try:
                return method(self, *args, **kwargs)
            except (TokenizerError, UsageError):
                raise
            except Exception as e:
                raise TokenizerFailure(_failed(self.path, action, e)) from None
            except BaseException as e:
                if not is_panic(e):
                    raise
                if hold_stderr:
                    _stderr.panicked = True
                raise TokenizerFailure(_failed(self.path, action, e)) from None
            finally:
                if hold_stderr:
                    _stderr.exit()
        return guarded
    return wrap


def _failed(path, action: str, e: BaseException) -> str:
    what = "panicked" if is_panic(e) else f"failed ({type(e).__name__})"
    detail = " ".join(str(e).split()) or type(e).__name__
    return f"the tokenizers library {what} {action} with {path}: {detail}"

"""The build key: everything that decides a dataset's bytes, hashed into one sha256 that
``dataset_metadata.json`` records (``build.key``), with its components beside it
(``build.components``) so that a changed one can be named.

::

    components = {"kind": "episodes", "format_version": 1, "sftdata": "0.1.0",
                  "code": sha256 of the source text of CODE_PATHS,
                  "inputs": [{"path": "chats.jsonl", "sha256": ...}, {"path": "hf://datasets/o/n@main/a.jsonl",
                             "commit": ...}],
                  "evals": [...],                     # --decontaminate files, as inputs
                  "tokenizer": {"file_sha256": ..., "template_sha256": ..., "state_sha256": ...,
                                "state": {"special_tokens": sha256 prefix, "chat_template.text": ..., ...}},
                  "options": {...}}                   # exactly the metadata's "options"
    key = sha256(canonical JSON of components)        # pack: "source" (the dataset packed) and its options

The code version is a hash of the source text of the modules whose output is the
dataset's bytes, computed once per process: any edit of them, a comment included, gives
another key and so a rebuild (erring on the side of rebuilding; a hand-bumped constant
would be forgotten). ``check_target`` compares a planned build with the target's metadata:
up to date, or the list of what changed, in words.
"""

from __future__ import annotations

import functools
import hashlib
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata as importlib_metadata
from pathlib import Path

import orjson

from .. import __version__
from ..errors import OutputExistsError
from ..storage import METADATA_FILE
from ..storage.location import local_path, remote_url
from ..storage.manifest import manifest_of
from .format import TOKENIZER_FILE, format_version_for

BUILD = "build"  # the metadata's key
BUILD_VERSION = 1  # of the layout of BUILD
# the modules that decide a dataset's bytes, relative to the sftdata package (folders: every .py below)
CODE_PATHS = ("__init__.py", "sources", "records", "tokenize", "media", "chat", "template", "curate", "packing",
              "options", "pref", "prepare", "pack", "store/format.py", "store/writer.py", "store/split_writer.py",
              "store/rows.py", "store/serving_file.py")
CODE_NAMES = {"export": "the export code"}  # what a kind's "code" component is called when it changes
LIBRARIES = ("tiktoken", "tokenizers", "jinja2")  # recorded beside sftdata's version (verify --retokenize)
SPLIT_PARTS = ("chat_template",)  # a tokenizer state's objects whose keys are named one by one when they change
NO_KEY = "no build key recorded (the dataset was made by an earlier sftdata)"
FORCED = "--force rebuilds it whatever its build key says"


def sha256_json(value) -> str:
    """sha256 of ``value`` as canonical JSON (compact, keys sorted at every level)."""
    return hashlib.sha256(orjson.dumps(value, option=orjson.OPT_SORT_KEYS)).hexdigest()


@functools.cache
def code_version(root: Path | None = None, paths: tuple[str, ...] = CODE_PATHS) -> str:
    """sha256 of the paths and source text of every module of ``paths`` (default
    ``CODE_PATHS``) under ``root`` (default: this sftdata; once per process). Without the
    sources (an install of compiled files only): of the version."""
    root = Path(__file__).resolve().parent.parent if root is None else root
    h = hashlib.sha256()
    try:
        for rel in paths:
            p = root / rel
            for f in sorted(p.rglob("*.py")) if p.is_dir() else [p]:
                h.update(f.relative_to(root).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    except OSError:
        return hashlib.sha256(f"sftdata {__version__} without its sources".encode()).hexdigest()
    return h.hexdigest()


def library_versions() -> dict:
    """The versions of sftdata and of the libraries that render and encode (None: not installed)."""
    out = {"sftdata": __version__}
    for name in LIBRARIES:
        try:
            out[name] = importlib_metadata.version(name)
        except importlib_metadata.PackageNotFoundError:
            out[name] = None
    return out


def library_changes(meta: dict | None) -> list[str]:
    """``name then -> now`` for each library whose version differs from the one a dataset
    records (``[]`` when it records none): its tokens were made by other code than would
    make them now (``verify --retokenize`` checks that they still agree)."""
    rec = recorded_build(meta)
    then = (rec or {}).get("libraries")
    if not isinstance(then, dict):
        return []
    now = library_versions()
    return [f"{k} {then.get(k) or 'not installed'} -> {now[k] or 'not installed'}" for k in now
            if k in then and then.get(k) != now[k]]


def tokenizer_component(state: dict) -> dict:
    """The tokenizer and template of a ``tokenizer_state.json``: the tokenizer file's sha256
    (tiktoken ranks, or the tokenizer.json), the template text's, the whole state's, and a
    short hash of each of its keys (``chat_template``'s key by key), so that whatever the
    state records (a template variable, a Hub commit, the engine) is in the key and a
    change of it is named."""
    parts = {}
    for k, v in state.items():
        if k in SPLIT_PARTS and isinstance(v, dict):
            parts.update({f"{k}.{k2}": sha256_json(v2)[:16] for k2, v2 in v.items()})
        else:
            parts[k] = sha256_json(v)[:16]
    template = state.get("chat_template")
    return {"file_sha256": state.get("ranks_sha256") or state.get("file_sha256"),
            "template_sha256": template.get("sha256") if isinstance(template, dict) else None,
            "state_sha256": sha256_json(state), "state": dict(sorted(parts.items()))}


def build_record(components: dict, identities: list[dict]) -> dict:
    """What the metadata records under ``BUILD``: the key, its components, the identity of
    each input read (``sources.identity``: a file's stat, a URL's version; beside the
    sha256 the components hold, never part of the key) and the library versions."""
    return {"version": BUILD_VERSION, "key": sha256_json(components), "components": components,
            "identities": identities, "libraries": library_versions()}


def base_components(kind: str, code_paths: tuple[str, ...] = CODE_PATHS) -> dict:
    """The components every build has; ``code_paths``: the modules whose output is its
    bytes (another command's than prepare's and pack's, e.g. export's)."""
    return {"kind": kind, "format_version": format_version_for(kind), "sftdata": __version__,
            "code": code_version() if tuple(code_paths) == CODE_PATHS else code_version(None, tuple(code_paths))}


def build_key(components: dict) -> str:
    return sha256_json(components)


def recorded_build(meta: dict | None) -> dict | None:
    """The metadata's ``BUILD`` record when it is one this sftdata reads, else None."""
    rec = (meta or {}).get(BUILD)
    ok = isinstance(rec, dict) and rec.get("version") == BUILD_VERSION and isinstance(rec.get("components"), dict)
    return rec if ok and isinstance(rec.get("key"), str) else None


def recorded_hashes(meta: dict | None) -> dict[str, dict]:
    """An earlier build's ``{path read: {"sha256", "identity"}}`` of each input and
    evaluation file (what ``sources.identity.known_sha256`` reuses)."""
    rec = recorded_build(meta)
    if rec is None:
        return {}
    comp = rec["components"]
    shas = {e.get("path"): e.get("sha256") for e in (comp.get("inputs") or []) + (comp.get("evals") or [])
            if isinstance(e, dict) and "commit" not in e}
    return {i["path"]: {"sha256": shas[i["path"]], "identity": i.get("identity")}
            for i in rec.get("identities") or [] if isinstance(i, dict) and i.get("path") in shas}


def input_component(path: str, sha256: str | None, identity: dict | None = None, commit: str | None = None) -> dict:
    """One input's part of the key: its content's sha256; a Hub input's commit instead (what
    it names cannot change); a URL read in part (sha256 unknown) its store's version."""
    if commit is not None:
        return {"path": path, "commit": commit}
    out = {"path": path, "sha256": sha256}
    return out if sha256 is not None or identity is None else {**out, "version": identity}


# ---------------------------------------------------------------------- naming what changed
def _sha(v) -> str:
    return f"{v[:12]}..." if isinstance(v, str) and len(v) > 16 else _show(v)


def _show(v) -> str:
    if v is None:
        return "none"
    text = orjson.dumps(v, option=orjson.OPT_SORT_KEYS).decode()
    return text if len(text) <= 48 else f"sha256 {sha256_json(v)[:12]}..."


def _inputs(old: list, new: list, what: str) -> list[str]:
    """Inputs (or evaluation files) added, gone, changed, or given in another order."""
    def by_path(entries):
        return {e.get("path"): e for e in entries if isinstance(e, dict)}

    o, n = by_path(old), by_path(new)
    out = []
    for path, e in n.items():
        was = o.get(path)
        if was is None:
            out.append(f"{what} {path} is new")
        elif was != e:
            if "commit" in e or "commit" in was:
                out.append(f"{what} {path} changed (commit {_sha(was.get('commit'))} -> {_sha(e.get('commit'))})")
            elif was.get("sha256") != e.get("sha256"):
                out.append(f"{what} {path} changed (sha256 {_sha(was.get('sha256'))} -> {_sha(e.get('sha256'))})")
            else:
                out.append(f"{what} {path} changed (its version {_show(was.get('version'))} -> "
                           f"{_show(e.get('version'))})")
    out += [f"{what} {path} is no longer given" for path in o if path not in n]
    if not out and [e.get("path") for e in old] != [e.get("path") for e in new]:
        out.append(f"{what}s are given in another order")
    return out


def _variable(part: str) -> bool:
    return any(w in part.lower() for w in ("variable", "kwargs", "template_var"))


def _state_value(state: dict | None, part: str):
    if not isinstance(state, dict):
        return None
    k, _, k2 = part.partition(".")
    v = state.get(k)
    return v.get(k2) if k2 and isinstance(v, dict) else v


def _tokenizer(old: dict, new: dict, old_state: dict | None, new_state: dict | None) -> list[str]:
    out = []
    if old.get("file_sha256") != new.get("file_sha256"):
        out.append(f"the tokenizer file changed (sha256 {_sha(old.get('file_sha256'))} -> "
                   f"{_sha(new.get('file_sha256'))})")
    if old.get("template_sha256") != new.get("template_sha256"):
        out.append(f"the chat template text changed (sha256 {_sha(old.get('template_sha256'))} -> "
                   f"{_sha(new.get('template_sha256'))})")
    if out or old.get("state_sha256") == new.get("state_sha256"):
        return out  # a new file or template explains the rest of the state
    o, n = old.get("state") or {}, new.get("state") or {}
    parts = sorted(p for p in set(o) | set(n) if o.get(p) != n.get(p))

    def shown(p):
        if old_state is None or new_state is None:
            return p
        a, b = _state_value(old_state, p), _state_value(new_state, p)
        if isinstance(a, dict) and isinstance(b, dict):  # the keys that differ, a few
            keys = [k for k in sorted(set(a) | set(b), key=str) if a.get(k) != b.get(k)]
            more = f" and {len(keys) - 3} more" if len(keys) > 3 else ""
            return f"{p}: " + ", ".join(f"{k} {_show(a.get(k))} -> {_show(b.get(k))}" for k in keys[:3]) + more
        return f"{p}: {_show(a)} -> {_show(b)}"

    variables = [p for p in parts if _variable(p)]
    if variables:
        out.append("a template variable changed (" + "; ".join(shown(p) for p in variables) + ")")
    rest = [p for p in parts if p not in variables]
    if rest or not variables:
        out.append("the tokenizer state changed (" + ("; ".join(shown(p) for p in rest) or "sha256 "
                   f"{_sha(old.get('state_sha256'))} -> {_sha(new.get('state_sha256'))}") + ")")
    return out


# recorded options that are no flag of their own: what a user changes to change them
RECORDED_GROUPS = {"template_limits": "the template limits (--template-max-steps, --template-max-output)"}


def _options(old: dict, new: dict) -> list[str]:
    out = []
    for k in sorted(set(old) | set(new)):
        if old.get(k) == new.get(k):
            continue
        a, b = old.get(k), new.get(k)
        if k in RECORDED_GROUPS and isinstance(a, dict) and isinstance(b, dict):
            fields = [f for f in sorted(set(a) | set(b)) if a.get(f) != b.get(f)]
            out.append(f"{RECORDED_GROUPS[k]} changed (" + ", ".join(f"{f} {_show(a.get(f))} -> {_show(b.get(f))}"
                                                              for f in fields) + ")")
            continue
        what = "a template variable" if _variable(k) else RECORDED_GROUPS.get(k, f"the option --{k.replace('_', '-')}")
        out.append(f"{what} changed ({'not given' if k not in old else _show(a)} -> "
                   f"{'not given' if k not in new else _show(b)})")
    return out


def describe_changes(old: dict | None, new: dict, old_state: dict | None = None,
                     new_state: dict | None = None) -> list[str]:
    """What differs between an earlier build's components (``old``; None: none recorded)
    and these, in words, most specific first; ``old_state``/``new_state`` (the tokenizer
    states) let a changed part of the state show its values."""
    if old is None:
        return [NO_KEY]
    out = []
    if old.get("kind") != new.get("kind"):
        out.append(f"the dataset kind changed ({_show(old.get('kind'))} -> {_show(new.get('kind'))})")
    out += _inputs(old.get("inputs") or [], new.get("inputs") or [], "the input")
    out += _inputs(old.get("evals") or [], new.get("evals") or [], "the evaluation file")
    if old.get("source") != new.get("source"):
        a, b = old.get("source") or {}, new.get("source") or {}
        if a.get("path") != b.get("path"):
            out.append(f"the source dataset changed ({_show(a.get('path'))} -> {_show(b.get('path'))})")
        else:
            out.append(f"the source dataset changed (its {METADATA_FILE} sha256 {_sha(a.get('metadata_sha256'))} "
                       f"-> {_sha(b.get('metadata_sha256'))})")
    if old.get("tokenizer") != new.get("tokenizer"):
        out += _tokenizer(old.get("tokenizer") or {}, new.get("tokenizer") or {}, old_state, new_state)
    out += _options(old.get("options") or {}, new.get("options") or {})
    if old.get("format_version") != new.get("format_version"):
        out.append(f"the format version changed ({_show(old.get('format_version'))} -> "
                   f"{_show(new.get('format_version'))})")
    if old.get("code") != new.get("code") or old.get("sftdata") != new.get("sftdata"):
        version = (f"sftdata {old.get('sftdata')} -> {new.get('sftdata')}, " if old.get("sftdata") != new.get("sftdata")
                   else "")
        out.append(f"{CODE_NAMES.get(new.get('kind'), 'the rendering and masking code')} changed ({version}source "
                   f"sha256 {_sha(old.get('code'))} -> {_sha(new.get('code'))})")
    known = {"kind", "inputs", "evals", "source", "tokenizer", "options", "format_version", "code", "sftdata"}
    out += [f"the build's {k} changed" for k in sorted((set(old) | set(new)) - known) if old.get(k) != new.get(k)]
    return out


# ---------------------------------------------------------------------- the target
@dataclass
class Target:
    """What is at a build's output now: nothing, or a folder (``exists``) with its metadata
    and tokenizer state when they can be read."""

    location: str = ""
    exists: bool = False
    metadata: dict | None = None
    state: dict | None = None
    written_ns: int | None = None  # the metadata file's mtime: when the build was committed (local targets)


def read_target(location) -> Target:
    """The dataset at ``location`` (a path, a ``file://`` URL or an object-store URL), as
    far as it can be read; never raises for a missing or damaged one (the writer's checks
    then say what is wrong)."""
    url = remote_url(location)
    if url is not None:
        from ..storage.object_cache import remote_metadata  # lazy: object-storage code loads only for a target at a URL

        try:
            meta = remote_metadata(url)
        except Exception:  # unreadable (a missing package, credentials): the writer's checks say so
            meta = None
        return Target(url, meta is not None, meta)
    root = local_path(location)
    if not root.exists():
        return Target(str(root))
    try:
        written = (root / METADATA_FILE).stat().st_mtime_ns
    except OSError:
        written = None
    return Target(str(root), True, _json_or_none(root / METADATA_FILE), _json_or_none(root / TOKENIZER_FILE), written)


def _json_or_none(path: Path) -> dict | None:
    try:
        value = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return value if isinstance(value, dict) else None


def damaged(root: Path, meta: dict) -> str | None:
    """What is wrong with the files of the dataset at ``root`` as its metadata lists them
    (one missing, not a file, or of another size than recorded), or None: a stat of each,
    no byte read (``sftdata verify`` reads them)."""
    listed = manifest_of(meta)
    if listed is None:
        return f"its {METADATA_FILE} does not list its files"
    sizes = {name: (rec or {}).get("bytes") for name, rec in (meta.get("files") or {}).items()}
    for split, info in meta["splits"].items():
        for shard in info["shards"]:
            sizes.update({f"{split}/{shard['name']}/{fn}": (rec or {}).get("bytes") for fn, rec in shard["files"].items()
                          if isinstance(rec, dict)})
    for rel in listed[0]:
        try:
            st = (root / rel).lstat()
        except OSError:
            return f"{rel} is missing"
        if not stat.S_ISREG(st.st_mode):
            return f"{rel} is not a file"
        want = sizes.get(rel)
        if isinstance(want, int) and st.st_size != want:
            return f"{rel} is {st.st_size:,} bytes, not the {want:,} recorded"
    return None


@dataclass
class BuildSummary:
    """What every build command's summary gives (``prepare.PrepareSummary``, ``pref.PrefSummary``
    add their kind's figures): records read, rejected (reason -> count) and repaired
    (repair -> records), tokens per split, the curation's counts, the time and the build
    key's outcome."""

    output_dir: str
    records_read: int = 0
    tokens: dict = field(default_factory=dict)  # split -> tokens
    trained_tokens: dict = field(default_factory=dict)
    rejected: dict = field(default_factory=dict)
    repaired: dict = field(default_factory=dict)
    dedup: dict = field(default_factory=dict)  # mode, exact_duplicates (always counted), near_duplicates ...
    decontamination: dict = field(default_factory=dict)  # ngram, files: [{path, items, too_short, contaminated}]
    seconds: float = 0.0
    build_key: str | None = None  # the dataset's build key
    up_to_date: bool = False  # the target held this build already: nothing was done
    changed: list = field(default_factory=list)  # why the target was rebuilt, in words (empty: a new target)
    libraries_changed: list = field(default_factory=list)  # up to date, but made with other library versions

    def key_dict(self) -> dict:
        """The last entries of ``as_dict``: the build key's outcome."""
        return {"build_key": self.build_key, "up_to_date": self.up_to_date, "changed": list(self.changed),
                "libraries_changed": list(self.libraries_changed)}

    @classmethod
    def found(cls, output_dir: str, meta: dict, **own):
        """The summary of the dataset a run found up to date, from its metadata (``own``:
        the kind's figures); each split's tokens filled in."""
        counts = meta.get("counts") or {}
        out = cls(output_dir, records_read=counts.get("records_read", 0), rejected=counts.get("rejected") or {},
                  repaired=counts.get("repaired") or {}, dedup=meta.get("dedup") or {},
                  decontamination=meta.get("decontamination") or {}, up_to_date=True, **own)
        out.add_splits(meta.get("splits") or {})
        return out

    def add_splits(self, splits: dict) -> None:
        """Each split's tokens and trained tokens, from its metadata."""
        for split, m in splits.items():
            self.tokens[split], self.trained_tokens[split] = m.get("tokens", 0), m.get("trained_tokens", 0)


@dataclass
class BuildCheck:
    """A planned build against its target: ``up_to_date`` (the target's key is this one),
    or ``changes``: why it is built (empty for a new target)."""

    key: str | None  # None: not known before the run (a new target, --force, standard input)
    target: Target = field(default_factory=Target)
    up_to_date: bool = False
    changes: list[str] = field(default_factory=list)

    def refuse_unless(self, overwrite: bool) -> None:
        """A dataset at the target that is not up to date, without --overwrite: refused,
        naming what changed (a target that is not a dataset is the writer's to refuse)."""
        t = self.target
        if overwrite or self.up_to_date or not t.exists or t.metadata is None:
            return
        raise OutputExistsError(f"{t.location} already exists and is not up to date: {'; '.join(self.changes)}. "
                                f"Pass --overwrite to rebuild it, or choose another --output-dir")


def check_target(target: Target, planned: Callable[[], tuple[dict | None, str | None]], state: dict | None = None,
                 force: bool = False) -> BuildCheck:
    """Is ``target`` up to date? ``planned()`` gives the build's components, or None and why
    they cannot be known before the run; it is called (it may hash inputs) only when the
    target records a build key to compare with. ``state``: the tokenizer state of the
    build, to show a changed part's values."""
    if not target.exists:
        return BuildCheck(None, target)
    if force:
        return BuildCheck(None, target, False, [FORCED])
    if target.metadata is None:  # not a dataset (or not one that can be read): the writer says what it is
        return BuildCheck(None, target)
    rec = recorded_build(target.metadata)
    if rec is None:
        return BuildCheck(None, target, False, [NO_KEY])
    damage = damaged(Path(target.location), target.metadata) if remote_url(target.location) is None else None
    if damage is not None:
        return BuildCheck(None, target, False, [f"its files are not the ones its {METADATA_FILE} lists ({damage})"])
    components, unknown = planned()
    if components is None:
        return BuildCheck(None, target, False, [unknown or "the build key cannot be known before the run"])
    key = build_key(components)
    if rec["key"] == key:
        return BuildCheck(key, target, True)
    changes = describe_changes(rec["components"], components, target.state, state)
    return BuildCheck(key, target, False, changes or ["its build key differs"])

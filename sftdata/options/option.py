"""What an option declares (``Option``), and the options that the build commands share with
``pack`` (--overwrite, --force, --wait, --engine, --ray-address): light to import, so that a
command that takes only these loads no pipeline (sftdata.options.declared holds the rest)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .values import parse_template_vars

CHAT, TOOL, PREF, RL = "prepare-chat", "prepare-tool", "prepare-pref", "prepare-rl"
COMMANDS = (CHAT, TOOL, PREF, RL)
FAMILY = {CHAT: "prepare", TOOL: "prepare", PREF: "pref", RL: "pref"}
ALL, EPISODES, PAIRS = frozenset(COMMANDS), frozenset((CHAT, TOOL)), frozenset((PREF, RL))
IO, TEMPLATE, CURATION, SPLIT, RUN = "Input and output", "Tokenizer and template", "Curation", "Split and shards", "Run"
SAME = object()  # record_pref: as record


def always(key: str, value: Callable | None = None) -> Callable[[object], dict]:
    return lambda o: {key: value(o) if value else getattr(o, key)}


def when_set(key: str, value=None) -> Callable[[object], dict]:
    """Recorded only when given (truthy), so a run without it keeps its earlier bytes."""
    return lambda o: {key: value(o) if value else getattr(o, key)} if getattr(o, key) else {}


@dataclass(frozen=True)
class Option:
    name: str  # the field of the options classes, the --config key (with - or _) and the CLI parameter
    flags: tuple[str, ...]  # () : set by the command itself (mode), never given
    type: object  # bool, int, float, str, SIZE, list (of str), dict (--template-var), or a tuple of those
    default: object
    help: str = ""
    pairs_help: str = ""  # what it means to prepare-pref / prepare-rl, added to their help
    metavar: str = ""
    panel: str = RUN
    takes: frozenset = ALL
    record: Callable | None = None  # the prepare family's entries of recorded()
    record_pref: object = SAME  # the pref family's, when they differ
    check: Callable | None = None  # (value, options) -> None, or raises UsageError
    why: str = ""  # a command that does not take a byte-changing option, or an option that records nothing: why
    field: bool = True  # False: a CLI parameter the options classes do not hold (engine, ray address, --truncation)
    cli_default: object = SAME  # the CLI's default, when it differs (--workers: all cores)
    show_default: object = True
    nullable: bool = False  # None is a value (no limit, not given)

    def records(self, family: str) -> Callable | None:
        return self.record if family == "prepare" or self.record_pref is SAME else self.record_pref

    def from_given(self, value) -> object:
        """A command line's value as the options classes hold it: a repeatable option's
        list (None: not given) as a tuple, --template-var's NAME=VALUE items as a dict."""
        if self.type is list:
            return tuple(value or ())
        return parse_template_vars(value) if self.type is dict else value

    def help_for(self, command: str) -> str:
        return f"{self.help} {self.pairs_help}" if self.pairs_help and command in PAIRS else self.help

    @property
    def cli_value(self) -> object:
        """The command line's default (a repeatable option's: none given)."""
        if self.type in (list, dict):
            return None
        return self.default if self.cli_default is SAME else self.cli_default


NOTHING = "never changes a byte"
SHARED: tuple[Option, ...] = (
    Option("overwrite", ("--overwrite",), bool, False, panel=IO, why=NOTHING,
           help="Replace the dataset at --output-dir when it is not up to date (its build key differs), once the "
                "new one is complete (never a folder that is not a dataset)."),
    Option("force", ("--force",), bool, False, panel=IO, why=NOTHING,
           help="Rebuild even when --output-dir is up to date (its metadata holds this run's build key); it is "
                "replaced as --overwrite replaces it, with the same safety."),
    Option("wait", ("--wait",), bool, False, panel=IO, why=NOTHING,
           help="When another sftdata is writing the same --output-dir, wait for it to finish instead of stopping "
                "at once (then --overwrite decides whether its result may be replaced)."),
    Option("engine", ("--engine",), str, "local", metavar="ENGINE", field=False, why=NOTHING,
           help="local (this machine: --workers processes) or ray (tasks on a Ray cluster; needs the ray extra). "
                "The result is byte-identical either way."),
    Option("ray_address", ("--ray-address",), str, None, metavar="ADDRESS", field=False, nullable=True, why=NOTHING,
           help="With --engine ray: the cluster to use (default: RAY_ADDRESS, else a local cluster started for the "
                "run)."),
)

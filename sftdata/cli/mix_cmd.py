"""``sftdata mix``: write a mixture file (several datasets at weights) that the loader,
``replay-order``, ``inspect`` and ``verify`` take wherever a dataset goes."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Group
from rich.table import Table
from rich.text import Text

from ..errors import UsageError
from ..order.batches import DEFAULT_SEED
from ..report.mixture import MixtureOverview
from ..store.mixture import BY, make_mixture
from .app import after_writing, app, handle_errors, out_console, print_json
from .options import JsonOpt, QuietOpt
from .terminal import one_line


def parse_spec(text: str) -> tuple[str | None, str, float]:
    """``[NAME=]DATASET:WEIGHT`` -> (name or None, dataset, weight)."""
    name = None
    path, sep, weight = text.rpartition(":")
    if not sep or not path:
        raise UsageError(f"{text!r}: give DATASET:WEIGHT (e.g. data/chat:0.8), or NAME=DATASET:WEIGHT")
    if "=" in path and not Path(path).exists():
        name, path = path.split("=", 1)
    try:
        w = float(weight)
    except ValueError:
        raise UsageError(f"{text!r}: the weight {weight!r} is not a number (DATASET:WEIGHT, e.g. data/chat:0.8)") \
            from None
    return name, path, w


@app.command("mix")
@handle_errors
def mix_cmd(
    specs: Annotated[list[str], typer.Argument(metavar="DATASET:WEIGHT...", show_default=False, help="Member "
                     "datasets and their weights (any positive numbers; shared out in proportion). NAME=DATASET:WEIGHT "
                     "names a member (default: its folder's name).")],
    output: Annotated[Path, typer.Option("--output", "-o", metavar="MIX", help="The mixture file to write (JSON; "
                      "member paths are stored relative to its folder).")],
    by: Annotated[str, typer.Option("--by", metavar="rows|tokens", help="What the weights share out per epoch: "
                  "rows (episodes, or packed rows) or tokens.")] = "rows",
    seed: Annotated[int, typer.Option("--seed", metavar="N", help="Seed of the mixture's order (which items of "
                    "each member, and how they interleave).")] = DEFAULT_SEED,
    overwrite: Annotated[bool, typer.Option("--overwrite", metavar="", help="Replace an existing mixture file.")]
    = False,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
) -> None:
    """Mix prepared datasets at weights into one mixture file.

    Every epoch of the mixture holds as many items as the members together (by rows; by
    tokens: as many tokens), each member exactly its share up to rounding: a small member
    is repeated, a large one subsampled, a different part each epoch. Train, replay,
    inspect and verify the mixture file as a dataset. The members must share tokenizer and
    format. See docs/MIXTURES.md.

    Examples:

    * `sftdata mix data/chat:0.8 data/tools:0.2 -o data/mix.json`
    * `sftdata mix code=data/a:3 data/b:1 --by tokens --seed 7 -o mix.json`
    * `python scripts/train.py --dataset data/mix.json --config configs/sft/tiny.json`
    * `sftdata replay-order data/mix.json --config configs/sft/tiny.json --csv > epoch0.csv`
    """
    if by not in BY:
        raise UsageError(f"--by must be one of {', '.join(BY)}, got {by!r}")
    parsed = [parse_spec(s) for s in specs]
    mixture, sha = make_mixture(parsed, output, by=by, seed=seed, overwrite=overwrite)
    with after_writing(output):
        _show(mixture, sha, output, as_json, quiet)


def _show(mixture, sha: str, output: Path, as_json: bool, quiet: bool) -> None:
    shares = mixture.shares()
    if as_json:
        d = mixture.as_dict()
        d["members"] = [{**m, "share": float(s)} for m, s in zip(d["members"], shares)]
        print_json({"path": str(output), "sha256": sha, **d})
        return
    if quiet:
        return
    t = Table(title=f"mixture {output} (by {mixture.by}, seed {mixture.seed})", title_justify="left",
              header_style="bold")
    for col in ("member", "dataset", "weight", "share"):
        t.add_column(col, justify="right" if col in ("weight", "share") else "left")
    for m, s in zip(mixture.members, shares):
        t.add_row(one_line(m.name), one_line(m.path), f"{m.weight:g}", f"{float(s):.1%}")
    out_console.print(t)
    out_console.print(Text(f"sha256 {sha}; `sftdata inspect {output}` shows each epoch's realized shares",
                           style="dim"))


def draw_mixture(ov: MixtureOverview) -> Group:
    """Per member: target share, then each epoch's realized items and tokens and shares."""
    head = Text(f"{one_line(ov.path)}\n", style="bold")
    head.append(f"sftdata mixture · by {ov.by} · seed {ov.seed} · members {ov.kind} · split {ov.split} · sha256 "
                f"{ov.sha256}")
    t = Table(header_style="bold")
    for col in ("member", "weight", "target", "eligible", "tokens"):
        t.add_column(col, justify="left" if col == "member" else "right")
    for e in range(len(ov.epoch_items)):
        t.add_column(f"epoch {e} {'rows' if ov.by == 'rows' else 'tokens'} (share)", justify="right")
    for m in ov.members:
        cells = [f"{(x.items if ov.by == 'rows' else x.tokens):,} ({(x.items_share if ov.by == 'rows' else x.tokens_share):.2%})"
                 for x in m.epochs]
        t.add_row(one_line(m.name), f"{m.weight:g}", f"{m.share:.2%}", f"{m.eligible:,}", f"{m.tokens:,}", *cells)
    other = Table(title=f"the other measure ({'tokens' if ov.by == 'rows' else 'rows'}) per epoch", title_justify="left",
                  header_style="bold")
    other.add_column("member")
    for e in range(len(ov.epoch_items)):
        other.add_column(f"epoch {e}", justify="right")
    for m in ov.members:
        other.add_row(one_line(m.name), *(f"{(x.tokens if ov.by == 'rows' else x.items):,} "
                                f"({(x.tokens_share if ov.by == 'rows' else x.items_share):.2%})" for x in m.epochs))
    rows = "rows" if ov.kind == "packed" else "episodes"
    note = Text(f"{rows} per epoch: {', '.join(f'{n:,}' for n in ov.epoch_items)} (min {ov.episode_min_tokens} tokens "
                f"per episode; `replay-order {ov.path} --csv` lists each epoch)", style="dim")
    return Group(head, t, other, note)

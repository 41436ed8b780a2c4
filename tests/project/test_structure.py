"""The structure cannot silently decay: the layers of docs/ARCHITECTURE.md §5 (import-linter),
ruff's rule set, no function-level imports of sftdata modules (a cycle or a layer break
hiding), every module placed in a layer and given its line in docs/ARCHITECTURE.md's map, no
specification-section names in the tree, and the tests' own layout: a folder of tests per
package, and no test module importing another."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.helpers.paths import ROOT

BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    path = BIN / name if (BIN / name).exists() else shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed (pip install -e '.[test]' installs it)")
    return str(path)


def test_the_import_layers_hold():
    r = subprocess.run([_tool("lint-imports"), "--no-cache"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]


def test_ruff_finds_nothing():
    r = subprocess.run([_tool("ruff"), "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:]


def _python_files(*folders: str):
    for folder in folders:
        yield from sorted((ROOT / folder).rglob("*.py"))


LAZY = "# lazy: "  # the one allowed reason for a function-level import: an optional path loads its code when used


def test_no_function_level_import_of_an_sftdata_module():
    """Imports sit at the top, where a reader sees them, except an optional path's (a dataset
    at a URL, a mixture file) marked ``# lazy: <why>`` on the line: import-linter still
    checks those against the layers (it reads imports inside functions too)."""
    hits = []
    for f in _python_files("sftdata", "scripts"):
        lines = f.read_text().splitlines()
        for fn in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for n in ast.walk(fn):
                    sftdata_import = (isinstance(n, ast.ImportFrom) and (n.level or (n.module or "").startswith("sftdata"))
                                      or isinstance(n, ast.Import) and any(a.name.startswith("sftdata") for a in n.names))
                    if sftdata_import and LAZY not in lines[n.lineno - 1]:
                        hits.append(f"{f.relative_to(ROOT)}:{n.lineno}")
    assert hits == []


def test_every_top_level_module_is_placed_in_a_layer():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    named = set()
    for c in config:
        for key in ("layers", "source_modules"):
            for entry in c.get(key, []):
                named.update(m.strip() for m in re.split(r"[|:]", entry))
    modules = {f"sftdata.{p.stem if p.is_file() else p.name}" for p in (ROOT / "sftdata").iterdir()
               if (p.suffix == ".py" and p.stem not in ("__init__", "__main__")) or (p / "__init__.py").is_file()}
    assert sorted(modules - named) == []


def test_no_specification_section_names_in_code_or_docs():
    pattern = re.compile(r"seed 00\d|the pack issue", re.IGNORECASE)
    hits = [f"{p.relative_to(ROOT)}:{i}" for folder in ("sftdata", "scripts", "docs")
            for p in sorted((ROOT / folder).rglob("*")) if p.suffix in (".py", ".md")
            for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert hits == []


def _module_map() -> list[str]:
    """The module paths of docs/ARCHITECTURE.md's map (§8): ``sftdata/`` then lines indented
    two spaces per level, a package ending in ``/`` and holding the lines indented below it."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    block = text[text.index("```\nsftdata/\n") + 4:]
    block = block[:block.index("\nscripts/")]
    out, stack = [], []
    for line in block.splitlines()[1:]:
        name = line.split()[0]
        if name == "#":
            continue
        depth = (len(line) - len(line.lstrip(" "))) // 2
        stack = stack[:depth - 1]
        if name.endswith("/"):
            stack.append(name)
        else:
            out.append("".join(stack) + name)
    return out


def test_the_module_map_has_one_line_per_module():
    listed = _module_map()
    present = sorted(p.relative_to(ROOT / "sftdata").as_posix() for p in (ROOT / "sftdata").rglob("*.py"))
    assert sorted(set(listed)) == sorted(listed), "a module listed twice"
    assert sorted(listed) == present


# ------------------------------------------------------------------------- the tests' own layout
TESTS = ROOT / "tests"
# folders of tests/ that are not named for an sftdata package, and why
OTHER_TEST_FOLDERS = {
    "scripts": "scripts/train.py (with gpt.py and trainer.py), run as a user runs it",
    "safety": "hostile inputs and results that cut across every pipeline",
    "project": "the layout itself (this module) and the benchmarks",
    "helpers": "what test modules share; no tests",
    "contract": "the CLI's --help and --json snapshots; no tests",
    "fixtures": "datasets written by earlier versions; no tests",
}


def _imports_a_test_module(node: ast.AST) -> str | None:
    """The name a statement imports when it is a test module or a conftest, else None."""
    def is_test(dotted: str) -> bool:
        return any(part.startswith("test_") or part == "conftest" for part in dotted.split("."))

    if isinstance(node, ast.Import):
        return next((a.name for a in node.names if is_test(a.name)), None)
    if isinstance(node, ast.ImportFrom):
        module = "." * node.level + (node.module or "")
        if node.level or is_test(node.module or ""):
            return module  # a relative import reaches a sibling module; pytest imports test modules by path
        return next((f"{module}.{a.name}" for a in node.names if is_test(a.name)), None)
    return None


def test_no_test_module_imports_another():
    """A test module, conftest or helper never imports a test module or a conftest: shared
    functions live in tests/helpers/ (``from tests.helpers.X import ...``) and shared fixtures
    in a conftest.py, where pytest finds them. Importing a test module would run its fixtures
    twice, tie the two to one folder, and break under ``--import-mode=importlib``."""
    hits = []
    for f in sorted(TESTS.rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            name = _imports_a_test_module(node)
            if name is not None:
                hits.append(f"{f.relative_to(ROOT)}:{node.lineno} imports {name}")
    assert hits == []


def test_every_test_module_sits_in_a_folder():
    """tests/ holds its conftest.py and __init__.py, and folders: none of its test modules sits
    at the top, where it would say nothing of what it tests (a new one goes to the folder of
    the package it tests)."""
    assert sorted(p.name for p in TESTS.glob("test_*.py")) == []


def test_the_test_folders_mirror_the_packages():
    """Every sftdata package has its folder of tests, and every folder of tests/ is named for a
    package or is one of OTHER_TEST_FOLDERS."""
    packages = {p.name for p in (ROOT / "sftdata").iterdir() if (p / "__init__.py").is_file()}
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert sorted(packages - folders) == [], "a package without tests"
    assert sorted(folders - packages - set(OTHER_TEST_FOLDERS)) == [], "a folder named for no package"


def test_at_most_six_modules_lie_loose_in_the_package_root():
    """Everything else sits in a package named for its concept; the root keeps the version,
    `python -m sftdata`, the errors and the two documented import paths."""
    loose = sorted(p.name for p in (ROOT / "sftdata").glob("*.py"))
    assert loose == ["__init__.py", "__main__.py", "attention.py", "errors.py", "torch.py"]


def _lower_bounds() -> dict[str, str]:
    """{distribution: lower bound} of the base install and every extra in pyproject.toml."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"]) + [r for extra in project["optional-dependencies"].values() for r in extra]
    out = {}
    for r in reqs:
        m = re.fullmatch(r"([A-Za-z0-9_.\-\[\]]+?)(?:\[[^\]]*\])?\s*>=\s*([0-9.]+)", r.strip())
        if m:
            out.setdefault(m.group(1).lower(), m.group(2))
    return out


def test_the_declared_floors_are_the_versions_ci_tests():
    """.ci/floors.txt pins what .ci/run's floors run installs; pyproject.toml declares the
    same lower bounds, so a floor CI does not test cannot be declared."""
    floors = {}
    for line in (ROOT / ".ci" / "floors.txt").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, _, version = line.partition("==")
            floors[name.lower()] = version
    bounds = _lower_bounds()
    for name, version in floors.items():
        declared = bounds.get(name)
        assert declared is not None, f"{name} is pinned in .ci/floors.txt but has no lower bound in pyproject.toml"
        tested = tuple(map(int, version.split(".")))
        floor = tuple(map(int, declared.split(".")))
        assert tested[:len(floor)] == floor, f"{name}: floors.txt tests {version}, pyproject.toml declares >={declared}"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = {re.split(r"[<>=\[]", r)[0].strip().lower() for r in project["dependencies"]}
    assert base <= set(floors), f"base dependencies without a tested floor: {sorted(base - set(floors))}"
    # the floors run uses CI's python3, 3.11 (Python 3.10 reached its end of life in October 2026)
    assert project["requires-python"] == ">=3.11"


_CITED = re.compile(r"(?:docs/)?\b([A-Z][A-Z_]+\.md)\b")


def test_every_document_the_code_and_docs_cite_exists():
    """A page named in code, scripts, benchmarks or docs (ARCHITECTURE.md, FORMAT.md ...) is
    a file of this repository, at the top or under docs/."""
    missing = set()
    for folder in ("sftdata", "scripts", "benchmarks", "docs", "tests"):
        for p in sorted((ROOT / folder).rglob("*")):
            if p.suffix not in (".py", ".md") or "contract" in p.parts:
                continue
            for name in _CITED.findall(p.read_text(encoding="utf-8")):
                if not ((ROOT / name).is_file() or (ROOT / "docs" / name).is_file()):
                    missing.add(f"{name} (cited in {p.relative_to(ROOT)})")
    for name in _CITED.findall((ROOT / "README.md").read_text(encoding="utf-8")):
        if not ((ROOT / name).is_file() or (ROOT / "docs" / name).is_file()):
            missing.add(f"{name} (cited in README.md)")
    assert sorted(missing) == []

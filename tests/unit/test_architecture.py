"""The layering of docs/architecture.md, checked against the code: every module of slurmpod sits in
one row of the packages table, imports point down the table (also those inside functions and
under TYPE_CHECKING), and no module imports itself back through others."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import slurmpod

PACKAGE = Path(slurmpod.__file__).resolve().parent
DOC = PACKAGE.parent / "docs" / "architecture.md"
ROW = re.compile(r"^\| (\w+) \| `(slurmpod[\w/.]*)` \|", re.M)
KNOWN_CYCLE = re.compile(r"`(slurmpod\.[\w.]+)` ↔ `(slurmpod\.[\w.]+)`")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(path: Path) -> set[str]:
    """slurmpod modules `path` imports anywhere in the file (`from pkg import mod` names mod)."""
    name = _module_name(path)
    pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = (".".join(pkg[: len(pkg) - node.level + 1] + ([node.module] if node.module
                                                                    else []))
                    if node.level else node.module or "")
            found = [base, *(f"{base}.{a.name}" for a in node.names)]
        else:
            continue
        out.update(m for m in found if m in MODULES and m != name)
    return out


def rows() -> list[tuple[str, str]]:
    """(layer, dotted name) from the top row down; a path ending in `/` covers a package."""
    got = []
    for layer, path in ROW.findall(DOC.read_text(encoding="utf-8")):
        dotted = path.rstrip("/").removesuffix(".py").replace("/", ".").removesuffix(".__init__")
        got.append((layer, dotted))
    return got


def row_of(module: str, table: list[tuple[str, str]]) -> int | None:
    """The row covering `module`: the longest name that is the module or a package above it
    (the `slurmpod/__init__.py` row covers only the top module)."""
    best = None
    for i, (_, dotted) in enumerate(table):
        covers = module == dotted or (dotted != "slurmpod" and module.startswith(dotted + "."))
        if covers and (best is None or len(dotted) > len(table[best][1])):
            best = i
    return best


def test_the_table_is_read() -> None:
    table = rows()
    assert len(table) >= 20 and table[-1] == ("base", "slurmpod")
    assert [layer for layer, _ in table] == sorted(
        (layer for layer, _ in table),
        key=["cli", "application", "adapters", "core", "shared", "base"].index)


def test_every_module_has_a_row_and_every_row_a_module() -> None:
    table = rows()
    missing = [m for m in MODULES if row_of(m, table) is None]
    assert not missing, f"docs/architecture.md's packages table has no row for {missing}"
    used = {row_of(m, table) for m in MODULES}
    empty = [table[i][1] for i in range(len(table)) if i not in used]
    assert not empty, f"rows that cover no module (moved or renamed?): {empty}"


def test_imports_point_down_the_table() -> None:
    table = rows()
    upward = []
    for module, path in MODULES.items():
        here = row_of(module, table)
        for target in imports_of(path):
            there = row_of(target, table)
            assert here is not None and there is not None
            if there < here:
                upward.append(f"{module} ({table[here][1]}) imports {target} "
                              f"({table[there][1]}, above it)")
    assert not upward, "imports point downward only:\n" + "\n".join(sorted(upward))


def _cycles() -> list[set[str]]:
    """Strongly connected components (Tarjan) of more than one module."""
    graph = {m: imports_of(p) for m, p in MODULES.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles_but_the_documented_ones() -> None:
    known = [set(pair) for pair in KNOWN_CYCLE.findall(DOC.read_text(encoding="utf-8"))]
    found = _cycles()
    assert [c for c in found if c not in known] == []
    stale = [sorted(c) for c in known if c not in found]
    assert not stale, f"gone: remove from docs/architecture.md's known cycles: {stale}"


def test_the_scan_can_fail() -> None:
    # Honest probes: a function-level import and a TYPE_CHECKING one are both seen.
    assert "slurmpod.megatron.placement" in imports_of(PACKAGE / "megatron" / "plan.py")
    assert "slurmpod.report.model" in imports_of(PACKAGE / "report" / "watch.py")
    table = rows()
    assert row_of("slurmpod.render.sbatch", table) != row_of("slurmpod.render.env", table)
    assert row_of("slurmpod.errors", table) != row_of("slurmpod", table)
    assert row_of("slurmpod.nonexistent_top", table) is None


@pytest.mark.parametrize("core", ["slurmpod.model", "slurmpod.megatron", "slurmpod.topology",
                                  "slurmpod.perf", "slurmpod.render", "slurmpod.backends.parse"])
def test_pure_core_runs_no_commands(core: str) -> None:
    for module, path in MODULES.items():
        if module == core or module.startswith(core + "."):
            text = path.read_text(encoding="utf-8")
            assert not re.search(r"^\s*(import|from) (subprocess|paramiko|pty)\b", text, re.M), \
                module


# Functions say what they do in named steps: none longer than this many lines (the `def` line
# to the last, docstring included).
MAX_FUNCTION_LINES = 100
# Still longer, in files other engineers own while they split them (issue 20): none left. The
# set may only shrink: an entry whose function is short now, or gone, fails the test below.
LONG_FUNCTIONS_ALLOWED: set[str] = set()


def long_functions(root: Path = PACKAGE) -> dict[str, int]:
    """`path::Qual.name` → lines, for every function or method over MAX_FUNCTION_LINES
    (nested ones too, under their parent's name)."""
    out: dict[str, int] = {}

    def visit(node: ast.AST, where: str, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = prefix + child.name
                if not isinstance(child, ast.ClassDef):
                    lines = (child.end_lineno or child.lineno) - child.lineno + 1
                    if lines > MAX_FUNCTION_LINES:
                        out[f"{where}::{name}"] = lines
                visit(child, where, name + ".")
            else:
                visit(child, where, prefix)

    for path in sorted(root.rglob("*.py")):
        where = path.relative_to(root.parent).as_posix()
        visit(ast.parse(path.read_text(encoding="utf-8")), where, "")
    return out


def test_no_function_is_longer_than_a_screen() -> None:
    found = long_functions()
    new = {k: v for k, v in found.items() if k not in LONG_FUNCTIONS_ALLOWED}
    assert not new, (f"functions over {MAX_FUNCTION_LINES} lines: split them into named steps: "
                     f"{new}")
    stale = sorted(LONG_FUNCTIONS_ALLOWED - set(found))
    assert not stale, f"short now (or gone): remove from LONG_FUNCTIONS_ALLOWED: {stale}"


def test_the_length_scan_can_fail(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()

    def lines(n: int, indent: str) -> str:
        return "".join(f"{indent}x{i} = {i}\n" for i in range(n))

    # A method of MAX + 1 lines is found under its class; one of exactly MAX lines is not.
    (pkg / "m.py").write_text("class C:\n    def long(self):\n"
                              + lines(MAX_FUNCTION_LINES, " " * 8)
                              + "def exact():\n" + lines(MAX_FUNCTION_LINES - 1, " " * 4))
    assert long_functions(pkg) == {"pkg/m.py::C.long": MAX_FUNCTION_LINES + 1}


def test_unit_tests_mirror_the_packages() -> None:
    """tests/unit/<package>/ holds the tests of slurmpod/<package>/; only the tests about the
    whole package (this file, the lazy-import rule) and shared fixtures sit at the top."""
    unit = Path(__file__).resolve().parent
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    folders = {d.name for d in unit.iterdir() if d.is_dir() and d.name != "__pycache__"}
    assert folders <= packages, f"test folders without a package: {sorted(folders - packages)}"
    assert all((unit / d / "__init__.py").exists() for d in folders)
    loose = sorted(p.name for p in unit.glob("test_*.py"))
    assert loose == ["test_architecture.py", "test_lazy_imports.py"], loose

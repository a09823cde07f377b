"""Function-level imports exist only for start-up, and say so.

The CLI loads each subcommand's module only when it runs, and a module may defer an import to the
function that needs it so that importing the module stays cheap (numpy, msgspec, jinja2, paramiko
and the heavier slurmpod packages load only where used). Every such import carries a `# lazy:`
comment giving its reason, and none defers a module that importing its own module loads anyway:
that import would buy nothing and only hide the dependency from readers and from the
architecture test's cycle scan.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import slurmpod

PACKAGE = Path(slurmpod.__file__).resolve().parent
TAG = "# lazy:"


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(
        ".__init__")


MODULES = {_module_name(p) for p in PACKAGE.rglob("*.py")}


def function_imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Import statements inside any function (nested ones included)."""
    def visit(node: ast.AST, in_function: bool) -> Iterator[ast.Import | ast.ImportFrom]:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, ast.Import | ast.ImportFrom):
                yield child
            yield from visit(child, in_function or isinstance(
                child, ast.FunctionDef | ast.AsyncFunctionDef))
    yield from visit(tree, False)


def lazy_imports() -> dict[Path, list[tuple[int, str, list[str]]]]:
    """path -> [(line, source line, modules imported)] for every function-level import."""
    out: dict[Path, list[tuple[int, str, list[str]]]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = path.read_text().splitlines()
        for node in function_imports(ast.parse("\n".join(lines))):
            if isinstance(node, ast.ImportFrom):
                base = ("." * node.level) + (node.module or "")
                # `from pkg import mod` imports the module pkg.mod (pkg itself is no choice)
                subs = [f"{base}.{a.name}" for a in node.names
                        if node.level == 0 and f"{base}.{a.name}" in MODULES]
                mods = subs + ([base] if len(subs) < len(node.names) else [])
            else:
                mods = [a.name for a in node.names]
            # the reason sits at the end of the line, or on the line above a parenthesised one
            said = lines[node.lineno - 1]
            above = lines[node.lineno - 2].strip() if node.lineno > 1 else ""
            if TAG not in said and above.startswith(TAG):
                said = above
            out.setdefault(path, []).append((node.lineno, said, mods))
    return out


LAZY = lazy_imports()


def test_the_scan_finds_function_level_imports() -> None:
    src = "import os\ndef f():\n    import json  # lazy: x\n    def g():\n        from a import b\n"
    found = [(n.lineno, type(n).__name__) for n in function_imports(ast.parse(src))]
    assert found == [(3, "Import"), (5, "ImportFrom")]
    assert sum(len(v) for v in LAZY.values()) > 50  # the CLI alone defers dozens


def test_every_function_level_import_says_why() -> None:
    missing = [f"{path.relative_to(PACKAGE.parent)}:{line}: {text.strip()}"
               for path, found in LAZY.items() for line, text, _ in found if TAG not in text]
    assert not missing, ("function-level imports need a `# lazy: <reason>` comment (or belong at "
                         "the top of the module):\n" + "\n".join(missing))


_LOADED = """
import json, sys
import {module}
print(json.dumps(sorted(sys.modules)))
"""


def _loaded_by(module: str) -> set[str]:
    cp = subprocess.run([sys.executable, "-c", _LOADED.format(module=module)],
                        capture_output=True, text=True, timeout=120,
                        cwd=PACKAGE.parent, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert cp.returncode == 0, cp.stderr[-2000:]
    return set(json.loads(cp.stdout))


@pytest.mark.parametrize("chunk", range(4))
def test_no_lazy_import_of_what_the_module_loads_anyway(chunk: int) -> None:
    paths = sorted(LAZY)[chunk::4]
    with ThreadPoolExecutor(max_workers=2) as pool:
        loaded = dict(zip(paths, pool.map(lambda p: _loaded_by(_module_name(p)), paths),
                          strict=True))
    pointless = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {mod} is loaded by importing "
        f"{_module_name(path)} already; import it at the top"
        for path in paths for line, _, mods in LAZY[path] for mod in mods
        if not mod.startswith(".") and mod in loaded[path]]
    assert not pointless, "\n".join(pointless)


def test_the_loaded_check_can_fail() -> None:
    # slurmpod.cli.main imports click at the top: a lazy `import click` there would be pointless.
    assert "click" in _loaded_by("slurmpod.cli.main")

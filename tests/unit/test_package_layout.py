"""The package's shape: no import cycles, no oversized module or docstring, no build history in the product.

Import cycles count imports inside functions too (a lazy import still ties the two modules
together); imports under ``if TYPE_CHECKING:`` never run and do not count.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = [ROOT / "backend" / "fastpath", ROOT / "client" / "fastpath_client"]
MAX_MODULE_LINES = 400
MAX_DOCSTRING_LINES = 20
# words about how the project was built, not what it is (upstream issue numbers like server#8663 are fine)
HISTORY = re.compile(r"helper-[0-9]|fresh[-]user|(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth) "
                     r"session|\.\./shared", re.IGNORECASE)


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(tree: ast.AST, modules: set[str]) -> set[str]:
    """The modules of ``modules`` a module imports; ``from pkg import mod`` counts ``pkg.mod`` alone."""
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            node.body = []
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            submodules = {f"{node.module}.{alias.name}" for alias in node.names} & modules
            found |= submodules if len(submodules) == len(node.names) else submodules | {node.module}
    return found & modules


def import_cycles(root: Path) -> list[list[str]]:
    """Strongly connected components of more than one module in ``root``'s import graph (Tarjan)."""
    files = {_module_name(p, root): p for p in root.rglob("*.py")}
    graph = {name: _imports(ast.parse(path.read_text()), set(files)) - {name} for name, path in files.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return found


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_no_module_imports_itself_back_through_another(package):
    """Invariant: the import graph of each package is acyclic (every strongly connected component is one module)."""
    assert import_cycles(package) == []


def test_the_cycle_check_finds_a_lazy_import_cycle(tmp_path):
    """The check itself: a <-> b through an import inside a function is a cycle; one under TYPE_CHECKING is not."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg import b\n")
    (package / "b.py").write_text("def f():\n    from pkg.a import x\n")
    (package / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import a\n")
    assert import_cycles(package) == [["pkg.a", "pkg.b"]]


def build_side_importers(root: Path, build_package: str, allowed: tuple[str, ...]) -> dict[str, list[str]]:
    """Modules of ``root`` outside ``build_package`` and ``allowed`` that import ``build_package`` or one of its
    modules (imports inside functions included), with what each imports."""
    files = {_module_name(p, root): p for p in root.rglob("*.py")}
    found = {}
    for name, path in sorted(files.items()):
        if name == build_package or name.startswith(build_package + ".") or name in allowed:
            continue
        imported = sorted(m for m in _imports(ast.parse(path.read_text()), set(files))
                          if m == build_package or m.startswith(build_package + "."))
        if imported:
            found[name] = imported
    return found


def test_only_the_build_cli_imports_the_build_side():
    """Invariant: no serving module imports fastpath.artifacts (the build side); only fastpath.cli.build and
    fastpath.artifacts itself do. Serving reads a build's manifest through fastpath.manifest."""
    root = ROOT / "backend" / "fastpath"
    assert build_side_importers(root, "fastpath.artifacts", allowed=("fastpath.cli.build",)) == {}


def test_the_build_side_check_finds_a_lazy_import(tmp_path):
    """The check itself: a lazy ``from pkg.build.x import y`` and a ``from pkg import build`` are found; the
    allowed module and the build package's own modules are not."""
    package = tmp_path / "pkg"
    (package / "build").mkdir(parents=True)
    for name in ("__init__.py", "build/__init__.py", "build/x.py", "cli.py"):
        (package / name).write_text("")
    (package / "build" / "x.py").write_text("from pkg import serve\n")
    (package / "cli.py").write_text("from pkg.build import x\n")
    (package / "serve.py").write_text("def f():\n    from pkg.build.x import y\n")
    (package / "other.py").write_text("from pkg import build\n")
    assert build_side_importers(package, "pkg.build", allowed=("pkg.cli",)) == {"pkg.other": ["pkg.build"], "pkg.serve": ["pkg.build.x"]}


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: p.name)
def test_every_module_stays_under_the_size_limit(package):
    """Invariant: no module of the product is longer than MAX_MODULE_LINES lines (split by responsibility)."""
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in package.rglob("*.py")}
    assert {path: n for path, n in sizes.items() if n > MAX_MODULE_LINES} == {}


def long_docstrings(root: Path, max_lines: int) -> dict[str, int]:
    """Docstrings of the modules, classes and functions under ``root`` longer than ``max_lines`` lines, as
    ``{"<path from root>:<name>": lines}`` (``<module>`` for a module's). A docstring's lines are those of its
    text as written, from the opening quotes' line to the closing quotes' line."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                text = ast.get_docstring(node, clean=False)
                lines = text.count("\n") + 1 if text else 0
                if lines > max_lines:
                    found[f"{path.relative_to(root).as_posix()}:{getattr(node, 'name', '<module>')}"] = lines
    return found


def test_every_docstring_says_what_in_a_few_lines():
    """Invariant: no docstring of a module, class or function in backend/fastpath is longer than
    MAX_DOCSTRING_LINES (20) lines. Measured figures, long rationale and
    measurement stories live in docs/ (design, benchmarks, known issues) and the docstring links them."""
    root = ROOT / "backend" / "fastpath"
    assert long_docstrings(root, MAX_DOCSTRING_LINES) == {}


def test_the_docstring_check_counts_every_kind_of_docstring(tmp_path):
    """The check itself: module, class, nested and async function docstrings of 21 lines are found with their
    line counts; a method's docstring of exactly 20 lines (its closing quotes' line included) and a one-liner are not."""
    body = "\n".join(f"line {i}" for i in range(21))
    twenty = "\n".join(f"line {i}" for i in range(19))
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(
        f'"""{body}"""\n'
        f'class C:\n    """{body}"""\n    def method(self):\n        """{twenty}\n        """\n'
        f'def outer():\n    def inner():\n        """{body}"""\n'
        f'async def run():\n    """{body}"""\n'
        'def short():\n    """One line."""\n'
    )
    assert long_docstrings(tmp_path, 20) == {"pkg/m.py:<module>": 21, "pkg/m.py:C": 21, "pkg/m.py:inner": 21,
                                             "pkg/m.py:run": 21}


def test_no_tracked_file_speaks_of_how_the_project_was_built():
    """Invariant: no tracked file's name or text carries build-history words (HISTORY), outside CI's own folder."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    hits = [name for name in files if HISTORY.search(name)]
    for name in files:
        path = ROOT / name
        if name.startswith(".ci/") or not path.is_file() or path.suffix in {".npz", ".png", ".onnx"}:
            continue
        text = path.read_text(errors="replace")
        hits += [f"{name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}" for m in HISTORY.finditer(text)]
    assert hits == []

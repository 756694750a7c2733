"""Import boundaries (DESIGN.md), read two ways: statically, every import statement of every source file
(module level and inside functions, relative ones resolved), and at run time, what a fresh interpreter loads
when it runs some code of the project."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Not source of the project: installed packages, the dashboard, run directories, test output.
NOT_SOURCE = {"node_modules", "frontend", "var", "test-artifacts", "__pycache__"}
# Build output at the top of the repo (git-ignored): `pip wheel .` (scripts/gpu_wheels.sh, `make gpu-rehearsal`)
# copies every package into build/lib, whose copies are not the source.
BUILD_OUTPUT = {"build", "dist"}


def source_files(*dirs: str, root: Path = ROOT) -> Iterator[Path]:
    """Every .py file under the given directories of the repo (all of it when none are given), sorted."""
    for top in [root / d for d in dirs] or [root]:
        for here, subdirs, files in os.walk(top):
            skip = NOT_SOURCE | (BUILD_OUTPUT if Path(here) == root else set())
            subdirs[:] = sorted(d for d in subdirs if d not in skip and not d.startswith("."))
            yield from (Path(here) / f for f in sorted(files) if f.endswith(".py"))


@dataclass(frozen=True)
class Import:
    file: str  # relative to the repo root
    line: int
    module: str  # absolute dotted name (`from . import x` in worker/trainer/a.py: worker.trainer.x)
    lazy: bool  # inside a function (runs when called, not when the module is imported)
    names: tuple[str, ...] = ()  # `from module import a, b`: a and b, each maybe a module of its own

    @property
    def top(self) -> str:
        return self.module.split(".")[0]

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {'lazy ' if self.lazy else ''}import {self.module}"


class _Imports(ast.NodeVisitor):
    def __init__(self, file: str, package: list[str]):
        self.file, self.package, self.depth, self.found = file, package, 0, []

    def _add(self, node: ast.AST, module: str, names: tuple[str, ...] = ()) -> None:
        self.found.append(Import(self.file, node.lineno, module, self.depth > 0, names))

    def _nested(self, node: ast.AST) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _nested

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(node, alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            base = self.package[: len(self.package) - node.level + 1]
            if node.module is None:  # `from . import a, b`: a and b are modules of the package
                for alias in node.names:
                    self._add(node, ".".join([*base, alias.name]))
                return
            self._add(node, ".".join([*base, node.module]), tuple(a.name for a in node.names))
        else:
            self._add(node, node.module or "", tuple(a.name for a in node.names))

    def visit_Call(self, node: ast.Call) -> None:
        # importlib.import_module("x") and __import__("x") with a literal name
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if name in ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) and not node.args[0].value.startswith("."):
            self._add(node, node.args[0].value)
        self.generic_visit(node)


def imports(path: Path, root: Path = ROOT) -> list[Import]:
    """Every import in the file, in order; `root` is the directory the top-level packages live in."""
    rel = path.resolve().relative_to(root)
    visitor = _Imports(rel.as_posix(), list(rel.parent.parts))  # the package a relative import starts from
    visitor.visit(ast.parse(path.read_text(), filename=str(path)))
    return visitor.found


def imports_under(*dirs: str) -> list[Import]:
    return [imp for path in source_files(*dirs) for imp in imports(path, ROOT)]


def packages_loaded(code: str, packages: tuple[str, ...]) -> list[str]:
    """Run `code` in a new interpreter at the repo root; return which of `packages` it loaded (with any module of
    theirs). Raises if the code itself fails."""
    probe = (f"import json, sys\n{code}\n"
             f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({sorted(packages)!r}))))")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def module_of(file: str) -> str:
    """The dotted module a source file is (backend/runs/__init__.py -> backend.runs)."""
    return file.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def targets(i: Import, modules: set[str]) -> set[str]:
    """The modules of `modules` an import loads: `from backend.runs import service` loads backend.runs.service
    (and the package backend.runs); `from backend.runs.models import Run` loads backend.runs.models."""
    return {m for m in (i.module, *(f"{i.module}.{n}" for n in i.names)) if m in modules}


def module_graph(found: list[Import]) -> dict[str, set[str]]:
    """Which modules of the scanned source each module imports, lazily or not, itself left out."""
    modules = {module_of(i.file) for i in found}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for i in found:
        src = module_of(i.file)
        graph[src] |= targets(i, modules) - {src}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (each an import cycle), names sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def imports_within(found: list[Import], modules: list[str]) -> list[Import]:
    """The imports from one of `modules` to another: the edges of a cycle, to name where it is made."""
    known = {module_of(i.file) for i in found}
    return [i for i in found if module_of(i.file) in modules
            and (targets(i, known) & set(modules)) - {module_of(i.file)}]

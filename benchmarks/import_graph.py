"""Print a package's import graph compactly: which subpackages each subpackage imports, and every import cycle
between the sibling modules of a package, typing-only and function-level imports included.

    python benchmarks/import_graph.py [--root DIR] [PACKAGE ...]      (default: registry, in this checkout)

`lint-imports` checks the same graph but, as configured, leaves out imports under `if TYPE_CHECKING:`, and an
import inside a function hides a cycle from a reader as well as it does from nobody at run time; this shows both,
marked, so that a hidden cycle is seen. It reads the source with `ast` and imports nothing, so `--root` can point
at any checkout (an old commit's `git archive`, to compare before and after a change).
"""

from __future__ import annotations

import argparse
import ast
from collections.abc import Iterator
from pathlib import Path

# How an import is made, strongest first: at module level, inside a function (at call time), typing only.
KINDS = ("module", "late", "typing")
MARK = {"module": "", "late": "(late)", "typing": "(typing)"}


def modules(root: Path, package: str) -> dict[str, Path]:
    """Every module of `package` under `root` by dotted name (a package by its own name, for its __init__)."""
    found: dict[str, Path] = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    """Whether an `if` test is `TYPE_CHECKING` or `typing.TYPE_CHECKING`."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(node: ast.AST, kind: str) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement under `node` with how it is made."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, kind
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for part in child.body:
                yield from _imports(ast.Module(body=[part], type_ignores=[]), "typing")
            for part in child.orelse:
                yield from _imports(ast.Module(body=[part], type_ignores=[]), kind)
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield from _imports(child, "typing" if kind == "typing" else "late")
        else:
            yield from _imports(child, kind)


def edges(found: dict[str, Path]) -> dict[tuple[str, str], str]:
    """Module-to-module imports inside the package, each with the strongest way it is made."""
    out: dict[tuple[str, str], str] = {}
    for name, path in found.items():
        is_package = path.name == "__init__.py"
        for stmt, kind in _imports(ast.parse(path.read_text(), str(path)), "module"):
            targets: list[str] = []
            if isinstance(stmt, ast.Import):
                targets = [alias.name for alias in stmt.names]
            else:
                base = stmt.module or ""
                if stmt.level:
                    anchor = name.split(".")
                    anchor = anchor[: len(anchor) - stmt.level + (1 if is_package else 0)]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in found else base for a in stmt.names]
            for target in targets:
                while target and target not in found:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    old = out.get((name, target))
                    if old is None or KINDS.index(kind) < KINDS.index(old):
                        out[(name, target)] = kind
    return out


def _child(package: str, module: str) -> str | None:
    """The direct child of `package` that `module` is or lies in (None: outside it, or the package itself)."""
    if not module.startswith(package + "."):
        return None
    return package + "." + module[len(package) + 1 :].split(".")[0]


def _imported_children(graph: dict[tuple[str, str], str], package: str, child: str) -> dict[str, str]:
    """The children of `package` that `child` (or a module in it) imports, each with the strongest kind."""
    seen: dict[str, str] = {}
    for (src, dst), kind in graph.items():
        target = _child(package, dst)
        if (src == child or src.startswith(child + ".")) and target and target != child:
            old = seen.get(target)
            if old is None or KINDS.index(kind) < KINDS.index(old):
                seen[target] = kind
    return seen


def _cycles(nodes: set[str], graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        """Tarjan's step for one node."""
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component: list[str] = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(nodes):
        if node not in index:
            visit(node)
    return found


def report(root: Path, package: str) -> list[str]:
    """The lines describing `package`'s graph: subpackage imports, then sibling cycles."""
    found = modules(root, package)
    graph = edges(found)
    packages = sorted(m for m, p in found.items() if p.name == "__init__.py")
    subpackages = [p for p in packages if p.count(".") == 1]
    short = len(package) + 1
    lines = [f"{package}: subpackage -> subpackages it imports {MARK['late']} only in functions, "
             f"{MARK['typing']} only for typing; [core modules it imports]"]
    for child in sorted(m for m in found if m.count(".") == 1):
        seen = _imported_children(graph, package, child)
        subs = [t[short:] + MARK[k] for t, k in sorted(seen.items()) if t in subpackages]
        core = [t[short:] + MARK[k] for t, k in sorted(seen.items()) if t not in subpackages]
        if child in subpackages:
            lines.append(f"  {child[short:]:<9} -> {' '.join(subs) or '-'}  [{' '.join(core)}]")
        elif subs:  # a core module that reaches up into a subpackage
            lines.append(f"  {child[short:]:<9} -> {' '.join(subs)}  (core module)")
    lines.append(f"{package}: import cycles between sibling modules (all imports)")
    cycles = 0
    for parent in packages:
        children: dict[str, set[str]] = {}
        kinds: dict[tuple[str, str], str] = {}
        for (src, dst), kind in graph.items():
            a, b = _child(parent, src), _child(parent, dst)
            if a and b and a != b:
                children.setdefault(a, set()).add(b)
                old = kinds.get((a, b))
                if old is None or KINDS.index(kind) < KINDS.index(old):
                    kinds[(a, b)] = kind
        for component in _cycles(set(children), children):
            cycles += 1
            links = [f"{a.rpartition('.')[2]}->{b.rpartition('.')[2]}{MARK[kinds[(a, b)]]}"
                     for a in component for b in component if (a, b) in kinds]
            lines.append(f"  {parent}: {', '.join(links)}")
    if not cycles:
        lines.append("  none")
    return lines


def main() -> None:
    """Print the report of each package asked for."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("packages", nargs="*", default=["registry"])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    args = parser.parse_args()
    for package in args.packages:
        print("\n".join(report(args.root, package)))


if __name__ == "__main__":
    main()

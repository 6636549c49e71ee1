"""The server's import graph, read from the source (no import runs): every `import` and
`from ... import` in `jobs/`, `metering/` and `starforge/`, at module level or inside a
function, as edges between module names."""

import ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("jobs", "metering", "starforge")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" not in path.parts:
                found[module_name(path)] = path
    return found


def from_module(name: str, node: ast.ImportFrom, is_package: bool) -> str:
    """The absolute name of the module that a `from ... import` in module `name` reads."""
    if not node.level:
        return node.module or ""
    here = name.split(".") if is_package else name.split(".")[:-1]
    here = here[: len(here) - node.level + 1]
    return ".".join([*here, node.module] if node.module else here)


def imports_of(name: str, source: str) -> set[str]:
    """The project modules `source` (module `name`) imports."""
    known = modules()
    is_package = known[name].name == "__init__.py" if name in known else False
    found = set()
    tree = ast.parse(source)
    typing_only = {  # `if TYPE_CHECKING:` blocks import nothing at run time
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and ast.unparse(node.test).endswith("TYPE_CHECKING")
        for inner in ast.walk(node)
    }
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = from_module(name, node, is_package)
            # `from pkg import mod` imports pkg.mod when that is a module, else names of pkg
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in known:  # `import a.b.c` of a name: its module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


@cache
def graph() -> dict[str, frozenset[str]]:
    return {name: frozenset(imports_of(name, path.read_text())) for name, path in modules().items()}


def reachable(start: str) -> set[str]:
    """Every project module `start` imports, directly or through others."""
    seen, todo = set(), [start]
    while todo:
        for target in graph()[todo.pop()]:
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def cycles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    edges = graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found

"""memplan's import contract, read from the source: every import statement of every module
(inside functions and TYPE_CHECKING blocks too), checked against the layers of
docs/pipeline.md, each a package (a path prefix):

    face (memplan, memplan.api, memplan.cli.*) -> compile, tools -> planner
        -> passes, solvers -> core

and beside them compat (memplan.compat, every private torch access), which the layers
that use torch may import and which imports nothing of memplan.

Only compat reads torch's private names (`private_torch`). The core imports nothing of
memplan outside it, and core/graph.py nothing but errors; the
core and the solvers import no torch; passes never import the planner; and no module
imports itself back through others.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

# Each layer by the module paths it holds: a package (every module under it) or, for the
# face, the package's own __init__ and the API module.
LAYERS = {
    "memplan.core": "core",
    "memplan.solvers": "solvers",
    "memplan.passes": "passes",
    "memplan.planner": "planner",
    "memplan.tools": "tools",
    "memplan.compile": "compile",
    "memplan.compat": "compat",
    "memplan.cli": "face",
    "memplan.api": "face",
    "memplan": "face",
}
# Each layer and the layers (besides itself and the core) it may import.
MAY_IMPORT = {
    "core": set(),
    "solvers": set(),
    "compat": set(),
    "passes": {"compat"},
    "planner": {"solvers", "passes", "compat"},
    "tools": {"solvers", "passes", "planner", "compat"},
    "compile": {"solvers", "passes", "planner", "compat"},
    "face": {"solvers", "passes", "planner", "tools", "compile", "compat"},
}
TORCH_FREE = frozenset({"core", "solvers"})
# core/graph.py is the bottom of the core: it imports no other memplan module but errors.
GRAPH = "memplan.core.graph"
GRAPH_IMPORTS = frozenset({"memplan.core.errors"})


@dataclass(frozen=True)
class Edge:
    """`source` imports `target` at `line`."""

    source: str
    target: str
    line: int


def layer(module: str) -> str:
    """The layer a memplan module belongs to: that of the longest path prefix it has in
    LAYERS ("memplan" itself is the package's __init__ only); "" for none."""
    for prefix, name in sorted(LAYERS.items(), key=lambda item: -len(item[0])):
        if module == prefix or (prefix != "memplan" and module.startswith(prefix + ".")):
            return name
    return ""


def read_imports(root: Path) -> tuple[set[str], list[Edge]]:
    """The modules of the package at `root` (a folder named memplan) and every import in
    them, named by module (a `from a import b` of a module b is an import of a.b)."""
    files = {_module_name(root, path): path for path in sorted(root.rglob("*.py"))}
    edges = []
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            for target in _targets(node, package, files):
                edges.append(Edge(module, target, node.lineno))
    return set(files), edges


def violations(modules: Iterable[str], edges: Iterable[Edge]) -> list[str]:
    """Every break of the contract (see the module), one line each; empty if none."""
    modules = set(modules)
    edges = list(edges)
    found = [
        f"{m} is in no layer of the contract" for m in sorted(modules) if layer(m) not in MAY_IMPORT
    ]
    for edge in edges:
        where = f"{edge.source}:{edge.line} imports {edge.target}"
        source = layer(edge.source)
        if edge.target.split(".")[0] == "torch":
            if source in TORCH_FREE:
                found.append(f"{where}: the {source} imports no torch")
            continue
        if edge.target not in modules:
            continue  # another library
        target = layer(edge.target)
        if source == "compat":
            found.append(f"{where}: compat imports nothing of memplan")
        if edge.source == GRAPH and edge.target not in GRAPH_IMPORTS:
            found.append(f"{where}: graph.py imports nothing of memplan but errors")
        if target not in (source, "core") and target not in MAY_IMPORT.get(source, ()):
            found.append(f"{where}: the {source} layer may not import the {target} layer")
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for edge in edges:
        if edge.target in modules and edge.target != edge.source:
            graph[edge.source].add(edge.target)
    found += [f"import cycle: {' -> '.join([*cycle, cycle[0]])}" for cycle in cycles(graph)]
    return found


def private_torch(root: Path) -> list[str]:
    """Every reading of a private torch name outside memplan/compat.py, one line each
    ("module:line name"): an import of a module or a name, or an attribute chain from
    `torch`, with a part that starts with an underscore. An operator's own name
    (torch.ops.aten._unsafe_view) is public."""
    found = []
    for path in sorted(root.rglob("*.py")):
        module = _module_name(root, path)
        if layer(module) == "compat":
            continue
        read = [
            (node.lineno, name)
            for node in ast.walk(ast.parse(path.read_text(), str(path)))
            for name in _torch_names(node)
        ]
        for line, name in dict.fromkeys(read):
            # torch._C is read within torch._C._profiler: the longest chain says it.
            longer = any(n.startswith(name + ".") for at, n in read if at == line)
            if _private(name) and not longer:
                found.append(f"{module}:{line} {name}")
    return found


def _private(name: str) -> bool:
    """Whether a dotted torch name has a private part (a dunder, torch.__version__, and an
    operator's name are public)."""
    parts = name.split(".")
    if parts[:2] == ["torch", "ops"]:
        return False
    return any(p.startswith("_") and not p.endswith("__") for p in parts)


def _torch_names(node: ast.AST) -> list[str]:
    """The torch names a node reads: the modules and names an import takes from torch,
    or the dotted chain of an attribute read on `torch` (torch._C._profiler)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "torch"]
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level or base.split(".")[0] != "torch":
            return []
        return [f"{base}.{a.name}" for a in node.names]
    if isinstance(node, ast.Attribute) and not isinstance(getattr(node, "ctx", None), ast.Del):
        chain = []
        current: ast.AST = node
        while isinstance(current, ast.Attribute):
            chain.append(current.attr)
            current = current.value
        if isinstance(current, ast.Name) and current.id == "torch":
            return [".".join(["torch", *reversed(chain)])]
    return []


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
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
    return found


def _module_name(root: Path, path: Path) -> str:
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _targets(node: ast.AST, package: str, modules: Mapping[str, Path]) -> list[str]:
    """The modules an import statement names ([] for any other node)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:  # relative: from the package, up level - 1 packages
        parent = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join([*parent, *([base] if base else [])])
    named = [f"{base}.{alias.name}" for alias in node.names]
    return list(dict.fromkeys(name if name in modules else base for name in named))

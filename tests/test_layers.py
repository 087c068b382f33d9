"""The layers of docs/ARCHITECTURE.md, checked on the imports: none runs up a floor."""

import ast
from pathlib import Path

import h5pack

PACKAGE = Path(h5pack.__file__).parent

# What each layer may import besides itself (the package root re-exports everything lazily).
ALLOWED = {
    "_types": set(),
    "_version": set(),
    "errors": set(),
    "core": {"_types", "errors"},
    "synthetic": {"_types", "errors", "core"},
    "read": {"_types", "errors", "core"},
    "write": {"_types", "_version", "errors", "core"},
    "training": {"_types", "errors", "core", "read"},
    "check": {"_types", "errors", "core", "read", "write"},
    "bench": {"_types", "errors", "core", "read", "write", "training", "check", "synthetic"},
    "cli": {"_types", "errors", "core", "read", "write", "training", "check", "synthetic", "bench"},
}
# The layers whose imports of other layers must be public names only.
PUBLIC_ONLY = {"cli", "bench"}


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "h5pack"


def _imports() -> list[tuple[str, str, list[str]]]:
    found = []
    for path in PACKAGE.rglob("*.py"):
        module = ".".join(("h5pack", *path.relative_to(PACKAGE).with_suffix("").parts))
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module == "h5pack" or node.module.startswith("h5pack."):
                    found.append((module, node.module, [a.name for a in node.names]))
            elif isinstance(node, ast.Import):
                found.extend(
                    (module, a.name, []) for a in node.names if a.name.startswith("h5pack")
                )
    return found


def test_every_module_belongs_to_a_layer() -> None:
    # ``__main__`` (``python -m h5pack``) is the command line's entry: it sits on top.
    layers = {_layer(module) for module, _, _ in _imports()} - {"__init__", "__main__"}
    assert layers <= set(ALLOWED), layers - set(ALLOWED)


def test_no_module_imports_a_layer_above_it() -> None:
    upward = []
    for module, imported, names in _imports():
        source, target = _layer(module), _layer(imported)
        if source in ("h5pack", "__init__", "__main__") or source == target:
            continue
        if target == "h5pack":  # ``from h5pack import x``: the facade, which sits on top
            upward.append(f"{module} imports {names} from the package root")
        elif target not in ALLOWED[source]:
            upward.append(f"{module} imports {imported}")
    assert upward == []


def test_cli_and_bench_use_public_names_of_the_layers() -> None:
    private = [
        f"{module} imports {name} from {imported}"
        for module, imported, names in _imports()
        if _layer(module) in PUBLIC_ONLY and _layer(imported) not in (_layer(module), "h5pack")
        for name in names
        if name.startswith("_") and not imported.endswith("_types")
    ]
    assert private == []


# -- cycles inside a folder and private imports (issue 16.4) ------------------------------


def _module_graph() -> dict[str, set[str]]:
    """Every h5pack module's imports of other h5pack modules, function-local ones included.

    ``from h5pack.x import y`` counts as importing ``h5pack.x.y`` when that is a module.
    Imports under ``if TYPE_CHECKING:`` are left out: they never run.
    """
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        module = (
            ".".join(("h5pack", *parts[:-1]))
            if parts[-1] == "__init__"
            else ".".join(("h5pack", *parts))
        )
        tree = ast.parse(path.read_text())
        typing_only = {
            id(child)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING"
            for child in ast.walk(node)
        }
        found: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module.startswith("h5pack"):
                    found.add(node.module)
                    for alias in node.names:
                        candidate = PACKAGE.parent / f"{node.module}.{alias.name}".replace(".", "/")
                        if candidate.with_suffix(".py").exists() or candidate.is_dir():
                            found.add(f"{node.module}.{alias.name}")
            elif isinstance(node, ast.Import):
                found.update(a.name for a in node.names if a.name.startswith("h5pack"))
        graph[module] = found - {module}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[tuple[str, ...]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(tuple(sorted(group)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(groups)


# Cycles that stand, each through function-local imports, and why (docs/ARCHITECTURE.md,
# "No hidden cycles"): a new one fails the test below, and so does one of these once broken
# (take it off the list).
KNOWN_CYCLES: set[tuple[str, ...]] = set()


def test_no_module_imports_one_that_imports_it_back() -> None:
    assert set(_cycles(_module_graph())) == KNOWN_CYCLES


def test_cycles_are_found_through_function_local_imports() -> None:
    graph = {"h5pack.a": {"h5pack.b"}, "h5pack.b": {"h5pack.c"}, "h5pack.c": {"h5pack.a"}}
    assert _cycles(graph) == [("h5pack.a", "h5pack.b", "h5pack.c")]
    assert _cycles({"h5pack.a": {"h5pack.b"}, "h5pack.b": set()}) == []


def test_no_module_imports_a_private_name_of_another() -> None:
    private = [
        f"{module} imports {name} from {imported}"
        for module, imported, names in _imports()
        for name in names
        if name.startswith("_")
        and imported != module
        and not imported.endswith("_types")
        and name != "__version__"
        # a module's own compiled half (core/jpegbox.py and its extension core/_jpegbox)
        and f"{imported}.{name}" != f"{module.rpartition('.')[0]}._{module.rpartition('.')[2]}"
    ]
    assert private == []

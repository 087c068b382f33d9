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

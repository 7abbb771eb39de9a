"""The package layering of docs/architecture.md, read from the sources' import statements (every
import, at module level or inside a function):

- `vae.kernels` imports neither `vae.model` nor `vae.run` (nor anything else of `vae`);
- `vae.model` never imports `vae.run` or `vae.distributed`: it declares what it needs of a run
  (`model.execution`);
- `vae.run` never imports `vae.distributed` (the engine takes row bands through `strategies.Bands`);
- the import graph of `vae` has no circle;
- the nodes import the library only through its public surface (`PUBLIC`);
- no family is named outside its folder: a registered family's name is no string in `vae/` (outside
  `vae/model/<family>/`), `nodes/` or `bench/`, which read it from the family's spec (`vae.families`).
"""
import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# What the nodes may import of the library (vae/__init__.py's docstring): the package's names, these
# modules, and the switches of `vae.kernels`.
PUBLIC = {"vae", "vae.families", "vae.loading", "vae.doctor", "vae.video_codecs", "vae.video_reader",
          "vae.video_writer", "vae.video_file"}
PUBLIC_PACKAGES = ("vae.kernels",)

FORBIDDEN = {"vae.kernels": ("vae.model", "vae.run", "vae.distributed", "vae.families", "vae.loading", "vae.doctor",
                             "vae.video"),
             "vae.model": ("vae.run", "vae.distributed", "vae.families", "vae.loading", "vae.doctor"),
             "vae.run": ("vae.distributed", "vae.families", "vae.loading", "vae.doctor")}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """The modules of the repository `path` imports (`from pkg import name` of a submodule counts as
    that submodule, not as the package, which Python has initialised before any of its modules)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            submodules = {f"{target}.{alias.name}" for alias in node.names if _is_module(f"{target}.{alias.name}")}
            found.update(submodules)
            if len(submodules) < len(node.names):  # names defined by (or re-exported from) `target` itself
                found.add(target)
    return found


def _is_module(name: str) -> bool:
    path = REPO / Path(*name.split("."))
    return path.with_suffix(".py").is_file() or path.is_dir()


def graph(root: str) -> dict[str, set[str]]:
    """module -> the modules under `root` it imports (packages by their __init__)."""
    modules = {module_name(p): p for p in (REPO / root).rglob("*.py")}
    return {name: {m for m in imports(path) if m in modules and m != name} for name, path in modules.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return found


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_a_layer_imports_nothing_above_it(layer):
    wrong = {name: sorted(m for m in deps if m.startswith(FORBIDDEN[layer]))
             for name, deps in graph("vae").items() if name == layer or name.startswith(layer + ".")}
    assert not {name: deps for name, deps in wrong.items() if deps}


def test_the_library_has_no_import_circle():
    assert cycles(graph("vae")) == []


def test_the_cycle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_nodes_import_only_the_public_surface():
    reached = {}
    for path in sorted((REPO / "nodes").rglob("*.py")) + [REPO / "__init__.py"]:
        inner = {m.removeprefix("..").removeprefix(".") for m in _relative_imports(path)}
        library = sorted(m for m in inner if (m == "vae" or m.startswith("vae.")) and m not in PUBLIC
                         and not m.startswith(PUBLIC_PACKAGES))
        if library:
            reached[path.relative_to(REPO).as_posix()] = library
    assert not reached


def _relative_imports(path: Path) -> set[str]:
    """The pack-relative modules `path` imports (`from ..vae.run import x` -> "vae.run", and "vae.run.x"
    when x is a module)."""
    found = set()
    pack_depth = len(path.relative_to(REPO).parts) - 1  # `..` from nodes/ is the pack root
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == pack_depth + 1 - (path.name == "__init__.py" and pack_depth == 0):
            target = node.module or ""
            found.add(target)
            found.update(f"{target}.{a.name}" if target else a.name for a in node.names
                         if _is_module(f"{target}.{a.name}" if target else a.name))
    return found


def test_no_family_is_named_outside_its_folder():
    """A family's name ("wan21") as a string constant in the product or the benchmarks outside its own folder
    is a fact of that family kept elsewhere: it belongs in its spec (`vae/model/<family>/spec.py`)."""
    from vae.families import NAMES

    own = [REPO / "vae" / "model" / name for name in NAMES]
    paths = [p for root in ("vae", "nodes", "bench") for p in sorted((REPO / root).rglob("*.py"))
             if not any(folder in p.parents for folder in own)] + [REPO / "__init__.py"]
    named = [f"{path.relative_to(REPO)}:{node.lineno}: {node.value!r}"
             for path in paths for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Constant) and node.value in NAMES]
    assert not named, "family names outside their folders (read them from the spec):\n" + "\n".join(named)

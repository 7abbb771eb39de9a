"""CI runs the suite in two lanes (.ci/run): exactness and unit tests first (`-m "not comfy and not measurement"`),
then the tests that run a real ComfyUI or measure (`-m "comfy or measurement"`). A test module that starts a
ComfyUI but is not marked would run in the first lane, where no server is expected, and `-m "not comfy"`
would not leave it out; so every such module says so itself, with a module-level `pytestmark` of
`pytest.mark.comfy` (conftest.py also marks the tests by their fixtures, but a module may start ComfyUI
without them, as test_core_interop_server.py's dynamic-VRAM probe does). AST only, nothing is imported.
"""
import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# What starts a ComfyUI: conftest's fixtures, the harness's classes, a base directory for a ComfyUI process.
STARTS_COMFYUI = {"comfy_tree", "comfy_server", "comfy_client", "comfy_browser", "ComfyServer", "ComfyPage",
                  "build_base_directory"}


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def _used_names(tree: ast.Module) -> set[str]:
    """Every name, attribute and function parameter a module uses."""
    return ({n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {n.arg for n in ast.walk(tree) if isinstance(n, ast.arg)}
            | {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)})


def _fixtures_over(tree: ast.Module, starting: set[str]) -> set[str]:
    """The fixtures a module defines that take one of `starting` (directly)."""
    return {f.name for f in tree.body if isinstance(f, ast.FunctionDef)
            and any("fixture" in ast.unparse(d) for d in f.decorator_list)
            and {a.arg for a in f.args.args} & starting}


def modules_starting_comfyui() -> dict[str, ast.Module]:
    """Test modules that use something in STARTS_COMFYUI, or a fixture (of any test module) built on one."""
    trees = {p.name: _tree(p) for p in sorted(TESTS.glob("test_*.py"))}
    starting = set(STARTS_COMFYUI)
    while True:  # fixtures over fixtures (object_info over comfy_client), across modules that import them
        grown = starting.union(*(_fixtures_over(tree, starting) for tree in trees.values()))
        if grown == starting:
            break
        starting = grown
    return {name: tree for name, tree in trees.items() if _used_names(tree) & _visible(tree, starting)}


def _visible(tree: ast.Module, starting: set[str]) -> set[str]:
    """Of `starting`, what a module can reach: the harness's names, its own fixtures and those it imports
    from other test modules (a fixture named like a local variable elsewhere, "files", is not theirs)."""
    imported = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                and (node.module or "").removeprefix("tests.").startswith(("test_", "comfy_support")) for a in node.names}
    visible = set(STARTS_COMFYUI) | (imported & starting)
    while True:  # the module's own fixtures over what it can reach
        grown = visible | _fixtures_over(tree, visible)
        if grown == visible:
            return visible
        visible = grown


def _marks(tree: ast.Module) -> str:
    """The source of the module's `pytestmark` ("" without one)."""
    return "".join(ast.unparse(node.value) for node in tree.body
                   if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in node.targets))


def test_every_module_that_starts_comfyui_is_marked_comfy():
    modules = modules_starting_comfyui()
    unmarked = [name for name, tree in modules.items() if not re.search(r"\bpytest\.mark\.comfy\b(?!_)", _marks(tree))]
    assert not unmarked, ("these test modules start a ComfyUI but have no module-level "
                          f"`pytestmark = pytest.mark.comfy` (CI's second lane, .ci/run): {unmarked}")
    assert {"test_nodes_server.py", "test_core_interop_server.py", "test_workflows_browser.py",
            "test_variants_server.py", "test_old_torch.py"} <= set(modules)  # the detection sees them


def test_ci_lanes_split_the_suite_in_two():
    """.ci/run's two lanes together select every test once: the second is the first's complement."""
    run = (TESTS.parent / ".ci" / "run").read_text()
    first, second = re.findall(r'^\s*lane [\w-]+ "([^"]+)"', run, re.M)
    assert first == "not comfy and not measurement" and second == "comfy or measurement", (first, second)

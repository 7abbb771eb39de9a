"""What the docs, docstrings and comments point at exists, so a rename or a deletion that leaves a stale
pointer fails here rather than misleading the next reader.

Checked, by regex over the text and the AST of our modules (nothing is imported; well under a second):
- repository paths (`vae/run/engine.py`, `bench/results/gpu/`, `vae/loading` for a module, `bench/results/x.*`);
- bare test files and test names (`test_layout.py`, `test_plan_is_frozen`);
- dotted references in backticks to our modules (`engine.decode`, `vae.run.kernel_plan.choose`,
  `strategies.ExactTiles`, `vae/video_file.FileSink`, `model.decode_chunk`): the name must be defined in
  that module (for a package, in it or one of its modules; a class's member after a class name).
bench/RESULTS.md keeps its commands as they were recorded, so only the result files it cites are checked there.
Also: every file in bench/results/ is cited.
"""
import ast
import os
import re
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# What is read: the product, the benchmarks, the docs, CI and the tests' own docstrings and comments.
SOURCES = ("__init__.py", "README.md", "CONTRIBUTING.md", ".ci/*", "docs/*.md", "vae/**/*.py", "nodes/**/*.py",
           "bench/*.py", "bench/*.sh", "tests/*.py", "tests/comfy_support/**/*.py")
# Our modules, by dotted name; tests/comfy_support's only as `comfy_support.<name>` (ComfyUI has a `server` too).
MODULE_ROOTS = {"vae": "vae", "nodes": "nodes", "bench": "bench", "comfy_support": "tests/comfy_support"}
TOP_DIRS = r"\.ci|vae|nodes|bench|tests|docs|web|example_workflows"
PATH = re.compile(rf"(?<![\w./-])((?:{TOP_DIRS})/[\w./*-]*[\w*/])(?![{{<\w])")  # not a template
BARE_TEST_FILE = re.compile(r"(?<![\w./-])(test_\w+\.py)\b")
TICKED = re.compile(r"`([^`\s]+)`")
DOTTED = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+")
TEST_NAME = re.compile(r"test_\w+")
FILE_SUFFIXES = {"py", "c", "md", "sh", "json", "jsonl", "txt", "err", "yaml", "toml", "js", "png", "jpg", "mp4",
                 "safetensors", "pt", "log"}


def _sources() -> list[Path]:
    own = Path(__file__).resolve()  # its examples of stale references are meant
    return sorted({p for pattern in SOURCES for p in REPO.glob(pattern) if p.is_file() and p.resolve() != own})


@cache
def _modules() -> dict[str, list[Path]]:
    """Dotted module name -> files, under every suffix of the name (`vae.kernels.activation_layout`,
    `kernels.activation_layout`, `activation_layout`) except for tests/comfy_support, named only in full."""
    out: dict[str, list[Path]] = {}
    for root, folder in MODULE_ROOTS.items():
        for path in (REPO / folder).rglob("*.py"):
            parts = [root, *path.relative_to(REPO / folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            for k in range(len(parts) if root == "comfy_support" else 1, len(parts) + 1):
                out.setdefault(".".join(parts[-k:]), []).append(path)
    return out


@cache
def _names(path: Path) -> dict[str, frozenset[str] | None]:
    """Top-level names of a module -> a class's members (None: not a class), `__all__` included."""
    tree = ast.parse(path.read_text())
    names: dict[str, frozenset[str] | None] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names[node.name] = None
        elif isinstance(node, ast.ClassDef):
            members = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
            members |= {t.id for n in node.body for t in _targets(n) if isinstance(t, ast.Name)}
            members |= {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)}
            names[node.name] = frozenset(members)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update({(a.asname or a.name).split(".")[0]: None for a in node.names})
        else:
            for target in _targets(node):
                names.update({n.id: None for n in ast.walk(target) if isinstance(n, ast.Name)})
                if isinstance(target, ast.Name) and target.id == "__all__":
                    names.update({e.value: None for e in node.value.elts if isinstance(e, ast.Constant)})
    return names


def _targets(node) -> list:
    if isinstance(node, ast.Assign):
        return node.targets
    return [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) and node.simple else []


def _defines(path: Path, name: str, member: str | None) -> bool:
    """Whether module `path` (a package: it or its modules) defines `name` (and the class `name` `member`),
    or any class of it has a member `name` (`model.decode_chunk` is a method of `VideoVAE`)."""
    files = [path] + (sorted(path.parent.glob("*.py")) if path.name == "__init__.py" else [])
    if path.name == "__init__.py" and (path.parent / name).is_dir():
        return True
    for file in files:
        names = _names(file)
        if name in names:
            return member is None or names[name] is None or member in names[name]
        if any(members and name in members for members in names.values()):
            return True
    return False


@cache
def _identifiers() -> tuple[frozenset[str], frozenset[str]]:
    """(every name and attribute our code defines or uses, every function parameter's name)."""
    names, parameters = set(), set()
    for path in {p for paths in _modules().values() for p in paths}:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.arg):
                parameters.add(node.arg)
            name = getattr(node, "name", None) or getattr(node, "id", None) or getattr(node, "attr", None)
            names.update([name] if isinstance(name, str) else [])
    return frozenset(names), frozenset(parameters)


def _dotted_error(ref: str) -> str | None:
    """Why the dotted reference `ref` to one of our modules is stale (None: it is not, or it is not ours).
    A bare module name that is also a parameter's name (`settings.backend`, `conv.weight`) may be a
    variable: then only a name our code has nowhere is stale."""
    parts = ref.split(".")
    if parts[-1] in FILE_SUFFIXES:  # a file name (`engine.py`, ComfyUI's `sd.py`): paths and test files are checked as such
        return None
    modules = _modules()
    for k in range(len(parts) - 1, 0, -1):
        module = ".".join(parts[:k])
        if module in modules:
            name, member = parts[k], parts[k + 1] if k + 1 < len(parts) else None
            if ".".join(parts[:k + 1]) in modules or any(_defines(p, name, member) for p in modules[module]):
                return None
            names, parameters = _identifiers()
            if k == 1 and module in parameters and name in names:
                return None
            return f"`{ref}`: {module} has no {'.'.join(parts[k:k + 2])}"
    return None


@cache
def _repo_paths() -> frozenset[str]:
    """Every file and folder of the repository, not descending into hidden folders (.venv, .cache, .git:
    hundreds of thousands of files on CI) or __pycache__; .ci itself is kept."""
    paths = set()
    for folder, subfolders, files in os.walk(REPO):
        subfolders[:] = [d for d in subfolders if d == ".ci" or not (d.startswith(".") or d == "__pycache__")]
        base = Path(folder).relative_to(REPO)
        paths.update(str(base / name) for name in subfolders + files)
    return frozenset(paths)


def _path_error(path: str) -> str | None:
    """Why the repository path `path` is stale: a file or folder, a glob, `vae/loading` for vae/loading.py,
    or `vae/video_file.FileSink` for a name in it."""
    path = path.rstrip("/.")
    if "*" in path:
        return None if any(REPO.glob(path)) else f"{path}: nothing matches"
    if path in _repo_paths() or f"{path}.py" in _repo_paths():
        return None
    module, _, names = path.partition(".")
    if names and f"{module}.py" in _repo_paths():  # `vae/engine.encode/decode`: either name
        for name, _, member in (name.partition(".") for name in names.split("/")):
            if not _defines(REPO / f"{module}.py", name, member or None):
                return f"{path}: {module}.py has no {name}"
        return None
    return f"{path}: no such file or folder"


@cache
def _test_names() -> frozenset[str]:
    return frozenset(re.findall(r"^(?:async )?def (test_\w+)", "\n".join(p.read_text() for p in REPO.glob("tests/test_*.py")), re.M))


def _file_error(name: str) -> str | None:
    return None if (REPO / "tests" / name).is_file() else f"{name}: no such test file"


def _stale(line: str) -> list[str]:
    errors = [_path_error(p) for p in PATH.findall(line)]
    errors += [_file_error(name) for name in BARE_TEST_FILE.findall(line)]
    for ticked in TICKED.findall(line):
        errors += [_dotted_error(ref) for ref in DOTTED.findall(ticked)]
        test = TEST_NAME.fullmatch(ticked.split("::")[-1].split("[")[0].removesuffix("()"))
        if test and test.group() not in _test_names():
            errors.append(f"`{test.group()}`: no such test")
    return [e for e in errors if e]


def test_docs_and_docstrings_point_at_what_exists():
    stale = [f"{path.relative_to(REPO)}:{number}: {error}"
             for path in _sources()
             for number, line in enumerate(path.read_text().splitlines(), 1)
             for error in _stale(line)]
    assert not stale, "stale references (rename or remove them):\n" + "\n".join(stale)


def test_results_cited_by_the_benchmark_record_exist():
    results = REPO / "bench" / "RESULTS.md"
    stale = [f"RESULTS.md:{number}: {error}"
             for number, line in enumerate(results.read_text().splitlines(), 1)
             for path in PATH.findall(line) if path.startswith("bench/results")
             for error in [_path_error(path)] if error]
    assert not stale, "\n".join(stale)


def test_every_committed_result_is_cited():
    """A file in bench/results/ is the raw output of a run the record cites (by name, or by its run's name
    for its .txt/.json/.err siblings); what nothing cites goes to bench/results/archive/<date>/ or away.
    bench/results/gpu/ is the GPU windows' own record (ledger and session logs), kept whole."""
    cited = "\n".join(p.read_text() for p in [REPO / "bench" / "RESULTS.md", REPO / "README.md", *REPO.glob("docs/*.md")])
    results = REPO / "bench" / "results"
    uncited = [str(p.relative_to(results)) for p in sorted(results.glob("*")) if p.is_file()
               and not re.search(rf"(?<![\w-]){re.escape(p.stem)}\.[\w*]", cited)]
    assert not uncited, f"results nothing cites (archive or delete them): {uncited}"

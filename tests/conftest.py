"""Shared fixtures: a real ComfyUI server (`comfy_server`, `comfy_client`) and its real frontend
(`comfy_browser`). Both are started once per ComfyUI tree per session, on first use, by tests marked
`comfy` / `browser`; without `.ci/setup` those tests skip (locally) or fail (CI=true).

Every test that uses a server runs once per tree in `environment.DEFAULT_TREES` (0.3.75 and 0.33.0;
the test id ends in the tree, e.g. `[0.33.0]`). `@pytest.mark.comfy_trees("0.33.0-fp16")` picks other
trees for a test. pytest groups the tests by tree, so one server runs at a time.

    @pytest.mark.comfy
    def test_something(comfy_server, comfy_client):
        comfy_server.assert_pack_imported()
        entry = comfy_client.run(prompt)            # queue + websocket wait + /history
        assert entry["status"]["status_str"] == "success"

    @pytest.mark.browser
    def test_workflow(comfy_browser, comfy_client):
        comfy_browser.load_workflow(ui_json).assert_clean()
        comfy_client.run(comfy_browser.graph_to_prompt())

The repository root is a ComfyUI pack. pytest >= 8 imports its `__init__.py` while setting up the
root `Package` collector; that file imports nothing at module level (ComfyUI and our node layer are
imported lazily by `comfy_entrypoint()`), which `test_pack_entry_point.py` keeps true. tests/ has no
`__init__.py`, so test modules are not part of the pack.
"""

import os
import sys
import tempfile
from pathlib import Path

import pytest

# The harness is imported as the top-level package `comfy_support` from this folder rather than as
# `tests.comfy_support`, which would depend on `tests` resolving to our namespace package.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from comfy_support import environment, old_torch  # noqa: E402  (needs the path entry above)

import heavy  # noqa: E402  (tests/heavy.py, by the same path entry)

# Under pytest-xdist (`-n 2`, as CI runs on its 2 cores) every worker, and every server it starts, computes
# on one thread: two workers of two threads each on two cores wait on each other's spinning threads.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)

SCRATCH_PREFIX = "streamvae-kernels-"
# Kernel choices measured by the tests (and the servers they start) go to a scratch folder, never the
# user's cache (kernels/kernel_choice.py); a pytest that a test starts keeps its parent's scratch folder.
if not Path(os.environ.get("STREAMVAE_KERNEL_CACHE", "/")).name.startswith(SCRATCH_PREFIX):
    os.environ["STREAMVAE_KERNEL_CACHE"] = tempfile.mkdtemp(prefix=SCRATCH_PREFIX)

if old_torch.active():  # before any test module imports the pack (see comfy_support/old_torch.py)
    old_torch.hide_newer_torch()

SERVER_FIXTURES = {"comfy_tree", "comfy_server", "comfy_client"}


@pytest.fixture(scope="session", autouse=True)
def ndhwc_convs_checked():
    """The channels-last convs' first-use check (vae/kernels/conv_check.py) decided before any test, so
    that a test which counts the convs of its first NDHWC run does not count the check's (a few seconds
    per process; tests of the check itself start it again)."""
    import torch

    from vae.kernels import conv_check

    for dtype in (torch.float32, torch.bfloat16):
        conv_check.failure("cpu", dtype)
BROWSER_FIXTURES = {"comfy_browser"}


def pytest_generate_tests(metafunc):
    """One test per ComfyUI tree for every test that (directly or through its fixtures) needs a server."""
    if "comfy_tree" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("comfy_trees")
    wanted = tuple(marker.args) if marker else environment.DEFAULT_TREES
    trees = environment.selected_trees(wanted)
    metafunc.parametrize("comfy_tree", trees, ids=trees, indirect=True, scope="session")


def pytest_addoption(parser):
    parser.addoption("--record-heavy", action="store_true",
                     help="write the heavy tests that pass into bench/results/heavy_tests.jsonl (tests/heavy.py)")
    parser.addoption("--run-heavy", action="store_true",
                     help="run the heavy tests even where that record holds them passed on this code")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's, which reads the groups into the test ids
def pytest_collection_modifyitems(config, items):
    """Mark tests by the fixtures they use (so `-m "not browser"` works even where a mark was forgotten),
    and group them for pytest-xdist (`-n 2 --dist loadgroup`, as CI runs): every test of one ComfyUI
    tree on one worker, so each tree's server starts once, and every other test with the rest of its
    module, so a module's fixtures are made once. A heavy test carries its code's hash to its reports and
    is skipped where the record holds it passed on that code (tests/heavy.py)."""
    record = heavy.read()
    for item in items:
        marker = item.get_closest_marker("heavy")
        if marker is not None:
            code = heavy.code(item.nodeid.split("::", 1)[0], tuple(marker.args))
            item.user_properties.append(("heavy_code", code))
            entry = heavy.passed_on_this_code(item.nodeid, code, record)
            if entry is not None and not config.getoption("run_heavy"):
                item.add_marker(pytest.mark.skip(reason=heavy.skip_reason(entry)))
        used = set(getattr(item, "fixturenames", ()))
        if used & (SERVER_FIXTURES | BROWSER_FIXTURES):
            item.add_marker(pytest.mark.comfy)
        if used & BROWSER_FIXTURES:
            item.add_marker(pytest.mark.browser)
        callspec = getattr(item, "callspec", None)
        tree = callspec.params.get("comfy_tree") if callspec is not None else None
        item.add_marker(pytest.mark.xdist_group(f"comfyui-{tree}" if tree else item.module.__name__))


def pytest_runtest_setup(item):
    """Fail each test of a worker whose groups did not reach the scheduler. pytest-xdist 3.8 writes the
    group into `item._nodeid`, which pytest 9.2 no longer reads; the groups then vanish without a word,
    and every module's fixtures (the released LTX-2 checkpoint: 2.3 GB on disk, 40 s) are built on both
    workers."""
    if os.environ.get("PYTEST_XDIST_WORKER") and item.config.getoption("loadgroup", default=False) and "@" not in item.nodeid:
        pytest.fail(f"pytest {pytest.__version__} dropped pytest-xdist's test groups: each module's fixtures "
                    "would be built on every worker. Install the versions requirements-dev.txt pins.", pytrace=False)


@pytest.fixture(scope="session")
def comfy_tree(request):
    """The ComfyUI tree (`comfy_support.environment.ComfyTree`) this test runs against."""
    return environment.TREES[request.param]


@pytest.fixture(scope="session")
def comfy_server(comfy_tree, tmp_path_factory):
    """A running ComfyUI server (`comfy_support.server.ComfyServer`) of `comfy_tree`, shared by every
    test on that tree.

    Attributes: `url`, `base` (its base directory), `tree`, `log` (text so far), `log_tail()`, `run(prompt)`,
    `assert_pack_imported()`, `client()`. Fails every dependent test with the log tail if the server
    cannot start.
    """
    environment.require_comfyui(comfy_tree)
    environment.require_fixtures()
    from comfy_support.server import ComfyServer, ServerDied, build_base_directory, unlink_working_tree

    base = build_base_directory(tmp_path_factory.mktemp(f"comfyui-{comfy_tree.id}"))
    server = ComfyServer(base, tree=comfy_tree)
    failure = None
    try:
        server.start()
    except ServerDied as error:
        failure = str(error)
    if failure:  # failed outside the except block, so the report is the log, not a chained traceback
        pytest.fail(failure, pytrace=False)
    yield server
    server.stop()
    unlink_working_tree(base)


@pytest.fixture
def comfy_client(comfy_server):
    """A fresh `comfy_support.client.ComfyClient` (own client id and websocket) for one test."""
    _fail_if_dead(comfy_server)
    client = comfy_server.client()
    yield client
    client.close()
    _fail_if_dead(comfy_server)


def _fail_if_dead(server) -> None:
    if not server.alive:
        pytest.fail(f"ComfyUI is no longer running\n{server.log_tail()}", pytrace=False)


@pytest.fixture(scope="session")
def comfy_browser(comfy_server):
    """The ComfyUI frontend in headless chromium (`comfy_support.browser.ComfyPage`), one tab for the
    session, every non-loopback request aborted. Helpers: `load_workflow(ui) -> LoadReport`,
    `graph_to_prompt()`, `graph_to_workflow()`, `screenshot(path)`, `evaluate(js)`, `log`.
    """
    environment.require_chromium()
    from comfy_support.browser import ComfyPage

    page = ComfyPage(comfy_server.url)
    failure = None
    try:
        page.launch()
    except Exception as error:  # playwright errors and timeouts: report them with both logs
        failure = (f"the ComfyUI frontend did not start: {error}\n"
                   f"console errors: {page.log.console_errors}\n{comfy_server.log_tail()}")
    if failure:
        page.close()
        pytest.fail(failure, pytrace=False)
    yield page
    page.close()



def pytest_configure(config):
    if config.getoption("record_heavy") and not hasattr(config, "workerinput"):  # not in a pytest-xdist worker
        config.pluginmanager.register(heavy.Recorder(), "heavy-recorder")


def pytest_terminal_summary(terminalreporter):
    """How many heavy tests this run left to the record (tests/heavy.py)."""
    left = [r for r in terminalreporter.stats.get("skipped", []) if r.when == "setup"
            and isinstance(r.longrepr, tuple) and r.longrepr[2].startswith("Skipped: heavy: passed on this code")]
    if left:
        terminalreporter.write_line(f"heavy: {len(left)} skipped, passed on this code "
                                    f"({heavy.RECORD.name}; --run-heavy runs them)")

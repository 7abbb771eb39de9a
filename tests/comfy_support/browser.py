"""The real ComfyUI frontend in headless Debian chromium, offline: comfyui-frontend-package 1.32.9
(ComfyUI 0.3.75) or 1.48.7 (ComfyUI 0.33.0).

Frontend facts this relies on (checked against 1.32.9 and 1.48.7):
- `window.app` (the ComfyApp) is assigned only after `app.setup()` registered every node definition from
  `/object_info` into `LiteGraph.registered_node_types`; the frontend then loads its start-up workflow.
  With the tutorial marked done (see `server.FRONTEND_SETTINGS`) that is the default workflow, so
  "`app.graph` has nodes" means start-up finished and a later `loadGraphData` will not be overwritten.
- `app.loadGraphData(workflow)` replaces the graph. Unknown node types do not throw: the node becomes a
  red placeholder (`has_errors`) and the frontend says so: 1.32.9 in a "This workflow has missing
  nodes" dialog, 1.48.7 in a non-modal error panel ("Missing node: <type>"). Errors while configuring
  the graph open an error dialog and are logged with `console.error`.
- `(await app.graphToPrompt()).output` is the API prompt the Queue button would send.
- Even offline, start-up logs a few harmless errors (404s for a new user's files, a TypeError inside the
  frontend's settings code), so `ComfyPage` reports only errors that occur during a call of ours.
"""

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit
from urllib.request import urlopen

from .environment import CHROMIUM

CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    # Second line of defence next to `page.route`: nothing but loopback resolves.
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1, EXCLUDE localhost",
]
LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1", "[::1]"}
READY_TIMEOUT_MS = 90_000

# True once the app exists, node definitions are registered and the start-up workflow is loaded.
JS_APP_READY = """() => {
    const app = window.app;
    return !!(app && app.graph && window.LiteGraph && app.graph.nodes.length > 0);
}"""

# Node types (also inside subgraph definitions) of a UI workflow that the frontend does not know.
JS_MISSING_TYPES = """(workflow) => {
    const known = window.LiteGraph.registered_node_types;
    const lists = [workflow.nodes || []];
    const subgraphs = (workflow.definitions && workflow.definitions.subgraphs) || [];
    for (const sub of subgraphs) lists.push(sub.nodes || []);
    const missing = lists.flat().map((n) => n.type).filter((t) => !(t in known));
    return [...new Set(missing)];
}"""

JS_LOAD = """async (workflow) => {
    await window.app.loadGraphData(workflow);
    // Let the frontend render the dialogs it opened while loading.
    await new Promise((resolve) => requestAnimationFrame(() => setTimeout(resolve, 50)));
}"""

# {node id: widgets_values} of the loaded graph, as "Save" would write them.
JS_WIDGET_VALUES = """() => Object.fromEntries(window.app.graph.nodes.map((n) => [String(n.id),
    {values: n.serialize().widgets_values ?? null, names: (n.widgets ?? []).map((w) => w.name)}]))"""

# PrimeVue dialogs, and the error panel of newer frontends (1.48.7 reports missing nodes there).
JS_OPEN_DIALOGS = """() => Array.from(document.querySelectorAll('.p-dialog, [data-testid=error-overlay]'))
    .filter((d) => d.checkVisibility())
    .map((d) => d.innerText.trim())"""

JS_DISMISS_ERROR_PANELS = """() => document.querySelectorAll('[data-testid=error-overlay-dismiss]')
    .forEach((b) => b.click())"""

# Toast notifications (PrimeVue): the frontend reports e.g. a workflow that fails its schema check
# ("Invalid workflow against zod schema") as a toast, not as a dialog or a console error.
# Toasts already on screen are marked (and closed) before a load, so a report lists only new ones even
# while an old one is still fading out.
JS_NEW_TOASTS = """() => Array.from(document.querySelectorAll('.p-toast-message:not([data-harness-seen])'))
    .filter((t) => t.checkVisibility())
    .map((t) => t.innerText.trim())"""

JS_DISMISS_TOASTS = """() => document.querySelectorAll('.p-toast-message').forEach((t) => {
    t.setAttribute('data-harness-seen', '');
    t.querySelector('.p-toast-close-button')?.click();
})"""


@dataclass
class LoadReport:
    """What happened while `ComfyPage.load_workflow` loaded one workflow."""

    missing_node_types: list[str]
    dialogs: list[str]  # text of every dialog open after loading (missing nodes, load errors, ...)
    console_errors: list[str]
    page_errors: list[str]
    # "<id> <type>: ..." for every node whose widgets_values the frontend changed while loading. Too few
    # values are silently filled with defaults and extra ones dropped, so this is the check that a
    # workflow's widget order and count match the node definitions.
    widget_mismatches: list[str] = field(default_factory=list)
    toasts: list[str] = field(default_factory=list)  # notifications shown while loading

    @property
    def problems(self) -> list[str]:
        found = [f"missing node type: {t}" for t in self.missing_node_types]
        found += [f"widgets changed on load: {m}" for m in self.widget_mismatches]
        found += [f"dialog: {d}" for d in self.dialogs]
        found += [f"notification: {t}" for t in self.toasts]
        found += [f"console error: {e}" for e in self.console_errors]
        found += [f"uncaught exception: {e}" for e in self.page_errors]
        return found

    def assert_clean(self) -> None:
        problems = "\n".join(self.problems)
        assert not problems, f"the frontend had problems loading the workflow:\n{problems}"


@dataclass
class PageLog:
    """Everything the page reported; the lists only grow, so callers compare lengths before/after."""

    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    failed_requests: list[str] = field(default_factory=list)  # loopback only; blocked ones are expected
    blocked_requests: list[str] = field(default_factory=list)

    def on_console(self, message) -> None:
        # Network failures arrive here too; they are tracked (with their URL) in failed_requests.
        if message.type == "error" and not message.text.startswith("Failed to load resource"):
            self.console_errors.append(message.text)

    def on_response(self, response) -> None:
        if response.status >= 400:
            self.failed_requests.append(f"{response.status} {response.url}")


def widget_mismatches(workflow: dict, loaded: dict, object_info: dict) -> list[str]:
    """Nodes whose `widgets_values` differ between the workflow and the graph loaded from it (`loaded`: node id ->
    {values, names} of its widgets), but for optional inputs the node gained after the workflow was saved: last
    widgets the frontend filled with their defaults (`object_info`), as a user's saved workflow loads them."""
    found = []
    for node in workflow.get("nodes") or []:
        given = node.get("widgets_values") if isinstance(node, dict) else None
        now = loaded.get(str(node.get("id")), {}) if given is not None else {}
        values = now.get("values")
        if given is None or values == given:
            continue
        optional = object_info.get(node.get("type"), {}).get("input", {}).get("optional", {})
        extra = len(values or []) - len(given) if isinstance(given, list) else 0
        added = list(zip(now["names"][-extra:], values[-extra:])) if extra > 0 else []  # the last widgets
        if not (added and values[:len(given)] == given
                and all(name in optional and optional[name][1].get("default") == value for name, value in added)):
            found.append(f"{node['id']} {node.get('type')}: {given} loaded as {values}")
    return found


def is_loopback(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme in ("data", "blob", "about") or parts.hostname in LOOPBACK_HOSTS


class ComfyPage:
    """One chromium tab on the ComfyUI frontend; create with `launch()` and `close()` when done."""

    def __init__(self, server_url: str):
        self.server_url = server_url.rstrip("/")
        self.log = PageLog()
        self._user_data = tempfile.TemporaryDirectory(prefix="streamvae-chromium-")
        self._playwright = None
        self._context = None
        self.page = None
        self._object_info = None

    def launch(self) -> "ComfyPage":
        """Start chromium (fresh profile), open the frontend and wait until it is ready."""
        from playwright.sync_api import sync_playwright  # imported late: optional dependency

        self._playwright = sync_playwright().start()
        self._context = self._playwright.chromium.launch_persistent_context(
            self._user_data.name, executable_path=str(CHROMIUM), headless=True,
            args=CHROMIUM_ARGS, viewport={"width": 1280, "height": 800},
        )
        self.page = self._context.pages[0] if self._context.pages else self._context.new_page()
        self.page.route("**/*", self._route)
        self.page.on("console", self.log.on_console)
        self.page.on("pageerror", lambda error: self.log.page_errors.append(str(error)))
        self.page.on("response", self.log.on_response)
        self.open()
        return self

    def _route(self, route) -> None:
        """Abort every request that would leave the machine (fonts, telemetry, registry look-ups)."""
        url = route.request.url
        if is_loopback(url):
            route.continue_()
        else:
            self.log.blocked_requests.append(url)
            route.abort()

    def open(self) -> None:
        """(Re)load the frontend and wait for start-up to finish; see the module docstring."""
        self.page.goto(self.server_url + "/")
        self.page.wait_for_function(JS_APP_READY, timeout=READY_TIMEOUT_MS)

    def close(self) -> None:
        if self._context is not None:
            self._context.close()
        if self._playwright is not None:
            self._playwright.stop()
        self._user_data.cleanup()

    # -- helpers for tests -------------------------------------------------------------------

    def evaluate(self, script: str, arg=None):
        """Run JavaScript in the page (`window.app`, `window.LiteGraph`, `window.comfyAPI` exist)."""
        return self.page.evaluate(script, arg)

    def frontend_version(self) -> str:
        return self.evaluate("() => window.__COMFYUI_FRONTEND_VERSION__")

    def registered_node_types(self) -> set[str]:
        return set(self.evaluate("() => Object.keys(window.LiteGraph.registered_node_types)"))

    def open_dialogs(self) -> list[str]:
        """The text of every visible dialog (PrimeVue `.p-dialog`) and error panel."""
        return self.evaluate(JS_OPEN_DIALOGS)

    def close_dialogs(self) -> None:
        """Close open dialogs (e.g. a missing-nodes warning left by an earlier load): Escape, and the
        close button of error panels."""
        for _ in range(5):
            if not self.open_dialogs():
                return
            self.evaluate(JS_DISMISS_ERROR_PANELS)
            self.page.keyboard.press("Escape")
            self.page.wait_for_timeout(100)
        raise RuntimeError(f"dialogs would not close: {self.open_dialogs()}")

    def load_workflow(self, workflow: dict | str | Path) -> LoadReport:
        """Load a UI-format workflow (dict, JSON text or file) with `app.loadGraphData`.

        Returns a `LoadReport`; call `.assert_clean()` on it to require a faultless load.
        """
        if isinstance(workflow, Path):
            workflow = workflow.read_text()
        if isinstance(workflow, str):
            workflow = json.loads(workflow)
        self.close_dialogs()
        self.evaluate(JS_DISMISS_TOASTS)
        errors_before = len(self.log.console_errors), len(self.log.page_errors)
        missing = self.evaluate(JS_MISSING_TYPES, workflow)
        self.evaluate(JS_LOAD, workflow)
        return LoadReport(
            missing_node_types=missing,
            dialogs=self.open_dialogs(),
            console_errors=self.log.console_errors[errors_before[0]:],
            page_errors=self.log.page_errors[errors_before[1]:],
            widget_mismatches=widget_mismatches(workflow, self.evaluate(JS_WIDGET_VALUES), self.object_info()),
            toasts=self.evaluate(JS_NEW_TOASTS),
        )

    def object_info(self) -> dict:
        """The server's node definitions (`/object_info`), read once per page."""
        if self._object_info is None:
            with urlopen(self.server_url + "/object_info", timeout=60) as response:
                self._object_info = json.load(response)
        return self._object_info

    def graph_to_prompt(self) -> dict:
        """The API prompt for the current graph, exactly what the Queue button would send."""
        return self.evaluate("async () => (await window.app.graphToPrompt()).output")

    def graph_to_workflow(self) -> dict:
        """The current graph serialised as a UI-format workflow (what "Save" would write)."""
        return self.evaluate("async () => (await window.app.graphToPrompt()).workflow")

    def screenshot(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(path))
        return path

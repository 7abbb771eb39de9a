"""One real ComfyUI server process on a throwaway base directory.

The base directory (`--base-directory`) holds everything ComfyUI would otherwise write into its own tree:
`custom_nodes/StreamVAE` (a symlink to this repository, so the server imports our working copy),
`custom_nodes/streamvae_test_probes` (probe_nodes/: test-only nodes that look inside core's conditioning),
`models/vae` (the tiny fixture checkpoints), `input/`, `output/`, `temp/` and `user/`.
"""

import json
import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import requests

from .client import ComfyClient
from .environment import FIXTURE_CONFIGS, FIXTURE_VAES, PACK_FOLDER, PROBE_FOLDER, REPO, SHARED, STUBS, TREES, ComfyTree

STARTUP_TIMEOUT_S = 120
LOG_TAIL_CHARS = 6000

# Frontend settings for the test user. With the tutorial marked done, the frontend loads its default
# workflow on start instead of opening the template browser over the canvas, and `ComfyPage` uses
# "default workflow loaded" as the sign that the frontend finished starting. Workflow validation is
# on in frontend 1.32.9 by default and off in 1.48.7 (0.33.0); on, both report a workflow that fails
# the schema, so the browser tests check the same thing on both.
FRONTEND_SETTINGS = {"Comfy.TutorialCompleted": True, "Comfy.Validation.Workflows": True}

# ComfyUI 0.33.0 starts every log line with a coloured level tag ("\x1b[32m[INFO]\x1b[0m    0.1 seconds: ...").
ANSI_COLOUR = re.compile(r"\x1b\[[\d;]*m")
LEVEL_TAG = re.compile(r"^\[(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\] ?", re.M)


class ServerDied(RuntimeError):
    """The ComfyUI process exited (or never answered); the message carries the end of its log."""


def build_base_directory(base: Path) -> Path:
    """Lay out a ComfyUI base directory with our pack and the fixture VAEs; returns `base`."""
    for sub in ("custom_nodes", "models/vae", "input", "output", "temp", "user/default"):
        (base / sub).mkdir(parents=True, exist_ok=True)
    (base / "custom_nodes" / PACK_FOLDER).symlink_to(REPO, target_is_directory=True)
    (base / "custom_nodes" / PROBE_FOLDER).symlink_to(Path(__file__).parent / "probe_nodes", target_is_directory=True)
    for name, rel in FIXTURE_VAES.items():
        install_fixture(SHARED / rel, base / "models" / "vae" / name, FIXTURE_CONFIGS.get(name))
    settings = base / "user" / "default" / "comfy.settings.json"
    settings.write_text(json.dumps(FRONTEND_SETTINGS))
    return base


def unlink_working_tree(base: Path) -> None:
    """Remove `build_base_directory`'s links into this repository (pytest keeps old temporary folders)."""
    for folder in (PACK_FOLDER, PROBE_FOLDER):
        (base / "custom_nodes" / folder).unlink(missing_ok=True)


def install_fixture(source: Path, target: Path, config: dict | None) -> None:
    """Copy a fixture checkpoint; with `config`, rewrite it with that config in its metadata."""
    if not config:
        shutil.copyfile(source, target)
        return
    import vae  # the repository root is on sys.path in the test process (pyproject pythonpath)

    state_dict, _ = vae.read_checkpoint(source)
    vae.save_checkpoint(state_dict, target, config=config)


def free_port() -> int:
    """A TCP port that was free a moment ago (the OS picks it; the tiny race is acceptable in tests)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ComfyServer:
    """A ComfyUI process of `tree` (default 0.3.75) serving `base` on 127.0.0.1; use `start()` / `stop()`
    or `with`."""

    def __init__(self, base: Path, port: int | None = None, tree: ComfyTree = TREES["0.3.75"]):
        self.base = Path(base)
        self.tree = tree
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = self.base / "comfyui.log"
        self._process: subprocess.Popen | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def command(self) -> list[str]:
        return [
            str(self.tree.python), str(self.tree.root / "main.py"),
            "--cpu", "--listen", "127.0.0.1", "--port", str(self.port),
            "--base-directory", str(self.base),
            # The tests compare decoded frames with the library's fp32 results to one 8-bit level; on a
            # CPU with native bf16 `decode_dtype: auto` would decode in bf16 (46-49 dB), so fp32 is forced
            # as ComfyUI users force it (tests/test_gpu_decisions.py covers `auto`).
            "--fp32-vae",
            # The default database path is inside the ComfyUI tree; keep the tree read-only.
            "--database-url", "sqlite:///:memory:",
            *self.tree.flags,
        ]

    def environment(self) -> dict[str, str]:
        """The server's environment: our torchvision/torchaudio stand-ins first on PYTHONPATH, unbuffered logs."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(STUBS), env.get("PYTHONPATH")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def start(self, timeout: float = STARTUP_TIMEOUT_S) -> "ComfyServer":
        """Launch the server and block until `/system_stats` answers; raises `ServerDied` otherwise."""
        with open(self.log_path, "wb") as log:
            self._process = subprocess.Popen(
                self.command(), cwd=self.base, env=self.environment(),
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )
        self._wait_until_ready(timeout)
        return self

    def _wait_until_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            try:
                if requests.get(f"{self.url}/system_stats", timeout=2).ok:
                    return
            except requests.ConnectionError:
                pass  # not listening yet
            time.sleep(0.25)
        self.stop()
        raise ServerDied(f"ComfyUI did not answer /system_stats within {timeout:.0f} s\n{self.log_tail()}")

    def stop(self, timeout: float = 15) -> None:
        """Terminate the server (SIGTERM, then SIGKILL after `timeout` seconds)."""
        if self._process is None or self._process.poll() is not None:
            return
        self._process.terminate()
        try:
            self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()

    def __enter__(self) -> "ComfyServer":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    @property
    def alive(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def check_alive(self) -> None:
        """Raise `ServerDied` with the log tail if the process has exited."""
        if not self.alive:
            code = None if self._process is None else self._process.returncode
            raise ServerDied(f"ComfyUI exited (code {code})\n{self.log_tail()}")

    # -- log ---------------------------------------------------------------------------------

    @property
    def log(self) -> str:
        """Everything the server has logged so far (stdout and stderr)."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    @property
    def plain_log(self) -> str:
        """`log` without the colour codes and level tags newer ComfyUI puts at the start of lines."""
        return LEVEL_TAG.sub("", ANSI_COLOUR.sub("", self.log))

    def log_tail(self, chars: int = LOG_TAIL_CHARS) -> str:
        return f"--- end of {self.log_path} ---\n{self.plain_log[-chars:]}"

    def pack_import_line(self, folder: str = PACK_FOLDER) -> str | None:
        """The line for `custom_nodes/<folder>` in ComfyUI's "Import times for custom nodes" table
        (e.g. "0.1 seconds (IMPORT FAILED): <path>"), or None if ComfyUI did not try to import it."""
        path = re.escape(str(self.base / "custom_nodes" / folder))
        found = re.search(rf"^\s*[\d.]+ seconds(?: \(IMPORT FAILED\))?: {path}\s*$", self.plain_log, re.M)
        return found.group(0).strip() if found else None

    def pack_import_failure(self, folder: str = PACK_FOLDER) -> str | None:
        """Why ComfyUI failed to import `custom_nodes/<folder>`, or None if it imported.

        ComfyUI keeps running when a pack fails (and `--quick-test-for-ci` still exits 0), so the only
        reliable signals are the import table and what was logged before it: a traceback ending in
        "Cannot import <path> module for custom nodes: <error>" when the import raised, or a one-line
        warning naming the path (e.g. "Error while calling comfy_entrypoint in <path>: <error>").
        """
        line = self.pack_import_line(folder)
        if line is None:
            return f"custom_nodes/{folder} is not in ComfyUI's import table (not found?)"
        if "(IMPORT FAILED)" not in line:
            return None
        path = str(self.base / "custom_nodes" / folder)
        traceback = re.search(rf"Traceback \(most recent call last\):\n(?:(?!Traceback).*\n)*?"
                              rf"Cannot import {re.escape(path)} module for custom nodes: .*", self.plain_log)
        if traceback:
            return traceback.group(0)
        return "\n".join(text for text in self.plain_log.splitlines() if path in text)

    def assert_pack_imported(self, folder: str = PACK_FOLDER) -> None:
        """Fail with ComfyUI's traceback unless `custom_nodes/<folder>` imported cleanly."""
        failure = self.pack_import_failure(folder)
        assert failure is None, f"ComfyUI failed to import custom_nodes/{folder}:\n{failure}"

    # -- clients -----------------------------------------------------------------------------

    def client(self) -> ComfyClient:
        """A new API client (own client id and websocket) that notices if this server dies."""
        return ComfyClient(self.url, check_alive=self.check_alive)

    def run(self, prompt: dict, timeout: float = 300) -> dict:
        """`prompt` queued and waited for on a client of its own (`ComfyClient.run`): its /history entry."""
        client = self.client()
        try:
            return client.run(prompt, timeout=timeout)
        finally:
            client.close()

"""Locations of the test environment, and what to do when part of it is missing.

Every path can be overridden by an environment variable so a developer can point the suite at their own
ComfyUI checkout or browser: STREAMVAE_SHARED, STREAMVAE_COMFYUI (the 0.3.75 tree),
STREAMVAE_COMFYUI_0_33 and STREAMVAE_COMFYUI_0_33_PYTHON (the 0.33.0 tree and the interpreter of its
own environment), STREAMVAE_CHROMIUM. STREAMVAE_COMFY_TREES (e.g. "0.33.0") limits the server and
browser tests to some of the trees while developing; CI runs them all.
"""

import importlib.util
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from vae import families

REPO = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("STREAMVAE_SHARED", REPO.parent / "shared")).resolve()
COMFYUI = Path(os.environ.get("STREAMVAE_COMFYUI", REPO / ".cache" / "ComfyUI")).resolve()
COMFYUI_0_33 = Path(os.environ.get("STREAMVAE_COMFYUI_0_33",
                                   REPO / ".cache" / "comfyui-0.33.0" / "ComfyUI")).resolve()
# Not resolved: a venv's python is a symlink to the base interpreter, which would lose the venv.
PYTHON_0_33 = Path(os.environ.get("STREAMVAE_COMFYUI_0_33_PYTHON",
                                  REPO / ".cache" / "venv-comfy-0.33.0" / "bin" / "python"))
CHROMIUM = Path(os.environ.get("STREAMVAE_CHROMIUM", "/usr/bin/chromium"))

# The torchvision and torchaudio stand-ins; only the ComfyUI server processes get them on their PYTHONPATH.
STUBS = Path(__file__).resolve().parent / "stubs"

# Folder name of our pack under <base>/custom_nodes, as ComfyUI reports it in logs and in
# `python_module` ("custom_nodes.StreamVAE").
PACK_FOLDER = "StreamVAE"
PROBE_FOLDER = "streamvae_test_probes"  # comfy_support/probe_nodes

# Tiny fixture checkpoints (of the families whose spec names one, `TinyModel.fixture_config`), installed into
# models/vae under names a test can recognise.
FIXTURE_VAES = {f"streamvae_tiny_{spec.name}.safetensors": f"reference/{spec.name}/tiny_vae.safetensors"
                for spec in families.SPECS if spec.tiny.fixture_config is not None}

# Config the tensor shapes cannot tell, written into the installed copy's safetensors metadata (the key
# layout stays the real one): the tiny SeedVR2 model uses 8 norm groups where the released file uses 32.
FIXTURE_CONFIGS = {f"streamvae_tiny_{spec.name}.safetensors": dict(spec.tiny.fixture_config)
                   for spec in families.SPECS if spec.tiny.fixture_config}


@dataclass(frozen=True)
class ComfyTree:
    """A ComfyUI release the server and browser tests run against: its source tree, the Python that
    runs its server (0.3.75 shares the test venv; 0.33.0 pins other frontend and package versions, so
    it has a venv of its own) and extra command-line flags."""

    id: str  # the test-id suffix, e.g. "0.33.0" or "0.33.0-fp16"
    root: Path
    python: Path
    flags: tuple[str, ...] = ()


TREES = {tree.id: tree for tree in (
    ComfyTree("0.3.75", COMFYUI, Path(sys.executable)),
    ComfyTree("0.33.0", COMFYUI_0_33, PYTHON_0_33),
    # Core's --fp16-intermediates: VAE outputs (IMAGE, LATENT) in fp16.
    ComfyTree("0.33.0-fp16", COMFYUI_0_33, PYTHON_0_33, ("--fp16-intermediates",)),
)}
DEFAULT_TREES = ("0.3.75", "0.33.0")  # every server and browser test runs on these


def selected_trees(wanted: tuple[str, ...] = DEFAULT_TREES) -> list[str]:
    """`wanted`, limited by STREAMVAE_COMFY_TREES when that is set (never on CI: CI tests every tree)."""
    chosen = os.environ.get("STREAMVAE_COMFY_TREES")
    if not chosen or in_ci():
        return list(wanted)
    allowed = {name.strip() for name in chosen.split(",")}
    return [tree for tree in wanted if tree in allowed or tree.split("-")[0] in allowed]


def in_ci() -> bool:
    """True on CI, where a missing piece of the environment is an error rather than a skip."""
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require(available: bool, what: str, hint: str = "run .ci/setup") -> None:
    """Skip the test when `what` is not installed; fail instead on CI so nothing is silently skipped."""
    if available:
        return
    message = f"missing {what}: {hint}"
    if in_ci():
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def require_modules(*names: str) -> None:
    """Require importable Python modules (from requirements-dev.txt) in the test process."""
    missing = [name for name in names if importlib.util.find_spec(name) is None]
    require(not missing, f"Python modules {missing}")


def require_comfyui(tree: ComfyTree) -> None:
    require((tree.root / "main.py").is_file(), f"ComfyUI {tree.id} ({tree.root})")
    require(tree.python.is_file() and os.access(tree.python, os.X_OK),
            f"the Python of ComfyUI {tree.id} ({tree.python})")
    require_modules("requests", "websocket")


def require_fixtures() -> None:
    missing = [rel for rel in FIXTURE_VAES.values() if not (SHARED / rel).is_file()]
    require(not missing, f"shared fixtures {missing} under {SHARED}",
            hint="put the shared folder beside the repository or set STREAMVAE_SHARED")


def require_chromium() -> None:
    require(CHROMIUM.is_file() and os.access(CHROMIUM, os.X_OK), f"chromium ({CHROMIUM})")
    require_modules("playwright")

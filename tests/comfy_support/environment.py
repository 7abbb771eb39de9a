"""Locations of the test environment, and what to do when part of it is missing.

Every path can be overridden by an environment variable so a developer can point the suite at their own
ComfyUI checkout or browser: STREAMVAE_SHARED, STREAMVAE_COMFYUI, STREAMVAE_CHROMIUM.
"""

import importlib.util
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("STREAMVAE_SHARED", REPO.parent / "shared")).resolve()
COMFYUI = Path(os.environ.get("STREAMVAE_COMFYUI", REPO / ".cache" / "ComfyUI")).resolve()
CHROMIUM = Path(os.environ.get("STREAMVAE_CHROMIUM", "/usr/bin/chromium"))

# The torchvision stand-in; only the ComfyUI server process gets it on its PYTHONPATH.
STUBS = Path(__file__).resolve().parent / "stubs"

# Folder name of our pack under <base>/custom_nodes, as ComfyUI reports it in logs and in
# `python_module` ("custom_nodes.StreamVAE").
PACK_FOLDER = "StreamVAE"

# Tiny fixture checkpoints, installed into models/vae under names a test can recognise.
FIXTURE_VAES = {
    "streamvae_tiny_seedvr2.safetensors": "reference/seedvr2/tiny_vae.safetensors",
    "streamvae_tiny_wan21.safetensors": "reference/wan21/tiny_vae.safetensors",
    "streamvae_tiny_wan22.safetensors": "reference/wan22/tiny_vae.safetensors",
}

# Config the tensor shapes cannot tell, written into the installed copy's safetensors metadata (the key
# layout stays the real one): the tiny SeedVR2 model uses 8 norm groups where the released file uses 32.
FIXTURE_CONFIGS = {"streamvae_tiny_seedvr2.safetensors": {"norm_num_groups": 8}}


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


def require_comfyui() -> None:
    require((COMFYUI / "main.py").is_file(), f"ComfyUI ({COMFYUI})")
    require_modules("requests", "websocket")


def require_fixtures() -> None:
    missing = [rel for rel in FIXTURE_VAES.values() if not (SHARED / rel).is_file()]
    require(not missing, f"shared fixtures {missing} under {SHARED}",
            hint="put the shared folder beside the repository or set STREAMVAE_SHARED")


def require_chromium() -> None:
    require(CHROMIUM.is_file() and os.access(CHROMIUM, os.X_OK), f"chromium ({CHROMIUM})")
    require_modules("playwright")

"""The pack's entry point imports without ComfyUI (and without a GPU); the libraries never import ComfyUI."""
import importlib.util
import inspect
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_root_init_imports_without_comfyui():
    before = set(sys.modules)
    spec = importlib.util.spec_from_file_location("streamvae_pack_probe", REPO / "__init__.py")
    pack = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pack)

    assert inspect.iscoroutinefunction(pack.comfy_entrypoint)
    assert (REPO / pack.WEB_DIRECTORY / "streamvae.js").is_file()
    loaded = set(sys.modules) - before
    assert not {m for m in loaded if m.split(".")[0] in ("comfy", "comfy_api", "nodes", "folder_paths", "server")}


def test_libraries_do_not_import_comfyui():
    code = ("import sys, vae, vae.kernels; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('comfy', 'comfy_api', 'folder_paths', 'server')); "
            "print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_entry_point_without_the_v3_api_says_what_to_do():
    """A ComfyUI without `comfy_api.latest` gets one line saying what is missing, not a traceback
    from deep inside the node modules (run apart: another test may have put a ComfyUI on sys.path)."""
    code = ("import asyncio, importlib.util, sys; "
            "spec = importlib.util.spec_from_file_location('streamvae_pack_probe', 'nodes_probe_root/__init__.py'); "
            "pack = importlib.util.module_from_spec(spec); spec.loader.exec_module(pack); "
            "asyncio.run(pack.comfy_entrypoint())").replace("nodes_probe_root", str(REPO))
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO.parent, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "ImportError: StreamVAE needs ComfyUI's V3 node API" in result.stderr, result.stderr[-2000:]

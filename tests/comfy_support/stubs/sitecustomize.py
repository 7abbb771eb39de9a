"""Started with every Python process of the test ComfyUI server (this folder is first on its
PYTHONPATH). Inert unless the tests ask: under STREAMVAE_EMULATE_OLD_TORCH=1 the server runs with
torch's newer APIs hidden (../old_torch.py); with STREAMVAE_FAULTS set, its StreamVAE runs get the
out-of-memory faults the tests write there (../faults.py)."""
import os
import sys

if os.environ.get("STREAMVAE_EMULATE_OLD_TORCH") == "1" or os.environ.get("STREAMVAE_FAULTS"):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if os.environ.get("STREAMVAE_EMULATE_OLD_TORCH") == "1":
        from old_torch import hide_newer_torch

        print(f"StreamVAE tests: emulating torch 2.4, hidden: {', '.join(hide_newer_torch())}", file=sys.stderr,
              flush=True)
    if os.environ.get("STREAMVAE_FAULTS"):
        import faults

        faults.install()
    sys.path.pop(0)

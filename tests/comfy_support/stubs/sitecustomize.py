"""Started with every Python process of the test ComfyUI server (this folder is first on its
PYTHONPATH): under STREAMVAE_EMULATE_OLD_TORCH=1 the server runs with torch's newer APIs hidden
(see ../old_torch.py). Inert otherwise."""
import os
import sys

if os.environ.get("STREAMVAE_EMULATE_OLD_TORCH") == "1":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from old_torch import hide_newer_torch

    print(f"StreamVAE tests: emulating torch 2.4, hidden: {', '.join(hide_newer_torch())}", file=sys.stderr, flush=True)
    sys.path.pop(0)

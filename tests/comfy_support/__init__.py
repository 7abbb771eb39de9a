"""Test harness that drives a real ComfyUI server (and its real web frontend) for the StreamVAE suite.

`.ci/setup` installs what this needs: ComfyUI 0.3.75 in `.cache/ComfyUI`, its requirements in `.venv`,
and Debian chromium. The pytest fixtures live in `tests/conftest.py`; this package holds the logic:

- `environment`: where things are, and skip-or-fail when something is not installed;
- `server`: `ComfyServer`, one ComfyUI process on a throwaway base directory;
- `client`: `ComfyClient`, HTTP + websocket access to `/prompt`, `/history`, `/view`, ...;
- `browser`: `ComfyPage`, the frontend in headless chromium, offline.
"""

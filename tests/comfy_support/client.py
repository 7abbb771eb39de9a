"""HTTP + websocket client for a ComfyUI server, shaped for tests.

Message shapes (ComfyUI 0.3.75): every websocket text frame is `{"type": ..., "data": {...}}`. A prompt
queued with our `client_id` streams `execution_start`, `execution_cached`, `executing` {node},
`progress` {value, max, node}, `progress_state` {nodes}, `executed` {node, output}, then
`execution_success` / `execution_error` / `execution_interrupted`, and finally `executing` with
`node: null`, sent after the history entry is stored. Progress goes only to the client that queued
the prompt, which is why `queue()` sends this client's id and opens the socket first.
"""

import json
import time
import uuid
from typing import Callable

import requests
import websocket  # the websocket-client package

Message = dict  # {"type": str, "data": dict}


class PromptRejected(Exception):
    """`POST /prompt` answered HTTP 400: ComfyUI's validation error.

    `error` is e.g. {"type": "prompt_outputs_failed_validation", "message", "details", "extra_info"};
    `node_errors` maps node id -> {"errors": [{"type": "value_bigger_than_max", ...}], "class_type", ...}.
    """

    def __init__(self, body: dict):
        self.body = body
        self.error = body.get("error", {})
        self.node_errors = body.get("node_errors", {})
        super().__init__(f"ComfyUI rejected the prompt:\n{json.dumps(body, indent=1)}")


class PromptFailed(Exception):
    """A prompt ran but its history status is not "success" (error or interrupt); carries the entry."""

    def __init__(self, entry: dict):
        self.entry = entry
        status = entry.get("status", {})
        super().__init__(f"prompt ended with status {status.get('status_str')!r}:\n"
                         f"{json.dumps(status.get('messages', []), indent=1)}")


class PromptEvents:
    """The websocket messages seen for one prompt, in arrival order."""

    def __init__(self, prompt_id: str):
        self.prompt_id = prompt_id
        self.messages: list[Message] = []
        self.done = False  # set once `executing` with node null arrived

    def of_type(self, kind: str) -> list[dict]:
        """The `data` of every message of type `kind` (e.g. "progress", "executed")."""
        return [m["data"] for m in self.messages if m["type"] == kind]

    @property
    def types(self) -> list[str]:
        return [m["type"] for m in self.messages]

    @property
    def progress(self) -> list[dict]:
        """`progress` messages: {"value", "max", "prompt_id", "node"}, one per ProgressBar update."""
        return self.of_type("progress")


class ComfyClient:
    """Talks to one ComfyUI server under its own `client_id`.

    `check_alive`, if given, is called while waiting so a dead server fails fast with its log.
    """

    def __init__(self, url: str, check_alive: Callable[[], None] | None = None, http_timeout: float = 30):
        self.url = url.rstrip("/")
        self.client_id = uuid.uuid4().hex
        self.http_timeout = http_timeout
        self._check_alive = check_alive or (lambda: None)
        self._ws: websocket.WebSocket | None = None
        self._events: dict[str, PromptEvents] = {}

    # -- plain HTTP ----------------------------------------------------------------------------

    def get(self, path: str, **params) -> requests.Response:
        response = requests.get(self.url + path, params=params or None, timeout=self.http_timeout)
        response.raise_for_status()
        return response

    def post(self, path: str, payload: dict | None = None) -> requests.Response:
        return requests.post(self.url + path, json=payload or {}, timeout=self.http_timeout)

    def object_info(self, node: str | None = None) -> dict:
        """All node definitions (`{node_id: info}`), or the info of one node (KeyError if unknown)."""
        if node is None:
            return self.get("/object_info").json()
        return self.get(f"/object_info/{node}").json()[node]

    def history(self, prompt_id: str) -> dict | None:
        """The history entry {"prompt", "outputs", "status", "meta"} of a prompt, None if not there."""
        return self.get(f"/history/{prompt_id}").json().get(prompt_id)

    def view(self, filename: str, subfolder: str = "", type: str = "output") -> bytes:
        """The bytes of a file the server serves from its output/input/temp folder."""
        return self.get("/view", filename=filename, subfolder=subfolder, type=type).content

    def upload_image(self, data: bytes, filename: str, subfolder: str = "", type: str = "input",
                     overwrite: bool = True) -> dict:
        """Upload an image file; returns {"name", "subfolder", "type"} (the name may be de-duplicated)."""
        response = requests.post(
            self.url + "/upload/image",
            files={"image": (filename, data)},
            data={"subfolder": subfolder, "type": type, "overwrite": "true" if overwrite else "false"},
            timeout=self.http_timeout,
        )
        response.raise_for_status()
        return response.json()

    def interrupt(self, prompt_id: str | None = None) -> None:
        """Interrupt the running prompt (only `prompt_id`, if given). Interrupt points are progress
        updates and node boundaries; a flag set while idle is cleared when the next prompt starts."""
        response = self.post("/interrupt", {"prompt_id": prompt_id} if prompt_id else {})
        response.raise_for_status()

    # -- prompts -------------------------------------------------------------------------------

    def queue(self, prompt: dict, extra_data: dict | None = None) -> str:
        """Queue an API-format prompt; returns its prompt id or raises `PromptRejected` on HTTP 400."""
        self._connect()  # before queueing, so no message of this prompt can be missed
        payload = {"prompt": prompt, "client_id": self.client_id, "extra_data": extra_data or {}}
        response = self.post("/prompt", payload)
        if response.status_code == 400:
            raise PromptRejected(response.json())
        response.raise_for_status()
        prompt_id = response.json()["prompt_id"]
        self._events.setdefault(prompt_id, PromptEvents(prompt_id))
        return prompt_id

    def wait(self, prompt_id: str, timeout: float = 120) -> PromptEvents:
        """Block until the prompt finished (ws `executing` with `node: null`); returns what was seen."""
        return self.wait_for(prompt_id, lambda message: False, timeout)

    def wait_for(self, prompt_id: str, predicate: Callable[[Message], bool],
                 timeout: float = 120) -> PromptEvents:
        """Block until a message of this prompt satisfies `predicate`, or the prompt finished.

        E.g. `wait_for(pid, lambda m: m["type"] == "progress")` to interrupt in the middle of a node.
        Raises TimeoutError listing the message types seen so far.
        """
        events = self.events(prompt_id)
        if events.done or any(predicate(m) for m in events.messages):
            return events
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"prompt {prompt_id} not done after {timeout} s; saw {events.types}")
            message = self._receive(min(remaining, 1.0))
            if message is None:
                self._check_alive()
                continue
            if message["data"].get("prompt_id") == prompt_id and (events.done or predicate(message)):
                return events

    def events(self, prompt_id: str) -> PromptEvents:
        """What the websocket delivered so far for `prompt_id` (kept after `wait` returns)."""
        return self._events.setdefault(prompt_id, PromptEvents(prompt_id))

    def run(self, prompt: dict, timeout: float = 120, check: bool = True) -> dict:
        """Queue, wait and return the history entry (plus its "prompt_id"); with `check`, raise
        `PromptFailed` unless the status is success."""
        prompt_id = self.queue(prompt)
        self.wait(prompt_id, timeout)
        entry = self.history(prompt_id)
        assert entry is not None, f"no history for finished prompt {prompt_id}"
        entry["prompt_id"] = prompt_id
        if check and entry["status"]["status_str"] != "success":
            raise PromptFailed(entry)
        return entry

    # -- websocket -----------------------------------------------------------------------------

    def _connect(self) -> None:
        if self._ws is None:
            ws_url = self.url.replace("http", "ws", 1) + f"/ws?clientId={self.client_id}"
            self._ws = websocket.create_connection(ws_url, timeout=self.http_timeout)

    def _receive(self, timeout: float) -> Message | None:
        """The next JSON message (recorded under its prompt id), or None on timeout.

        Binary frames (preview images) are skipped.
        """
        self._connect()
        self._ws.settimeout(timeout)
        try:
            frame = self._ws.recv()
        except websocket.WebSocketTimeoutException:
            return None
        if not isinstance(frame, str):
            return {"type": "binary", "data": {}}
        message = json.loads(frame)
        message.setdefault("data", {})
        prompt_id = message["data"].get("prompt_id")
        if prompt_id is not None:
            events = self.events(prompt_id)
            events.messages.append(message)
            if message["type"] == "executing" and message["data"].get("node") is None:
                events.done = True
        return message

    def close(self) -> None:
        if self._ws is not None:
            self._ws.close()
            self._ws = None

"""The warnings of one run, gathered for whoever reports it (a node's run report, the CLI's stderr).

The library says each warning twice on purpose: a log record on the "streamvae" logger (what a server
log shows) and a Python `RuntimeWarning` (what a library user's filters see). A front end that
reports runs itself wants each one once, as text: `collected()` keeps the log records at WARNING and
above that this thread emits while it is open, and stops the same text from also being shown as a
Python warning. Other warnings (torch's, ...) are still shown, once per run and place.
"""
import contextlib
import logging
import threading
import warnings

log = logging.getLogger("streamvae")


class _ThreadRecords(logging.Handler):
    """WARNING-and-above records of one thread (ComfyUI runs a prompt on its worker thread while the
    server's own threads go on logging)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.thread, self.messages = threading.get_ident(), []

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread == self.thread:
            self.messages.append(record.getMessage())


def _text(message: str) -> str:
    """A message as a note: without the "StreamVAE: " the log needs and a note does not."""
    return message.removeprefix("StreamVAE: ")


@contextlib.contextmanager
def collected():
    """Yields a list that holds, once the block ends, the run's warnings as text, each once, in order."""
    notes: list[str] = []
    records = _ThreadRecords()
    log.addHandler(records)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")  # a warning said in an earlier run is this run's warning too
            yield notes
    finally:
        log.removeHandler(records)
        said = [_text(m) for m in records.messages]
        for note in said:
            if note not in notes:
                notes.append(note)
        shown = set()
        for warning in caught:  # not ours: shown as they would have been, each once
            key = (str(warning.message), warning.category, warning.filename, warning.lineno)
            if _text(key[0]) not in said and key not in shown:
                shown.add(key)
                warnings.showwarning(warning.message, warning.category, warning.filename, warning.lineno)

"""What a handler prints and logs while it runs, kept with its attempt.

A worker child runs jobs on several threads at once and ``sys.stdout`` belongs to the
whole process, so swapping it per job (``contextlib.redirect_stdout``) would mix one
job's output into another's and race with the swap back. Instead the first capture in a
process replaces ``sys.stdout`` and ``sys.stderr``, once, with streams that write to the
*calling thread's* capture when it has one and to the original stream otherwise, and
adds one logging handler that does the same for log records. A job is then just a
thread-local pointer set and cleared around its handler.

Each stream keeps its last ``OUTPUT_MAX_BYTES`` (the tail is what explains a failure).
What is not caught: output of threads the handler starts itself, and bytes written to
file descriptor 1 or 2 directly (C extensions, child processes that inherit them; the
shell kind captures its command's output itself).
"""

import logging
import sys
import threading
from collections import deque

from queue_app.conf import settings

STREAMS = ("stdout", "stderr", "log")

_local = threading.local()
_install_lock = threading.Lock()
_log_handler = None


def current():
    """Return the calling thread's active Capture, or None."""
    return getattr(_local, "capture", None)


class _ThreadStream:
    """Stands in for sys.stdout / sys.stderr: per-thread capture, else the original."""

    def __init__(self, name, original):
        self._name = name
        self._original = original

    def write(self, text):
        capture = current()
        if capture is None:
            return self._original.write(text)
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        capture.write(self._name, text)
        return len(text)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def flush(self):
        if current() is None:
            self._original.flush()

    def __getattr__(self, name):
        # encoding, isatty(), fileno() and the rest: whatever the real stream says.
        return getattr(self._original, name)


class _ThreadLogHandler(logging.Handler):
    """Copies log records of a thread that is capturing into its capture."""

    def __init__(self):
        super().__init__()
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    def emit(self, record):
        capture = current()
        if capture is not None:
            if capture.discards:
                return  # formatting a record costs more than the rest of its trip here
            try:
                capture.write("log", self.format(record) + "\n")
            except Exception:
                self.handleError(record)
        elif not self._others_handle(record):
            # Being on the root logger, this handler stops Python's last resort (a site
            # with no log handler of its own: Django's default). Outside a job nothing
            # captures the record, so do what the last resort would: "lease lost" and
            # "could not settle" must not go nowhere.
            last = logging.lastResort
            if last is not None and record.levelno >= last.level:
                last.handle(record)

    def _others_handle(self, record):
        """Whether a handler other than this one sees ``record`` (as Logger.callHandlers walks)."""
        logger = logging.getLogger(record.name) if record.name != "root" else logging.getLogger()
        while logger is not None:
            if any(h is not self and record.levelno >= h.level for h in logger.handlers):
                return True
            if not logger.propagate:
                return False
            logger = logger.parent
        return False


def install():
    """Put the thread-dispatching streams and log handler in place (once per process;
    again only if something else has replaced sys.stdout/sys.stderr since)."""
    global _log_handler
    with _install_lock:
        for name in ("stdout", "stderr"):
            stream = getattr(sys, name)
            if not isinstance(stream, _ThreadStream):
                setattr(sys, name, _ThreadStream(name, stream))
        if _log_handler is None:
            _log_handler = _ThreadLogHandler()
            logging.getLogger().addHandler(_log_handler)


def installed():
    return isinstance(sys.stdout, _ThreadStream) and isinstance(sys.stderr, _ThreadStream)


class _Tail:
    """The last ``limit`` bytes (UTF-8) written, and how many bytes came before them."""

    def __init__(self, limit):
        self.limit = limit
        self.chunks = deque()
        self.chars = 0
        self.dropped = 0

    def write(self, text):
        if len(text) > self.limit:
            # A character is at least one byte: `limit` characters hold the byte tail.
            self.dropped += len(text[: -self.limit].encode("utf-8", "replace"))
            text = text[-self.limit :]
        self.chunks.append(text)
        self.chars += len(text)
        while self.chars - len(self.chunks[0]) >= self.limit:
            first = self.chunks.popleft()
            self.chars -= len(first)
            self.dropped += len(first.encode("utf-8", "replace"))

    def value(self):
        data = "".join(self.chunks).encode("utf-8", "replace")
        # A cut through a multi-byte character loses that character, not the text.
        text = data[-self.limit :].decode("utf-8", "ignore")
        return text, self.dropped + len(data) - len(text.encode("utf-8"))


class Capture:
    """Collect what the calling thread prints and logs inside ``with capture:``.

    ``value()`` is None when nothing was written (most jobs: no metadata at all), else
    {"stdout": str, "stderr": str, "log": str} with only the streams that got text, plus
    "truncated": {stream: bytes dropped from its start} when a stream overflowed.
    """

    discards = False

    def __init__(self, limit=None):
        self.limit = int(settings.OUTPUT_MAX_BYTES if limit is None else limit)
        self.tails = {}
        self._previous = None

    def __enter__(self):
        if self.limit > 0:
            if not installed():
                install()
            self._previous = current()
            _local.capture = self
        return self

    def __exit__(self, *exc):
        if self.limit > 0:
            _local.capture = self._previous
            self._previous = None
        return False

    def write(self, stream, text):
        """Add ``text`` to ``stream`` ("stdout", "stderr" or "log")."""
        if not text or self.limit <= 0:
            return
        tail = self.tails.get(stream)
        if tail is None:
            tail = self.tails[stream] = _Tail(self.limit)
        tail.write(text)

    def value(self):
        if not self.tails:
            return None
        out, truncated = {}, {}
        for stream in STREAMS:
            if stream in self.tails:
                out[stream], dropped = self.tails[stream].value()
                if dropped:
                    truncated[stream] = dropped
        if truncated:
            out["truncated"] = truncated
        return out


class Discard(Capture):
    """A capture that keeps nothing: for what the calling thread prints and logs that
    belongs to no attempt (Django's "Task ... state=RUNNING" line from task_started's
    receivers), dropped here unformatted; other log handlers still see it."""

    discards = True

    def __init__(self):
        # One per task start: no settings read, nothing to keep.
        self.limit = 1
        self.tails = {}
        self._previous = None

    def write(self, stream, text):
        pass


def write(stream, text):
    """Add ``text`` to the calling thread's capture, if it has one (for output a handler
    collected itself, like a subprocess's); return whether it was kept."""
    capture = current()
    if capture is None:
        return False
    capture.write(stream, text)
    return True


def streams(output):
    """[(stream, text, bytes dropped from its start)] of a stored ``value()``, in order."""
    if not isinstance(output, dict):
        return []
    truncated = output.get("truncated") or {}
    return [(name, output[name], truncated.get(name, 0)) for name in STREAMS if output.get(name)]

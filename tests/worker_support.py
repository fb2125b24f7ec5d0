"""Handlers and process helpers for the worker tests.

The handlers register on import, so a `manage.py runworker --import tests.worker_support`
subprocess has them too.
"""

import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from django.conf import settings as django_settings
from django.db import connection, connections

from queue_app.handlers import registry
from queue_app.worker import loop as worker
from queue_app.worker import supervisor
from tests import sample_handlers as handlers

ROOT = Path(__file__).resolve().parent.parent


def spin(payload):
    """Busy-loop in Python for ``seconds``: never sleeps, never yields to a timer."""
    end = time.monotonic() + payload.get("seconds", 60)
    n = 0
    while time.monotonic() < end:
        n += 1
    return n


def mark(payload):
    """Append a line to ``path`` (one line per run), then sleep ``seconds``; with
    ``until_lines``, only until the file has that many lines (runs that meet)."""
    path = payload["path"]
    with open(path, "a") as f:
        f.write(f"{os.getpid()}\n")
    seconds, until = payload.get("seconds", 0), payload.get("until_lines")
    if until is None:
        time.sleep(seconds)
        return "marked"
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and len(Path(path).read_text().split()) < until:
        time.sleep(0.02)
    return "marked"


def flaky(payload):
    """Fail until the marker file has ``fails`` lines, then succeed."""
    path = Path(payload["path"])
    with open(path, "a") as f:
        f.write("x\n")
    if len(path.read_text().splitlines()) <= payload.get("fails", 2):
        raise handlers.Boom("not yet")
    return "ok"


def stall_once(payload):
    """Stall for a minute the first time (marker absent), succeed at once afterwards."""
    path = Path(payload["path"])
    if not path.exists():
        path.write_text("stalled")
        time.sleep(60)
    return "ok"


def noop(payload):
    return None


def rendezvous(payload):
    """Sign in at ``path``, then wait until ``expected`` jobs have signed in (or
    ``patience`` seconds); return how many had: jobs that ran at the same time all see
    ``expected``, and return within milliseconds of each other."""
    with open(payload["path"], "a") as f:
        f.write("here\n")
    end = time.monotonic() + payload.get("patience", 10)
    while (seen := len(Path(payload["path"]).read_text().splitlines())) < payload["expected"]:
        if time.monotonic() > end:
            break
        time.sleep(0.002)
    return seen


ALL = {
    "spin": spin,
    "mark": mark,
    "flaky": flaky,
    "stall_once": stall_once,
    "noop": noop,
    "rendezvous": rendezvous,
}


def register_all():
    handlers.register_all()
    for kind, func in ALL.items():
        registry.register(kind, func)


register_all()


# --- processes ------------------------------------------------------------------------------

# Every process the helpers below start; kill_survivors() (an autouse fixture in conftest
# calls it after each test) kills what is still running, so a failed or hung test cannot
# leave a worker holding the test database or keep pytest from exiting.
_started = []


def kill_survivors():
    """Kill (SIGKILL) every process started here that is still running; return how many."""
    killed = 0
    while _started:
        proc = _started.pop()
        if isinstance(proc, subprocess.Popen):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
                killed += 1
        elif proc.is_alive():
            proc.kill()
            proc.join()
            killed += 1
    return killed


# JOBQUEUE_TEST_PATIENCE=N multiplies the waits below: the Django 6.0 repeat runs at nice 19
# beside the database suites (scripts/test.sh), where a subprocess can get no CPU for 30 s.
PATIENCE = float(os.environ.get("JOBQUEUE_TEST_PATIENCE") or 1)


def join(proc, within=15):
    """Wait for ``proc`` to exit and return its exit code; kill it and fail if it does
    not exit within ``within`` seconds."""
    within *= PATIENCE
    proc.join(within)
    if proc.is_alive():
        proc.kill()
        proc.join()
        raise AssertionError(f"worker process {proc.pid} did not exit within {within}s (killed)")
    return proc.exitcode


def stop(proc, sig=signal.SIGTERM, within=15):
    """Send ``sig`` to a worker started by start_worker() and wait for it (see join())."""
    if proc.is_alive():
        os.kill(proc.pid, sig)
    return join(proc, within)


def end_mark(marker):
    """Append a line to a ``mark`` job's file: one waiting for until_lines it now reaches ends."""
    with open(marker, "a") as f:
        f.write("go\n")


def end_mark_once_stopping(marker, name=None):
    """Append the line a running ``mark`` job with until_lines=2 waits for, once its worker
    has recorded its stop (the supervisor signals its children just after) and a second
    more: the job then ends after its child was told to stop, however slow the machine."""
    from queue_app.models import Worker, WorkerState

    workers = Worker.objects.filter(name=name) if name else Worker.objects.all()
    wait_for(lambda: workers.filter(state=WorkerState.STOPPING).exists(), timeout=60, what="the stop")
    time.sleep(1)
    end_mark(marker)


def start_worker(**options):
    """Fork a runworker supervisor (it inherits this process's settings, test database
    and handlers); return the Process. ``worker.run`` forks its own children from it."""
    options.setdefault("poll", 0.05)
    connections.close_all()
    proc = multiprocessing.get_context("fork").Process(target=_worker_main, args=(options,))
    proc.start()
    _started.append(proc)
    return proc


def _worker_main(options):
    code = 1
    try:
        connections.close_all()
        code = supervisor.run(worker.Options(**options))
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        connections.close_all()
        os._exit(code)


def run_worker(within=30, **options):
    """Run a worker to the end (burst or max_jobs) and return its exit code."""
    return join(start_worker(**options), within)


def wait_for(predicate, timeout=10, interval=0.05, what="condition", proc=None):
    """Poll ``predicate`` until it is true; on timeout fail, with the output of ``proc``
    (a manage() Popen, killed then) if given: what the process said is the diagnosis."""
    timeout *= PATIENCE
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    said = ""
    if proc is not None:
        proc.kill()
        said = f"; the process said:\n{proc.communicate(timeout=30)[0]}"
    raise AssertionError(f"timed out after {timeout}s waiting for {what}{said}")


def database_url():
    """A DATABASE_URL for the live (test) database, for manage.py subprocesses."""
    s = connection.settings_dict
    if connection.vendor == "sqlite":
        return f"sqlite:///{s['NAME']}"
    scheme = {"postgresql": "postgres", "mysql": "mysql"}[connection.vendor]
    auth = s["USER"] + (f":{s['PASSWORD']}" if s.get("PASSWORD") else "")
    return f"{scheme}://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or ''}/{s['NAME']}"


def manage(*args, extra_env=None, **popen):
    """Start ``manage.py *args`` with the test database (and ``extra_env``); return the Popen."""
    # The developer's JOBQUEUE_* exports would change the subprocess's settings (the
    # in-process tests pin them in conftest); the project's defaults apply instead.
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBQUEUE_") and k != "SQLITE_TEST_NAME"}
    env.update(DATABASE_URL=database_url(), PYTHONUNBUFFERED="1")
    env.update(extra_env or {})
    connections.close_all()
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **popen,
    )
    _started.append(proc)
    return proc


def read_until(proc, text, timeout=30):
    """Read ``proc``'s output (a manage() Popen) line by line until a line contains
    ``text``; return everything read so far. Fails on timeout or if ``proc`` exits first,
    so a test waits for what it needs to have happened, not for a guessed time."""
    timeout *= PATIENCE
    lines, found = [], threading.Event()

    def pump():
        for line in proc.stdout:
            lines.append(line)
            if text in line:
                found.set()
                return

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    if not found.wait(timeout):
        raise AssertionError(f"no line with {text!r} within {timeout}s; read: {''.join(lines)!r}")
    return "".join(lines)


def lease_settings(**overrides):
    """JOBQUEUE for worker tests: the project's settings plus fast backoff."""
    return {**getattr(django_settings, "JOBQUEUE", {}), **overrides}

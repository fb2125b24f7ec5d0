"""The built-in ``shell`` kind: run a command on the worker, as the QueueCTL seed does.

Off unless ``JOBQUEUE["SHELL_JOBS"] = True``: anyone who can enqueue a job can then run
programs as the worker's user.

The payload is ``{"command": "touch /tmp/done"}`` or ``{"command": ["touch", "/tmp/done"]}``.
A string is split like a POSIX shell would split it (``shlex.split``) and the program is
run directly, without a shell: no globs, pipes, redirections or ``$VARS``, so a payload
cannot smuggle in a second command through quoting. Ask for a shell explicitly in the
command (``sh -c 'echo hi >> log'``), or set ``SHELL_JOBS_USE_SHELL`` to hand every
string command to ``/bin/sh -c``.

The command sees only the worker's environment variables that ``SHELL_JOBS_ENV`` names
(PATH, HOME, the locale ...), not its SECRET_KEY, DATABASE_URL or other credentials.
The command runs with the job's timeout (or ``DEFAULT_TIMEOUT``), a little less in fact,
so that the command is killed and its output kept before the supervisor kills the whole
worker process for the overrun. Its stdout and stderr are kept with the attempt (the
capture, capture.py) and in the result: ``{"exit_code": 0, "stdout": ..., "stderr": ...}``,
each the last ``OUTPUT_MAX_BYTES``. A non-zero exit fails the attempt with CommandFailed,
whose message carries the exit code and the end of stderr.
"""

import os
import shlex
import subprocess

from queue_app.conf import settings
from queue_app.worker import capture

# Characters of stderr quoted in a failed attempt's error message.
ERROR_STDERR_CHARS = 2000


class CommandFailed(RuntimeError):
    """The command exited with a non-zero status."""

    def __init__(self, exit_code, stderr):
        self.exit_code = exit_code
        self.stderr = stderr
        tail = stderr.strip()[-ERROR_STDERR_CHARS:]
        super().__init__(f"command exited with status {exit_code}" + (f": {tail}" if tail else ""))


def argv(command, use_shell=None):
    """Return what subprocess.run gets for ``command`` (and whether through a shell)."""
    use_shell = settings.SHELL_JOBS_USE_SHELL if use_shell is None else use_shell
    if isinstance(command, list) and command and all(isinstance(a, str) for a in command):
        return command, False
    if not isinstance(command, str):
        raise ValueError('a shell job\'s payload needs "command": a string or a list of strings')
    if not command.strip():
        raise ValueError("the command is empty")
    if use_shell:
        return command, True
    return shlex.split(command), False


def environment():
    """The variables a command runs with: the worker's own, only those SHELL_JOBS_ENV names.
    Whoever may enqueue a shell job reads what its command prints, and the worker's
    environment holds its database password and secret key."""
    allowed = settings.SHELL_JOBS_ENV or ()
    return {name: os.environ[name] for name in allowed if name in os.environ}


def command_timeout(seconds):
    """The subprocess's share of a job timeout: a margin for killing it and keeping its
    output before the supervisor's own deadline passes."""
    if not seconds:
        return None
    return seconds - min(0.5, seconds * 0.1)


def _text(value):
    if value is None:
        return ""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def _tail(text):
    limit = int(settings.OUTPUT_MAX_BYTES) or len(text)
    return text[-limit:]


def run(payload, job=None):
    """Run ``payload["command"]``; return its exit code and output, or raise."""
    if not settings.SHELL_JOBS:
        raise PermissionError('shell jobs are disabled; set JOBQUEUE["SHELL_JOBS"] = True to allow them')
    if not isinstance(payload, dict) or "command" not in payload:
        raise ValueError('a shell job\'s payload needs "command": a string or a list of strings')
    args, use_shell = argv(payload["command"])
    timeout = job.timeout if job is not None and job.timeout is not None else settings.DEFAULT_TIMEOUT
    try:
        done = subprocess.run(
            args,
            shell=use_shell,
            env=environment(),
            capture_output=True,
            text=True,
            errors="replace",
            stdin=subprocess.DEVNULL,
            timeout=command_timeout(timeout),
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        # subprocess.run has killed the command; keep what it wrote before that.
        capture.write("stdout", _text(exc.stdout))
        capture.write("stderr", _text(exc.stderr))
        raise TimeoutError(f"command ran past the job's {timeout:g}s timeout and was killed") from None
    capture.write("stdout", done.stdout)
    capture.write("stderr", done.stderr)
    if done.returncode:
        raise CommandFailed(done.returncode, done.stderr)
    return {"exit_code": done.returncode, "stdout": _tail(done.stdout), "stderr": _tail(done.stderr)}

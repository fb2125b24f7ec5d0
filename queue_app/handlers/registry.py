"""kind -> handler. A handler takes the job's payload (and, if it asks, the job).

A kind nobody registered may be the module path of a django.tasks Task
(``myapp.tasks.send_report``): get() resolves it to that Task. Whoever can enqueue
chooses the kind, and importing a module runs its top-level code, so only modules inside
``TASK_MODULES`` (by default the installed apps' and the project's packages) are imported.

A chunked kind (``chunk=N``) takes up to N of its ready jobs in one call: its handler
gets their payloads as a list and returns one outcome per job (chunk_outcomes() reads
them); the worker gathers the chunks (worker/loop.py) and settles each job on its own.
"""

import functools
import importlib
import inspect
import sys
from contextlib import contextmanager
from typing import NamedTuple

from django.apps import apps
from django.core.signals import setting_changed
from django.tasks import Task
from django.utils.module_loading import import_string

from queue_app.conf import project_packages, settings
from queue_app.core import encryption
from queue_app.core.retrying import NONE, RetryPolicy
from queue_app.exceptions import UnknownKind
from queue_app.handlers import faults

_handlers = {}
# kind -> its RetryPolicy, for the kinds registered with retry_on, discard_on or backoff.
_policies = {}
# kind -> (Chunking, the chunk handler), for the kinds registered with chunk=N. _handlers
# holds an adapter (_alone) for a job of such a kind run on its own.
_chunks = {}


class Chunking(NamedTuple):
    """How a chunked kind's jobs reach its handler: up to ``size`` in one call, the worker
    waiting up to ``wait_ms`` milliseconds for that many to be ready."""

    size: int
    wait_ms: float = 0


def chunking_of(size, wait_ms, what):
    """The Chunking that ``chunk=size, chunk_wait_ms=wait_ms`` ask for (None: no chunks);
    TypeError, naming ``what``, for a bad value."""
    if size is None:
        if wait_ms:
            raise TypeError(f"{what}: chunk_wait_ms needs chunk=N")
        return None
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise TypeError(f"{what}: chunk must be a positive integer (jobs per call), got {size!r}")
    if isinstance(wait_ms, bool) or not isinstance(wait_ms, (int, float)) or not 0 <= wait_ms <= 60_000:
        raise TypeError(
            f"{what}: chunk_wait_ms must be a number of milliseconds in 0..60000, got {wait_ms!r}"
        )
    return Chunking(size, wait_ms)


def register(
    kind, func, *, retry_on=None, discard_on=None, backoff=None, encrypt=None, chunk=None, chunk_wait_ms=0
):
    """Make ``func`` run jobs of ``kind``. ``retry_on``: only these exceptions retry;
    ``discard_on``: these dead-letter at once; ``backoff(attempt, exception)``: seconds
    before the retry, or None for the default (core/retrying.py); ``encrypt``: True or
    the payload's field names stored encrypted (core/encryption.py); ``chunk``: up to
    this many jobs per call, waiting up to ``chunk_wait_ms`` for them (chunk_outcomes()).
    Raise TypeError for a bad option, before anything is registered."""
    policy = RetryPolicy(retry_on=retry_on, discard_on=discard_on, backoff=backoff)
    encryption.spec_of(encrypt, f"{kind}: encrypt")
    chunking = chunking_of(chunk, chunk_wait_ms, kind)
    encryption.declare(kind, encrypt)
    if chunking:
        _chunks[kind] = (chunking, func)
        _handlers[kind] = _alone(func)
    else:
        _chunks.pop(kind, None)
        _handlers[kind] = func
    if policy:
        _policies[kind] = policy
    else:
        _policies.pop(kind, None)
    return func


def handler(kind, **options):
    """Decorator form of register(): ``@handler("email", retry_on=(SMTPException,))``,
    ``@handler("email", chunk=100, chunk_wait_ms=200)``."""
    encrypt = encryption.spec_of(options.pop("encrypt", None), f"{kind}: encrypt")
    chunking = chunking_of(options.pop("chunk", None), options.pop("chunk_wait_ms", 0), kind)
    policy = RetryPolicy(**options)  # checked where it is written, not at the first failure

    def decorate(func):
        return register(
            kind,
            func,
            retry_on=policy.retry_on,
            discard_on=policy.discard_on,
            backoff=policy.backoff,
            encrypt=encrypt,
            chunk=chunking.size if chunking else None,
            chunk_wait_ms=chunking.wait_ms if chunking else 0,
        )

    return decorate


def unregister(kind):
    encryption.declare(kind, None)
    _handlers.pop(kind, None)
    _policies.pop(kind, None)
    _chunks.pop(kind, None)


# --- chunks ------------------------------------------------------------------------------


class ChunkOutcomeError(TypeError):
    """A chunked handler returned something that is not one outcome per job."""


def chunking(kind):
    """How ``kind``'s jobs are chunked (a Chunking), or None: one job per call. A Task
    kind is resolved (task_for) to read its ``chunk`` option; an unknown kind is None."""
    found = _chunks.get(kind)
    if found is not None:
        return found[0]
    if kind in _handlers:
        return None
    try:
        return task_chunking(task_for(kind))
    except UnknownKind:
        return None


def task_chunking(task):
    """The Chunking a Task declares (``@task(chunk=N, chunk_wait_ms=M)``), or None."""
    size = getattr(task, "chunk", None)
    return Chunking(size, getattr(task, "chunk_wait_ms", 0) or 0) if size else None


def chunk_handler(kind):
    """The function (or Task) that takes a chunk of ``kind``'s jobs; UnknownKind if none."""
    found = _chunks.get(kind)
    if found is not None:
        return found[1]
    task = task_for(kind)
    if task_chunking(task) is None:
        raise UnknownKind(kind)
    return task


def largest_chunk():
    """The largest chunk size registered so far (0: none)."""
    return max((chunking.size for chunking, _ in _chunks.values()), default=0)


def chunk_outcomes(value, jobs):
    """Each job's outcome, in order, from what a chunked handler returned for ``jobs``:
    a list (or tuple) with one item per job, in their order; a dict keyed by job id (an
    int, or its str as a TaskResult's id is); or None, every job done with no result. An
    item that is an exception fails its job; a job a dict leaves out fails with
    ChunkOutcomeError, and so does every job when the value has another shape."""
    if value is None:
        return [None] * len(jobs)
    if isinstance(value, (list, tuple)):
        if len(value) == len(jobs):
            return list(value)
        error = ChunkOutcomeError(f"the chunked handler returned {len(value)} outcomes for {len(jobs)} jobs")
        return [error] * len(jobs)
    if isinstance(value, dict):
        missing = object()
        out = []
        for job in jobs:
            found = value.get(job.id, missing)
            if found is missing:
                found = value.get(str(job.id), missing)
            if found is missing:
                found = ChunkOutcomeError(f"the chunked handler returned no outcome for job {job.id}")
            out.append(found)
        return out
    error = ChunkOutcomeError(
        "a chunked handler returns a list (one outcome per job, in order), a dict by job id "
        f"or None, not {type(value).__name__}"
    )
    return [error] * len(jobs)


def only(value, job):
    """The one outcome of a chunk of one (``job``): its result, or raise its exception."""
    (outcome,) = chunk_outcomes(value, [job])
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def wants_jobs(func):
    """True when a chunked handler declares a ``jobs`` parameter (it gets the Job rows)."""
    try:
        return _wants_jobs(func)
    except TypeError:
        return _declares(func, "jobs")


@functools.lru_cache(maxsize=256)
def _wants_jobs(func):
    return _declares(func, "jobs")


def _alone(func):
    """``func`` (a chunked handler) as a one-job handler, for a job run on its own
    (execution.execute(), run_one()): a chunk of one."""
    extra = (lambda job: {"jobs": [job]}) if wants_jobs(func) else (lambda job: {})
    if inspect.iscoroutinefunction(func):

        async def run_alone(payload, job):
            return only(await func([payload], **extra(job)), job)

    else:

        def run_alone(payload, job):
            return only(func([payload], **extra(job)), job)

    run_alone.chunked = func
    return run_alone


def policy(kind):
    """The RetryPolicy of ``kind``: its registration's, or its Task's (QueueTask's
    retry_on, discard_on and backoff); NONE for a kind that declared none or is unknown."""
    if kind in _policies:
        return _policies[kind]
    found = _handlers.get(kind)
    if found is None:
        try:
            found = task_for(kind)
        except UnknownKind:
            return NONE
    return task_policy(found) if is_task(found) else NONE


def task_policy(task):
    """The RetryPolicy a Task declares (none for a plain django.tasks Task)."""
    return RetryPolicy(
        retry_on=getattr(task, "retry_on", ()),
        discard_on=getattr(task, "discard_on", ()),
        backoff=getattr(task, "backoff_function", None),
    )


@contextmanager
def override(handlers=None, /, **more):
    """Register ``handlers`` ({kind: func}) for the block, then put back what was there
    before (also what the block itself registered or unregistered): for tests."""
    before, policies, sealed = dict(_handlers), dict(_policies), encryption.declarations()
    chunks = dict(_chunks)
    try:
        for kind, func in {**(handlers or {}), **more}.items():
            register(kind, func)
        yield
    finally:
        _handlers.clear()
        _handlers.update(before)
        _policies.clear()
        _policies.update(policies)
        _chunks.clear()
        _chunks.update(chunks)
        encryption.restore(sealed)


def get(kind):
    """Return the handler for ``kind`` (a registered function or a Task) or raise
    UnknownKind; wrapped with its fault plan when JOBQUEUE["FAULTS"] names the kind."""
    try:
        found = _handlers[kind]
    except KeyError:
        found = task_for(kind)
    return faults.applied(kind, found)


class UnknownTask(UnknownKind):
    """A dotted kind that does not lead to a django.tasks Task."""

    def __init__(self, kind, reason):
        super().__init__(kind)
        self.args = (f"no handler registered for kind {kind!r}, and it is not a django.tasks Task: {reason}",)


def task_modules():
    """The packages (or modules) a Task kind may be imported from."""
    if settings.TASK_MODULES is not None:
        return list(settings.TASK_MODULES)
    return [config.name for config in apps.get_app_configs()] + project_packages()


def module_allowed(module_path):
    return any(module_path == entry or module_path.startswith(entry + ".") for entry in task_modules())


# Kinds whose module path passed task_for()'s checks: a worker resolves the same few
# kinds for every job, and the checks (the app configs, the project's packages) cost
# more than running a no-op task. Forgotten when the settings they read change.
_allowed_kinds = set()


def _forget(*, setting, **kwargs):
    if setting in ("JOBQUEUE", "INSTALLED_APPS", "ROOT_URLCONF"):
        _allowed_kinds.clear()


setting_changed.connect(_forget)


def task_for(kind):
    """Return the django.tasks Task whose module path is ``kind``, or raise UnknownKind.

    Only a module attribute that already is a Task instance is returned; nothing is
    called. Only modules inside task_modules() are imported, never the standard library.
    """
    module_path, _, name = kind.rpartition(".")
    if kind not in _allowed_kinds:
        if not module_path or not all(part.isidentifier() for part in kind.split(".")):
            raise UnknownKind(kind)
        if module_path.partition(".")[0] in sys.stdlib_module_names:
            raise UnknownTask(kind, f"{module_path} is a standard-library module")
        if not module_allowed(module_path):
            raise UnknownTask(kind, f"{module_path} is outside the TASK_MODULES setting")
        if len(_allowed_kinds) >= 1024:
            _allowed_kinds.clear()
        _allowed_kinds.add(kind)
    try:
        # import_module() of a module already imported still costs a few microseconds a
        # job. One still running its top-level code (in another thread) is left to it: it
        # waits for the import to finish, where sys.modules has the module half made.
        module = sys.modules.get(module_path)
        if module is None or getattr(getattr(module, "__spec__", None), "_initializing", False):
            module = importlib.import_module(module_path)
    except (Exception, SystemExit) as exc:
        # Whatever the module's top-level code raises fails the attempt (the kind is
        # unknown here) instead of escaping into the worker; SystemExit would end its thread.
        raise UnknownTask(kind, f"module {module_path} does not import ({exc!r})") from exc
    found = getattr(module, name, None)
    if not isinstance(found, Task):
        raise UnknownTask(kind, f"{module_path}.{name} is {'missing' if found is None else 'not a Task'}")
    return found


def is_task(func):
    return isinstance(func, Task)


def kinds():
    return sorted(_handlers)


def wants_job(func):
    """True when the handler declares a ``job`` parameter (asked once per handler:
    inspect.signature costs as much as running a no-op job's handler)."""
    try:
        return _wants_job(func)
    except TypeError:  # an unhashable callable: nothing to remember it by
        return _declares_job(func)


@functools.lru_cache(maxsize=1024)
def _wants_job(func):
    return _declares_job(func)


def _declares_job(func):
    return _declares(func, "job")


def _declares(func, name):
    try:
        return name in inspect.signature(func).parameters
    except (TypeError, ValueError):
        return False


# The sample workloads SAMPLE_HANDLERS registers (dotted paths: they live in ops/, above).
SAMPLES = {
    kind: f"queue_app.ops.samples.{kind}"
    for kind in ("email", "report", "webhook", "flaky", "slow", "crashy")
}


def load_samples():
    """Register the sample workloads (SAMPLES)."""
    for kind, path in SAMPLES.items():
        register(kind, import_string(path))


def load_configured_handlers():
    if settings.SAMPLE_HANDLERS:
        load_samples()
    for kind, path in (settings.HANDLERS or {}).items():
        register(kind, import_string(path) if isinstance(path, str) else path)
    faults.configure(known=kinds())

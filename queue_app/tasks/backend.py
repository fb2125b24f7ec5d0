"""The django.tasks backend: a site's ``@task`` functions become ordinary jobs.

    TASKS = {
        "default": {
            "BACKEND": "queue_app.backends.DatabaseBackend",
            "QUEUES": ["default", "emails"],          # [] allows any queue name
            "OPTIONS": {
                "database": "default",   # the DATABASES alias jobs are written to
                "max_attempts": 5,       # backend-wide defaults for our extras
                "timeout": 300,
            },
        },
    }

A task's job has kind = the task's module path and payload = {"args": [...],
"kwargs": {...}}; priority, queue_name and run_after (-> run_at) carry over. Our extras
(max_attempts, timeout, idempotency_key, unique_for, concurrency_key, backoff,
on_success, on_failure, webhook_url, debounce_* and unique_key/unique_while) are task options: ``@task(max_attempts=5)`` on
Django 6.1, ``.using(idempotency_key=..., unique_for=3600)`` or
``.using(concurrency_key="customer:42")`` per call, or ``with_options(task, ...)`` on
Django 6.0, whose ``@task`` does not pass extra keyword arguments on.

``backoff`` is a retry base (``backoff=3``: 3, 9, 27... seconds) or a dict with any of
``base``, ``max`` (seconds) and ``jitter``; it sets the task's ``backoff_base``,
``backoff_max`` and ``backoff_jitter``, which may also be given one by one.

Retry control by exception (core/retrying.py), as on a native ``@handler``: ``retry_on``
(only these exceptions retry), ``discard_on`` (these dead-letter at once) and a
``backoff`` that is a function of (attempt, exception) returning seconds or None (it
sets ``backoff_function``). They are code, not job fields: the worker reads them off
the task its job's kind names, so they belong to the task's definition (``@task(...)``
or ``with_options``), and ``.using()`` keeps them but cannot set them.

``chunk=N`` (and ``chunk_wait_ms=M``) makes it a chunked task: the worker calls its
function with up to N of its jobs' TaskResults at once (each with ``.id``, ``.args``,
``.kwargs``) and it returns one outcome per job (handlers/registry.py chunk_outcomes()).
Like the retry options it belongs to the definition; it cannot take a context.

``encrypt=True`` stores the task's arguments encrypted, ``encrypt=("card",)`` the
arguments of those parameters, by keyword or position (core/encryption.py); like the
retry options it belongs to the definition.

``on_success`` / ``on_failure`` name the follow-up job chaining.py enqueues when the
job completes / is dead-lettered: another Task (run with no arguments, at its own
priority and queue, with its own options; a ``parent`` parameter, if it has one,
receives the parent's outcome) or a job template dict ``{"kind": ..., "payload": {...},
...options}`` as enqueue() takes it.
"""

import inspect
from collections.abc import Callable
from dataclasses import InitVar, dataclass, fields, replace

from asgiref.sync import sync_to_async
from django.apps import apps
from django.conf import settings as django_settings
from django.core import checks
from django.core.signals import setting_changed
from django.db import connections, router, transaction
from django.tasks import DEFAULT_TASK_QUEUE_NAME, Task, task_backends
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued
from django.utils import timezone
from django.utils.json import normalize_json

from queue_app.conf import settings
from queue_app.core import encryption, transitions, validation, webhooks
from queue_app.core.retrying import RetryPolicy
from queue_app.exceptions import InvalidJob, UnknownKind
from queue_app.handlers import registry
from queue_app.models import KIND_MAX_LENGTH, QUEUE_NAME_MAX_LENGTH, Job
from queue_app.tasks import results as task_results

OPTION_NAMES = ("database", "max_attempts", "timeout", "backoff")
BACKOFF_FIELDS = ("backoff_base", "backoff_max", "backoff_jitter")
# Retry control by exception: the task's definition, read by the worker (not job fields).
RETRY_FIELDS = ("retry_on", "discard_on", "backoff_function")
FOLLOW_UP_FIELDS = ("on_success", "on_failure")
EXTRA_FIELDS = (
    "max_attempts",
    "timeout",
    "idempotency_key",
    "unique_for",
    "concurrency_key",
    *FOLLOW_UP_FIELDS,
    "webhook_url",
    *BACKOFF_FIELDS,
    *RETRY_FIELDS,
    *validation.ADMISSION_FIELDS,
    "encrypt",
    *validation.ORDERING_FIELDS,
    "chunk",
    "chunk_wait_ms",
)
# A follow-up Task's own options that go into its template (not idempotency_key: one
# key would make every follow-up after the first return the first; not unique_for).
TEMPLATE_OPTIONS = ("max_attempts", "timeout", "concurrency_key", "webhook_url", *BACKOFF_FIELDS)
# The keys a backoff dict may hold, and the job field each one sets.
BACKOFF_KEYS = {"base": "backoff_base", "max": "backoff_max", "jitter": "backoff_jitter"}


def backoff_fields(backoff):
    """``backoff`` (a base, or a dict of base/max/jitter) as job fields, or a function
    of (attempt, exception) as the task's backoff_function; values are checked later, by
    validate_task, like the fields given one by one."""
    if backoff is None:
        return {}
    if callable(backoff):
        return {"backoff_function": backoff}
    if isinstance(backoff, dict):
        unknown = sorted(map(str, set(backoff) - set(BACKOFF_KEYS)))
        if unknown:
            raise InvalidTask(f"backoff: unknown key(s) {', '.join(unknown)}; allowed: base, max, jitter")
        return {BACKOFF_KEYS[key]: value for key, value in backoff.items()}
    if isinstance(backoff, bool) or not isinstance(backoff, (int, float)):
        raise InvalidTask(
            "backoff must be a number (the base), a dict of base, max, jitter, or a function "
            f"of (attempt, exception); got {backoff!r}"
        )
    return {"backoff_base": backoff}


def follow_up(value, field):
    """``value`` (a Task, a job template dict or None) as the template chaining.py
    enqueues; values are checked later, by validate_task."""
    if value is None or isinstance(value, dict):
        return value
    if not isinstance(value, Task):
        raise InvalidTask(
            f"{field} must be a Task or a job template dict "
            f'({{"kind": ..., "payload": {{...}}, ...options}}), got {value!r}'
        )
    template = {
        "kind": value.module_path,
        "payload": {"args": [], "kwargs": {}},
        "queue_name": value.queue_name,
        "priority": value.priority,
    }
    try:
        for name in TEMPLATE_OPTIONS:
            option = getattr(value, name, None)
            if option is not None:
                # A template is JSON until the parent finishes: durations as seconds.
                template[name] = (
                    validation.seconds(option, name, maximum=float("inf"))
                    if name in ("timeout", "backoff_max")
                    else option
                )
    except InvalidJob as exc:
        raise InvalidTask(f"{field}: {exc}") from None
    for name in FOLLOW_UP_FIELDS:
        nested = getattr(value, name, None)
        if nested is not None:
            template[name] = follow_up(nested, f"{field}.{name}")
    return template


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueTask(Task):
    """A django.tasks Task that also carries the queue's own job options."""

    # Attempts before the job is dead-lettered; None: OPTIONS["max_attempts"] or JOBQUEUE's default.
    max_attempts: int | None = None
    # Seconds one attempt may run; None: OPTIONS["timeout"] or JOBQUEUE's default.
    timeout: float | None = None
    # Enqueueing a key that a live job holds returns that job instead of a new one.
    idempotency_key: str | None = None
    # With an idempotency_key: the key dedupes only this long (seconds or a timedelta);
    # after that an enqueue inserts a new job. Not stored on the job.
    unique_for: float | None = None
    # With the task's per_key limit (flow.py), jobs sharing this key run at most per_key at a time.
    concurrency_key: str | None = None
    # Retry backoff (base ** attempt seconds, capped, jittered); None: OPTIONS["backoff"]
    # or JOBQUEUE's BACKOFF_* settings.
    backoff_base: float | None = None
    backoff_max: float | None = None
    backoff_jitter: bool | None = None
    # The follow-up enqueued when the job completes / is dead-lettered: a Task or a job
    # template dict (see the module docstring).
    on_success: Task | dict | None = None
    on_failure: Task | dict | None = None
    # Gets a signed POST when the job ends (webhooks.py; WEBHOOK_ALLOWED_HOSTS).
    webhook_url: str | None = None
    # Only these exceptions retry (empty: all); these dead-letter at once ("discarded: <type>");
    # backoff_function(attempt, exception) -> seconds or None (the default backoff).
    retry_on: tuple = ()
    discard_on: tuple = ()
    backoff_function: Callable | None = None
    # Debounce and uniqueness by state (validation.ADMISSION_FIELDS), as enqueue() takes them.
    debounce_key: str | None = None
    debounce_for: float | str | None = None
    debounce_max_wait: float | str | None = None
    debounce_mode: str | None = None
    unique_key: str | None = None
    unique_while: str | tuple | None = None
    # True: the task's arguments are stored encrypted; parameter names: those arguments,
    # by keyword or by position (core/encryption.py; JOBQUEUE["ENCRYPTION_KEYS"]).
    encrypt: bool | tuple = ()
    # Ordered keys (validation.ORDERING_FIELDS): one at a time per key, in enqueue order.
    ordering_key: str | None = None
    ordering_blocks: bool | None = None
    # Up to this many jobs per call of the function, which gets their TaskResults; the
    # worker waits up to chunk_wait_ms for that many (None: one job per call).
    chunk: int | None = None
    chunk_wait_ms: float = 0
    # ``@task(backoff=3)`` or ``backoff={"base": 3, "max": 600}``: sets the backoff_*
    # fields; ``backoff=function``: sets backoff_function.
    backoff: InitVar[float | dict | Callable | None] = None

    def __post_init__(self, backoff):
        for name, value in backoff_fields(backoff).items():
            object.__setattr__(self, name, value)
        # Checked where the task is declared, not at its first failure (TypeError).
        policy = RetryPolicy(
            retry_on=self.retry_on, discard_on=self.discard_on, backoff=self.backoff_function
        )
        object.__setattr__(self, "retry_on", policy.retry_on)
        object.__setattr__(self, "discard_on", policy.discard_on)
        spec = encryption.spec_of(self.encrypt, f"{self.module_path}: encrypt")
        object.__setattr__(self, "encrypt", () if spec is None else spec)
        if registry.chunking_of(self.chunk, self.chunk_wait_ms, self.module_path) and self.takes_context:
            raise TypeError(
                f"{self.module_path}: a chunked task cannot take a context (its function gets "
                "the TaskResults of its chunk's jobs, each with its own id, args and kwargs)"
            )
        Task.__post_init__(self)

    def get_backend(self):
        # Django's imports task_backends at every call, for every enqueue.
        return task_backends[self.backend]

    def using(
        self,
        *,
        priority=None,
        queue_name=None,
        run_after=None,
        backend=None,
        max_attempts=None,
        timeout=None,
        idempotency_key=None,
        unique_for=None,
        concurrency_key=None,
        on_success=None,
        on_failure=None,
        webhook_url=None,
        backoff=None,
        backoff_base=None,
        backoff_max=None,
        backoff_jitter=None,
        **admission,
    ):
        """Create a new Task with modified defaults."""
        if callable(backoff):
            raise TypeError(
                "a backoff function belongs to the task's definition (@task(backoff=...) or "
                "with_options): the worker finds it by the task's module path, not per call"
            )
        unknown = sorted(set(admission) - {*validation.ADMISSION_FIELDS, *validation.ORDERING_FIELDS})
        if unknown:
            raise TypeError(f"using() got unexpected keyword argument(s): {', '.join(unknown)}")
        # Task is a slots dataclass, so zero-argument super() is not available here.
        task = Task.using(
            self, priority=priority, queue_name=queue_name, run_after=run_after, backend=backend
        )
        extras = {
            "max_attempts": max_attempts,
            "timeout": timeout,
            "idempotency_key": idempotency_key,
            "unique_for": unique_for,
            "concurrency_key": concurrency_key,
            "on_success": on_success,
            "on_failure": on_failure,
            "webhook_url": webhook_url,
            **backoff_fields(backoff),
            **{
                name: value
                for name, value in zip(BACKOFF_FIELDS, (backoff_base, backoff_max, backoff_jitter))
                if value is not None
            },
            **admission,
        }
        changes = {name: value for name, value in extras.items() if value is not None}
        return replace(task, **changes) if changes else task


def with_options(task, **options):
    """Return a copy of ``task`` carrying our job options (max_attempts, timeout,
    idempotency_key, unique_for, concurrency_key, on_success, on_failure, webhook_url,
    backoff or backoff_base/backoff_max/backoff_jitter, retry_on, discard_on).

    For Django 6.0, whose ``@task`` does not pass extra keywords to the backend, and for
    tasks created by another backend's ``task_class``.
    """
    unknown = sorted(set(options) - {*EXTRA_FIELDS, "backoff"})
    if unknown:
        raise TypeError(
            f"unknown task option(s): {', '.join(unknown)}; allowed: {', '.join(EXTRA_FIELDS)}, backoff"
        )
    options = {**options, **backoff_fields(options.pop("backoff", None))}
    base = {f.name: getattr(task, f.name) for f in fields(task)}
    return QueueTask(**{**base, **options})


def task(function=None, **options):
    """``django.tasks.task`` that also takes our job options, on Django 6.0 as on 6.1:
    ``@task(max_attempts=5, timeout=60)``. Django's own arguments (priority, queue_name,
    backend, takes_context) go to Django's decorator, ours through with_options(): 6.0's
    ``@task`` would refuse them, 6.1's passes them on itself."""
    from django.tasks import task as django_task

    ours = {name: options.pop(name) for name in list(options) if name in {*EXTRA_FIELDS, "backoff"}}

    def make(func):
        made = django_task(func, **options)
        return with_options(made, **ours) if ours else made

    return make(function) if function is not None else make


def _invalid(exc):
    return InvalidTask(str(exc))


# (backend alias, task, DEFAULT_MAX_ATTEMPTS) -> the validated EnqueueRequest its jobs
# start from (its payload replaced per call). validate_task (inspect.signature, the
# follow-up templates) and the enqueue options cost as much as the rest of an enqueue in
# Python, and a Task is frozen: they are checked on its first enqueue and again only when
# the settings change (the runtime default of max_attempts is in the key). Not for a task
# with a run_after: its run_at depends on the moment of the call.
_REQUESTS = {}
# The same by (alias, id(task)) -> (task, request, default): a Task's dataclass hash goes over
# every one of its ~40 fields, a tenth of the backend's own Python per call, and a
# module's @task is the same object at every call. The entry holds the task, so its id
# cannot be reused while it is there; an equal task (.using() per call) is found in
# _REQUESTS by its hash and then kept here too.
_BY_ID = {}
_REQUESTS_MAX = 1024


def _forget(*, setting, **kwargs):
    if setting in ("TASKS", "JOBQUEUE"):
        _REQUESTS.clear()
        _BY_ID.clear()


setting_changed.connect(_forget)

# Every .enqueue() sends task_enqueued to the same few receivers (Django's own log line
# among them): with the per-sender cache on, as tasks/running.py turns it on in workers,
# Signal.send looks them up once instead of scanning them under a lock per send, a
# quarter of what .enqueue() costs beyond enqueue(). connect() and disconnect() clear it.
task_enqueued.use_caching = True


class DatabaseBackend(BaseTaskBackend):
    task_class = QueueTask

    # run_after becomes the job's run_at (no worker leases it earlier) and is kept as
    # given on Job.run_after, which get_result() reads back.
    supports_defer = True
    # Workers run ``async def`` tasks on an event loop per worker thread: --threads N
    # runs N at once per child (README "Using django.tasks" says why not one shared loop).
    supports_async_task = True
    # Results are rows: any thread or process can read them.
    supports_get_result = True
    # Higher priority leases first (with aging, see ordering.py).
    supports_priority = True

    def __init__(self, alias, params):
        # Stays lenient: check() reports bad settings, and it can only run once this succeeds.
        super().__init__(alias, params)
        self.params = params

    @property
    def database(self):
        """The DATABASES alias this backend's jobs live in."""
        return self.options.get("database") or router.db_for_write(Job)

    def validate_task(self, task):
        """Determine whether the provided Task can be executed by the backend."""
        super().validate_task(task)
        try:
            validation.name(task.module_path, "the task's module path", KIND_MAX_LENGTH)
            validation.name(task.queue_name, "queue_name", QUEUE_NAME_MAX_LENGTH)
            if getattr(task, "max_attempts", None) is not None:
                validation.max_attempts(task.max_attempts)
            if getattr(task, "timeout", None) is not None:
                validation.seconds(task.timeout, "timeout", maximum=settings.MAX_TIMEOUT_SECONDS)
            validation.idempotency_key(getattr(task, "idempotency_key", None))
            if getattr(task, "unique_for", None) is not None:
                # Whether a key goes with it is checked at enqueue: @task(unique_for=...)
                # with .using(idempotency_key=...) per call is the usual way to give both.
                validation.seconds(
                    task.unique_for, "unique_for", maximum=validation.MAX_SCHEDULE_AHEAD.total_seconds()
                )
            validation.concurrency_key(getattr(task, "concurrency_key", None))
            encrypt = getattr(task, "encrypt", ())
            if encrypt:
                params = [] if encrypt is True else list(inspect.signature(task.func).parameters)
                if task.takes_context and params:
                    params = params[1:]  # the TaskContext is not among the stored args
                encryption.declare(task.module_path, encrypt, params)
            now = timezone.now()
            for field in FOLLOW_UP_FIELDS:
                validation.template(follow_up(getattr(task, field, None), field), field, now)
            if getattr(task, "webhook_url", None) is not None:
                webhooks.check_url(
                    validation.text(task.webhook_url, "webhook_url")
                    if isinstance(task.webhook_url, str)
                    else task.webhook_url
                )
            validation.backoff_base(getattr(task, "backoff_base", None))
            validation.backoff_max(getattr(task, "backoff_max", None))
            validation.backoff_jitter(getattr(task, "backoff_jitter", None))
            admission = {f: getattr(task, f, None) for f in validation.ADMISSION_FIELDS}
            if admission["debounce_key"] is not None or admission["unique_key"] is not None:
                # As with unique_for, the key often comes per call (.using()): a task
                # without one is checked at enqueue.
                validation.admission(admission)
        except InvalidJob as exc:
            raise _invalid(exc) from None

    def _job_options(self, task):
        defaults = {**self.options, **backoff_fields(self.options.get("backoff"))}

        def pick(name):
            value = getattr(task, name, None)
            return defaults.get(name) if value is None else value

        return {
            "queue_name": task.queue_name,
            "priority": task.priority,
            "run_at": task.run_after,
            "max_attempts": pick("max_attempts"),
            "timeout": pick("timeout"),
            "idempotency_key": getattr(task, "idempotency_key", None),
            "unique_for": getattr(task, "unique_for", None),
            "concurrency_key": getattr(task, "concurrency_key", None),
            **{field: follow_up(getattr(task, field, None), field) for field in FOLLOW_UP_FIELDS},
            "webhook_url": getattr(task, "webhook_url", None),
            **{name: pick(name) for name in BACKOFF_FIELDS},
            **{name: getattr(task, name, None) for name in validation.ADMISSION_FIELDS},
            **{name: getattr(task, name, None) for name in validation.ORDERING_FIELDS},
        }

    def request(self, task, args, kwargs):
        """The validated EnqueueRequest of a call of ``task`` (InvalidTask if refused)."""
        template = key = None
        # The default a task without max_attempts gets is a runtime setting: a template
        # holds the value of its time, so it serves only while that value stands.
        attempts = settings.DEFAULT_MAX_ATTEMPTS
        by_id = _BY_ID.get((self.alias, id(task)))
        if by_id is not None and by_id[0] is task and by_id[2] == attempts:
            template = by_id[1]
        elif task.run_after is None:
            key = (self.alias, task, attempts)
            try:
                template = _REQUESTS.get(key)
            except TypeError:  # a task holding a dict (a follow-up template): checked each time
                key = None
        if template is None:
            self.validate_task(task)
        try:
            # normalize_json copies what it is given; nothing to copy is a new empty one.
            payload = {
                "args": normalize_json(list(args)) if args else [],
                "kwargs": normalize_json(dict(kwargs)) if kwargs else {},
            }
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{task.module_path}: task arguments must be JSON-serializable ({exc})") from None
        try:
            if template is None:
                template = validation.enqueue_request(task.module_path, payload, **self._job_options(task))
                if key is None:
                    return template
                if len(_REQUESTS) >= _REQUESTS_MAX:
                    _REQUESTS.clear()
                _REQUESTS[key] = template
                req = template
            else:
                req = validation.request_as(template, payload)
            if key is not None:
                if len(_BY_ID) >= _REQUESTS_MAX:
                    _BY_ID.clear()
                _BY_ID[(self.alias, id(task))] = (task, template, attempts)
            return req
        except InvalidJob as exc:
            if exc.field == "payload":
                raise
            raise _invalid(exc) from None

    def enqueue(self, task, args, kwargs):
        """Queue up a task to be executed."""
        req = self.request(task, args, kwargs)
        database = self.database
        try:
            job, created = transitions.enqueue(req, using=database)
        except InvalidJob as exc:
            if exc.field == "payload":
                raise
            raise _invalid(exc) from None
        if not created:
            # An idempotency or unique key matched a job, or a debounce updated one:
            # report that job, as it stands.
            return self.get_result(job.id)
        result = task_results.pending(job, task, self.alias)
        # Workers see the job only when the caller's transaction commits, so receivers
        # hear about it then (at once outside a transaction; never after a rollback).
        connection = connections[database]
        if connection.in_atomic_block or not connection.autocommit:
            transaction.on_commit(lambda: task_enqueued.send(type(self), task_result=result), using=database)
        else:  # what on_commit() would do, without its lambda and second connection lookup
            task_enqueued.send(type(self), task_result=result)
        return result

    def enqueued(self, task, job):
        """A job of ``task`` enqueued by a workflow (canvas.py): its TaskResult, and
        task_enqueued sent on commit, as enqueue() does."""
        result = task_results.pending(job, task, self.alias)
        transaction.on_commit(lambda: task_enqueued.send(type(self), task_result=result), using=self.database)
        return result

    async def aenqueue(self, task, args, kwargs):
        """Queue up a task function (or coroutine) to be executed."""
        return await sync_to_async(self.enqueue, thread_sensitive=True)(task, args, kwargs)

    def get_result(self, result_id):
        """Retrieve a task result by id; raise TaskResultDoesNotExist if there is none."""
        try:
            job_id = int(str(result_id))
        except ValueError:
            raise TaskResultDoesNotExist(result_id) from None
        job = Job.objects.using(self.database).filter(id=job_id).first()
        if job is None:
            raise TaskResultDoesNotExist(result_id)
        try:
            task = registry.task_for(job.kind)
        except UnknownKind as exc:
            raise TaskResultDoesNotExist(f"job {job.id} ({job.state}) is not a task here: {exc}") from None
        return task_results.from_job(job, task, self.alias)

    async def aget_result(self, result_id):
        """See get_result()."""
        return await sync_to_async(self.get_result, thread_sensitive=True)(result_id)

    def check(self, **kwargs):
        yield from super().check(**kwargs)
        where = f"TASKS[{self.alias!r}]"
        if not apps.is_installed("queue_app"):
            yield checks.Error(
                f"{where} uses {type(self).__name__}, but queue_app is not in INSTALLED_APPS.",
                hint="Add 'queue_app' to INSTALLED_APPS and run migrate.",
                id="queue_app.E001",
            )
        queues = self.params.get("QUEUES", [DEFAULT_TASK_QUEUE_NAME])
        if isinstance(queues, (str, bytes)) or not all(isinstance(q, str) for q in queues):
            yield checks.Error(
                f"{where}['QUEUES'] must be a list of queue names, got {queues!r}.",
                hint='For example "QUEUES": ["default", "emails"]; [] allows any name.',
                id="queue_app.E002",
            )
        else:
            for queue in queues:
                try:
                    validation.name(queue, "queue name", QUEUE_NAME_MAX_LENGTH)
                except InvalidJob as exc:
                    yield checks.Error(f"{where}['QUEUES']: {exc}.", id="queue_app.E003")
            if queues and DEFAULT_TASK_QUEUE_NAME not in queues:
                yield checks.Warning(
                    f"{where}['QUEUES'] does not include {DEFAULT_TASK_QUEUE_NAME!r}, the queue "
                    "@task uses when not given queue_name: such tasks are refused at import.",
                    hint=f"Add {DEFAULT_TASK_QUEUE_NAME!r} to QUEUES or give every @task a queue_name.",
                    id="queue_app.W001",
                )
        if not isinstance(self.options, dict):
            yield checks.Error(f"{where}['OPTIONS'] must be a dict.", id="queue_app.E004")
            return
        unknown = sorted(set(self.options) - set(OPTION_NAMES))
        if unknown:
            yield checks.Error(
                f"{where}['OPTIONS'] has unknown key(s): {', '.join(map(str, unknown))}.",
                hint=f"Known keys: {', '.join(OPTION_NAMES)}.",
                id="queue_app.E005",
            )
        database = self.options.get("database")
        if database is not None and database not in django_settings.DATABASES:
            yield checks.Error(
                f"{where}['OPTIONS']['database'] is {database!r}, which is not in DATABASES.",
                hint=f"Use one of: {', '.join(django_settings.DATABASES)}.",
                id="queue_app.E006",
            )
        try:
            if self.options.get("max_attempts") is not None:
                validation.max_attempts(self.options["max_attempts"])
            if self.options.get("timeout") is not None:
                validation.seconds(self.options["timeout"], "timeout", maximum=settings.MAX_TIMEOUT_SECONDS)
            if callable(self.options.get("backoff")):
                raise InvalidTask(
                    "backoff cannot be a function here: give it to the task (@task(backoff=...))"
                )
            backoff = backoff_fields(self.options.get("backoff"))
            validation.backoff_base(backoff.get("backoff_base"))
            validation.backoff_max(backoff.get("backoff_max"))
            validation.backoff_jitter(backoff.get("backoff_jitter"))
        except (InvalidJob, InvalidTask) as exc:
            yield checks.Error(f"{where}['OPTIONS']: {exc}.", id="queue_app.E007")

"""The JSON API under /api/, built with django-ninja (schema at /api/openapi.json,
interactive docs at /api/docs).

Every endpoint parses input, calls enqueueing / transitions / metrics, and renders the
result. Auth: an API key in the X-API-Key header (API_KEY_HEADER) or a staff session;
writes need a permission (a read-write key, or queue_app.add_job / change_job for
users); reads are open without credentials only when API_READS_OPEN is True.
"""

from contextlib import suppress
from datetime import datetime
from functools import wraps
from typing import Annotated, Any, Literal

from django.http import Http404, HttpRequest, HttpResponseNotAllowed
from ninja import Body, Field, NinjaAPI, Path, Query, Schema, Status
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.openapi.docs import Swagger
from ninja.security import APIKeyHeader, SessionAuthIsStaff
from pydantic import ConfigDict, StrictBool

from queue_app.conf import settings
from queue_app.core import aborting, canvas, durations, enqueueing, flow, runtime, transitions, validation
from queue_app.exceptions import InvalidJob, InvalidTransition, JobNotFound, UnknownKind, WaitTimeout
from queue_app.handlers import registry
from queue_app.models import (
    CONCURRENCY_KEY_MAX_LENGTH,
    IDEMPOTENCY_KEY_MAX_LENGTH,
    JOB_STATUSES,
    KIND_MAX_LENGTH,
    PRIORITY_MAX,
    PRIORITY_MIN,
    QUEUE_NAME_MAX_LENGTH,
    STATUSES,
    WORKER_STATUSES,
    DeadLetter,
    Pause,
    State,
    Worker,
    attach_statuses,
)
from queue_app.ops import actions as operations
from queue_app.ops import metrics, reads, redaction
from queue_app.ops import why as explain
from queue_app.ops import workflows as workflow_reads
from queue_app.web.auth import SHELL_PERMISSION, Principal, authenticate
from queue_app.worker import wakeup

MAX_ID = 2**63 - 1
JobId = Path(..., ge=1, le=MAX_ID, description="The job's id.")
StateName = Literal[tuple(State.values)]
# Any name of the one status table (models.STATUSES): a state, a derived status, or late.
StatusName = Literal[tuple(STATUSES)]


# --- authentication -------------------------------------------------------------------


class KeyAuth(APIKeyHeader):
    param_name = settings.API_KEY_HEADER

    def authenticate(self, request, key):
        api_key = authenticate(key)
        return Principal(actor=f"api-key:{api_key.name}", key=api_key) if api_key else None


class StaffSession(SessionAuthIsStaff):
    def _get_key(self, request):
        # No staff session, nothing to protect from forgery: leave the caller unauthenticated
        # (401, as documented) rather than answer 403 "CSRF check Failed".
        user = getattr(request, "user", None)
        if user is None or not (user.is_authenticated and user.is_staff):
            return None
        return super()._get_key(request)

    def authenticate(self, request, key):
        user = super().authenticate(request, key)
        return Principal(actor=f"user:{user.get_username()}", user=user) if user else None


def open_reads(request):
    """Lets safe requests through without credentials when API_READS_OPEN is set."""
    if settings.API_READS_OPEN and request.method in ("GET", "HEAD"):
        return Principal(actor="anonymous")
    return None


class QueueAPI(NinjaAPI):
    """A NinjaAPI whose 405 answers are JSON like every other refusal."""

    @property
    def urls(self):
        patterns, app_name, namespace = super().urls
        for pattern in patterns:
            pattern.callback = _json_405(pattern.callback)
        return patterns, app_name, namespace


def _json_405(view):
    # ninja answers a method no operation takes with a plain-text HttpResponseNotAllowed.
    @wraps(view)
    def check(request, *args, **kwargs):
        response = view(request, *args, **kwargs)
        if isinstance(response, HttpResponseNotAllowed):
            allowed = response["Allow"]
            message = f"{request.method} is not allowed here; allowed: {allowed}"
            response = api.create_response(request, {"error": message, "field": None}, status=405)
            response["Allow"] = allowed
        return response

    return check


api = QueueAPI(
    title="jobqueue API",
    version="1",
    description="Enqueue, inspect and operate the job queue.",
    auth=[KeyAuth(), StaffSession(), open_reads],
    urls_namespace="jobqueue-api",
    # Served from ninja's bundled static files ("ninja" is in INSTALLED_APPS), not a CDN;
    # no validator badge, which would be fetched from the internet.
    docs=Swagger(settings={"validatorUrl": None}),
)


def _limit_body(run):
    """Refuse bodies over API_MAX_BODY_BYTES before anything reads them."""

    @wraps(run)
    def check(request, *args, **kwargs):
        limit = settings.API_MAX_BODY_BYTES
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        if length > limit:
            return api.create_response(
                request,
                {"error": f"the body is {length} bytes; the limit is {limit}", "field": None},
                status=413,
            )
        return run(request, *args, **kwargs)

    return check


api.add_decorator(_limit_body, mode="view")


def _need_view(request, perm):
    """Refuse a staff session without ``perm``: the API reads what the dashboard shows it."""
    if not request.auth.may_read(perm):
        raise HttpError(403, f"this read needs the {perm} permission (or an API key)")


def _need(request, perm):
    if not request.auth.can(perm):
        scope = "write" if perm == "queue_app.add_job" else "operate"
        raise HttpError(403, f"this write needs the {perm} permission (or an API key with the {scope} scope)")
    return request.auth.actor


# --- errors: every refusal is JSON {"error": ..., "field": ...} -----------------------


def _error(request, status, message, field=None, **extra):
    return api.create_response(request, {"error": message, "field": field, **extra}, status=status)


@api.exception_handler(InvalidJob)
def _invalid_job(request, exc):
    return _error(request, 400, str(exc), exc.field)


@api.exception_handler(ValidationError)
def _invalid_input(request, exc):
    def name(loc):
        loc = [str(p) for p in loc]
        # ("body", <parameter>, field...) / ("query", field) / ("path", field)
        loc = loc[2:] if loc[:1] == ["body"] else loc[1:]
        return ".".join(loc) or None

    first = exc.errors[0] if exc.errors else {}
    field = name(first.get("loc", ()))
    message = f"{field}: {first.get('msg', 'invalid')}" if field else first.get("msg", "invalid request body")
    entry, _, inner = (field or "").partition(".")
    index, _, inner = inner.partition(".")
    if entry == "jobs" and index.isdigit() and inner:
        # A bulk entry's field, named as the bulk's own checks name it: "job 1: priority ...".
        field, message = inner, f"job {index}: {inner}: {first.get('msg', 'invalid')}"
    details = [{"field": name(e.get("loc", ())), "message": e.get("msg", "")} for e in exc.errors]
    return _error(request, 400, message, field, details=details)


@api.exception_handler(JobNotFound)
def _not_found(request, exc):
    return _error(request, 404, str(exc))


@api.exception_handler(InvalidTransition)
def _conflict(request, exc):
    return _error(request, 409, str(exc), state=exc.state)


@api.exception_handler(AuthenticationError)
def _unauthenticated(request, exc):
    return _error(request, 401, f"send an API key in the {settings.API_KEY_HEADER} header or log in as staff")


@api.exception_handler(HttpError)
def _http_error(request, exc):
    return _error(request, exc.status_code, str(exc))


@api.exception_handler(Http404)
def _no_such_object(request, exc):
    # Replaces ninja's own {"detail": ...} for Http404.
    return _error(request, 404, str(exc) or "not found")


# --- schemas ------------------------------------------------------------------------------


class Refused(Schema):
    error: str
    field: str | None = None


class Duplicate(Refused):
    job_id: int


# Any operation may refuse its input (400), its caller (401), a caller without the
# permission (403: a write's, or for a staff session a read's view permission, as on the
# dashboard) or an oversized body (413).
REFUSALS = {400: Refused, 401: Refused, 403: Refused, 413: Refused}
WRITE_REFUSALS = REFUSALS


# The schema states the bounds validation (core/validation.py) enforces, so what it
# documents as valid is what the API takes: names, lengths and ranges.
NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.:\-]*$"
KindName = Annotated[str, Field(min_length=1, max_length=KIND_MAX_LENGTH, pattern=NAME_PATTERN)]
QueueName = Annotated[str, Field(min_length=1, max_length=QUEUE_NAME_MAX_LENGTH, pattern=NAME_PATTERN)]
MaxAttempts = Annotated[int, Field(ge=1, le=settings.MAX_ATTEMPTS_LIMIT)]
TEN_YEARS = validation.MAX_SCHEDULE_AHEAD.total_seconds()


class JobIn(Schema):
    model_config = ConfigDict(extra="forbid")

    kind: KindName = Field(..., description="Which handler runs the job.", examples=["email"])
    payload: Any = Field(default=None, description="Any JSON value; {} when omitted.")
    queue_name: QueueName | None = None
    priority: int | None = Field(
        default=None, ge=PRIORITY_MIN, le=PRIORITY_MAX, description="-100..100, higher runs first."
    )
    run_at: datetime | None = Field(
        default=None, description="Earliest start; timezone-aware ISO 8601, within 10 years of now."
    )
    run_after: float | None = Field(
        default=None, ge=0, le=TEN_YEARS, description="Earliest start as seconds from now."
    )
    max_attempts: MaxAttempts | None = None
    idempotency_key: str | None = Field(default=None, min_length=1, max_length=IDEMPOTENCY_KEY_MAX_LENGTH)
    concurrency_key: str | None = Field(
        default=None,
        min_length=1,
        max_length=CONCURRENCY_KEY_MAX_LENGTH,
        description="With the kind's per_key limit, at most per_key jobs with this key run at once.",
    )
    timeout: float | None = Field(
        default=None, gt=0, le=settings.MAX_TIMEOUT_SECONDS, description="Seconds one attempt may run."
    )
    unique_for: float | None = Field(
        default=None, gt=0, le=TEN_YEARS, description="Seconds the idempotency key dedupes for."
    )
    strict: bool = Field(
        default=False, description="409 instead of 200 when the idempotency key matches a job."
    )
    on_success: dict | None = Field(
        default=None, description="Follow-up job template: kind, payload, options."
    )
    on_failure: dict | None = Field(default=None, description="Follow-up job template when it dead-letters.")
    webhook_url: str | None = Field(
        default=None, description="POSTed the outcome; host must be allow-listed."
    )
    backoff_base: float | None = Field(
        default=None,
        ge=validation.BACKOFF_BASE_RANGE[0],
        le=validation.BACKOFF_BASE_RANGE[1],
        description="Retry after backoff_base ** attempt seconds, 1..100.",
    )
    backoff_max: float | None = Field(
        default=None,
        gt=0,
        le=validation.MAX_BACKOFF_SECONDS,
        description="Seconds; the cap on one retry delay.",
    )
    backoff_jitter: StrictBool | None = Field(default=None, description="Spread each retry over 0..delay.")
    # Debounce and uniqueness by state (validation.admission).
    debounce_key: str | None = Field(
        default=None,
        description="While this key's job is pending and never leased, an enqueue with the key "
        "updates that job (200) instead of inserting one; needs debounce_for.",
    )
    debounce_for: float | str | None = Field(
        default=None, description='Seconds (or "30s", "5m"): the job runs this long after the last enqueue.'
    )
    debounce_max_wait: float | str | None = Field(
        default=None, description="At most this long after the first enqueue, however many come."
    )
    debounce_mode: Literal["replace", "keep"] | None = Field(
        default=None, description="replace (default): the newest payload wins; keep: the first stays."
    )
    unique_key: str | None = Field(
        default=None,
        description="An enqueue returns this key's newest job (200) while it is in unique_while.",
    )
    unique_while: str | list[str] | None = Field(
        default=None,
        description='"active" (default: pending or leased), "pending" (one follow-up while one runs) '
        "or a list of states.",
    )
    depends_on: list[int] | None = Field(
        default=None, description="Job ids it waits for: it stays waiting until they have all ended."
    )
    on_dependency_failure: Literal["cancel", "run", "hold"] | None = Field(
        default=None,
        description="When one of depends_on fails: cancel it (default), run it anyway, or hold it.",
    )
    ordering_key: str | None = Field(
        default=None,
        description="Jobs sharing this key run one at a time, in enqueue order: it waits (state "
        "waiting) for the key's previous job to end.",
    )
    ordering_blocks: StrictBool | None = Field(
        default=None,
        description="With ordering_key: a dead-lettered job holds the next one until it is requeued "
        "and completes, or the held job is requeued (skipped past) or cancelled.",
    )


class BulkIn(Schema):
    model_config = ConfigDict(extra="forbid")

    jobs: list[JobIn]


class RequeueIn(Schema):
    model_config = ConfigDict(extra="forbid")

    payload: Any = Field(default=None, description="Replaces the payload when given.")
    max_attempts: MaxAttempts | None = None


class JobFields(Schema):
    """What a job's row says, but its JSON columns (JobOut has them whole, JobRow previews)."""

    id: int
    kind: str
    queue_name: str
    priority: int
    run_at: datetime
    state: str
    status: str = Field(
        ...,
        description="The state, but a pending job is ready, scheduled, retrying or paused: "
        + "; ".join(f"{name}: {STATUSES[name]}" for name in JOB_STATUSES),
    )
    attempts: int
    max_attempts: int
    idempotency_key: str | None
    concurrency_key: str | None = None
    lease_owner: str | None
    lease_expires_at: datetime | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    timeout: float | None
    backoff_base: float | None
    backoff_max: float | None
    backoff_jitter: bool | None
    cancel_requested_at: datetime | None = Field(
        None, description="Set while a running job is being aborted."
    )
    progress: float | None = Field(None, description="0-100, as the running handler last reported.")
    progress_message: str | None = None


class JobOut(JobFields):
    ordering_key: str | None = Field(None, description="Its ordered key, if enqueued with one.")
    payload: Any
    result: Any
    last_error: Any
    metadata: Any = Field(None, description="JSON the handler attached.")
    crashes: int | None = Field(
        None,
        description="Attempts whose worker process died or was killed for its timeout; "
        "at MAX_CRASHES the job is dead-lettered as poison.",
    )


class JobRow(JobFields):
    """A job in a list: its JSON columns as bounded previews, so a page's size stays bounded
    whatever its rows hold (the whole job: GET /api/jobs/{id})."""

    payload_preview: str = Field(
        ..., description="The payload's JSON text, cut at LIST_PREVIEW_CHARS characters."
    )
    payload_size: int = Field(..., description="Characters of the payload's whole JSON text.")
    result_preview: str | None = None
    result_size: int | None = None
    last_error_message: str | None = Field(None, description="The start of the last error's message.")


class EventOut(Schema):
    id: int
    type: str
    at: datetime
    attempt: int
    worker: str
    from_state: str
    to_state: str
    message: str
    metadata: Any


class WhyOut(Schema):
    code: str = Field(
        description="running, waiting, held, ended, scheduled, retrying, queue_paused, "
        "kind_paused, concurrency_limit, rate_limit, per_key_limit, no_worker, no_worker_serves, busy, eligible"
    )
    text: str
    link: str


class JobDetail(JobOut):
    events: list[EventOut]
    why: WhyOut | None = Field(None, description="Why a pending or waiting job is not running now.")


class JobPage(Schema):
    items: list[JobRow]
    next_before: int | None = Field(None, description="Pass as ?before= for the next (older) page.")


class DeadLetterRow(Schema):
    """A dead letter in a list: payload and error as bounded previews (the whole of them:
    the job's own endpoint)."""

    id: int
    job_id: int
    kind: str
    payload_preview: str
    payload_size: int
    attempts: int
    error_type: str | None = None
    error_message: str | None = None
    reason: str
    created_at: datetime
    resolved_at: datetime | None
    resolution: str


class DeadLetterPage(Schema):
    items: list[DeadLetterRow]
    next_before: int | None = None


class WorkerOut(Schema):
    id: int
    name: str
    host: str
    pid: int
    queues: Any
    kinds: Any
    concurrency: int
    threads: int
    state: str
    status: str = Field(
        ..., description="; ".join(f"{name}: {meaning}" for name, meaning in WORKER_STATUSES.items())
    )
    started_at: datetime
    last_heartbeat: datetime
    stopped_at: datetime | None
    stop_requested_at: datetime | None
    quiet_requested_at: datetime | None
    jobs_in_hand: int
    jobs_done: int


class Stats(Schema):
    jobs: dict[str, int]
    jobs_by_queue: dict[str, dict[str, int]]
    jobs_by_kind: dict[str, dict[str, int]]
    events: dict[str, int]
    oldest_pending_seconds: float
    dead_letters: int
    workers: dict[str, int]


def _names_shell(kind, options):
    """Whether a job of ``kind`` with ``options`` is, or enqueues as a follow-up, a shell job."""
    if kind == validation.SHELL_KIND:
        return True
    return any(
        isinstance(template, dict) and _names_shell(template.get("kind"), template)
        for template in (options.get("on_success"), options.get("on_failure"))
    )


def _need_shell(request, kind, options):
    """A shell job runs its command on a worker: enqueuing one (or a follow-up that is one)
    needs more than add_job."""
    if _names_shell(kind, options) and not request.auth.can(SHELL_PERMISSION):
        raise HttpError(
            403, f"shell jobs need the {SHELL_PERMISSION} permission (or an API key created with --shell)"
        )


def _kinds(kind, options):
    """``kind`` and the kinds of the follow-up templates in ``options``, nested."""
    yield kind
    for template in (options.get("on_success"), options.get("on_failure")):
        if isinstance(template, dict):
            yield from _kinds(template.get("kind"), template)


def _need_known(kind, options):
    """Refuse a kind no handler is registered for on this site (nor a django.tasks Task it
    may import): a job no worker can run is a mistake, and the API is no way to reach
    handlers only some worker loaded (the sample workloads, SAMPLE_HANDLERS)."""
    for name in _kinds(kind, options):
        if not isinstance(name, str):
            continue  # validation says what is wrong with it
        try:
            registry.get(name)
        except UnknownKind as exc:
            raise InvalidJob(f"unknown kind {name[:100]!r}: {exc}", "kind") from None


def _need_shell_for(request, job_id):
    kind = reads.kind_of(job_id)
    if kind is not None:
        _need_shell(request, kind, {})


def _shown(request, jobs):
    """Jobs as the caller may see them: redacted (ops/redaction.py) unless it holds the
    unredacted permission or key scope."""
    return redaction.rows(jobs, request.auth.unredacted)


def _shown_one(request, job):
    return _shown(request, [job])[0]


class _WithEvents:
    """A job read with the timeline given (the shown rows), not its own related manager's."""

    def __init__(self, job, events):
        self._job, self.events, self.why = job, events, None

    def __getattr__(self, name):
        return getattr(self._job, name)


def _options(job: JobIn):
    data = job.model_dump(exclude_unset=True)
    data.pop("strict", None)
    return data.pop("kind"), data.pop("payload", None), data


def _name_filter(value, field):
    if value is not None and (len(value) > 255 or not validation.NAME_RE.match(value)):
        raise InvalidJob(f"{field} {value[:50]!r} is not a valid {field} name", field)
    return value


def _limit(value):
    return min(value or settings.API_PAGE_SIZE, settings.API_MAX_PAGE_SIZE)


# --- jobs ------------------------------------------------------------------------------------


@api.post("/jobs", response={200: JobOut, 201: JobOut, **WRITE_REFUSALS, 409: Duplicate}, tags=["jobs"])
def create_job(request: HttpRequest, job: JobIn = Body(...)):
    """Enqueue a job: 201 with the new job, 200 with the existing one on an idempotency- or
    unique-key match (409 naming it when ``strict`` is true) or a debounce (always 200: the
    job was updated)."""
    _need(request, "queue_app.add_job")
    kind, payload, options = _options(job)
    _need_shell(request, kind, options)
    _need_known(kind, options)
    created = enqueueing.enqueue(kind, payload, **options)
    key = "unique_key" if options.get("unique_key") is not None else "idempotency_key"
    if job.strict and not created.was_created and options.get("debounce_key") is None:
        message = f"{key} matches job {created.id} ({created.state}); it was not enqueued again"
        return Status(409, {"error": message, "field": key, "job_id": created.id})
    return Status(201 if created.was_created else 200, _shown_one(request, created))


@api.post("/jobs/bulk", response={201: list[JobOut], **WRITE_REFUSALS}, tags=["jobs"])
def create_jobs(request: HttpRequest, body: BulkIn):
    """Enqueue many jobs in one transaction: all or none."""
    _need(request, "queue_app.add_job")
    if not 1 <= len(body.jobs) <= settings.MAX_BATCH:
        raise InvalidJob(f"jobs must hold 1..{settings.MAX_BATCH} entries, got {len(body.jobs)}", "jobs")
    specs = []
    for i, job in enumerate(body.jobs):
        try:
            kind, payload, options = _options(job)
        except InvalidJob as exc:
            raise InvalidJob(f"job {i}: {exc}", exc.field) from None
        _need_shell(request, kind, options)
        try:
            _need_known(kind, options)
        except InvalidJob as exc:
            raise InvalidJob(f"job {i}: {exc}", exc.field) from None
        specs.append({"kind": kind, "payload": payload, **options})
    return Status(201, _shown(request, attach_statuses(enqueueing.bulk_enqueue(specs))))


@api.get("/jobs", response={200: JobPage, **REFUSALS}, tags=["jobs"])
def list_jobs(
    request: HttpRequest,
    state: StateName | None = None,
    status: StatusName | None = Query(
        None, description="A state, a derived status (ready ...) or late; not with state."
    ),
    kind: str | None = Query(None, min_length=1, max_length=KIND_MAX_LENGTH, pattern=NAME_PATTERN),
    queue: str | None = Query(None, min_length=1, max_length=QUEUE_NAME_MAX_LENGTH, pattern=NAME_PATTERN),
    before: int | None = Query(None, ge=1, le=MAX_ID, description="Only jobs with a smaller id."),
    limit: int | None = Query(None, ge=1, le=10_000),
):
    """Jobs, newest first, filtered by state or status, kind and queue; paginate with ``before``."""
    _need_view(request, "queue_app.view_job")
    if state and status:
        raise InvalidJob("give state or status, not both (status also takes every state)", "status")
    filters = reads.Filters(
        state=status or state, kind=_name_filter(kind, "kind"), queue=_name_filter(queue, "queue")
    )
    page = reads.job_page(filters, before=before, size=_limit(limit), unredacted=request.auth.unredacted)
    return {"items": page.rows, "next_before": page.older}


@api.get("/jobs/{job_id}", response={200: JobDetail, **REFUSALS, 404: Refused}, tags=["jobs"])
def get_job(
    request: HttpRequest,
    job_id: int = JobId,
    wait: str | None = Query(
        None,
        max_length=20,
        description="Wait up to this long (10s, 500ms; at most API_MAX_WAIT_SECONDS) for the job "
        "to end before answering: a long poll. The answer is the job as it stands then.",
    ),
):
    """One job with its whole event timeline."""
    _need_view(request, "queue_app.view_job")
    if wait is not None:
        try:
            seconds = durations.parse(wait)
        except ValueError as exc:
            raise InvalidJob(str(exc), "wait") from None
        with suppress(WaitTimeout):
            wakeup.until_ended(job_id, min(seconds, float(settings.API_MAX_WAIT_SECONDS)))
    found = reads.job_detail(job_id, unredacted=request.auth.unredacted)
    if found is None:
        raise JobNotFound(job_id)
    shown = _WithEvents(found["job"], found["events"])
    if found["job"].state in (State.PENDING, State.WAITING):
        shown.why = explain.why(found["job"]).as_dict()
    return shown


@api.delete(
    "/jobs/{job_id}",
    response={200: JobOut, 202: JobOut, **WRITE_REFUSALS, 404: Refused, 409: Refused},
    tags=["jobs"],
)
def cancel_job(request: HttpRequest, job_id: int = JobId):
    """Cancel a pending job (200), or ask the worker running a leased one to abort it
    (202: it ends cancelled when its handler stops or is killed); 409 when it has finished."""
    actor = _need(request, "queue_app.change_job")
    job = aborting.cancel(job_id, actor=actor, reason="cancelled over the API")
    return Status(202 if job.state == State.LEASED else 200, _shown_one(request, job))


@api.post(
    "/jobs/{job_id}/requeue",
    response={200: JobOut, **WRITE_REFUSALS, 404: Refused, 409: Refused},
    tags=["jobs"],
)
def requeue_job(request: HttpRequest, job_id: int = JobId, body: RequeueIn | None = Body(None)):
    """Send a dead-lettered or cancelled job back to pending with a fresh budget."""
    actor = _need(request, "queue_app.change_job")
    _need_shell_for(request, job_id)  # running its command again, or an edited one
    kwargs = {}
    if body is not None:
        fields = body.model_dump(exclude_unset=True)
        if "payload" in fields:
            kwargs["payload"] = {} if fields["payload"] is None else fields["payload"]
        if fields.get("max_attempts") is not None:
            kwargs["max_attempts"] = fields["max_attempts"]
    return _shown_one(request, transitions.requeue(job_id, actor=actor, **kwargs))


# --- stats, dead letters, workers ------------------------------------------------------------


@api.get("/stats", response={200: Stats, **REFUSALS}, tags=["queue"])
def stats(request: HttpRequest):
    """Job counts by state, queue and kind; event totals; backlog age; dead letters; workers."""
    _need_view(request, "queue_app.view_job")
    snap = metrics.snapshot()

    def nest(pairs):
        out = {}
        for (name, state), n in sorted(pairs.items()):
            out.setdefault(name, {})[state] = n
        return out

    return {
        "jobs": snap.jobs,
        "jobs_by_queue": nest(snap.jobs_by_queue),
        "jobs_by_kind": nest(snap.jobs_by_kind),
        "events": snap.events,
        "oldest_pending_seconds": snap.oldest_pending_seconds,
        "dead_letters": snap.dead_letters,
        "workers": snap.workers,
    }


@api.get("/dead-letters", response={200: DeadLetterPage, **REFUSALS}, tags=["dead letters"])
def list_dead_letters(
    request: HttpRequest,
    resolved: bool = Query(False, description="true: resolved ones instead of open ones."),
    before: int | None = Query(None, ge=1, le=MAX_ID),
    limit: int | None = Query(None, ge=1, le=10_000),
):
    """Dead letters, newest first: unresolved unless ?resolved=true."""
    _need_view(request, "queue_app.view_deadletter")
    page = reads.dead_letter_page(
        resolved=resolved, before=before, size=_limit(limit), unredacted=request.auth.unredacted
    )
    return {"items": page.rows, "next_before": page.older}


@api.post(
    "/dead-letters/{letter_id}/replay",
    response={200: JobOut, **WRITE_REFUSALS, 404: Refused, 409: Refused},
    tags=["dead letters"],
)
def replay_dead_letter(request: HttpRequest, letter_id: int = Path(..., ge=1, le=MAX_ID)):
    """Requeue the dead letter's job; 409 when it was already resolved."""
    actor = _need(request, "queue_app.change_job")
    letter = DeadLetter.objects.filter(id=letter_id).first()
    if letter is None:
        raise Http404(f"dead letter {letter_id} does not exist")
    if letter.resolved_at is not None:
        message = f"dead letter {letter_id} was already {letter.resolution or 'resolved'}"
        return Status(409, {"error": message, "field": None})
    _need_shell_for(request, letter.job_id)
    return _shown_one(request, transitions.requeue(letter.job_id, actor=actor))


@api.get("/workers", response={200: list[WorkerOut], **REFUSALS}, tags=["queue"])
def list_workers(request: HttpRequest, limit: int | None = Query(None, ge=1, le=10_000)):
    """Registered workers, newest first, each with its status (lost: silent past a lease)."""
    _need_view(request, "queue_app.view_worker")
    return reads.worker_rows(limit=_limit(limit), order=("-started_at", "-id"))


def _ask_worker(request, worker_id, ask, what):
    _need(request, "queue_app.change_worker")
    worker = Worker.objects.alive().filter(id=worker_id).first()
    if worker is None:
        raise Http404(f"no running worker with id {worker_id}")
    if not ask([worker_id]):
        return Status(409, {"error": f"worker {worker.name} was already told to {what}", "field": None})
    worker.refresh_from_db()
    return worker


@api.post(
    "/workers/{worker_id}/quiet",
    response={200: WorkerOut, **WRITE_REFUSALS, 404: Refused, 409: Refused},
    tags=["queue"],
)
def quiet_worker(request: HttpRequest, worker_id: int = Path(..., ge=1, le=MAX_ID)):
    """Ask a running worker to go quiet: it leases no more, runs what it holds and stays up
    until stopped; it sees the request within a second. 409 when already quiet or stopping."""
    return _ask_worker(request, worker_id, operations.request_quiet, "go quiet or stop")


@api.post(
    "/workers/{worker_id}/stop",
    response={200: WorkerOut, **WRITE_REFUSALS, 404: Refused, 409: Refused},
    tags=["queue"],
)
def stop_worker(request: HttpRequest, worker_id: int = Path(..., ge=1, le=MAX_ID)):
    """Ask a running worker to stop: it leases no more, finishes what it holds within its
    grace period, hands back the rest and exits. 409 when already told to stop."""
    return _ask_worker(request, worker_id, operations.request_stop, "stop")


# --- flow control: pauses (flow.py) ----------------------------------------------------------


class PauseIn(Schema):
    model_config = ConfigDict(extra="forbid")

    queue: QueueName | None = None
    kind: KindName | None = None
    reason: str = ""


class PauseOut(Schema):
    scope: str
    name: str
    created_at: datetime
    actor: str
    reason: str


@api.get("/pauses", response={200: list[PauseOut], **REFUSALS}, tags=["queue"])
def list_pauses(request: HttpRequest):
    """Paused queues and kinds: their pending jobs are not leased until resumed."""
    _need_view(request, "queue_app.view_pause")
    return list(Pause.objects.all())


@api.post("/pauses", response={201: PauseOut, 200: PauseOut, **WRITE_REFUSALS}, tags=["queue"])
def create_pause(request: HttpRequest, body: PauseIn):
    """Pause a queue or a kind cluster-wide (201; 200 if it already was)."""
    actor = _need(request, "queue_app.add_pause")  # the admin's permission for the same
    validation.text(body.reason, "reason")
    paused, created = flow.pause(queue=body.queue, kind=body.kind, actor=actor, reason=body.reason)
    return Status(201 if created else 200, paused)


@api.delete("/pauses", response={200: dict, **WRITE_REFUSALS, 404: Refused}, tags=["queue"])
def delete_pause(
    request: HttpRequest,
    queue: str | None = Query(None, min_length=1, max_length=QUEUE_NAME_MAX_LENGTH, pattern=NAME_PATTERN),
    kind: str | None = Query(None, min_length=1, max_length=KIND_MAX_LENGTH, pattern=NAME_PATTERN),
):
    """Resume a paused queue (?queue=) or kind (?kind=); 404 when it was not paused."""
    _need(request, "queue_app.delete_pause")
    if not flow.resume(queue=queue, kind=kind):
        return Status(
            404, {"error": f"{'queue' if queue else 'kind'} {queue or kind!r} is not paused", "field": None}
        )
    return {"resumed": queue or kind}


# --- runtime settings (core/runtime.py) --------------------------------------------------


class RuntimeSettingOut(Schema):
    name: str  # the operator's name, e.g. "lease-seconds"
    setting: str  # the JOBQUEUE name, e.g. "LEASE_SECONDS"
    value: float | int  # in force: the stored value, else JOBQUEUE's
    configured: float | int  # JOBQUEUE's (or the default)
    source: Literal["store", "settings"]
    updated_at: datetime | None
    updated_by: str


class RuntimeSettingIn(Schema):
    model_config = ConfigDict(extra="forbid")

    # A number, or for a seconds setting a duration such as "30s" or "5m".
    value: float | int | str


SettingName = Path(..., min_length=1, max_length=64, pattern=r"^[A-Za-z_-]+$")


@api.get("/config", response={200: list[RuntimeSettingOut], **REFUSALS}, tags=["queue"])
def list_config(request: HttpRequest):
    """The runtime settings: each one's value in force and where it comes from."""
    _need_view(request, "queue_app.view_runtimesetting")
    return runtime.entries()


@api.put("/config/{name}", response={200: RuntimeSettingOut, **WRITE_REFUSALS}, tags=["queue"])
def set_config(request: HttpRequest, body: RuntimeSettingIn, name: str = SettingName):
    """Store a runtime setting's value: every worker uses it within RUNTIME_SETTINGS_TTL
    seconds. 400 with the settings check's message for a bad value."""
    actor = _need(request, "queue_app.change_runtimesetting")
    return runtime.set_value(name, body.value, actor=actor)


@api.delete(
    "/config/{name}", response={200: RuntimeSettingOut, **WRITE_REFUSALS, 404: Refused}, tags=["queue"]
)
def unset_config(request: HttpRequest, name: str = SettingName):
    """Go back to JOBQUEUE's value; 404 when none was stored."""
    actor = _need(request, "queue_app.delete_runtimesetting")
    found = runtime.unset(name, actor=actor)
    if found is None:
        return Status(404, {"error": f"{name!r} has no stored value", "field": "name"})
    return found


# --- workflows: groups (canvas.py, ops/workflows.py) -------------------------------------------


class GroupIn(Schema):
    model_config = ConfigDict(extra="forbid")

    jobs: list[JobIn] = Field(..., description="The members, in member order.")
    callback: dict | None = Field(
        default=None,
        description="Job template (kind, payload, options) enqueued once; its payload gets 'group'.",
    )
    policy: Literal["success", "always", "first_failure"] = "success"
    name: str = ""


class GroupMember(Schema):
    id: int
    kind: str
    state: str
    status: str


class GroupOut(Schema):
    id: int
    name: str
    policy: str
    status: str = Field(..., description="open while members are left, else succeeded or failed.")
    total: int
    ended: int
    completed: int
    dead_letter: int
    cancelled: int
    callback: dict | None
    callback_job: int | None
    callback_error: str
    created_at: datetime
    fired_at: datetime | None
    closed_at: datetime | None
    members: list[GroupMember]


@api.post("/groups", response={201: GroupOut, **WRITE_REFUSALS}, tags=["workflows"])
def create_group(request: HttpRequest, body: GroupIn):
    """Enqueue jobs as one group with an optional callback, all or none."""
    _need(request, "queue_app.add_job")
    if not 1 <= len(body.jobs) <= settings.MAX_BATCH:
        raise InvalidJob(f"jobs must hold 1..{settings.MAX_BATCH} entries, got {len(body.jobs)}", "jobs")
    specs = []
    for job in body.jobs:
        kind, payload, options = _options(job)
        _need_shell(request, kind, options)
        specs.append({"kind": kind, "payload": payload, **options})
    if body.callback is not None:
        _need_shell(request, body.callback.get("kind"), body.callback)
    g = canvas.group(specs, callback=body.callback, policy=body.policy, name=body.name)
    return Status(201, workflow_reads.group(g.id))


@api.get("/groups/{group_id}", response={200: GroupOut, **REFUSALS, 404: Refused}, tags=["workflows"])
def get_group(request: HttpRequest, group_id: int = Path(..., ge=1, le=MAX_ID)):
    """A group's progress: n of m ended, completed, dead, cancelled, its callback and members."""
    _need_view(request, "queue_app.view_job")
    found = workflow_reads.group(group_id)
    if found is None:
        return Status(404, {"error": f"group {group_id} does not exist", "field": None})
    return found

"""The queue's tables: Job, its append-only Event log, DeadLetter, and the Worker registry.

Only ``queue_app.core.transitions`` changes ``Job.state`` or writes Event and DeadLetter rows.
The claim query's indexes are vendor-specific and live in migration 0002.

This module is also the one definition of what operators read: every surface
(dashboard, admin, CLI, API, metrics, health) asks these querysets and properties and
none re-derives them. A job's *status* is its state, except that a pending job is
exactly one of (first match wins):

- ``paused``: its queue or its kind has a Pause row. Held: no claim leases it, and it is
  never ready or late, whatever its run_at says.
- ``ready``: ``run_at <= now``. The next claim may lease it, including a retry whose
  backoff has passed (it is as claimable as a new job).
- ``retrying``: ``run_at > now`` and ``attempts > 0``: waiting out a retry backoff.
- ``scheduled``: ``run_at > now`` and ``attempts == 0``: not due yet.

``late`` is not a status of its own but a part of ready: a ready job whose run_at is
more than OPS_LATE_SECONDS ago (``Job.is_late``, ``Job.objects.late()``). A worker is
*lost* when it is not stopped but its heartbeat is older than LEASE_SECONDS
(``Worker.status``, ``Worker.objects.lost()``).

Each pending status is one Q object (``status_q``) that both the querysets and the
annotation ``with_status()`` use; ``derive_status`` is the same rule in Python, for one
job in hand, and a property test holds the two together.
"""

from datetime import timedelta

from django.db import models
from django.db.models import Case, F, Q, Value, When
from django.utils import timezone

from queue_app.conf import settings

PRIORITY_MIN = -100
PRIORITY_MAX = 100
IDEMPOTENCY_KEY_MAX_LENGTH = 255
# A debounce or unique key: its AdmissionKey row's id adds a prefix of up to 9 characters,
# and stays within 255 (MariaDB may refuse a longer unique varchar: mysql.W003).
ADMISSION_KEY_MAX_LENGTH = 240
CONCURRENCY_KEY_MAX_LENGTH = 255
KIND_MAX_LENGTH = 200
QUEUE_NAME_MAX_LENGTH = 100


class State(models.TextChoices):
    # Enqueued with depends_on: held until every job it depends on has ended, then
    # pending in the transaction of the last one's end (workflows.py). Never leased, late
    # or counted as ready while here.
    WAITING = "waiting"
    # Waiting to be claimed; ready once run_at has passed. Also where retries wait.
    PENDING = "pending"
    # Claimed by a worker whose lease runs until lease_expires_at.
    LEASED = "leased"
    # The handler returned; result holds its value. Terminal.
    COMPLETED = "completed"
    # The attempt budget is spent; a DeadLetter row says why. Requeue brings it back.
    DEAD_LETTER = "dead_letter", "Dead letter"
    # Stopped by an operator before it completed. Terminal.
    CANCELLED = "cancelled"


class EventType(models.TextChoices):
    ENQUEUED = "enqueued"
    CLAIMED = "claimed"
    COMPLETED = "completed"
    # An attempt failed and the job went back to pending for a retry at run_at.
    FAILED = "failed"
    # An attempt failed (or its lease lapsed) with no attempts left.
    DEAD_LETTERED = "dead_lettered", "Dead-lettered"
    # A lapsed lease was taken back; metadata says whether it went to pending or dead_letter.
    RECOVERED = "recovered"
    REQUEUED = "requeued"
    CANCELLED = "cancelled"
    # A pending job's run_at moved to now by an operator ("retry now").
    RESCHEDULED = "rescheduled"
    PRIORITY_CHANGED = "priority_changed"
    PAYLOAD_CHANGED = "payload_changed"
    # A worker gave back a claimed job it did not start (shutdown); no attempt consumed.
    RELEASED = "released"
    # Its handler asked to run later (raised Snooze): back to pending at a later run_at,
    # the attempt not consumed; metadata holds the delay and the job's snooze count.
    SNOOZED = "snoozed"
    # Another enqueue with its debounce_key came while it was pending and never leased:
    # its run_at moved (metadata: old and new run_at, whether the payload was replaced).
    DEBOUNCED = "debounced"
    # A waiting job's dependencies have all ended: it went to pending (metadata: how).
    UNBLOCKED = "unblocked"
    # A waiting job's dependency failed and its policy is hold: it stays waiting until
    # an operator requeues (runs) or cancels it.
    HELD = "held"
    # A job cancelled or held because a dependency failed waits again: that dependency
    # (metadata ``after``) was requeued, or was itself revived.
    REVIVED = "revived"
    # An operator asked a running job to stop (cancel_requested_at set); it stays leased
    # until its handler returns or, after the abort grace, its process is killed.
    ABORT_REQUESTED = "abort_requested"


# A pending job's derived statuses, as Job.status spells them.
READY = "ready"
SCHEDULED = "scheduled"
RETRYING = "retrying"
PAUSED = "paused"
LATE = "late"
# Statuses that split pending, in display order; each pending job has exactly one.
PENDING_STATUSES = (READY, SCHEDULED, RETRYING, PAUSED)

# Every name a status filter takes, in display order, with its one-line meaning: the
# dashboard's and the admin's filters, `inspect --state`, the API's ?status= and the
# metrics' labels all read this table. Job.status is always one of these names except
# "pending" (the union of the four pending statuses) and "late" (a part of ready).
STATUSES = {
    READY: "pending and due, its queue and kind not paused: the next claim may lease it",
    LATE: "ready, and due for longer than OPS_LATE_SECONDS: the workers are not keeping up",
    SCHEDULED: "pending, first attempt not due yet (run_at in the future)",
    RETRYING: "pending after a failed attempt, waiting out its backoff (run_at in the future)",
    PAUSED: "pending in a paused queue or kind: held, never leased (nor late) until resumed",
    State.WAITING: "enqueued with depends_on: waits for those jobs to end, never leased until then",
    State.PENDING: "waiting to be leased: ready, scheduled, retrying or paused",
    State.LEASED: "claimed by a worker, running until it settles or its lease lapses",
    State.COMPLETED: "its handler returned",
    State.DEAD_LETTER: "its attempts are spent; a dead letter says why, requeue brings it back",
    State.CANCELLED: "stopped by an operator before it completed",
}
# What Job.status can be: the table less the two names that are not one job's status.
JOB_STATUSES = tuple(name for name in STATUSES if name not in (State.PENDING, LATE))


def late_before(now):
    """The run_at before which a ready job is late."""
    return now - timedelta(seconds=float(settings.OPS_LATE_SECONDS))


def paused_q():
    """Jobs whose queue or kind is paused (two subqueries on the few Pause rows)."""
    return Q(queue_name__in=Pause.objects.filter(scope=PauseScope.QUEUE).values("name")) | Q(
        kind__in=Pause.objects.filter(scope=PauseScope.KIND).values("name")
    )


def status_q(name, now):
    """The one condition for status ``name`` at ``now`` (a state, a pending status or late)."""
    pending = Q(state=State.PENDING)
    if name == PAUSED:
        return pending & paused_q()
    free = pending & ~paused_q()
    if name == READY:
        return free & Q(run_at__lte=now)
    if name == LATE:
        return free & Q(run_at__lte=late_before(now))
    if name == RETRYING:
        return free & Q(run_at__gt=now, attempts__gt=0)
    if name == SCHEDULED:
        return free & Q(run_at__gt=now, attempts=0)
    if name in State.values:
        return Q(state=name)
    raise ValueError(f"unknown status {name!r}; choose one of {', '.join(STATUSES)}")


def derive_status(state, run_at, attempts, paused, now):
    """A job's status from its fields, as ``status_q`` decides it in SQL."""
    if state != State.PENDING:
        return state
    if paused:
        return PAUSED
    if run_at <= now:
        return READY
    return RETRYING if attempts > 0 else SCHEDULED


class JobQuerySet(models.QuerySet):
    def pending(self):
        return self.filter(state=State.PENDING)

    def status(self, name, now=None):
        """Jobs in status ``name`` (any name of STATUSES); ValueError for another."""
        return self.filter(status_q(name, now or timezone.now()))

    def ready(self, now=None):
        """Pending, due, and not paused: what the next claim may lease."""
        return self.status(READY, now)

    def late(self, now=None):
        """Ready jobs due for longer than OPS_LATE_SECONDS (never a paused one)."""
        return self.status(LATE, now)

    def scheduled(self, now=None):
        """Pending jobs not due yet that have never run."""
        return self.status(SCHEDULED, now)

    def retrying(self, now=None):
        """Pending jobs waiting out a retry backoff."""
        return self.status(RETRYING, now)

    def paused(self):
        """Pending jobs held by a paused queue or kind."""
        return self.filter(status_q(PAUSED, None))

    def with_status(self, now=None):
        """Annotate each job's status at ``now``, so Job.status reads it without a query."""
        now = now or timezone.now()
        return self.annotate(
            derived_status=Case(
                *(When(status_q(name, now), then=Value(name)) for name in PENDING_STATUSES),
                default=F("state"),
                output_field=models.CharField(),
            )
        )

    def leased(self):
        return self.filter(state=State.LEASED)

    def expired(self, now=None):
        return self.filter(state=State.LEASED, lease_expires_at__lt=now or timezone.now())

    def completed(self):
        return self.filter(state=State.COMPLETED)

    def dead(self):
        return self.filter(state=State.DEAD_LETTER)

    def cancelled(self):
        return self.filter(state=State.CANCELLED)


class Job(models.Model):
    id = models.BigAutoField(primary_key=True)
    kind = models.CharField(max_length=KIND_MAX_LENGTH)
    queue_name = models.CharField(max_length=QUEUE_NAME_MAX_LENGTH, default="default")
    payload = models.JSONField(default=dict, blank=True)
    priority = models.SmallIntegerField(default=0)
    run_at = models.DateTimeField(default=timezone.now)
    # The earliest start the enqueuer asked for (django.tasks' run_after), kept as given:
    # run_at starts there or at the enqueue, whichever is later, and retries move it.
    # Empty: as soon as possible. Nullable, so adding it is a catalogue change.
    run_after = models.DateTimeField(null=True, blank=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    max_attempts = models.PositiveIntegerField(default=3)
    idempotency_key = models.CharField(
        max_length=IDEMPOTENCY_KEY_MAX_LENGTH, null=True, blank=True, unique=True
    )
    lease_owner = models.CharField(max_length=255, null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    # The attempt its worker's supervisor last saw running (its lease renewal writes it):
    # a lease recovered while ``attempts`` is another number never reached its handler as
    # far as the row knows, and recovery gives the attempt back (transitions.recover), at
    # most RECOVERY_RETURNS times (``returned_attempts``).
    started_attempt = models.PositiveIntegerField(null=True, blank=True)
    returned_attempts = models.PositiveIntegerField(null=True, blank=True)
    # Attempts that ended with their worker process dead (a crash: os._exit, a signal, an
    # OOM kill) or killed for its timeout, counted apart from ordinary failures: at
    # MAX_CRASHES the job is dead-lettered as "poison" (transitions.fail). Empty: none.
    crashes = models.PositiveIntegerField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    result = models.JSONField(null=True, blank=True)
    last_error = models.JSONField(null=True, blank=True)
    timeout = models.FloatField(null=True, blank=True, help_text="Seconds; empty for the default.")
    # Workflows (chaining.py, webhooks.py): follow-up job templates, the job that
    # chained this one, and where to POST the outcome. All nullable so adding them to
    # a large table is a catalogue change, not a rewrite.
    on_success = models.JSONField(null=True, blank=True)
    on_failure = models.JSONField(null=True, blank=True)
    parent = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        related_name="children",
        # No constraint and no cascade: pruning a parent leaves the child's history alone.
        on_delete=models.DO_NOTHING,
        db_constraint=False,
    )
    webhook_url = models.CharField(max_length=2000, null=True, blank=True)
    # Per-job retry backoff; empty means the JOBQUEUE BACKOFF_* settings (conf.py).
    backoff_base = models.FloatField(null=True, blank=True, help_text="Empty for the default.")
    backoff_max = models.FloatField(null=True, blank=True, help_text="Seconds; empty for the default.")
    backoff_jitter = models.BooleanField(null=True, blank=True, help_text="Empty for the default.")
    # Abort and progress (aborting.py, running.py). cancel_requested_at means something
    # only while leased: the worker running the job stops it. Progress and metadata are
    # what the handler last reported, written without an event (not transitions).
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    progress = models.FloatField(null=True, blank=True, help_text="0-100, as the handler last reported.")
    progress_message = models.CharField(max_length=500, null=True, blank=True)
    metadata = models.JSONField(null=True, blank=True)
    # Per-key limit (flow.py): with its kind's KindLimit.per_key set, at most that many
    # jobs with this key are leased at once. No index of its own: the leased jobs of a
    # kind, the only rows counted by key, come from jq_job_state_kind_queue and are few.
    concurrency_key = models.CharField(
        max_length=CONCURRENCY_KEY_MAX_LENGTH, null=True, blank=True, help_text="Empty: not limited per key."
    )
    # Groups and dependencies (core/workflows.py). ``in_workflow`` is true for a group
    # member and for a job others depend on: its end must go the long way, through the
    # hook that counts it (engines.base.NO_FOLLOW_UP). ``waiting_for``: how many of a
    # waiting job's dependencies have not ended; ``depends``: its options
    # {"policy": cancel|run|hold, "pass": null|"arg"|"payload", "held": bool}, and for an
    # ordered key's job "ordering" (the key) and "after" (the job ahead of it).
    group = models.ForeignKey(
        "JobGroup", null=True, blank=True, related_name="members", on_delete=models.PROTECT
    )
    in_workflow = models.BooleanField(null=True, blank=True)
    waiting_for = models.PositiveIntegerField(null=True, blank=True)
    depends = models.JSONField(null=True, blank=True)
    # Ordered keys (transitions._enqueue_ordered): jobs with one key run one at a time in
    # enqueue order, each a dependency of the next. Shown, never looked up: the key's
    # AdmissionKey row ("ordering:KEY") points at its newest job.
    ordering_key = models.CharField(max_length=ADMISSION_KEY_MAX_LENGTH, null=True, blank=True)

    # The W3C trace context (traceparent, tracestate) of the enqueue, with OpenTelemetry
    # installed and a trace open (core/telemetry.py): each attempt's span continues it.
    trace_context = models.JSONField(null=True, blank=True)

    objects = JobQuerySet.as_manager()

    class Meta:
        ordering = ["-id"]
        # Counts by state, kind and queue (metrics, dashboard) read this index only.
        indexes = [models.Index(fields=["state", "kind", "queue_name"], name="jq_job_state_kind_queue")]
        # A shell job runs a command of the enqueuer's choosing on a worker: more than
        # add_job, which every writer has (web/api.py asks for it; API keys: can_run_shell).
        permissions = [
            ("enqueue_shell_job", "Can enqueue, edit and requeue shell jobs (commands run on workers)"),
            # Without it every surface shows secrets in payloads, results, errors and
            # output as [redacted] (ops/redaction.py), and payloads cannot be edited.
            ("view_unredacted_payload", "Can see payloads, results, errors and output unredacted"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(priority__gte=PRIORITY_MIN) & Q(priority__lte=PRIORITY_MAX),
                name="jq_job_priority_range",
            ),
            models.CheckConstraint(condition=Q(attempts__gte=0), name="jq_job_attempts_nonneg"),
            models.CheckConstraint(condition=Q(max_attempts__gte=1), name="jq_job_max_attempts_pos"),
            models.CheckConstraint(condition=Q(state__in=State.values), name="jq_job_state_valid"),
            # A leased job always knows its owner and deadline; no other state has them.
            models.CheckConstraint(
                condition=(
                    Q(state=State.LEASED, lease_owner__isnull=False, lease_expires_at__isnull=False)
                    | (~Q(state=State.LEASED) & Q(lease_owner__isnull=True, lease_expires_at__isnull=True))
                ),
                name="jq_job_lease_iff_leased",
            ),
        ]

    def __str__(self):
        return f"#{self.id} {self.kind} ({self.state})"

    @property
    def status(self):
        """The job's status now (see the module docstring); one of JOB_STATUSES."""
        # Lists read it from with_status() in the same query; one job in hand asks the
        # Pause table only when pending, the one case a pause can change the answer.
        annotated = self.__dict__.get("derived_status")
        if annotated is not None:
            return annotated
        paused = self.state == State.PENDING and self.is_paused()
        return derive_status(self.state, self.run_at, self.attempts, paused, timezone.now())

    @property
    def is_late(self):
        """Ready and due for longer than OPS_LATE_SECONDS."""
        return self.status == READY and self.run_at <= late_before(timezone.now())

    def is_paused(self):
        """Whether this job's queue or kind is paused."""
        return Pause.objects.is_paused(self.queue_name, self.kind)


def attach_statuses(jobs, now=None):
    """Set each job's status as with_status() would, reading the Pause table once for all
    of them (a freshly enqueued batch would otherwise ask once per pending job)."""
    now = now or timezone.now()
    paused = set(Pause.objects.values_list("scope", "name"))
    for job in jobs:
        held = (PauseScope.QUEUE, job.queue_name) in paused or (PauseScope.KIND, job.kind) in paused
        job.__dict__["derived_status"] = derive_status(
            job.state, job.run_at, job.attempts, job.state == State.PENDING and held, now
        )
    return jobs


class AdmissionKey(models.Model):
    """A debounce or unique key's lock row (transitions._debounce, _unique): inserted or
    locked first in every enqueue with that key, so such enqueues take turns on every
    database, and pointing at the job the key stands for now."""

    # "debounce:KEY" or "unique:KEY": the two options never share a row.
    id = models.CharField(primary_key=True, max_length=255)
    # The key's newest job; no constraint, so pruning a job leaves the key alone.
    job_id = models.BigIntegerField(null=True, blank=True)
    updated_at = models.DateTimeField()

    def __str__(self):
        return f"{self.id} -> job {self.job_id}"


class Event(models.Model):
    """One row per transition; never updated or deleted except with its job (prune)."""

    id = models.BigAutoField(primary_key=True)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    type = models.CharField(max_length=32, choices=EventType.choices)
    at = models.DateTimeField(default=timezone.now)
    attempt = models.PositiveIntegerField(default=0)
    worker = models.CharField(max_length=255, blank=True, default="")
    from_state = models.CharField(max_length=16, blank=True, default="")
    to_state = models.CharField(max_length=16, blank=True, default="")
    message = models.TextField(blank=True, default="")
    metadata = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["type", "at"], name="jq_event_type_at")]

    def __str__(self):
        return f"{self.type} #{self.job_id} @{self.at:%Y-%m-%d %H:%M:%S.%f}"


class GroupPolicy(models.TextChoices):
    # The callback runs once every member has completed; a failed member closes the
    # group without it.
    SUCCESS = "success"
    # The callback runs once every member has ended, whatever their outcomes.
    ALWAYS = "always"
    # The callback runs at the first failed member (dead-lettered or cancelled), and the
    # members still pending are cancelled; with no failure, once every member completed.
    FIRST_FAILURE = "first_failure"


class JobGroup(models.Model):
    """Jobs enqueued together, with an optional callback job enqueued exactly once when
    the group's policy says so. The counters move in the transaction of each member's
    terminal transition (workflows.member_ended), under this row's lock."""

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(max_length=200, blank=True, default="")
    policy = models.CharField(max_length=16, choices=GroupPolicy.choices, default=GroupPolicy.SUCCESS)
    # A follow-up template (as on_success); ``callback_task``: it is a @task call, whose
    # kwargs get ``group`` instead of its payload.
    callback = models.JSONField(null=True, blank=True)
    callback_task = models.BooleanField(default=False)
    callback_job = models.ForeignKey(
        Job, null=True, blank=True, related_name="+", on_delete=models.SET_NULL, db_constraint=False
    )
    callback_error = models.TextField(blank=True, default="")
    # Set, with a conditional UPDATE under the row's lock, by the one member end that
    # decides the callback runs: a second decision (a member ending at the same instant,
    # a member cancelled by the first failure) finds it set and enqueues nothing.
    fired_at = models.DateTimeField(null=True, blank=True)
    total = models.PositiveIntegerField(default=0)
    completed = models.PositiveIntegerField(default=0)
    dead = models.PositiveIntegerField(default=0)
    cancelled = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)
    # When the last member ended; cleared when a requeued member re-opens the group.
    closed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]

    def __str__(self):
        return f"group {self.id} ({self.ended} of {self.total} ended)"

    @property
    def ended(self):
        return self.completed + self.dead + self.cancelled

    @property
    def status(self):
        """open while members are left, else succeeded or failed."""
        if self.closed_at is None:
            return "open"
        return "succeeded" if self.completed == self.total else "failed"


class Dependency(models.Model):
    """``job`` waits for ``upstream`` to end (depends_on)."""

    id = models.BigAutoField(primary_key=True)
    job = models.ForeignKey(Job, related_name="dependencies", on_delete=models.CASCADE)
    upstream = models.ForeignKey(Job, related_name="dependents", on_delete=models.CASCADE)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "upstream"], name="jq_dependency_unique")]

    def __str__(self):
        return f"{self.job_id} waits for {self.upstream_id}"


class DeadLetterQuerySet(models.QuerySet):
    def unresolved(self):
        return self.filter(resolved_at__isnull=True)


class DeadLetter(models.Model):
    """Why a job ran out of attempts. Kept after requeue (resolved_at set) as history."""

    id = models.BigAutoField(primary_key=True)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="dead_letters")
    kind = models.CharField(max_length=KIND_MAX_LENGTH)
    payload = models.JSONField(default=dict, blank=True)
    attempts = models.PositiveIntegerField()
    error = models.JSONField(null=True, blank=True)
    # "failed" (its attempts spent), "not_retryable", "poison" (MAX_CRASHES crashes), or
    # the kind's retry policy's "discarded: <type>" / "not in retry_on: <type>".
    # "undecryptable payload": no key in ENCRYPTION_KEYS opens it.
    reason = models.CharField(max_length=200, default="failed")
    created_at = models.DateTimeField(default=timezone.now)
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolution = models.CharField(max_length=32, blank=True, default="")

    objects = DeadLetterQuerySet.as_manager()

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["resolved_at", "created_at"], name="jq_dead_resolved")]

    def __str__(self):
        return f"dead letter #{self.id} for job #{self.job_id}"


class WorkerState(models.TextChoices):
    # Leasing and running jobs.
    RUNNING = "running"
    # Told to go quiet (a quiet request): no new leases, running what it holds, and
    # staying up (heartbeat, recovery) until told to stop, so a deploy can drain it first.
    QUIET = "quiet"
    # Told to stop (signal or stop request): no new leases, finishing claimed work.
    STOPPING = "stopping"
    # Exited cleanly and released what it held. A running worker whose heartbeat is
    # stale is shown as lost; that is derived, never stored.
    STOPPED = "stopped"


LOST = "lost"
# A worker's status (Worker.status) in display order, with its one-line meaning.
WORKER_STATUSES = {
    WorkerState.RUNNING: "leasing and running jobs, heartbeat fresh",
    WorkerState.QUIET: "leasing no more, running what it holds, up until told to stop",
    WorkerState.STOPPING: "finishing its claimed jobs, leasing no more",
    LOST: "not stopped, but silent for longer than a lease (LEASE_SECONDS): its leases have lapsed",
    WorkerState.STOPPED: "exited cleanly and released what it held",
}


def lost_before(now=None):
    """The heartbeat before which a worker that has not stopped is lost."""
    # LEASE_SECONDS rather than a stale limit of its own: a worker renews its leases
    # on each heartbeat, so one silent for a whole lease has let them lapse and any
    # worker may recover its jobs. Whatever its row says, it is no longer doing its
    # work, and a second knob could only make "lost" disagree with the leases.
    return (now or timezone.now()) - timedelta(seconds=float(settings.LEASE_SECONDS))


class WorkerQuerySet(models.QuerySet):
    def alive(self):
        """Workers that have not stopped (lost ones included)."""
        return self.exclude(state=WorkerState.STOPPED)

    def lost(self, now=None):
        """Workers not stopped whose heartbeat is older than LEASE_SECONDS."""
        return self.alive().filter(last_heartbeat__lt=lost_before(now))

    def live(self, now=None):
        """Workers not stopped whose heartbeat is fresh: running, quiet or stopping, not lost."""
        return self.alive().filter(last_heartbeat__gte=lost_before(now))

    def leasing(self, now=None):
        """Live workers that lease: running, neither quiet nor stopping."""
        return self.live(now).filter(state=WorkerState.RUNNING)

    def status(self, name, now=None):
        """Workers whose status (Worker.status) is ``name``; ValueError for another name."""
        if name == LOST:
            return self.lost(now)
        if name == WorkerState.STOPPED:
            return self.filter(state=WorkerState.STOPPED)
        if name in WorkerState.values:
            return self.live(now).filter(state=name)
        raise ValueError(f"unknown worker status {name!r}; choose one of {', '.join(WORKER_STATUSES)}")


class Worker(models.Model):
    """One runworker supervisor, as it registers itself; the registry behind `workers`."""

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(max_length=255, unique=True)
    host = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    queues = models.JSONField(default=list, blank=True)
    kinds = models.JSONField(default=list, blank=True)
    concurrency = models.PositiveIntegerField(default=1)
    threads = models.PositiveIntegerField(default=1)
    state = models.CharField(max_length=16, choices=WorkerState.choices, default=WorkerState.RUNNING)
    started_at = models.DateTimeField(default=timezone.now)
    last_heartbeat = models.DateTimeField(default=timezone.now)
    stopped_at = models.DateTimeField(null=True, blank=True)
    # Set by `stopworkers` (any host); the worker sees it on its next heartbeat.
    stop_requested_at = models.DateTimeField(null=True, blank=True)
    # Set by `stopworkers --quiet`, the dashboard or the API; seen where the stop request is.
    quiet_requested_at = models.DateTimeField(null=True, blank=True)
    jobs_in_hand = models.PositiveIntegerField(default=0)
    # {job id: thread number within its child} of the jobs its threads run, as the last
    # heartbeat saw them (Running now's thread column). Kept here, not on the job row:
    # which thread runs a job is the worker's business and changes with no event, and
    # the supervisor already reads it from the children's shared memory each heartbeat,
    # so recording it adds nothing to the claim or the start of a job.
    running_threads = models.JSONField(default=dict, blank=True)
    jobs_done = models.PositiveBigIntegerField(default=0)
    # Database outages this worker waited out (worker/outages.py): jobqueue_db_reconnects_total.
    db_reconnects = models.PositiveBigIntegerField(default=0)

    objects = WorkerQuerySet.as_manager()

    class Meta:
        ordering = ["-started_at", "-id"]
        indexes = [models.Index(fields=["state", "last_heartbeat"], name="jq_worker_state_hb")]

    def __str__(self):
        return f"{self.name} ({self.state})"

    @property
    def status(self):
        """running, quiet, stopping, stopped, or lost (see WORKER_STATUSES)."""
        if self.state != WorkerState.STOPPED and self.last_heartbeat < lost_before():
            return LOST
        return self.state


class EventCount(models.Model):
    """Events ever appended, per type: folded in by metrics.fold_events(), never recounted.

    Survives prune, so ``jobqueue_events_total`` is a true counter.
    """

    type = models.CharField(max_length=32, primary_key=True)
    count = models.BigIntegerField(default=0)

    def __str__(self):
        return f"{self.type}: {self.count}"


class JobCount(models.Model):
    """Jobs in one (state, kind, queue): folded from the event log with EventCount.

    Each event's from_state and to_state move one job between rows; deleting jobs
    (prune, the admin's delete) takes them out in its own transaction
    (metrics.forget_jobs), so a scrape reads these few rows, never the job table.
    ``manage.py metrics --verify`` recounts and reports drift.
    """

    state = models.CharField(max_length=16)
    kind = models.CharField(max_length=KIND_MAX_LENGTH)
    queue_name = models.CharField(max_length=QUEUE_NAME_MAX_LENGTH)
    count = models.BigIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["state", "kind", "queue_name"], name="jq_jobcount_key"),
        ]

    def __str__(self):
        return f"{self.state} {self.kind} {self.queue_name}: {self.count}"


class HistogramMetric(models.TextChoices):
    # Ready to claimed: how long a job waited for a worker (conf METRICS_WAIT_BUCKETS).
    WAIT = "wait"
    # Claimed to completed: one attempt's run time (conf METRICS_DURATION_BUCKETS).
    RUN = "run"


class JobHistogram(models.Model):
    """A histogram per kind and queue, folded in with EventCount."""

    metric = models.CharField(max_length=8, choices=HistogramMetric.choices)
    kind = models.CharField(max_length=KIND_MAX_LENGTH)
    queue_name = models.CharField(max_length=QUEUE_NAME_MAX_LENGTH)
    # Counts per bucket bound in settings, then +Inf (not cumulative).
    buckets = models.JSONField(default=list)
    count = models.BigIntegerField(default=0)
    sum = models.FloatField(default=0.0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["metric", "kind", "queue_name"], name="jq_histogram_key"),
        ]

    def __str__(self):
        return f"{self.metric} {self.kind} {self.queue_name}: {self.count}"


class FlowSpan(models.TextChoices):
    # One minute: the queues page's windows up to an hour (kept two hours).
    MINUTE = "m"
    # One hour: its 24-hour and 7-day windows (kept eight days).
    HOUR = "h"


class FlowBucket(models.Model):
    """One queue and kind's flow in one minute or one hour, folded from the event log
    with EventCount (ops/flow_rollup.py): jobs enqueued, attempts completed and failed,
    and sketches of the waits (due to claimed) and run times (claimed to completed) that
    began and ended in it. The queues page reads these rows, a few per bucket of its
    window, never the events."""

    span = models.CharField(max_length=1, choices=FlowSpan.choices)
    start = models.DateTimeField()
    queue_name = models.CharField(max_length=QUEUE_NAME_MAX_LENGTH)
    kind = models.CharField(max_length=KIND_MAX_LENGTH)
    enqueued = models.BigIntegerField(default=0)
    completed = models.BigIntegerField(default=0)
    failed = models.BigIntegerField(default=0)
    # {sketch index: count} (flow_rollup.index): log-scale buckets, a tenth apart.
    waits = models.JSONField(default=dict, blank=True)
    runs = models.JSONField(default=dict, blank=True)

    class Meta:
        constraints = [
            # Also the index a window's read and the retention's delete seek on.
            models.UniqueConstraint(fields=["span", "start", "queue_name", "kind"], name="jq_flow_key"),
        ]

    def __str__(self):
        return f"{self.queue_name} {self.kind} {self.span}{self.start:%Y-%m-%d %H:%M}"


class MetricsCheckpoint(models.Model):
    """One row (id=1): how far the event log has been folded into EventCount.

    ``gaps`` holds ids below the checkpoint that were missing when it passed them (a
    transaction that took the id had not committed yet, or rolled back), with when
    they were first seen, so a late commit is still counted; see metrics.py.
    """

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    last_event_id = models.BigIntegerField(default=0)
    gaps = models.JSONField(default=dict, blank=True)
    folded_at = models.DateTimeField(null=True, blank=True)
    # JobCount holds the events up to this id as a recount (None: not counted yet, the
    # next fold recounts); later events move jobs between its rows.
    counts_from = models.BigIntegerField(null=True, blank=True)
    # FlowBucket holds the events folded from about this time on (None: no fold with it
    # yet); the queues page says so for a window that starts earlier.
    flow_since = models.DateTimeField(null=True, blank=True)

    def __str__(self):
        return f"events folded up to #{self.last_event_id}"


class ApiKey(models.Model):
    """A key for scripts calling the JSON API. Only a SHA-256 of the key is stored."""

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(max_length=100, unique=True)
    # The first characters of the key, to tell keys apart in the admin; not secret.
    prefix = models.CharField(max_length=12)
    hashed_key = models.CharField(max_length=64, unique=True)
    # Its scopes. Reads are always allowed to a live key; enqueuing needs can_write;
    # cancelling, requeuing, replaying, pausing and resuming need can_operate; shell jobs
    # (a command run on a worker) need can_run_shell as well.
    can_write = models.BooleanField(default=True)
    can_operate = models.BooleanField(default=True)
    can_run_shell = models.BooleanField(default=False)
    # Sees payloads, results, errors and output as stored instead of redacted.
    can_see_unredacted = models.BooleanField(default=False)
    # After this the key is refused, as a revoked one is; empty: it does not expire.
    expires_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return f"{self.name} ({self.prefix}…)"

    @property
    def scopes(self):
        """Its scopes as words: read, write, operate, shell, unredacted."""
        flags = (
            ("write", self.can_write),
            ("operate", self.can_operate),
            ("shell", self.can_run_shell),
            ("unredacted", self.can_see_unredacted),
        )
        return ["read", *(name for name, on in flags if on)]


class PauseScope(models.TextChoices):
    QUEUE = "queue"
    KIND = "kind"


class PauseQuerySet(models.QuerySet):
    def is_paused(self, queue_name, kind):
        """Whether a job of ``kind`` on ``queue_name`` is held by a pause."""
        return self.filter(
            Q(scope=PauseScope.QUEUE, name=queue_name) | Q(scope=PauseScope.KIND, name=kind)
        ).exists()


class Pause(models.Model):
    """A paused queue or kind: its pending jobs stay pending and no claim leases them."""

    id = models.BigAutoField(primary_key=True)
    scope = models.CharField(max_length=8, choices=PauseScope.choices)
    name = models.CharField(max_length=KIND_MAX_LENGTH)
    created_at = models.DateTimeField(default=timezone.now)
    actor = models.CharField(max_length=255, blank=True, default="")
    reason = models.TextField(blank=True, default="")

    objects = PauseQuerySet.as_manager()

    class Meta:
        ordering = ["scope", "name"]
        constraints = [models.UniqueConstraint(fields=["scope", "name"], name="jq_pause_scope_name")]

    def __str__(self):
        return f"{self.scope} {self.name} (paused)"


class KindLimit(models.Model):
    """Flow control for one kind, cluster-wide (see flow.py): at most ``concurrency``
    leased at once, at most ``per_key`` leased at once per job ``concurrency_key``, at
    most ``rate_limit`` starts per ``rate_period`` seconds. With ``fair``, the kind's
    concurrency keys (tenants) are leased round-robin (flow.py, Fair share).

    The row is also the lock that claims of this kind take; ``window_start`` and
    ``window_count`` are the current rate window, and ``fair_after`` the tenant a fair
    claim served last, all written under that lock.
    """

    kind = models.CharField(max_length=KIND_MAX_LENGTH, primary_key=True)
    concurrency = models.PositiveIntegerField(null=True, blank=True, help_text="Empty: no limit.")
    rate_limit = models.PositiveIntegerField(
        null=True, blank=True, help_text="Starts per period; empty: no limit."
    )
    per_key = models.PositiveIntegerField(
        null=True, blank=True, help_text="Leased at once per concurrency key; empty: no limit."
    )
    rate_period = models.FloatField(default=60.0, help_text="Seconds.")
    window_start = models.DateTimeField(null=True, blank=True)
    window_count = models.PositiveIntegerField(default=0)
    fair = models.BooleanField(
        default=False, help_text="Lease the kind's concurrency keys (tenants) round-robin."
    )
    # Where the fair round-robin resumes: None, at the start of the cycle (the jobs
    # without a key, then the keys in order); "", just after the keyless jobs; a key,
    # just after that key. Keys are never empty (validation.concurrency_key).
    fair_after = models.CharField(max_length=CONCURRENCY_KEY_MAX_LENGTH, null=True, blank=True)
    fair_weights = models.JSONField(
        default=dict,
        blank=True,
        help_text='Fair share: {"key": N} leases N of that key\'s jobs per round; others 1.',
    )
    from_settings = models.BooleanField(default=False)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["kind"]

    def __str__(self):
        return f"limit {self.kind}"


class MissedTicks(models.TextChoices):
    # After downtime, the missed ticks of a schedule run once (the latest of them).
    RUN_ONCE = "run_once"
    # After downtime, missed ticks are dropped; the next tick runs on time.
    SKIP = "skip"


class Schedule(models.Model):
    """A cron schedule: ``scheduling.tick()`` enqueues one job per due tick."""

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(max_length=100, unique=True)
    cron = models.CharField(
        max_length=200, help_text="Cron expression, e.g. '*/5 * * * *' (croniter; 6 fields = seconds)."
    )
    kind = models.CharField(max_length=KIND_MAX_LENGTH)
    payload = models.JSONField(default=dict, blank=True)
    queue_name = models.CharField(max_length=QUEUE_NAME_MAX_LENGTH, default="default")
    priority = models.SmallIntegerField(default=0)
    # Defined before the ``timezone`` field, which shadows the module in this class body.
    created_at = models.DateTimeField(default=timezone.now)
    timezone = models.CharField(max_length=64, default="UTC")
    enabled = models.BooleanField(default=True)
    # Empty: the setting SCHEDULE_MISSED_TICKS.
    missed_ticks = models.CharField(max_length=16, choices=MissedTicks.choices, blank=True, default="")
    # The latest tick enqueued; the next one is computed from it.
    last_tick = models.DateTimeField(null=True, blank=True)
    from_settings = models.BooleanField(default=False)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return f"{self.name} ({self.cron})"


class RuntimeSetting(models.Model):
    """A setting an operator changed while the queue runs (core/runtime.py): it overrides
    JOBQUEUE's value in every process within RUNTIME_SETTINGS_TTL seconds."""

    # The JOBQUEUE name, e.g. "LEASE_SECONDS" (conf.RUNTIME lists those allowed).
    name = models.CharField(max_length=64, primary_key=True)
    value = models.JSONField()
    updated_at = models.DateTimeField(default=timezone.now)
    updated_by = models.CharField(max_length=150, blank=True, default="")

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return f"{self.name} = {self.value!r}"


class SettingChange(models.Model):
    """One change of a runtime setting, kept as its audit trail: who, when, old -> new
    (None: JOBQUEUE's value was in force, before a set or after an unset)."""

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(max_length=64)
    old = models.JSONField(null=True, blank=True)
    new = models.JSONField(null=True, blank=True)
    actor = models.CharField(max_length=150, blank=True, default="")
    at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["name", "-at"], name="queue_setting_change_name")]

    def __str__(self):
        return f"{self.name}: {self.old!r} -> {self.new!r}"


class KindCrashes(models.Model):
    """Per kind, the attempts whose worker process died or was killed for its timeout,
    and the jobs quarantined for it as "poison" (MAX_CRASHES): counted by the failing
    edge (transitions.fail, crashed=True) in its transaction, so the dashboard and
    /metrics read one small table, and pruning the jobs does not lower the totals."""

    kind = models.CharField(max_length=KIND_MAX_LENGTH, primary_key=True)
    crashes = models.BigIntegerField(default=0)
    poisoned = models.BigIntegerField(default=0)
    last_crash_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["kind"]
        verbose_name_plural = "kind crashes"

    def __str__(self):
        return f"{self.kind}: {self.crashes} crash(es), {self.poisoned} poisoned"

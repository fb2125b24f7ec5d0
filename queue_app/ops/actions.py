"""What an operator does to jobs from the admin, the dashboard or the CLI: one job, or
every job a filter matches, in batches (``apply_many``, the one bulk path: the admin's
"every job matching the filter" actions and `manage.py requeue --all-matching` alike).

Each job goes through its edge in ``transitions`` (so each writes its own event);
deleting a job removes its history with it and so writes none. Parameters are
validated before the first job is touched: a bad priority or payload writes nothing.
"""

import json
import logging
import time
from dataclasses import dataclass, field

from django.db import router, transaction
from django.utils import timezone

from queue_app.conf import settings
from queue_app.core import aborting, transitions, validation
from queue_app.exceptions import InvalidJob, InvalidTransition, JobNotFound
from queue_app.models import Job, Schedule, State, Worker
from queue_app.ops import metrics, redaction
from queue_app.worker import schedules as scheduling

log = logging.getLogger("queue_app")


@dataclass(frozen=True)
class Action:
    name: str
    label: str
    # Jobs in other states are skipped before any lock is taken.
    states: frozenset
    # The Django permission the operator needs ("change" or "delete" on Job).
    permission: str = "change"
    # The parameter the action takes from a form: "priority", "payload" or None.
    param: str | None = None
    # A parameter the action may take but no form asks for (the CLI's --max-attempts).
    option: str | None = None


ACTIONS = {
    a.name: a
    for a in [
        Action(
            "requeue",
            "Requeue",
            frozenset({State.DEAD_LETTER, State.CANCELLED, State.WAITING}),
            option="max_attempts",
        ),
        Action("retry_now", "Retry now", frozenset({State.PENDING})),
        Action("cancel", "Cancel", frozenset({State.PENDING, State.LEASED, State.WAITING})),
        Action(
            "change_priority",
            "Change priority",
            frozenset({State.PENDING, State.DEAD_LETTER}),
            param="priority",
        ),
        Action(
            "edit_payload", "Edit payload", frozenset({State.PENDING, State.DEAD_LETTER}), param="payload"
        ),
        Action("delete", "Delete", frozenset(State.values), permission="delete"),
    ]
}


@dataclass
class Outcome:
    done: int = 0
    skipped: int = 0
    # True when the time budget ran out with matching jobs left; running again continues.
    more: bool = False
    errors: list = field(default_factory=list)


def get(name):
    try:
        return ACTIONS[name]
    except KeyError:
        raise InvalidJob(f"unknown action {name!r}; choose one of {', '.join(ACTIONS)}", "action") from None


def clean(action, value):
    """Validate an action's parameter; raise InvalidJob with what to fix."""
    if action.param == "priority":
        if isinstance(value, str):
            try:
                value = int(value.strip())
            except ValueError:
                raise InvalidJob(f"priority must be a whole number, got {value!r}", "priority") from None
        return validation.priority(value)
    if action.param == "payload":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError as exc:
                raise InvalidJob(f"payload is not valid JSON: {exc}", "payload") from None
        return validation.payload(value)
    if action.option == "max_attempts" and value is not None:
        return validation.max_attempts(value)
    return None


def _run(action, job_id, value, actor, using):
    if action.name == "requeue":
        transitions.requeue(job_id, max_attempts=value, actor=actor, using=using)
    elif action.name == "retry_now":
        transitions.retry_now(job_id, actor=actor, using=using)
    elif action.name == "cancel":
        # A running job is asked to abort; it ends cancelled when its worker stops it.
        aborting.cancel(job_id, actor=actor, reason=f"cancelled by {actor}", using=using)
    elif action.name == "change_priority":
        transitions.change_priority(job_id, value, actor=actor, using=using)
    elif action.name == "edit_payload":
        transitions.change_payload(job_id, value, actor=actor, using=using)
    elif action.name == "delete" and not _delete([job_id], actor, using):
        raise JobNotFound(job_id)


def _delete(job_ids, actor, using):
    """Delete jobs with their history; return the set of ids that were still there."""
    with transaction.atomic(using=using):
        found = list(
            Job.objects.using(using).filter(id__in=job_ids).select_for_update().values_list("id", flat=True)
        )
        # The maintained counts lose them in the same transaction (their events go with them).
        metrics.forget_jobs(found, using=using)
        Job.objects.using(using).filter(id__in=found).delete()
    for job_id in found:
        log.info("deleted id=%s by=%s", job_id, actor)
    return set(found)


# Actions that would run a shell job's command again, or an edited one: they need
# validation.SHELL_PERMISSION on top of change_job (callers say whether the user has it).
SHELL_GUARDED = ("requeue", "edit_payload")


def _shell_refused(action):
    return InvalidJob(
        f"{action.label.lower()} of a shell job needs the {validation.SHELL_PERMISSION} permission", "kind"
    )


# A payload shown redacted would be saved with its [redacted] markers in place of the
# secrets: only a caller who sees it whole may edit it.
PAYLOAD_REFUSAL = f"editing a payload needs the {redaction.PERMISSION} permission (it is shown redacted)"


def apply(name, job_id, value=None, *, actor="", may_run_shell=True, may_edit_payload=True, using=None):
    """Apply one action to one job; raise InvalidJob, InvalidTransition or JobNotFound."""
    action = get(name)
    if name == "edit_payload" and not may_edit_payload:
        raise InvalidJob(PAYLOAD_REFUSAL, "payload")
    value = clean(action, value)
    db = using or router.db_for_write(Job)
    guarded = name in SHELL_GUARDED and not may_run_shell
    if guarded and Job.objects.using(db).filter(id=job_id, kind=validation.SHELL_KIND).exists():
        raise _shell_refused(action)
    _run(action, job_id, value, actor, db)


def summary(action, outcome):
    """(what a batched action did, in one sentence; whether it all went through), for the
    admin's and the dashboard's message."""
    text = f"{action.label}: {outcome.done} job{'s' if outcome.done != 1 else ''} done"
    if outcome.skipped:
        text += f", {outcome.skipped} skipped (their state no longer allows it: {'; '.join(outcome.errors)})"
    if outcome.more:
        text += ". Time budget reached: run the same action again to continue with the rest"
    return text + ".", not (outcome.more or outcome.skipped)


def _noop(n):
    pass


def apply_many(
    name,
    queryset,
    value=None,
    *,
    actor="",
    may_run_shell=True,
    may_edit_payload=True,
    batch_size=None,
    seconds=None,
    progress=_noop,
):
    """Apply an action to every job in ``queryset``, a batch per transaction, until done
    or the time budget is spent (``seconds``, default OPS_ACTION_SECONDS; ``math.inf``
    for none). Jobs that changed state meanwhile are skipped, and so are shell jobs
    (SHELL_GUARDED) for a caller without ``may_run_shell``. ``progress(n)`` is called
    after each batch with the number of jobs it handled."""
    action = get(name)
    if name == "edit_payload" and not may_edit_payload:
        raise InvalidJob(PAYLOAD_REFUSAL, "payload")
    value = clean(action, value)
    out = Outcome()
    if name in SHELL_GUARDED and not may_run_shell:
        shell = queryset.filter(state__in=action.states, kind=validation.SHELL_KIND)
        out.skipped = shell.count()
        if out.skipped:
            out.errors.append(str(_shell_refused(action)))
        queryset = queryset.exclude(kind=validation.SHELL_KIND)
    batch_size = batch_size or settings.OPS_BATCH_SIZE
    deadline = time.monotonic() + (settings.OPS_ACTION_SECONDS if seconds is None else seconds)
    db = queryset.db
    # Keyset over id: each batch is one index range, however large the match.
    ids_qs = queryset.filter(state__in=action.states).order_by("id").values_list("id", flat=True)
    last = 0
    while True:
        ids = batch = list(ids_qs.filter(id__gt=last)[:batch_size])
        if not ids:
            return out
        # One transaction per batch: locks are held for one batch only; each edge
        # runs in its own savepoint so one refusal does not undo the others.
        with transaction.atomic(using=db):
            if action.name == "delete":
                # One lock, fold and DELETE for the batch (a job gone meanwhile is skipped).
                deleted = _delete(ids, actor, db)
                out.done += len(deleted)
                gone = [job_id for job_id in ids if job_id not in deleted]
                out.skipped += len(gone)
                out.errors += [str(JobNotFound(job_id)) for job_id in gone][: max(5 - len(out.errors), 0)]
                ids = []
            for job_id in ids:
                try:
                    with transaction.atomic(using=db):
                        _run(action, job_id, value, actor, db)
                    out.done += 1
                except (InvalidTransition, JobNotFound) as exc:
                    out.skipped += 1
                    if len(out.errors) < 5:
                        out.errors.append(str(exc))
        progress(len(batch))
        last = batch[-1]
        if time.monotonic() > deadline:
            out.more = ids_qs.filter(id__gt=last).exists()
            return out


def set_schedule_enabled(name, enabled, *, using=None):
    """Turn cron schedule ``name`` on or off (schedules.set_enabled)."""
    return scheduling.set_enabled(name, enabled, using=using or router.db_for_write(Schedule))


def run_schedule_now(name, *, may_run_shell=True, using=None):
    """Enqueue one job of cron schedule ``name`` now (schedules.run_now); a shell
    schedule needs ``may_run_shell`` as requeuing a shell job does."""
    using = using or router.db_for_write(Job)
    kind = Schedule.objects.using(using).filter(name=name).values_list("kind", flat=True).first()
    if kind == validation.SHELL_KIND and not may_run_shell:
        raise InvalidJob(
            f"running a shell schedule needs the {validation.SHELL_PERMISSION} permission", "kind"
        )
    return scheduling.run_now(name, using=using)


def request_stop(worker_ids, *, using=None):
    """Ask running workers to stop; each sees it on its next heartbeat. Return how many."""
    qs = Worker.objects.using(using or router.db_for_write(Worker)).alive()
    return qs.filter(id__in=list(worker_ids), stop_requested_at__isnull=True).update(
        stop_requested_at=timezone.now()
    )


def request_quiet(worker_ids, *, using=None):
    """Ask running workers to go quiet: they lease no more and run what they hold, and stay
    up until stopped; each sees it on its next stop check. Return how many were asked."""
    qs = Worker.objects.using(using or router.db_for_write(Worker)).alive()
    return qs.filter(
        id__in=list(worker_ids), stop_requested_at__isnull=True, quiet_requested_at__isnull=True
    ).update(quiet_requested_at=timezone.now())

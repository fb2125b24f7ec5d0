"""The dashboard: server-rendered pages over ``queue_app.ops.reads`` (what they show,
laid out by ``queue_app.ops.dashboard``) and ``queue_app.ops.actions`` (actions). Staff only; reading needs view permission on
jobs, acting needs change (or delete) permission.

A page asked with ``?partial=1`` returns only its live region, which the page's
script fetches every few seconds and swaps in; without script the page is whole.
"""

from functools import wraps
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from queue_app.conf import settings
from queue_app.core import flow
from queue_app.core.validation import SHELL_PERMISSION
from queue_app.exceptions import InvalidJob, InvalidTransition, JobNotFound
from queue_app.models import Job, State
from queue_app.ops import actions as operations
from queue_app.ops import dashboard, reads, redaction, workflows
from queue_app.ops import why as explain


def _perm(codename):
    def decorate(view):
        @staff_member_required
        @wraps(view)
        def wrapped(request, *args, **kwargs):
            if not request.user.has_perm(codename):
                raise PermissionDenied(f"needs {codename}")
            return view(request, *args, **kwargs)

        return wrapped

    return decorate


def _unredacted(request):
    return request.user.has_perm(redaction.PERMISSION)


def _page(request, template, context, *, live=True):
    context.update(
        unredacted=_unredacted(request),
        refresh_seconds=settings.DASHBOARD_REFRESH_SECONDS if live else 0,
        can_change=request.user.has_perm("queue_app.change_job"),
        can_delete=request.user.has_perm("queue_app.delete_job"),
    )
    if live and request.GET.get("partial"):
        return render(request, f"queue_app/partials/{template}", context)
    return render(request, f"queue_app/{template}", context)


def _cursor(request):
    return reads.as_id(request.GET.get("before", ""))


@_perm("queue_app.view_job")
def overview(request):
    return _page(
        request, "overview.html", {"nav": "overview", **dashboard.overview(unredacted=_unredacted(request))}
    )


# What the jobs list's bulk form offers, over a selection or the whole filter.
BULK_ACTIONS = ("requeue", "retry_now", "cancel", "delete")
FILTER_KEYS = ("status", "kind", "queue", "q", "text", "schedule")


@require_POST
@_perm("queue_app.view_job")
def bulk(request):
    """A bulk action from the jobs list: first a page restating the filter (or the
    selection) and the count, then, confirmed, the action in batches (apply_many)."""
    filters = {k: request.POST.get(f"f_{k}", "").strip() for k in FILTER_KEYS}
    query = urlencode({k: v for k, v in filters.items() if v})
    back = redirect(reverse("queue_app_dashboard:jobs") + (f"?{query}" if query else ""))
    name, scope = request.POST.get("action", ""), request.POST.get("scope", "")
    if name not in BULK_ACTIONS or scope not in ("selected", "matching"):
        messages.error(
            request, "Refused: choose a bulk action and whether it is for the selection or the filter."
        )
        return back
    chosen = operations.get(name)
    if not request.user.has_perm(f"queue_app.{chosen.permission}_job"):
        raise PermissionDenied(f"needs queue_app.{chosen.permission}_job")
    ids = []
    if scope == "matching":
        if not any(filters.values()):
            messages.error(
                request,
                f"{chosen.label} refused: no filter is set, so it would be every job. "
                "Filter the list first, or select the jobs. Nothing was changed.",
            )
            return back
        narrow = {k: filters[k] for k in ("kind", "queue", "q", "text", "schedule")}
        try:
            wanted = reads.Filters(state=filters["status"] or None, unredacted=_unredacted(request), **narrow)
        except InvalidJob as exc:
            messages.error(request, f"{chosen.label} refused: {exc}. Nothing was changed.")
            return back
        qs = wanted.apply(Job.objects.all())
    else:
        ids = sorted({i for i in map(reads.as_id, request.POST.getlist("ids")) if i is not None})
        if not ids:
            messages.error(request, f"{chosen.label} refused: no job is selected. Nothing was changed.")
            return back
        qs = Job.objects.filter(id__in=ids)
    if request.POST.get("confirm") != "yes":
        cap = settings.OPS_COUNT_CAP
        count = qs.filter(state__in=chosen.states).order_by()[: cap + 1].count()
        context = {
            "nav": "jobs",
            "action": chosen,
            "scope": scope,
            "filters": filters,
            "ids": ids,
            "count": count,
            "capped": count > cap,
            "query": query,
        }
        return _page(request, "bulk_confirm.html", context, live=False)
    outcome = operations.apply_many(
        name,
        qs,
        actor=f"admin:{request.user.get_username()}",
        may_run_shell=request.user.has_perm(SHELL_PERMISSION),
        may_edit_payload=_unredacted(request),
    )
    text, clean = operations.summary(chosen, outcome)
    (messages.success if clean else messages.warning)(request, text)
    return back


@_perm("queue_app.view_job")
def jobs(request):
    filters = {
        k: request.GET.get(k, "").strip() for k in ("status", "kind", "queue", "q", "text", "schedule")
    }
    narrow = {k: filters[k] for k in ("kind", "queue", "q", "text", "schedule")}
    narrow["unredacted"] = _unredacted(request)
    try:
        chosen = reads.Filters(state=filters["status"] or None, **narrow)
    except InvalidJob as exc:
        messages.error(request, f"{exc}; showing every status.")
        filters["status"] = ""
        chosen = reads.Filters(**narrow)
    page = reads.job_page(chosen, before=_cursor(request), unredacted=_unredacted(request))
    query = urlencode({k: v for k, v in filters.items() if v})
    context = {
        "nav": "jobs",
        "page": page,
        "filters": filters,
        "query": query,
        "statuses": dashboard.status_choices(),
        "bulk_actions": [
            operations.get(n)
            for n in BULK_ACTIONS
            if request.user.has_perm(f"queue_app.{operations.get(n).permission}_job")
        ],
        **reads.filter_choices(),
    }
    return _page(request, "jobs.html", context)


def _job_page(request, job_id, *, payload_draft=None, status=200):
    found = reads.job_detail(job_id, unredacted=_unredacted(request))
    if found is None:
        raise Http404(f"job {job_id} does not exist")
    entries = dashboard.timeline(found["events"])
    context = {
        "nav": "jobs",
        **found,
        "status": found["job"].status,
        "actions": operations.ACTIONS,
        "timeline": entries,
        "timing": dashboard.job_timing(found["job"], entries),
        "effective_priority": dashboard.effective_priority(found["job"]),
        "payload_draft": payload_draft,
        "why": explain.why(found["job"]) if found["job"].state in (State.PENDING, State.WAITING) else None,
    }
    response = _page(request, "job.html", context)
    response.status_code = status
    return response


@_perm("queue_app.view_job")
def job(request, job_id):
    return _job_page(request, job_id)


@require_POST
@_perm("queue_app.view_job")
def job_action(request, job_id, action):
    try:
        chosen = operations.get(action)
    except InvalidJob:
        raise Http404(f"no action {action!r}") from None
    if not request.user.has_perm(f"queue_app.{chosen.permission}_job"):
        raise PermissionDenied(f"needs queue_app.{chosen.permission}_job")
    value = request.POST.get(chosen.param) if chosen.param else None
    try:
        operations.apply(
            action,
            job_id,
            value,
            actor=f"admin:{request.user.get_username()}",
            may_run_shell=request.user.has_perm(SHELL_PERMISSION),
            may_edit_payload=_unredacted(request),
        )
    except (InvalidJob, InvalidTransition) as exc:
        messages.error(request, f"{chosen.label} refused: {exc}")
        if action == "edit_payload":
            # Shown again with what was typed, to fix rather than retype.
            return _job_page(request, job_id, payload_draft=value or "", status=400)
        return redirect("queue_app_dashboard:job", job_id=job_id)
    except JobNotFound as exc:
        raise Http404(str(exc)) from None
    messages.success(request, f"{chosen.label}: job {job_id} done.")
    if action == "delete":
        return redirect("queue_app_dashboard:jobs")
    return redirect("queue_app_dashboard:job", job_id=job_id)


@_perm("queue_app.view_deadletter")
def dead_letters(request):
    resolved = request.GET.get("resolved") == "1"
    kind, error_type = request.GET.get("kind", "").strip(), request.GET.get("error", "").strip()
    page = reads.dead_letter_page(
        resolved=resolved,
        kind=kind,
        error_type=error_type,
        before=_cursor(request),
        unredacted=_unredacted(request),
    )
    chosen = {"resolved": "1" if resolved else "", "kind": kind, "error": error_type}
    context = {
        "nav": "dead",
        "page": page,
        "resolved": resolved,
        "kind": kind,
        "error_type": error_type,
        "groups": reads.dead_letter_groups(resolved=resolved, kind=kind),
        "query": urlencode({k: v for k, v in chosen.items() if v}),
    }
    return _page(request, "dead_letters.html", context)


@_perm("queue_app.view_job")
def running(request):
    worker = request.GET.get("worker", "").strip()
    context = {"nav": "running", "rows": dashboard.running(worker=worker or None), "worker": worker}
    return _page(request, "running.html", context)


@_perm("queue_app.view_worker")
def workers(request):
    return _page(request, "workers.html", {"nav": "workers", "workers": dashboard.workers()})


def _ask_worker(request, worker_id, template, ask, asked, refused):
    """GET: the confirmation page for one running worker; POST (from it): ``ask`` it."""
    if request.method == "GET":
        worker = reads.worker_rows(include_stopped=False, ids=[worker_id])
        if not worker:
            messages.error(request, "That worker is not running.")
            return redirect("queue_app_dashboard:workers")
        return _page(request, template, {"nav": "workers", "worker": worker[0]}, live=False)
    messages.success(request, asked if ask([worker_id]) else refused)
    return redirect(reverse("queue_app_dashboard:workers"))


@require_http_methods(["GET", "POST"])
@_perm("queue_app.change_worker")
def worker_stop(request, worker_id):
    return _ask_worker(
        request,
        worker_id,
        "worker_stop.html",
        operations.request_stop,
        "Stop requested.",
        "That worker is not running or was already told to stop.",
    )


@require_http_methods(["GET", "POST"])
@_perm("queue_app.change_worker")
def worker_quiet(request, worker_id):
    return _ask_worker(
        request,
        worker_id,
        "worker_quiet.html",
        operations.request_quiet,
        "Quiet requested.",
        "That worker is not running, or was already told to go quiet or stop.",
    )


@_perm("queue_app.view_job")
def queues(request):
    window = request.GET.get("window", "") or reads.FLOW_WINDOW_DEFAULT
    if window not in reads.FLOW_WINDOWS:
        messages.error(request, f"Unknown window {window!r}; showing {reads.FLOW_WINDOW_DEFAULT}.")
        window = reads.FLOW_WINDOW_DEFAULT
    limits = dashboard.limits()
    context = {
        "nav": "queues",
        **dashboard.queues(window=window, limits=limits),
        "limits": limits,
        "crashes": dashboard.crashes(),
    }
    return _page(request, "queues.html", context)


def _pause_target(request):
    """The queue or kind a Pause/Resume button names, as flow.pause/resume take it."""
    return {scope: request.POST[scope] for scope in ("queue", "kind") if scope in request.POST}


@require_POST
@_perm("queue_app.add_pause")
def pause(request):
    try:
        paused, created = flow.pause(**_pause_target(request), actor=f"admin:{request.user.get_username()}")
    except InvalidJob as exc:
        messages.error(request, f"Pause refused: {exc}")
    else:
        what = f"{paused.scope} {paused.name}"
        messages.success(request, f"Paused {what}." if created else f"{what} was already paused.")
    return redirect("queue_app_dashboard:queues")


@require_POST
@_perm("queue_app.delete_pause")
def resume(request):
    target = _pause_target(request)
    try:
        resumed = flow.resume(**target)
    except InvalidJob as exc:
        messages.error(request, f"Resume refused: {exc}")
    else:
        what = " ".join(f"{k} {v}" for k, v in target.items())
        messages.success(request, f"Resumed {what}." if resumed else f"{what} was not paused.")
    return redirect("queue_app_dashboard:queues")


@_perm("queue_app.view_schedule")
def schedules(request):
    return _page(request, "schedules.html", {"nav": "schedules", "rows": dashboard.schedules()})


@require_POST
@_perm("queue_app.view_schedule")
def schedule_run_now(request, name):
    if not request.user.has_perm("queue_app.add_job"):
        raise PermissionDenied("needs queue_app.add_job")
    try:
        job = operations.run_schedule_now(name, may_run_shell=request.user.has_perm(SHELL_PERMISSION))
    except InvalidJob as exc:
        messages.error(request, f"Run now refused: {exc}")
        return redirect("queue_app_dashboard:schedules")
    messages.success(request, f"Schedule {name}: job {job.id} enqueued to run now.")
    return redirect("queue_app_dashboard:job", job_id=job.id)


@_perm("queue_app.view_job")
def workflow(request, job_id):
    """A job's workflow: its dependency graph drawn, and its group's progress."""
    found = workflows.dependencies(job_id)
    if found is None:
        raise Http404(f"job {job_id} does not exist")
    context = {
        "nav": "jobs",
        "job": found,
        "graph": workflows.graph(job_id),
        "group": workflows.group(found["group"]) if found["group"] is not None else None,
    }
    return _page(request, "workflow.html", context, live=False)


@require_POST
@_perm("queue_app.change_schedule")
def schedule_enable(request, name):
    enabled = request.POST.get("enabled") == "1"
    try:
        operations.set_schedule_enabled(name, enabled)
    except InvalidJob as exc:
        messages.error(request, f"Refused: {exc}")
    else:
        messages.success(request, f"Schedule {name} {'enabled' if enabled else 'disabled'}.")
    return redirect("queue_app_dashboard:schedules")

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
from django.views.decorators.http import require_POST

from queue_app.conf import settings
from queue_app.core.validation import SHELL_PERMISSION
from queue_app.exceptions import InvalidJob, InvalidTransition, JobNotFound
from queue_app.ops import actions as operations
from queue_app.ops import dashboard, reads, workflows


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


def _page(request, template, context, *, live=True):
    context.update(
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
    return _page(request, "overview.html", {"nav": "overview", **dashboard.overview()})


@_perm("queue_app.view_job")
def jobs(request):
    filters = {k: request.GET.get(k, "").strip() for k in ("status", "kind", "queue", "q")}
    try:
        chosen = reads.Filters(
            state=filters["status"] or None, kind=filters["kind"], queue=filters["queue"], q=filters["q"]
        )
    except InvalidJob as exc:
        messages.error(request, f"{exc}; showing every status.")
        filters["status"] = ""
        chosen = reads.Filters(kind=filters["kind"], queue=filters["queue"], q=filters["q"])
    page = reads.job_page(chosen, before=_cursor(request))
    query = urlencode({k: v for k, v in filters.items() if v})
    context = {
        "nav": "jobs",
        "page": page,
        "filters": filters,
        "query": query,
        "statuses": dashboard.status_choices(),
        **reads.filter_choices(),
    }
    return _page(request, "jobs.html", context)


@_perm("queue_app.view_job")
def job(request, job_id):
    found = reads.job_detail(job_id)
    if found is None:
        raise Http404(f"job {job_id} does not exist")
    context = {
        "nav": "jobs",
        **found,
        "status": found["job"].status,
        "actions": operations.ACTIONS,
    }
    context["effective_priority"] = dashboard.effective_priority(found["job"])
    return _page(request, "job.html", context, live=False)


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
        )
    except (InvalidJob, InvalidTransition) as exc:
        messages.error(request, f"{chosen.label} refused: {exc}")
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
    page = reads.dead_letter_page(resolved=resolved, before=_cursor(request))
    return _page(request, "dead_letters.html", {"nav": "dead", "page": page, "resolved": resolved})


@_perm("queue_app.view_worker")
def workers(request):
    return _page(request, "workers.html", {"nav": "workers", "workers": dashboard.workers()})


@require_POST
@_perm("queue_app.change_worker")
def worker_stop(request, worker_id):
    n = operations.request_stop([worker_id])
    messages.success(
        request, "Stop requested." if n else "That worker is not running or was already told to stop."
    )
    return redirect(reverse("queue_app_dashboard:workers"))


@_perm("queue_app.view_job")
def queues(request):
    return _page(request, "queues.html", {"nav": "queues", "rows": reads.queues()})


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

"""What operators read about workflows: a group's progress, a job's dependencies.
(canvas.py builds them; core/workflows.py keeps their counts.)"""

from queue_app.models import Dependency, Job, JobGroup, attach_statuses


def _member(job):
    return {"id": job.id, "kind": job.kind, "state": job.state, "status": job.status}


def group(group_id, *, members=True):
    """A group's progress {id, name, policy, status, total, completed, dead_letter,
    cancelled, ended, callback, callback_job, ..., members [{id, kind, state, status}]},
    or None if there is no such group."""
    g = JobGroup.objects.filter(id=group_id).first()
    if g is None:
        return None
    out = {
        "id": g.id,
        "name": g.name,
        "policy": g.policy,
        "status": g.status,
        "total": g.total,
        "ended": g.ended,
        "completed": g.completed,
        "dead_letter": g.dead,
        "cancelled": g.cancelled,
        "callback": g.callback,
        "callback_job": g.callback_job_id,
        "callback_error": g.callback_error,
        "created_at": g.created_at,
        "fired_at": g.fired_at,
        "closed_at": g.closed_at,
    }
    if members:
        jobs = attach_statuses(list(Job.objects.filter(group_id=g.id).order_by("id").only(*_FIELDS)))
        out["members"] = [_member(job) for job in jobs]
    return out


_FIELDS = ("id", "kind", "state", "queue_name", "run_at", "attempts")


def dependencies(job_id):
    """A job's place in a DAG: {id, state, waiting_for, depends, group, upstream [...],
    dependents [...]}, or None if there is no such job."""
    job = Job.objects.filter(id=job_id).first()
    if job is None:
        return None
    ups = Dependency.objects.filter(job_id=job.id).values("upstream_id")
    downs = Dependency.objects.filter(upstream_id=job.id).values("job_id")
    return {
        "id": job.id,
        "kind": job.kind,
        "state": job.state,
        "waiting_for": job.waiting_for,
        "depends": job.depends,
        "group": job.group_id,
        "upstream": [
            _member(j)
            for j in attach_statuses(list(Job.objects.filter(id__in=ups).order_by("id").only(*_FIELDS)))
        ],
        "dependents": [
            _member(j)
            for j in attach_statuses(list(Job.objects.filter(id__in=downs).order_by("id").only(*_FIELDS)))
        ],
    }

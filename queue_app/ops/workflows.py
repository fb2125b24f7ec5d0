"""What operators read about workflows: a group's progress, a job's dependencies.
(canvas.py builds them; core/workflows.py keeps their counts.)"""

from django.db.models import Q

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


# How the dashboard draws a workflow (inline SVG): one column per depth, one row per job.
NODE_W, NODE_H, COL, ROW, PAD = 160, 36, 200, 52, 10
FILLS = {
    "waiting": "#eaeef2",
    "pending": "#ddf4ff",
    "leased": "#fff8c5",
    "completed": "#dafbe1",
    "dead_letter": "#ffebe9",
    "cancelled": "#f6f8fa",
}


def graph(job_id, *, limit=200):
    """The dependency graph around a job, laid out for drawing: {nodes [{id, kind, state,
    x, y, fill, here}], edges [{x1, y1, x2, y2}], width, height, truncated}, each node at
    its depth (longest path from a job with no dependencies). At most ``limit`` jobs."""
    seen, frontier, edges = {job_id}, [job_id], set()
    while frontier and len(seen) < limit:
        pairs = Dependency.objects.filter(Q(job_id__in=frontier) | Q(upstream_id__in=frontier)).values_list(
            "upstream_id", "job_id"
        )
        frontier = []
        for up, down in pairs:
            edges.add((up, down))
            for node in (up, down):
                if node not in seen and len(seen) < limit:
                    seen.add(node)
                    frontier.append(node)
    edges = {(u, d) for u, d in edges if u in seen and d in seen}
    jobs = {j.id: j for j in Job.objects.filter(id__in=seen).only("id", "kind", "state")}
    depth = dict.fromkeys(jobs, 0)
    for _ in range(len(jobs)):  # longest path: at most one pass per job (a DAG settles sooner)
        moved = False
        for up, down in edges:
            if up in depth and down in depth and depth[down] < depth[up] + 1:
                depth[down], moved = depth[up] + 1, True
        if not moved:
            break
    rows, nodes, at = {}, [], {}
    for node_id in sorted(jobs):
        col = depth[node_id]
        row = rows[col] = rows.get(col, -1) + 1
        x, y = PAD + col * COL, PAD + row * ROW
        at[node_id] = (x, y)
        job = jobs[node_id]
        nodes.append(
            {
                "id": node_id,
                "kind": job.kind if len(job.kind) <= 20 else job.kind[:19] + "…",
                "state": job.state,
                "x": x,
                "y": y,
                "fill": FILLS.get(job.state, "#ffffff"),
                "here": node_id == job_id,
            }
        )
    lines = [
        {"x1": at[u][0] + NODE_W, "y1": at[u][1] + NODE_H // 2, "x2": at[d][0], "y2": at[d][1] + NODE_H // 2}
        for u, d in sorted(edges)
        if u in at and d in at
    ]
    return {
        "nodes": nodes,
        "edges": lines,
        "width": PAD * 2 + (max(depth.values(), default=0) + 1) * COL,
        "height": PAD * 2 + (max(rows.values(), default=0) + 1) * ROW,
        "node_w": NODE_W,
        "node_h": NODE_H,
        "truncated": len(seen) >= limit,
    }

"""Building workflows: a group with a callback, a chain, a DAG (workflows.py keeps their
books as the jobs end).

    from queue_app import call, chain, group, Workflow

    g = group([{"kind": "resize", "payload": {"img": i}} for i in ids] + [call(thumb, 7)],
              callback={"kind": "publish", "payload": {"album": 3}}, policy="always")
    jobs = chain(call(fetch, url), call(parse), call(store))   # each gets the last result
    wf = Workflow()
    wf.add("a", {"kind": "extract"})
    wf.add("b", {"kind": "load"}, after=["a"])
    jobs = wf.enqueue()                                         # {"a": Job, "b": Job}

A step is a native job spec (a dict with kind, payload and enqueue options, as
bulk_enqueue takes), an EnqueueRequest, or a @task call (``queue_app.call``). Everything
is validated before anything is written, and each builder enqueues in one transaction.
"""

import dataclasses

from django.db import router, transaction
from django.utils import timezone

from queue_app.core import transitions, validation
from queue_app.exceptions import InvalidJob
from queue_app.models import GroupPolicy, Job, JobGroup


def _request(step, now, where):
    """(EnqueueRequest, is_task, database or None) of one step."""
    if isinstance(step, validation.EnqueueRequest):
        return step, False, None
    if hasattr(step, "enqueue_request"):
        return step.enqueue_request(), True, step.database
    if not isinstance(step, dict):
        raise InvalidJob(f"{where}: expected a job spec dict or a task call, got {type(step).__name__}")
    spec = dict(step)
    try:
        kind = spec.pop("kind")
    except KeyError:
        raise InvalidJob(f"{where}: kind is required", "kind") from None
    payload = spec.pop("payload", None)
    try:
        return validation.request(kind, payload, spec, now), False, None
    except InvalidJob as exc:
        raise InvalidJob(f"{where}: {exc}", exc.field) from None


def _announce(steps, jobs):
    """Tell each task call its job is in (task_enqueued on commit, as .enqueue() sends)."""
    for step, job in zip(steps, jobs):
        if hasattr(step, "enqueued"):
            step.enqueued(job)


def _database(using, found):
    dbs = {db for db in found if db is not None}
    if using is not None:
        dbs.add(using)
    if len(dbs) > 1:
        raise InvalidJob(f"a workflow's jobs must share one database, not {', '.join(sorted(dbs))}")
    return dbs.pop() if dbs else router.db_for_write(Job)


def _template(step, now):
    """A callback step as a follow-up template (a dict), and whether it is a task call."""
    if isinstance(step, dict):
        return validation.template(step, "callback", now), False
    req, is_task, _ = _request(step, now, "callback")
    spec = {"kind": req.kind, "payload": req.payload}
    for name in validation.TEMPLATE_FIELDS:
        value = getattr(req, name, None)
        if (name == "debounce_mode" and req.debounce_key is None) or (
            name == "ordering_blocks" and req.ordering_key is None
        ):
            continue  # the request's default, which means nothing without a key
        if value is not None:
            spec[name] = value
    return validation.template(spec, "callback", now), is_task


def group(members, *, callback=None, policy=GroupPolicy.SUCCESS, name="", using=None):
    """Enqueue ``members`` as one group; ``callback`` runs once, when ``policy`` says:
    success (every member completed), always (every member ended) or first_failure (at
    the first failure, cancelling the members still pending, or when all completed).
    A requeued member re-opens the group and re-arms the callback: the policy decides
    once more (workflows.py says exactly when).

    The callback's payload (a task's kwargs) gets ``group``: {id, name, policy, counts
    {total, completed, dead_letter, cancelled}, members [{id, kind, state, result |
    error}] in member order}. Return the JobGroup, with ``job_ids`` in member order."""
    now = timezone.now()
    members = list(members)
    if not members:
        raise InvalidJob("a group needs at least one member", "members")
    if policy not in GroupPolicy.values:
        raise InvalidJob(f"policy must be one of {', '.join(GroupPolicy.values)}", "policy")
    name = validation.text(name or "", "name")[:200]
    built = [_request(step, now, f"member {i}") for i, step in enumerate(members)]
    template, callback_task = (None, False) if callback is None else _template(callback, now)
    db = _database(using, [b[2] for b in built] + [getattr(callback, "database", None)])
    with transaction.atomic(using=db):
        g = JobGroup.objects.using(db).create(
            name=name,
            policy=policy,
            callback=template,
            callback_task=callback_task,
            total=len(built),
            created_at=now,
        )
        jobs = transitions.bulk_enqueue(
            [dataclasses.replace(req, group_id=g.id) for req, _, _ in built], using=db
        )
        _announce(members, jobs)
    g.job_ids = [job.id for job in jobs]
    return g


def chain(*steps, using=None):
    """Enqueue ``steps`` so that each waits for the one before and gets its result: a
    task call as its first positional argument, a native job under "dependencies" in its
    payload ([{id, kind, state, result}]). A failure cancels the rest. Return the jobs."""
    wf = Workflow()
    for i, step in enumerate(steps):
        wf.add(i, step, after=[i - 1] if i else (), pass_result=True)
    out = wf.enqueue(using=using)
    return [out[i] for i in range(len(steps))]


class Workflow:
    """A DAG of steps by name, enqueued together: each waits for the steps it comes after."""

    def __init__(self):
        self.steps = {}

    def add(self, name, step, *, after=(), on_dependency_failure=None, pass_result=False):
        """Add step ``name``, run once every step of ``after`` has ended (its
        on_dependency_failure: cancel, run or hold; pass_result: give it their results)."""
        if name in self.steps:
            raise InvalidJob(f"workflow: step {name!r} is added twice")
        self.steps[name] = (step, tuple(after), on_dependency_failure, pass_result)
        return name

    def order(self):
        """The step names, each after the steps it comes after; InvalidJob on an unknown
        name or a cycle (which it names)."""
        for name, (_, after, _, _) in self.steps.items():
            unknown = [a for a in after if a not in self.steps]
            if unknown:
                raise InvalidJob(f"workflow: step {name!r} comes after unknown step(s) {unknown!r}")
        out, state = [], {}

        def visit(name, path):
            if state.get(name) == "done":
                return
            if state.get(name) == "visiting":
                cycle = path[path.index(name) :] + [name]
                raise InvalidJob("workflow: a cycle: " + " -> ".join(map(repr, cycle)), "depends_on")
            state[name] = "visiting"
            for upstream in self.steps[name][1]:
                visit(upstream, [*path, name])
            state[name] = "done"
            out.append(name)

        for name in self.steps:
            visit(name, [])
        return out

    def enqueue(self, *, using=None):
        """Validate every step, then enqueue them all in one transaction; return {name: Job}."""
        now = timezone.now()
        names = self.order()
        built = {name: _request(self.steps[name][0], now, f"step {name!r}") for name in names}
        db = _database(using, [b[2] for b in built.values()])
        out = {}
        with transaction.atomic(using=db):
            for name in names:
                _, after, policy, pass_result = self.steps[name]
                req, is_task, _ = built[name]
                if after:
                    ids, depends = validation.dependency_options(
                        [*req.depends_on, *(out[a].id for a in after)],
                        policy,
                        ("arg" if is_task else "payload") if pass_result else None,
                    )
                    req = dataclasses.replace(req, depends_on=ids, depends=depends)
                out[name], _ = transitions.enqueue(req, using=db)
                _announce([self.steps[name][0]], [out[name]])
        return out

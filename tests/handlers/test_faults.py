"""Fault injection: decisions that are the same on every run, each fault in this process,
and each fault meeting a real worker (a forked runworker) on the test database."""

import asyncio
import multiprocessing
import os
import subprocess
import sys
import time
from collections import Counter
from types import SimpleNamespace

import pytest
from django.core.exceptions import ImproperlyConfigured

from queue_app import bulk_enqueue, enqueue
from queue_app.handlers import faults, registry
from queue_app.models import EventType, Job, State
from queue_app.worker.execution import run_one
from tests import sample_handlers as handlers
from tests import sample_tasks as tasks
from tests.support import event_types as events
from tests.worker_support import ROOT, lease_settings, run_worker


def job(id, attempt):
    """What a wrapped handler reads of the job the worker passes it."""
    return SimpleNamespace(id=id, attempts=attempt)


# --- decisions --------------------------------------------------------------------------------


def test_same_seed_job_and_attempt_always_get_the_same_decision():
    plan = faults.FaultPlan(seed=3, error=0.2, crash=0.1, stall=0.1, delay=(0.0, 1.0), delay_rate=0.5)
    again = faults.FaultPlan(seed=3, error=0.2, crash=0.1, stall=0.1, delay=(0.0, 1.0), delay_rate=0.5)

    first = [plan.decide(j, a) for j in range(200) for a in (1, 2, 3)]

    assert [plan.decide(j, a) for j in range(200) for a in (1, 2, 3)] == first
    assert [again.decide(j, a) for j in range(200) for a in (1, 2, 3)] == first


def test_decisions_are_the_same_in_another_process_with_another_hash_seed():
    code = (
        "import django; django.setup()\n"
        "from queue_app.handlers.faults import FaultPlan\n"
        "plan = FaultPlan(seed='demo', error=0.3, crash=0.2, delay=(0.1, 0.5), delay_rate=0.5)\n"
        "print([(d.fault, round(d.delay, 9)) for d in (plan.decide(j, 1) for j in range(50))])\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345", "DJANGO_SETTINGS_MODULE": "jobqueue_project.settings"}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    plan = faults.FaultPlan(seed="demo", error=0.3, crash=0.2, delay=(0.1, 0.5), delay_rate=0.5)

    assert out.stdout.strip() == str(
        [(d.fault, round(d.delay, 9)) for d in (plan.decide(j, 1) for j in range(50))]
    )


def test_different_seeds_fault_different_jobs():
    picked = {
        seed: {j for j in range(1000) if faults.FaultPlan(seed=seed, error=0.1).decide(j, 1).fault}
        for seed in (0, 1, 2)
    }

    assert picked[0] != picked[1] != picked[2] != picked[0]
    # Independent draws: two seeds share about a tenth of their faulted jobs, not most.
    assert len(picked[0] & picked[1]) < len(picked[0]) / 2


def test_rates_are_honoured_over_a_thousand_attempts():
    plan = faults.FaultPlan(seed=0, error=0.1, crash=0.05, stall=0.02, delay=0.5, delay_rate=0.3)
    decisions = [plan.decide(j, 1) for j in range(1000)]
    counts = Counter(d.fault for d in decisions)

    # Deterministic, so exact; each within a few standard deviations of its rate.
    assert counts == {None: 841, "error": 84, "crash": 54, "stall": 21}
    delayed = sum(d.delay == 0.5 for d in decisions)
    assert delayed == 278
    assert sum(d.delay == 0.0 for d in decisions) == 1000 - delayed


def test_a_retry_draws_afresh():
    plan = faults.FaultPlan(seed=9, error=0.5)

    by_attempt = [[plan.decide(j, a).fault for j in range(100)] for a in (1, 2)]

    assert by_attempt[0] != by_attempt[1]
    assert any(first == "error" and second is None for first, second in zip(*by_attempt))


def test_attempts_limit_faults_to_those_attempt_numbers():
    plan = faults.FaultPlan(crash=1.0, delay=0.2, attempts={1})

    assert {plan.decide(j, 1) for j in range(50)} == {faults.Decision("crash", 0.2)}
    assert {plan.decide(j, a) for j in range(50) for a in (2, 3)} == {faults.Decision()}
    assert faults.FaultPlan(error=1.0, attempts=2).decide(7, 2).fault == "error"


def test_delay_range_draws_each_attempts_wait_between_its_bounds():
    plan = faults.FaultPlan(seed=1, delay=(0.1, 0.3))
    waits = [plan.decide(j, 1).delay for j in range(500)]

    assert all(0.1 <= w <= 0.3 for w in waits)
    assert min(waits) < 0.11 and max(waits) > 0.29


@pytest.mark.parametrize(
    "options, message",
    [
        ({"error": 1.5}, "error must be a rate between 0 and 1"),
        ({"crash": -0.1}, "crash must be a rate"),
        ({"error": 0.6, "crash": 0.5}, "must not exceed 1"),
        ({"delay": (0.3, 0.1)}, "low <= high"),
        ({"delay": -1}, "delay must be seconds"),
        ({"attempts": {0}}, "attempt numbers"),
        ({"stall_seconds": 0}, "stall_seconds must be positive"),
        ({"exception": "ValueError"}, "exception must be an exception class"),
    ],
)
def test_impossible_plans_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        faults.FaultPlan(**options)


# --- each fault in this process ---------------------------------------------------------------


def test_error_fault_raises_injected_fault_naming_seed_job_and_attempt():
    wrapped = faults.inject(handlers.with_job, seed=4, error=1.0)

    with pytest.raises(faults.InjectedFault, match=r"^injected error \(seed=4, job=12, attempt=2\)$"):
        wrapped({}, job=job(12, 2))


def test_error_fault_can_raise_another_exception_class():
    wrapped = faults.inject(handlers.echo, error=1.0, exception=ConnectionError)

    with pytest.raises(ConnectionError, match="injected error"):
        wrapped({})


def test_handler_without_a_fault_runs_and_its_result_passes_through():
    with_job = faults.inject(handlers.with_job, seed=2, error=0.5)
    clean = next(j for j in range(100) if faults.plan_of(with_job).decide(j, 1).fault is None)

    assert with_job({}, job=job(clean, 1)) == {"id": clean, "attempt": 1}
    assert faults.inject(handlers.add, delay=0.01)({"a": 1, "b": 1}) == 2


def test_wrapper_asks_for_the_job_only_when_the_handler_does():
    # registry.wants_job reads the signature through functools.wraps' __wrapped__.
    assert registry.wants_job(faults.inject(handlers.with_job, error=0.1))
    assert not registry.wants_job(faults.inject(handlers.echo, error=0.1))


def test_delay_fault_waits_then_runs_the_handler():
    wrapped = faults.inject(handlers.echo, delay=0.3)

    began = time.monotonic()
    assert wrapped({"n": 1}) == {"n": 1}
    assert time.monotonic() - began >= 0.3


def test_stall_fault_blocks_for_its_seconds_and_raises_if_nothing_killed_it():
    wrapped = faults.inject(handlers.echo, stall=1.0, stall_seconds=0.3)

    began = time.monotonic()
    with pytest.raises(faults.InjectedFault, match=r"injected stall .*the 0.3s stall ended"):
        wrapped({})
    assert time.monotonic() - began >= 0.3


def test_crash_fault_ends_the_process_with_its_exit_code():
    wrapped = faults.inject(handlers.echo, crash=1.0, crash_code=71)
    proc = multiprocessing.get_context("fork").Process(target=wrapped, args=({},))
    proc.start()
    proc.join(10)

    assert proc.exitcode == 71


def test_async_handler_stays_async_and_delays_without_blocking_its_loop():
    wrapped = faults.inject(handlers.async_echo, delay=0.2)

    async def both():
        began = time.monotonic()
        results = await asyncio.gather(wrapped({"n": 1}), wrapped({"n": 2}))
        return results, time.monotonic() - began

    assert asyncio.iscoroutinefunction(wrapped)
    results, took = asyncio.run(both())
    assert results == [{"n": 1}, {"n": 2}]
    assert 0.2 <= took < 0.4  # the two waits overlapped (one after the other takes 0.4)
    with pytest.raises(faults.InjectedFault):
        asyncio.run(faults.inject(handlers.async_echo, error=1.0)({}))


def test_wrapping_again_replaces_the_plan_instead_of_stacking():
    once = faults.inject(handlers.echo, error=1.0)
    twice = faults.inject(once, delay=0.01)

    assert faults.original(twice) is handlers.echo
    assert faults.plan_of(twice).error == 0.0
    assert twice({"n": 1}) == {"n": 1}


@pytest.mark.django_db
def test_task_wrapped_stays_a_task_and_its_job_meets_the_fault():
    wrapped = faults.inject(tasks.add, seed=1, error=1.0, attempts={1})
    registry.register(tasks.add.module_path, wrapped)
    result = tasks.add.using(max_attempts=2).enqueue(2, 3)

    first = run_one(worker_id="faults:1")
    Job.objects.filter(id=first.id).update(run_at=first.created_at)  # skip the backoff
    second = run_one(worker_id="faults:1")

    assert isinstance(wrapped, type(tasks.add)) and wrapped.module_path == tasks.add.module_path
    failed = first.events.get(type=EventType.FAILED).metadata["error"]
    assert failed["type"] == "queue_app.handlers.faults.InjectedFault"
    assert failed["message"] == f"injected error (seed=1, job={first.id}, attempt=1)"
    assert (second.state, second.result) == (State.COMPLETED, 5)
    assert str(second.id) == result.id


# --- JOBQUEUE["FAULTS"] -----------------------------------------------------------------------


def test_faults_setting_wraps_the_registered_handler(settings):
    settings.JOBQUEUE = {
        **settings.JOBQUEUE,
        "FAULTS": {
            "echo": {"seed": 5, "error": 1.0, "exception": "tests.sample_handlers.Boom", "attempts": [1]},
        },
    }

    registry.load_configured_handlers()

    wrapped = registry.get("echo")
    assert faults.original(wrapped) is handlers.echo
    assert faults.plan_of(wrapped).attempts == {1}
    with pytest.raises(handlers.Boom, match="seed=5"):
        wrapped({}, job=job(1, 1))


def test_faults_setting_wraps_a_kind_registered_after_start_up_and_registered_again(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "FAULTS": {"late": {"seed": 1, "error": 1.0}}}
    faults.configure()  # nothing registered as "late" yet: a warning, not an error
    try:
        registry.register("late", handlers.echo)
        with pytest.raises(faults.InjectedFault):
            registry.get("late")({}, job=job(1, 1))
        registry.register("late", handlers.add)  # registered again: still wrapped
        assert faults.original(registry.get("late")) is handlers.add
        assert registry.get("late") is registry.get("late")  # one wrapper, not one per lookup
    finally:
        registry.unregister("late")


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"echo": {"error": 2}}, r"\['echo'\]: error must be a rate"),
        ({"echo": {"eror": 0.1}}, r"\['echo'\]: .*unexpected keyword argument 'eror'"),
        ({"echo": 0.1}, r"must be a dict of FaultPlan options"),
        ({"echo": {"exception": "tests.sample_handlers.Nope"}}, r"\['echo'\]: .*Nope"),
    ],
)
def test_faults_setting_with_a_mistake_says_where(settings, spec, message):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "FAULTS": spec}

    with pytest.raises(ImproperlyConfigured, match=message):
        faults.configure()


# --- real worker processes --------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_crash_on_the_first_attempt_kills_the_child_and_the_retry_completes(settings):
    settings.JOBQUEUE = lease_settings(BACKOFF_BASE=0.05)
    registry.register("crash_once", faults.inject(handlers.with_job, crash=1.0, attempts={1}))
    job = enqueue("crash_once", max_attempts=3)

    assert run_worker(max_jobs=2, concurrency=1, batch=1, poll=0.02) == 0

    job.refresh_from_db()
    assert (job.state, job.attempts, job.result) == (State.COMPLETED, 2, {"id": job.id, "attempt": 2})
    failed = job.events.get(type=EventType.FAILED)
    assert failed.attempt == 1
    assert failed.metadata["error"]["type"] == "WorkerCrashed"
    assert "exited with code 70" in failed.message
    assert events(job) == [
        EventType.ENQUEUED,
        EventType.CLAIMED,
        EventType.FAILED,
        EventType.CLAIMED,
        EventType.COMPLETED,
    ]


@pytest.mark.django_db(transaction=True)
def test_stall_past_the_jobs_timeout_fails_with_a_timeout_then_retries_and_dead_letters(settings):
    settings.JOBQUEUE = lease_settings(BACKOFF_BASE=0.05)
    registry.register("stuck", faults.inject(handlers.echo, stall=1.0))
    job = enqueue("stuck", timeout=0.3, max_attempts=2)

    # run_worker fails at 30 s: the hour-long stalls were cut short by the timeout.
    assert run_worker(max_jobs=2, concurrency=1, batch=1, poll=0.02, timeout=None) == 0

    job.refresh_from_db()
    assert (job.state, job.attempts) == (State.DEAD_LETTER, 2)
    assert job.last_error["type"] == "TimeoutError"
    assert "0.3s timeout" in job.last_error["message"]
    assert events(job) == [
        EventType.ENQUEUED,
        EventType.CLAIMED,
        EventType.FAILED,
        EventType.CLAIMED,
        EventType.DEAD_LETTERED,
    ]
    assert job.events.get(type=EventType.FAILED).metadata["error"]["type"] == "TimeoutError"


@pytest.mark.django_db(transaction=True)
def test_error_on_every_attempt_exhausts_max_attempts_and_dead_letters(settings):
    settings.JOBQUEUE = lease_settings(BACKOFF_BASE=0.05)
    registry.register("always_fails", faults.inject(handlers.echo, seed=5, error=1.0))
    job = enqueue("always_fails", max_attempts=3)

    assert run_worker(max_jobs=3, concurrency=1, batch=1, poll=0.02) == 0

    job.refresh_from_db()
    assert (job.state, job.attempts) == (State.DEAD_LETTER, 3)
    assert job.last_error["type"] == "queue_app.handlers.faults.InjectedFault"
    assert job.last_error["message"] == f"injected error (seed=5, job={job.id}, attempt=3)"
    assert [e.metadata["error"]["message"] for e in job.events.filter(type=EventType.FAILED)] == [
        f"injected error (seed=5, job={job.id}, attempt={n})" for n in (1, 2)
    ]


@pytest.mark.django_db(transaction=True)
def test_worker_outcomes_are_the_ones_the_plan_predicts():
    registry.register("chaos", faults.inject(handlers.echo, seed="predict", error=0.3, delay=(0.0, 0.02)))
    jobs = bulk_enqueue([{"kind": "chaos", "payload": {"n": n}, "max_attempts": 1} for n in range(30)])
    plan = faults.plan_of(registry.get("chaos"))

    assert run_worker(burst=True, concurrency=2, batch=5) == 0

    predicted = {j.id: State.DEAD_LETTER if plan.decide(j.id, 1).fault else State.COMPLETED for j in jobs}
    assert dict(Job.objects.filter(id__in=predicted).values_list("id", "state")) == predicted

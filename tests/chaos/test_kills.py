"""kill -9 of worker children, and of whole workers, during a drain.

A child killed mid-job fails that attempt (the supervisor records the crash) and the job
runs again: a duplicate the `failed` event explains. What it had claimed and not
started is given back at once, and what it had claimed but not yet recorded is taken
back at once too: nothing waits for its lease to lapse. A whole worker killed (its
children die with it) leaves its leases to lapse; recovery elsewhere takes them back.
"""

import os
import random
import signal
import time

import pytest
from django.db import connections, transaction

from tests import sample_tasks
from tests.chaos import harness

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_children_killed_every_half_second_lose_nothing_and_leave_nothing_to_lapse(tmp_path):
    marker = tmp_path / "runs"
    # One commit for the lot, not one per job (a disk flush each on PostgreSQL and MariaDB):
    # the workers start after it.
    with transaction.atomic():
        ids = harness.enqueue_marks(sample_tasks.mark, marker, harness.JOBS, seconds=0.005)
    proc = harness.worker("child-killer")
    kills, rng = 0, random.Random(7)
    try:
        end = time.monotonic() + 120
        while time.monotonic() < end and (
            kills < 2 or sum(harness.runs(marker).values()) < harness.JOBS * 0.9
        ):
            time.sleep(0.5)
            pids = harness.children(proc.pid)
            if pids:
                os.kill(rng.choice(pids), signal.SIGKILL)
                kills += 1
        connections.close_all()
        took = harness.wait_finished(list(ids.values()))
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)

    result = harness.tally("child_kills", ids, marker, kills=kills, after_faults_s=round(took, 1))
    harness.check(result)
    assert kills >= 2
    # Every orphan was taken back at once, none left for its lease (30 s) to lapse.
    assert harness.expired_recoveries(list(ids.values())) == 0, out
    assert proc.returncode == 0, out


def test_whole_workers_killed_and_restarted_lose_nothing(tmp_path):
    from queue_app.models import Worker, WorkerState
    from tests.worker_support import wait_for

    marker = tmp_path / "runs"
    with transaction.atomic():
        ids = harness.enqueue_marks(sample_tasks.mark, marker, harness.JOBS, seconds=0.02)
    # A short lease: a killed worker's jobs come back within seconds, not 30.
    lease = ("--lease", "1s", "--recovery-interval", "250ms")
    names = ["host-a", "host-b"]
    procs = [harness.worker(name, *lease) for name in names]
    kills = 0
    try:
        end = time.monotonic() + 120
        while time.monotonic() < end and (
            kills < 2 or sum(harness.runs(marker).values()) < harness.JOBS * 0.9
        ):
            time.sleep(0.7)
            victim = kills % 2
            procs[victim].kill()  # the supervisor; its children die with it (PR_SET_PDEATHSIG)
            procs[victim].communicate(timeout=30)
            kills += 1
            names[victim] = f"host-{'ab'[victim]}-{kills}"
            procs[victim] = harness.worker(names[victim], *lease)
            # Kill working workers, not ones still booting (a loaded machine takes seconds).
            wait_for(
                lambda n=names[victim]: Worker.objects.filter(name=n, state=WorkerState.RUNNING).exists(),
                timeout=60,
            )
        connections.close_all()
        took = harness.wait_finished(list(ids.values()))
    finally:
        for name, p in zip(names, procs):
            # One started just now gets its signal once it can take it (it has registered).
            wait_for(
                lambda n=name: Worker.objects.filter(name=n, state=WorkerState.RUNNING).exists(), timeout=60
            )
            p.send_signal(signal.SIGTERM)
        outs = [p.communicate(timeout=60)[0] for p in procs]

    result = harness.tally("worker_kills", ids, marker, kills=kills, after_faults_s=round(took, 1))
    harness.check(result)
    assert kills >= 2
    assert all(p.returncode == 0 for p in procs), outs


def _until_recovered(ids):
    """Wait until recovery has taken back one of ``ids``' jobs: the fault must outlast it."""
    from queue_app.models import Event, EventType
    from tests.worker_support import wait_for

    wait_for(
        lambda: Event.objects.filter(job_id__in=ids.values(), type=EventType.RECOVERED).exists(),
        timeout=60,
        what="the other worker to recover a lapsed lease",
    )


def test_a_whole_worker_stalled_past_its_lease_then_resumed_loses_nothing_and_its_late_work_is_refused(
    tmp_path,
):
    """SIGSTOP of a worker (supervisor and children) for three leases (of 1 s): the other worker's
    recovery takes its jobs back and runs them; resumed, the stalled one's acknowledgements
    are refused by the fence, so each job completes exactly once (a second run is explained
    by the `recovered` event before it)."""
    from queue_app.models import Event, EventType

    marker = tmp_path / "runs"
    with transaction.atomic():
        ids = harness.enqueue_marks(sample_tasks.mark, marker, harness.JOBS, seconds=0.02)
    lease = ("--lease", "1s", "--recovery-interval", "250ms")
    stalled, other = harness.worker("stalled", *lease), harness.worker("steady", *lease)
    try:
        harness.holding("stalled", "steady")  # both up, and the one to stall holds leases
        frozen = [stalled.pid, *harness.children(stalled.pid)]
        harness.freeze(frozen)
        time.sleep(3)  # three leases, and until the steady one took some back (however slow)
        _until_recovered(ids)
        harness.thaw(frozen)
        connections.close_all()
        took = harness.wait_finished(list(ids.values()))
    finally:
        outs = harness.stop_all([stalled, other])

    result = harness.tally("stall_past_lease", ids, marker, kills=1, after_faults_s=round(took, 1))
    harness.check(result)
    assert result["states"] == {"completed": len(ids)}, (result, outs)
    # The stall did strand work: the steady worker took it back when the leases lapsed.
    assert Event.objects.filter(job_id__in=ids.values(), type=EventType.RECOVERED).exists(), outs
    completed = Event.objects.filter(job_id__in=ids.values(), type=EventType.COMPLETED)
    assert completed.count() == len(ids), result  # one completion each: the late ones refused
    assert all(p.returncode == 0 for p in (stalled, other)), outs


def test_a_worker_partitioned_from_the_database_past_its_lease_loses_nothing_when_it_heals(tmp_path):
    """One worker reaches the database through a relay that goes silent for three leases
    (a partition: no reset, its queries hang); the other, connected directly, recovers the
    partitioned worker's jobs and runs them. Healed, the partitioned worker's late
    acknowledgements are refused by the fence: each job completes once, and each second
    run is explained by the recovery before it."""
    from django.db import connection

    from queue_app.models import Event, EventType
    from tests.chaos.partition import Relay
    from tests.worker_support import database_url

    if connection.vendor == "sqlite":
        pytest.skip("SQLite is a file on this host: there is no network to partition")
    s = connection.settings_dict
    relay = Relay(
        s["HOST"] or "127.0.0.1", int(s["PORT"] or {"postgresql": 5432, "mysql": 3306}[connection.vendor])
    )
    through_relay = database_url().replace(f":{s['PORT']}/", f":{relay.port}/")
    marker = tmp_path / "runs"
    with transaction.atomic():
        ids = harness.enqueue_marks(sample_tasks.mark, marker, harness.JOBS, seconds=0.02)
    lease = ("--lease", "1s", "--recovery-interval", "250ms")
    far = harness.worker("far", *lease, database_url=through_relay)
    near = harness.worker("near", *lease)
    try:
        harness.holding("far", "near")  # both up, and the far one holds leases
        relay.cut()
        time.sleep(3)  # three leases, and until the near one took some back (however slow)
        _until_recovered(ids)
        relay.heal()
        connections.close_all()
        took = harness.wait_finished(list(ids.values()))
    finally:
        outs = harness.stop_all([far, near])
        relay.close()

    result = harness.tally("network_partition", ids, marker, kills=1, after_faults_s=round(took, 1))
    harness.check(result)
    assert result["states"] == {"completed": len(ids)}, (result, outs)
    assert Event.objects.filter(job_id__in=ids.values(), type=EventType.COMPLETED).count() == len(ids)
    assert Event.objects.filter(job_id__in=ids.values(), type=EventType.RECOVERED).exists(), outs
    assert all(p.returncode == 0 for p in (far, near)), outs

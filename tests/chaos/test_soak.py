"""A soak: many tasks through several workers, one of them kill -9'd and restarted at a
steady beat, and one never touched, whose child's resident memory is read at the start
and at the end (a leak per job shows over thousands of jobs).

Sizes: 3 x JOBQUEUE_CHAOS_JOBS tasks; JOBQUEUE_SOAK_KILL_EVERY seconds between kills
(1 by default); JOBQUEUE_SOAK_WORKERS runworkers of two children each (3 by default). The
long soak, 100,000 tasks through 8 children: JOBQUEUE_CHAOS_JOBS=33334
JOBQUEUE_SOAK_KILL_EVERY=10 JOBQUEUE_SOAK_WORKERS=4.
"""

import os
import random
import signal
import time

import pytest
from django.db import connections

from queue_app.models import Worker, WorkerState
from tests import sample_tasks
from tests.chaos import harness
from tests.worker_support import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

KILL_EVERY = float(os.environ.get("JOBQUEUE_SOAK_KILL_EVERY", "1"))
WORKERS = int(os.environ.get("JOBQUEUE_SOAK_WORKERS", "3"))


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


def test_a_soak_with_a_worker_killed_at_a_steady_beat_loses_nothing_and_leaks_nothing(tmp_path):
    from django.db import connection

    if connection.vendor == "sqlite":
        pytest.skip("the soak is for the servers many hosts share; SQLite's kills are in test_kills.py")
    marker = tmp_path / "runs"
    total = harness.JOBS * 3
    ids = harness.enqueue_marks(sample_tasks.mark, marker, total, seconds=0.01)
    lease = ("--lease", "1s", "--recovery-interval", "250ms")
    steady = harness.worker("soak-steady", *lease)
    names = [f"soak-{n}" for n in range(WORKERS - 1)]
    procs = [harness.worker(name, *lease) for name in names]
    rng, kills, rss = random.Random(11), 0, []
    try:
        harness.wait_for_runs(marker, total // 10)
        child = wait_for(lambda: harness.children(steady.pid), timeout=60, what="the steady worker's child")[
            0
        ]
        time.sleep(0.5)  # past its first jobs: imports and caches warm
        assert child in harness.children(steady.pid), (
            f"the steady worker's child {child} was replaced before any kill; its output: {''.join(steady.lines)}"
        )
        rss.append(rss_kib(child))
        end = time.monotonic() + 600
        while time.monotonic() < end and (kills < 3 or sum(harness.runs(marker).values()) < total * 0.95):
            time.sleep(KILL_EVERY)
            victim = rng.randrange(len(procs))
            procs[victim].kill()
            procs[victim].communicate(timeout=30)
            kills += 1
            names[victim] = f"soak-{victim}-{kills}"
            procs[victim] = harness.worker(names[victim], *lease)
            wait_for(  # kill working workers, not booting ones
                lambda n=names[victim]: Worker.objects.filter(name=n, state=WorkerState.RUNNING).exists(),
                timeout=60,
            )
        connections.close_all()
        took = harness.wait_finished(list(ids.values()), timeout=300)
        if child in harness.children(steady.pid):
            rss.append(rss_kib(child))
    finally:
        for name, p in zip(["soak-steady", *names], [steady, *procs]):
            wait_for(
                lambda n=name: Worker.objects.filter(name=n, state=WorkerState.RUNNING).exists(), timeout=60
            )
            p.send_signal(signal.SIGTERM)
        outs = [p.communicate(timeout=60)[0] for p in (steady, *procs)]

    result = harness.tally(
        "soak", ids, marker, kills=kills, workers=WORKERS, rss_kib=rss, after_faults_s=round(took, 1)
    )
    harness.check(result)
    assert kills >= 3
    assert len(rss) == 2, "the steady worker's child was replaced: it should never have been touched"
    # Within 10% (and a megabyte of allocator noise) of where it started.
    assert rss[1] <= rss[0] * 1.10 + 1024, rss
    assert all(p.returncode == 0 for p in (steady, *procs)), outs

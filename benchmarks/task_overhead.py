"""What a `@task` job costs a worker beyond a native job, in CPU time per job, without the
database: the claimed jobs' attempts (the handler's call with its signals, TaskResults and
output capture) and their batched acknowledgement's task_finished, timed with
time.process_time() in one process, so the machine's load hardly moves it. The claim and
the commit, the same for both paths, are left out (worker_throughput.py and
task_vs_native.py time those).

    .venv/bin/python benchmarks/task_overhead.py               # 1,000 jobs a round, 5 rounds
    .venv/bin/python benchmarks/task_overhead.py --jobs 1000 --rounds 9

Per round, three figures in turns: native ("bench.stamp"), `@task`
(jobqueue_project.tasks.stamp), and `@task` with the "django.tasks" logger at WARNING:
Django's own receivers log an INFO line at each task's start and finish, which Django's
default handlers drop when DEBUG is off, but which are built first. One JSON line of
medians, with the load average.
"""

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from worker_throughput import django_snippet, fresh_database

MEASURE = """
import logging, statistics, time
from django.utils import timezone
from queue_app import bulk_enqueue
from queue_app.core import transitions
from queue_app.models import Job
from queue_app.worker import capture, execution
from jobqueue_project.tasks import stamp
tasks_log = logging.getLogger("django.tasks")

def per_job_us(path, n):
    Job.objects.all().delete()
    if path == "native":
        bulk_enqueue([{{"kind": "bench.stamp"}}] * n)
    else:
        for _ in range(n):
            stamp.enqueue()
    tasks_log.setLevel(logging.WARNING if path == "task_quiet" else logging.NOTSET)
    now = timezone.now()
    jobs = execution.claimed(transitions.claim("bench/0.1", limit=n, now=now, lease_seconds=600), now)
    began = time.process_time()
    done = []
    for job in jobs:
        done.append((job, execution.attempt(job, "bench/0.1", capture.Capture())))
    execution.acknowledged(done, {{job.id for job in jobs}}, timezone.now())
    took = time.process_time() - began
    tasks_log.setLevel(logging.NOTSET)
    return took / n * 1e6

runs = {{"native": [], "task": [], "task_quiet": []}}
for r in range({rounds}):
    for path in runs:
        runs[path].append(per_job_us(path, {jobs}))
print(json.dumps({{path: round(statistics.median(us), 1) for path, us in runs.items()}}))
"""


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=1000, help="jobs a round (at most MAX_BATCH, 1000)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    fresh_database("sqlite")
    got = json.loads(django_snippet("sqlite", MEASURE.format(jobs=args.jobs, rounds=args.rounds)))
    print(
        json.dumps(
            {
                "bench": "task_overhead_cpu_us_per_job",
                "jobs": args.jobs,
                "rounds": args.rounds,
                "native_us": got["native"],
                "task_us": got["task"],
                "task_without_django_log_lines_us": got["task_quiet"],
                "task_extra_us": round(got["task"] - got["native"], 1),
                "load_1m": round(os.getloadavg()[0], 2),
            }
        )
    )


if __name__ == "__main__":
    main()

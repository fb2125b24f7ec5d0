"""What OpenTelemetry costs a worker and an enqueue, in CPU time per job, in one process:
time.process_time() (every thread of the process, so the SDK's export thread is counted),
which the machine's load hardly moves, where worker_throughput.py --tracing measures
drain throughput by the wall clock.

    .venv/bin/python benchmarks/tracing_overhead.py              # 1,000 jobs a round, 5 rounds
    .venv/bin/python benchmarks/tracing_overhead.py --jobs 1000 --rounds 9

Three processes in turns, each on a fresh SQLite file: ``absent`` (opentelemetry hidden,
as on a site without the packages), ``off`` (opentelemetry-api installed, no provider
set) and ``on`` (the SDK as tests/otel_setup.py sets it up for benchmarks: a
BatchSpanProcessor and an exporter that drops what it is given). In each, per job:

- ``attempt_us``: an attempt as the batched worker runs it (telemetry.attempt around
  execution.attempt of a no-op job, outcome set), claim and commit left out, of jobs from
  one bulk_enqueue (one trace context: worker_throughput.py's case);
- ``attempt_single_us``: the same, of jobs enqueued one by one (a trace context each);
- ``enqueue_us``: one enqueue() of a no-op job outside any trace, its SQLite insert included;
- ``loop_us``: the whole worker loop (worker.Loop, one thread, ``--batch``) over jobs
  from one bulk_enqueue: claims, attempts and batched acknowledgements, as a drain's
  child runs them but in this process: what a drain pays per job, where ``attempt_us``
  times the attempts alone, in a tight loop (its code and data stay in the CPU's
  caches; between a worker's claims they do not, so the same work costs more there);
- with ``on``, ``sdk_span_us``: the SDK alone, what our attempt span asks of it (a span
  with the same attributes in a remote parent's trace, made current and back, two more
  attributes, ended): the floor our code cannot go under.

One JSON line of medians, the extra each path costs with tracing on over off (and off
over absent), and the load average.

``--callgrind``: instead, instructions per job (valgrind's callgrind, counting only the
measured part: the figures the machine's load does not move) of ``loop_us`` off and on
and of ``sdk_span_us``, one process each, in pairs; a few minutes. Under valgrind every
batch would outlast the loop's 50 ms ACK_DELAY and be acknowledged on its own, so the
acknowledgements ride on the next claim, as they do at full speed.
"""

import argparse
import concurrent.futures
import json
import os
import statistics
import subprocess
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from worker_throughput import PY, ROOT, URLS, fresh_database, run

# sys.modules[name] = None makes ``import name`` raise ImportError: a site without it.
HIDE = "import sys\nfor name in ('opentelemetry',):\n    sys.modules[name] = None\n"

MEASURE = """
import os, django, json, statistics, time
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "jobqueue_project.settings")
django.setup()
from django.utils import timezone
from queue_app import bulk_enqueue, enqueue
from queue_app.core import telemetry, transitions
from queue_app.models import Job
from queue_app.worker import capture, execution, loop
from queue_app.worker.slots import Budget, Slots
import multiprocessing
import tests.worker_support  # registers "noop"

COUNT = bool(os.environ.get("JQ_CALLGRIND"))
if COUNT:
    loop.ACK_DELAY = 3600  # see --callgrind

def _count(on, n):
    # callgrind counts only between these, of the measured round (not the warm-up)
    if COUNT and n == {jobs}:
        import subprocess
        subprocess.run(["callgrind_control", "-i", "on" if on else "off", str(os.getpid())], capture_output=True)

def attempt_us(n, bulk=True):
    Job.objects.all().delete()
    if bulk:
        bulk_enqueue([{{"kind": "noop"}}] * n)
    else:  # each its own trace, so its own carrier to parse
        for _ in range(n):
            enqueue("noop")
    now = timezone.now()
    jobs = execution.claimed(transitions.claim("bench/0.1", limit=n, now=now, lease_seconds=600), now)
    began = time.process_time()
    for job in jobs:
        with telemetry.attempt(job, "bench/0.1") as traced:
            execution.attempt(job, "bench/0.1", capture.Capture())
            traced.settled("completed")
    return (time.process_time() - began) / n * 1e6

def enqueue_us(n):
    Job.objects.all().delete()
    began = time.process_time()
    for _ in range(n):
        enqueue("noop")
    return (time.process_time() - began) / n * 1e6

def loop_us(n, batch={batch}):
    Job.objects.all().delete()
    bulk_enqueue([{{"kind": "noop"}}] * n)
    options = loop.Options(batch=batch, burst=True, concurrency=1, threads=1, poll=0.05).resolved()
    # As the supervisor sizes a child's (one thread, no chunked kinds).
    slots = Slots(1, 2 * (batch + 1), buffered=2 * batch)
    worker = loop.Loop(options, "bench/0.1", slots, Budget(multiprocessing.get_context("fork"), None))
    _count(True, n)
    began = time.process_time()
    worker.run()
    telemetry.flush()  # the spans the processor still holds: their export is part of the cost
    spent = time.process_time() - began
    _count(False, n)
    assert Job.objects.completed().count() == n
    return spent / n * 1e6

def sdk_span_us(n):
    from opentelemetry import context, propagate, trace
    tracer = trace.get_tracer("bench")
    parent = propagate.extract({{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}})
    _count(True, n)
    began = time.process_time()
    for i in range(n):
        span = tracer.start_span("run noop", context=parent, kind=trace.SpanKind.CONSUMER, attributes={{
            "queue_app.kind": "noop", "queue_app.queue": "default", "queue_app.job_id": i,
            "queue_app.attempt": 1, "queue_app.worker_id": "bench/0.1", "queue_app.wait_seconds": 0.5}})
        token = context.attach(trace.set_span_in_context(span))
        context.detach(token)
        span.set_attributes({{"queue_app.outcome": "completed", "queue_app.run_seconds": 0.001}})
        span.end()
    spent = time.process_time() - began
    _count(False, n)
    return spent / n * 1e6

paths = {{"attempt_us": attempt_us, "attempt_single_us": lambda n: attempt_us(n, bulk=False),
         "enqueue_us": enqueue_us, "loop_us": loop_us}}
if telemetry.tracing():
    paths["sdk_span_us"] = sdk_span_us
if {only!r}:
    paths = {{name: paths[name] for name in {only!r}}}
for path in paths.values():
    path(100)  # warm: imports, caches, the first queries' plans
runs = {{name: [] for name in paths}}
for _ in range({rounds}):
    for name, path in paths.items():
        runs[name].append(path({jobs}))
print(json.dumps({{"tracing": telemetry.tracing(), **{{name: statistics.median(us) for name, us in runs.items()}}}}))
"""

MODES = {
    "absent": (HIDE, {}),
    "off": ("", {}),
    "on": ("", {"OTEL_SETUP": "tests.otel_setup.configure"}),
}


def measure(mode, jobs, rounds, batch):
    prelude, env = MODES[mode]
    fresh_database("sqlite")
    code = MEASURE.format(jobs=jobs, rounds=rounds, batch=batch, only=())
    out = run("sqlite", [PY, "-c", prelude + code], env)
    return json.loads(out.stdout)


_urls = threading.Lock()
URLS_SQLITE = "sqlite:///{}"


def instructions(mode, path, jobs, batch):
    """Instructions per job of ``path`` in ``mode``, counted by callgrind."""
    prelude, env = MODES[mode]
    db = f"/tmp/jq_bench_tracing_{mode}_{path}.db"
    with _urls:  # fresh_database and run read URLS: one file per measurement
        URLS["sqlite"] = "sqlite:///" + db
        fresh_database("sqlite")
    out_file = Path(db + ".callgrind")
    code = MEASURE.format(jobs=jobs, rounds=1, batch=batch, only=(path,))
    argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out_file}"]
    subprocess.run(
        [*argv, PY, "-c", prelude + code],
        cwd=ROOT,
        env=dict(
            os.environ,
            **env,
            DATABASE_URL=URLS_SQLITE.format(db),
            JOBQUEUE_LOG_LEVEL="WARNING",
            JQ_CALLGRIND="1",
        ),
        check=True,
        capture_output=True,
    )
    totals = [line for line in out_file.read_text().splitlines() if line.startswith("totals:")]
    out_file.unlink()
    return int(totals[0].split()[1]) / jobs


def count(args):
    """--callgrind: loop_us off and on, and the SDK's floor, in instructions per job."""
    todo = [("off", "loop_us"), ("on", "loop_us"), ("on", "sdk_span_us")]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # valgrind runs one core each
        got = dict(zip(todo, pool.map(lambda t: instructions(*t, args.jobs, args.batch), todo)))
    off, on, sdk = got[todo[0]], got[todo[1]], got[todo[2]]
    print(
        json.dumps(
            {
                "bench": "tracing_instructions_per_job",
                "jobs": args.jobs,
                "batch": args.batch,
                "loop_off": round(off),
                "loop_on": round(on),
                "loop_on_extra": round(on - off),
                "loop_on_vs_off": round(on / off, 3),
                "sdk_span": round(sdk),
                # How much of what tracing adds to the loop is the SDK's own work for our span.
                "sdk_share_of_extra": round(sdk / (on - off), 3),
                "sdk_floor_vs_loop_off": round(sdk / off, 3),
                "load_1m": round(os.getloadavg()[0], 2),
            }
        )
    )


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=1000, help="jobs a round (at most MAX_BATCH, 1000)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--turns", type=int, default=2, help="times each mode's process runs, in turns")
    parser.add_argument("--batch", type=int, default=10, help="the worker loop's batch size (loop_us)")
    parser.add_argument("--callgrind", action="store_true", help="instructions per job instead (valgrind)")
    args = parser.parse_args()
    if args.callgrind:
        return count(args)
    URLS["sqlite"] = "sqlite:////tmp/jq_bench_tracing.db"
    got = {mode: [] for mode in MODES}
    for _ in range(args.turns):
        for mode in MODES:
            got[mode].append(measure(mode, args.jobs, args.rounds, args.batch))
    assert [g["tracing"] for g in (got["absent"][0], got["off"][0], got["on"][0])] == [False, False, True]
    med = {
        mode: {k: round(statistics.median(g[k] for g in runs), 1) for k in runs[0] if k != "tracing"}
        for mode, runs in got.items()
    }
    print(
        json.dumps(
            {
                "bench": "tracing_cpu_us_per_job",
                "jobs": args.jobs,
                "rounds": args.rounds,
                "batch": args.batch,
                "turns": args.turns,
                **{f"{mode}_{k}": v for mode, figures in med.items() for k, v in figures.items()},
                "attempt_on_extra_us": round(med["on"]["attempt_us"] - med["off"]["attempt_us"], 1),
                "attempt_single_on_extra_us": round(
                    med["on"]["attempt_single_us"] - med["off"]["attempt_single_us"], 1
                ),
                "attempt_off_extra_us": round(med["off"]["attempt_us"] - med["absent"]["attempt_us"], 1),
                "loop_on_extra_us": round(med["on"]["loop_us"] - med["off"]["loop_us"], 1),
                "loop_on_vs_off": round(med["on"]["loop_us"] / med["off"]["loop_us"], 3),
                "loop_off_extra_us": round(med["off"]["loop_us"] - med["absent"]["loop_us"], 1),
                # The SDK's own work for our span against what a no-op job costs the loop
                # untraced: the least tracing can cost a drain, whatever our code does.
                "sdk_floor_vs_loop_off": round(med["on"]["sdk_span_us"] / med["off"]["loop_us"], 3),
                "enqueue_on_extra_us": round(med["on"]["enqueue_us"] - med["off"]["enqueue_us"], 1),
                "enqueue_off_extra_us": round(med["off"]["enqueue_us"] - med["absent"]["enqueue_us"], 1),
                "load_1m": round(os.getloadavg()[0], 2),
            }
        )
    )


if __name__ == "__main__":
    main()

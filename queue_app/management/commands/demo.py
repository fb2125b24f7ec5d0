"""manage.py demo: the queue's whole story with real worker processes, the same on every run.

The command re-runs itself as a subprocess whose DATABASE_URL names the demo's
database (a throwaway SQLite file unless --keep or --database), so the database is
chosen before Django opens any connection, and the workers it starts inherit it.
"""

import argparse
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from django.conf import settings as django_settings
from django.core.management import call_command

from queue_app import bulk_enqueue, enqueue
from queue_app.core import ordering, transitions
from queue_app.models import Event, EventType, Job, State
from queue_app.ops import cli, fixtures, metrics

QUEUE = "demo"
LEASE = 2.0
AGING = 0.2
WAIT = (
    90.0  # seconds any one step may take before the demo gives up (exit 1): a loaded CI machine took over 30
)


class DemoFailed(Exception):
    pass


class Command(cli.QueueCommand):
    # The configured database may not be the demo's (or may not exist): check nothing there.
    requires_system_checks = []
    help = (
        "Run the queue's showcase with real worker processes: priority dispatch, a retry, a handler "
        "crash, a worker killed mid-job and its orphan recovered, a delayed job, priority aging, a "
        "dead letter requeued with a corrected payload, then the final state, recent events and "
        "metrics. Runs on a throwaway SQLite database (deleted afterwards) unless --keep or "
        "--database is given. Takes about 20 seconds."
    )
    epilog = """examples:
  manage.py demo                                   # throwaway SQLite database
  manage.py demo --keep                            # on the configured database (DATABASE_URL, default queue.db)
  manage.py demo --database postgres://postgres@127.0.0.1:5432/jobqueue
  manage.py demo --run 30s                         # then feed sample jobs to the workers for 30 s
  manage.py demo --run 1m --kind email --kind webhook

The story is the same on every run (ids and times aside). Exit status 1 if a step does not
reach its outcome within 30 s (the workers' log is shown), 2 on bad options."""

    def add_arguments(self, parser):
        parser.add_argument(
            "--keep", action="store_true", help="Run on the configured database and keep what the demo wrote."
        )
        parser.add_argument(
            "--database",
            metavar="URL",
            help="Run on this database (e.g. postgres://..., mysql://..., sqlite:///demo.db); kept.",
        )
        parser.add_argument(
            "--run",
            type=cli.duration,
            metavar="DURATION",
            help="After the story, keep enqueueing sample jobs for this long, e.g. 30s.",
        )
        parser.add_argument(
            "--kind",
            action="append",
            dest="kinds",
            metavar="KIND",
            help=f"Sample workload for --run (repeatable; default all: {', '.join(fixtures.PAYLOADS)}).",
        )
        # The re-run subprocess: the database is already the demo's.
        parser.add_argument("--here", action="store_true", help=argparse.SUPPRESS)

    def handle(self, *args, **o):
        for kind in o["kinds"] or []:
            if kind not in fixtures.PAYLOADS:
                raise cli.bad_input(
                    f"--kind {kind}: no such sample workload; choose from {', '.join(fixtures.PAYLOADS)}"
                )
        if o["kinds"] and not o["run"]:
            raise cli.bad_input("--kind chooses the workload of --run; give --run DURATION too")
        if o["keep"] and o["database"]:
            raise cli.bad_input("give --keep (the configured database) or --database URL, not both")
        if o["here"]:
            return Story(self, o).run()
        return self.relaunch(o)

    def relaunch(self, o):
        env = child_env()
        tmp = None
        if o["database"]:
            env["DATABASE_URL"] = o["database"]
            where = "the database given with --database (kept)"
        elif o["keep"]:
            where = "the configured database (kept)"
        else:
            tmp = tempfile.mkdtemp(prefix="jobqueue-demo-")
            env["DATABASE_URL"] = f"sqlite:///{tmp}/demo.db"
            where = "a throwaway SQLite database (deleted at the end; --keep to keep one)"
        args = ["--here"]
        if o["run"]:
            args += ["--run", str(o["run"])]
        for kind in o["kinds"] or []:
            args += ["--kind", kind]
        self.stdout.write(f"jobqueue demo on {where}")
        started = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "django", "demo", *args],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            bufsize=1,
        )
        try:
            for line in proc.stdout:
                self.stdout.write(line.rstrip("\n"))
            code = proc.wait()
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGINT)
            proc.wait()
            raise
        finally:
            if tmp:
                shutil.rmtree(tmp, ignore_errors=True)
        if code:
            raise cli.CommandError(f"the demo failed (exit status {code})", returncode=code)
        self.stdout.write(f"demo finished in {time.monotonic() - started:.1f}s")


def child_env():
    """The environment for a subprocess that must import exactly what this one does."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", DJANGO_SETTINGS_MODULE=django_settings.SETTINGS_MODULE)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    # A test run's SQLite name must not redirect the demo's database.
    env.pop("SQLITE_TEST_NAME", None)
    # The story's jobs are the sample workloads (crashy, slow ...), which only the demo,
    # the tests and a hand-run try register.
    env["JOBQUEUE_SAMPLE_HANDLERS"] = "1"
    # Its workers refuse to start without a key; the demo's throwaway database signs
    # nothing that outlives it, so a throwaway key is enough.
    env.setdefault("SECRET_KEY", secrets.token_urlsafe(50))
    return env


class Story:
    def __init__(self, command, options):
        self.command = command
        self.options = options
        self.workers = []
        self.log_path = Path(tempfile.mkstemp(prefix="jobqueue-demo-workers-", suffix=".log")[1])
        # Open for the demo's whole run: every worker it starts writes here.
        self.log = open(self.log_path, "a")  # noqa: SIM115
        self.tag = f"{os.getpid()}"
        self.first_id = None

    def say(self, text=""):
        self.command.stdout.write(text)

    # --- processes ------------------------------------------------------------------------

    def start_worker(self, n):
        name = f"demo-{self.tag}-{n}"
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "django",
                "runworker",
                "--queue",
                QUEUE,
                "--name",
                name,
                "--concurrency",
                "1",
                "--threads",
                "1",
                "--batch",
                "1",
                "--poll",
                "50ms",
                "--lease",
                f"{LEASE}s",
                "--heartbeat",
                "500ms",
                "--recovery-interval",
                "500ms",
                "--aging",
                f"{AGING}s",
                "--grace",
                "5s",
            ],
            env=child_env(),
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.workers.append(proc)
        return proc

    def stop_workers(self):
        for proc in self.workers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.workers:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def wait(self, what, predicate, timeout=WAIT):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if predicate():
                return
            time.sleep(0.05)
        raise DemoFailed(f"timed out after {timeout:.0f}s waiting for {what}")

    def settled(self, *jobs, state=State.COMPLETED):
        ids = [j.id for j in jobs]
        return lambda: Job.objects.filter(id__in=ids, state=state).count() == len(ids)

    # --- the story --------------------------------------------------------------------------

    def run(self):
        ok = False
        try:
            call_command("migrate", verbosity=0)
            unfinished = Job.objects.filter(queue_name=QUEUE, state__in=[State.PENDING, State.LEASED]).count()
            if unfinished:
                raise cli.bad_input(
                    f"queue {QUEUE!r} already holds {unfinished} unfinished jobs; "
                    "cancel them or run the demo on another database"
                )
            self.first_id = (Job.objects.order_by("-id").values_list("id", flat=True).first() or 0) + 1
            self.priority_dispatch()
            self.retry_crash_delay()
            self.killed_worker()
            self.aging()
            self.dead_letter()
            if self.options["run"]:
                self.stream(self.options["run"], self.options["kinds"] or list(fixtures.PAYLOADS))
            self.stop_workers()
            self.final()
            ok = True
        except DemoFailed as exc:
            self.say(f"DEMO FAILED: {exc}")
            self.say("--- workers' log (last 40 lines) ---")
            self.log.flush()
            for line in self.log_path.read_text().splitlines()[-40:]:
                self.say(line)
            raise cli.CommandError(str(exc)) from None
        finally:
            self.stop_workers()
            self.log.close()
            if ok:
                self.log_path.unlink(missing_ok=True)

    def priority_dispatch(self):
        self.say("1. Priority dispatch: three emails enqueued together, priorities 0, 20 and 5")
        jobs = bulk_enqueue(
            [
                {"kind": "email", "payload": {"to": f"p{p}@example.com"}, "priority": p, "queue_name": QUEUE}
                for p in (0, 20, 5)
            ]
        )
        self.start_worker(1)
        self.say("   worker 1 started (manage.py runworker: 1 process, leases 1 job at a time)")
        self.wait("the three emails", self.settled(*jobs))
        order = [Job.objects.get(id=e.job_id).priority for e in claims(jobs)]
        self.say(f"   claimed in order of priority: {' -> '.join(map(str, order))}")

    def retry_crash_delay(self):
        flaky = enqueue("flaky", {"succeed_on": 2}, max_attempts=3, queue_name=QUEUE)
        crashy = enqueue("crashy", {"succeed_on": 2}, max_attempts=3, queue_name=QUEUE)
        later = enqueue("email", {"to": "later@example.com"}, run_after=1.5, queue_name=QUEUE)
        self.say("2. A retry: a flaky job fails its first attempt and succeeds on the second")
        self.wait("the flaky job", self.settled(flaky))
        failed = Event.objects.get(job_id=flaky.id, type=EventType.FAILED)
        flaky.refresh_from_db()
        self.say(
            f"   attempt 1: {failed.metadata['error']['type']}: {failed.message}; "
            f"retried after a {failed.metadata['delay']:g}s backoff"
        )
        self.say(f"   attempt {flaky.attempts}: {flaky.state}, result {cli.compact(flaky.result)}")

        self.say("3. A handler crash: a job whose handler kills its own worker process (exit 70)")
        self.wait("the crashing job", self.settled(crashy))
        failed = Event.objects.get(job_id=crashy.id, type=EventType.FAILED)
        crashy.refresh_from_db()
        self.say(f"   attempt 1: {failed.metadata['error']['type']}: {failed.message}")
        self.say(f"   the supervisor started a new process; attempt {crashy.attempts}: {crashy.state}")

        self.say("4. A delayed job: an email enqueued with --run-after 1.5s")
        self.wait("the delayed email", self.settled(later))
        later.refresh_from_db()
        claimed = Event.objects.get(job_id=later.id, type=EventType.CLAIMED)
        verdict = "not before its run_at" if claimed.at >= later.run_at else "BEFORE its run_at (a bug)"
        self.say(f"   waited as scheduled, claimed {verdict}; {later.state}")

    def killed_worker(self):
        self.say(
            f"5. A worker killed mid-job: worker 1 gets SIGKILL while running a 1.5s job (lease {LEASE:g}s)"
        )
        slow = enqueue("slow", {"seconds": 1.5}, queue_name=QUEUE)
        # Once a lease renewal has seen it running (Job.started_attempt): a job claimed and
        # never seen started would get its attempt back when recovered.
        self.wait(
            "the slow job to start",
            lambda: Job.objects.filter(id=slow.id, state=State.LEASED, started_attempt=1).exists(),
        )
        victim = self.workers[0]
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        self.say("   worker 1 is gone; the job stays leased, and nobody renews its lease")
        self.start_worker(2)
        self.say("   worker 2 started; it sweeps for expired leases every 0.5s")
        self.wait(
            "the orphan to be recovered",
            lambda: Event.objects.filter(job_id=slow.id, type=EventType.RECOVERED).exists(),
        )
        recovered = Event.objects.get(job_id=slow.id, type=EventType.RECOVERED)
        lease_end = recovered.metadata["error"]["message"].rsplit(" ", 1)[-1]
        late = "after" if recovered.at.isoformat() >= lease_end else "BEFORE"
        self.say(f"   recovered {late} the lease expired (attempt 1 counted), back to {recovered.to_state}")
        self.wait("the recovered job", self.settled(slow))
        slow.refresh_from_db()
        self.say(f"   attempt {slow.attempts} on worker 2: {slow.state}")

    def aging(self):
        self.say(f"6. Priority aging: a waiting job earns a point of priority every {AGING:g}s")
        blocker, low = bulk_enqueue(
            [
                {"kind": "slow", "payload": {"seconds": 2}, "priority": 50, "queue_name": QUEUE},
                {
                    "kind": "email",
                    "payload": {"to": "patient@example.com"},
                    "priority": 0,
                    "queue_name": QUEUE,
                },
            ]
        )
        self.wait("the busy worker", lambda: Job.objects.filter(id=blocker.id, state=State.LEASED).exists())
        self.say("   worker 2 is busy for 2s; a priority-0 email waits")
        pause = low.run_at.timestamp() + 5.5 * AGING - time.time()
        time.sleep(max(pause, 0))
        high = enqueue("email", {"to": "eager@example.com"}, priority=4, queue_name=QUEUE)
        self.say("   after five intervals a fresh priority-4 email arrives")
        self.wait("the two emails", self.settled(blocker, low, high))
        first, _second = claims([low, high])
        earned = ordering.effective_priority(0, low.run_at, first.at, AGING)
        winner = (
            "the older priority-0 email ran first"
            if first.job_id == low.id
            else "the priority-4 email ran first"
        )
        self.say(f"   {winner}: it had earned {'more than 4' if earned > 4 else str(earned)} points by then")

    def dead_letter(self):
        self.say("7. A dead letter: an email to 'nobody' with 2 attempts")
        bad = enqueue("email", {"to": "nobody"}, max_attempts=2, queue_name=QUEUE)
        self.wait("the dead letter", self.settled(bad, state=State.DEAD_LETTER))
        bad.refresh_from_db()
        self.say(
            f"   both attempts failed ({bad.last_error['type']}: {bad.last_error['message']}): {bad.state}"
        )
        transitions.requeue(bad.id, payload={"to": "somebody@example.com"}, actor="demo")
        self.say('   requeued with a corrected payload {"to": "somebody@example.com"}')
        self.wait("the requeued email", self.settled(bad))
        bad.refresh_from_db()
        self.say(
            f"   attempt {bad.attempts} after the requeue: {bad.state}, result {cli.compact(bad.result)}"
        )

    def stream(self, seconds, kinds):
        self.say(f"8. Sample workload for {seconds:g}s: {', '.join(kinds)}")
        end, n, jobs = time.monotonic() + seconds, 0, []
        console = self.command.console()
        with cli.progress(console, "enqueueing", None) as bar:
            while time.monotonic() < end:
                kind = kinds[n % len(kinds)]
                payload = fixtures.PAYLOADS[kind](n % 3 + 1)
                if kind == "slow":
                    payload = {"seconds": 0.2}
                jobs.append(enqueue(kind, payload, queue_name=QUEUE))
                n += 1
                bar.advance(bar.task, 1)
                time.sleep(0.25)
        self.wait(
            "the sample jobs",
            lambda: (
                not Job.objects.filter(
                    id__in=[j.id for j in jobs], state__in=[State.PENDING, State.LEASED]
                ).exists()
            ),
            timeout=60,
        )
        done = Job.objects.filter(id__in=[j.id for j in jobs], state=State.COMPLETED).count()
        self.say(f"   {n} jobs enqueued, {done} completed")

    def final(self):
        self.say("Final state of the demo's jobs:")
        mine = Job.objects.filter(id__gte=self.first_id)
        counts = {s: mine.filter(state=s).count() for s in State.values}
        self.say("   " + ", ".join(f"{state} {n}" for state, n in counts.items()))
        self.say("Recent events (newest first):")
        for e in Event.objects.filter(job_id__gte=self.first_id).select_related("job").order_by("-id")[:8]:
            self.say(f"   job {e.job_id:<4} {e.job.kind:<7} {e.type:<13} attempt {e.attempt}")
        self.say("Metrics snapshot (manage.py metrics --once):")
        for line in metrics.render().decode().splitlines():
            _name, _, value = line.rpartition(" ")
            if line.startswith(("jobqueue_jobs{", "jobqueue_dead_letters ", "jobqueue_workers")) or (
                line.startswith("jobqueue_events_total{") and float(value) > 0
            ):
                self.say(f"   {line}")


def claims(jobs):
    """The first claimed event of each job, in the order they were claimed."""
    first = {}
    for e in Event.objects.filter(job_id__in=[j.id for j in jobs], type=EventType.CLAIMED).order_by("id"):
        first.setdefault(e.job_id, e)
    return sorted(first.values(), key=lambda e: e.id)

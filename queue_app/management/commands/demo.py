"""A small end-to-end run on the configured database: priority order, a retry,
a dead letter requeued with a corrected payload, and each job's timeline."""
import time

from django.core.management import call_command
from django.core.management.base import BaseCommand

from queue_app import enqueue, transitions
from queue_app.execution import run_one
from queue_app.models import Event, Job

QUEUE = "demo"


class Command(BaseCommand):
    help = "Run a small deterministic end-to-end example (uses the 'demo' queue)."

    def handle(self, *args, **options):
        call_command("migrate", verbosity=0)
        out = self.stdout.write
        kw = {"queue_name": QUEUE}

        out("1. Priority dispatch: three emails enqueued with priority 0, 20, 5")
        jobs = [enqueue("email", {"to": f"user{p}@example.com"}, priority=p, **kw) for p in (0, 20, 5)]
        ran = [self.run() for _ in jobs]
        out("   ran in order of priority: " + ", ".join(str(j.priority) for j in ran))

        out("2. A retry: a flaky job fails its first attempt and succeeds on the second")
        flaky = enqueue("flaky", {"succeed_on": 2}, max_attempts=3, **kw)
        self.run()
        flaky.refresh_from_db()
        wait = (flaky.run_at - flaky.created_at).total_seconds()
        out(f"   attempt 1 failed; retry scheduled by backoff ({flaky.status}, ~{round(wait)}s later)")
        while (job := self.run()) is None:
            time.sleep(0.1)
        out(f"   attempt {job.attempts}: {job.state}, result {job.result}")

        out("3. A dead letter: an email to a bad address, 2 attempts, then requeued fixed")
        bad = enqueue("email", {"to": "nobody"}, max_attempts=2, **kw)
        self.run()
        transitions.retry_now(bad.id, actor="demo")
        self.run()
        bad.refresh_from_db()
        out(f"   after {bad.attempts} attempts: {bad.state} ({bad.last_error['message']})")
        transitions.requeue(bad.id, payload={"to": "somebody@example.com"}, actor="demo")
        job = self.run()
        out(f"   requeued with a corrected payload: {job.state}, result {job.result}")

        out("4. Timelines")
        for job in [*jobs, flaky, bad]:
            kinds = [e.type for e in Event.objects.filter(job_id=job.id).order_by("id")]
            out(f"   {job.kind:<6} p={job.priority:<3} " + " -> ".join(kinds))
        counts = {s: Job.objects.filter(queue_name=QUEUE, state=s).count() for s in ("pending", "completed", "dead_letter")}
        out(f"5. Final state of the demo queue: {counts}")

    def run(self):
        return run_one(worker_id="demo-worker", queues=[QUEUE])

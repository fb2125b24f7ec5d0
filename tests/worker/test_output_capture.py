"""What a handler prints and logs is kept with its attempt: in the terminal event, in
`history`, on the dashboard's job page and in the admin; per thread, bounded."""

import json
import logging
import sys
import threading
import time
from io import StringIO

import pytest
from django.core.management import call_command
from django.urls import reverse

from queue_app import bulk_enqueue, enqueue
from queue_app.handlers import registry
from queue_app.models import EventType, Job, State
from queue_app.worker import capture, shell
from queue_app.worker.execution import run_one
from tests.worker_support import lease_settings, run_worker


def chatty(payload):
    print(f"hello {payload['n']}")
    print("warning: disk nearly full", file=sys.stderr)
    return payload["n"]


def fails_loudly(payload):
    print("step 1 ok")
    print("step 2 about to break", file=sys.stderr)
    raise ValueError("step 2 broke")


def quiet(payload):
    return "shh"


def flood(payload):
    sys.stdout.write(payload["text"] * payload["times"] + "END")


def logs(payload):
    logging.getLogger("tests.capture").warning("careful with %s", payload["what"])
    logging.getLogger("tests.capture").debug("not let through by the logging config")


def interleaved(payload):
    """Print this job's token on several lines, yielding between them so threads mix."""
    for i in range(5):
        print(f"job {payload['n']} line {i}")
        time.sleep(0.002)
    return payload["n"]


def flaky_chatty(payload, job):
    print(f"attempt {job.attempts} starting")
    if job.attempts < 2:
        raise ConnectionError("upstream not ready")
    return "ok"


HANDLERS = {
    "chatty": chatty,
    "fails_loudly": fails_loudly,
    "quiet": quiet,
    "flood": flood,
    "logs": logs,
    "interleaved": interleaved,
    "flaky_chatty": flaky_chatty,
}


@pytest.fixture(autouse=True)
def _handlers():
    for kind, func in HANDLERS.items():
        registry.register(kind, func)


def event(job, type_):
    (found,) = Job.objects.get(id=job.id).events.filter(type=type_)
    return found


@pytest.mark.django_db
def test_what_a_handler_prints_is_kept_with_its_completed_attempt():
    job = enqueue("chatty", {"n": 7})

    run_one()

    assert event(job, EventType.COMPLETED).metadata["output"] == {
        "stdout": "hello 7\n",
        "stderr": "warning: disk nearly full\n",
    }


@pytest.mark.django_db
def test_output_of_a_failed_attempt_is_kept_beside_its_error():
    job = enqueue("fails_loudly", max_attempts=2)

    run_one()
    Job.objects.filter(id=job.id).update(run_at=Job.objects.get(id=job.id).created_at)
    run_one()

    expected = {"stdout": "step 1 ok\n", "stderr": "step 2 about to break\n"}
    failed = event(job, EventType.FAILED)
    assert failed.metadata["output"] == expected
    assert failed.metadata["error"]["message"] == "step 2 broke"
    assert event(job, EventType.DEAD_LETTERED).metadata["output"] == expected


@pytest.mark.django_db
def test_a_handler_that_prints_nothing_adds_no_output_to_its_event():
    job = enqueue("quiet")

    run_one()

    assert "output" not in event(job, EventType.COMPLETED).metadata


@pytest.mark.django_db
def test_output_keeps_the_last_max_bytes_of_each_stream(settings):
    settings.JOBQUEUE = lease_settings(OUTPUT_MAX_BYTES=1000)
    job = enqueue("flood", {"text": "0123456789", "times": 500})

    run_one()

    output = event(job, EventType.COMPLETED).metadata["output"]
    assert len(output["stdout"]) == 1000
    assert output["stdout"].endswith("789END")
    assert output["truncated"] == {"stdout": 5003 - 1000}


def test_cut_through_a_multibyte_character_keeps_valid_text():
    with capture.Capture(limit=1001) as out:
        sys.stdout.write("é" * 2000)  # two bytes each

    text = out.value()["stdout"]
    assert text == "é" * 500
    assert out.value()["truncated"] == {"stdout": 4000 - 1000}


@pytest.mark.django_db
def test_zero_output_max_bytes_turns_capture_off(settings, capsys):
    settings.JOBQUEUE = lease_settings(OUTPUT_MAX_BYTES=0)
    job = enqueue("chatty", {"n": 3})

    run_one()

    assert "output" not in event(job, EventType.COMPLETED).metadata
    assert "hello 3" in capsys.readouterr().out


@pytest.mark.django_db
def test_log_records_a_handler_emits_are_captured_with_it():
    job = enqueue("logs", {"what": "the database"})

    run_one()

    log = event(job, EventType.COMPLETED).metadata["output"]["log"]
    assert "WARNING tests.capture: careful with the database" in log
    assert "not let through" not in log


def test_each_thread_captures_only_what_it_writes(capsys):
    results = {}

    def job(n):
        with capture.Capture(limit=10_000) as out:
            for i in range(50):
                print(f"token-{n} {i}")
                if i % 10 == 0:
                    time.sleep(0.001)
        results[n] = out.value()["stdout"]

    threads = [threading.Thread(target=job, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    print("from the main thread, not captured")
    for t in threads:
        t.join(30)

    assert sorted(results) == list(range(8))
    for n, text in results.items():
        assert text == "".join(f"token-{n} {i}\n" for i in range(50))
    assert "from the main thread, not captured" in capsys.readouterr().out


@pytest.mark.parametrize("batch", [1, 10])  # settled by execute(); by batched acks
@pytest.mark.django_db(transaction=True)
def test_worker_threads_keep_each_jobs_output_apart(batch):
    jobs = bulk_enqueue([{"kind": "interleaved", "payload": {"n": n}} for n in range(24)])

    assert run_worker(burst=True, concurrency=1, threads=4, batch=batch) == 0

    for job in jobs:
        output = event(job, EventType.COMPLETED).metadata["output"]
        n = job.payload["n"]
        assert output == {"stdout": "".join(f"job {n} line {i}\n" for i in range(5))}


@pytest.mark.django_db(transaction=True)
def test_shell_job_output_is_kept_by_a_real_worker(settings):
    settings.JOBQUEUE = lease_settings(SHELL_JOBS=True)
    registry.register("shell", shell.run)
    job = enqueue("shell", {"command": "sh -c 'echo out; echo err >&2'"})

    assert run_worker(burst=True) == 0

    assert event(job, EventType.COMPLETED).metadata["output"] == {"stdout": "out\n", "stderr": "err\n"}


@pytest.mark.django_db
def test_history_shows_each_attempts_output():
    job = enqueue("flaky_chatty", max_attempts=3)
    run_one()
    Job.objects.filter(id=job.id).update(run_at=Job.objects.get(id=job.id).created_at)
    run_one()

    out = StringIO()
    call_command("history", str(job.id), "--json", stdout=out)
    attempts = json.loads(out.getvalue())["attempts"]
    assert [a["outcome"] for a in attempts] == ["failed", "completed"]
    assert [a["output"] for a in attempts] == [
        {"stdout": "attempt 1 starting\n"},
        {"stdout": "attempt 2 starting\n"},
    ]

    out = StringIO()
    call_command("history", str(job.id), stdout=out)
    text = out.getvalue()
    assert "stdout:\n    attempt 1 starting" in text
    assert "stdout:\n    attempt 2 starting" in text


@pytest.mark.django_db
def test_history_says_when_output_was_cut(settings):
    settings.JOBQUEUE = lease_settings(OUTPUT_MAX_BYTES=100)
    job = enqueue("flood", {"text": "x", "times": 150})
    run_one()

    out = StringIO()
    call_command("history", str(job.id), stdout=out)

    assert "stdout (the last part; 53 earlier bytes dropped):" in out.getvalue()


@pytest.mark.django_db
def test_dashboard_job_page_shows_each_attempts_output(admin_client):
    job = enqueue("fails_loudly", max_attempts=1)
    run_one()

    page = admin_client.get(reverse("queue_app_dashboard:job", args=[job.id])).content.decode()

    assert "Captured output" in page
    assert "step 1 ok" in page
    assert "step 2 about to break" in page


@pytest.mark.django_db
def test_dashboard_escapes_captured_output(admin_client):
    registry.register("html", lambda payload: print("<script>alert(1)</script>"))
    job = enqueue("html")
    run_one()

    page = admin_client.get(reverse("queue_app_dashboard:job", args=[job.id])).content.decode()

    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<script>alert(1)" not in page


@pytest.mark.django_db
def test_admin_event_inline_shows_captured_output(admin_client):
    job = enqueue("chatty", {"n": 42})
    run_one()

    page = admin_client.get(reverse("admin:queue_app_job_change", args=[job.id])).content.decode()

    assert "hello 42" in page
    assert "warning: disk nearly full" in page
    assert State.COMPLETED in page


# --- the log handler outside a job ----------------------------------------------------------------


@pytest.fixture
def isolated_logger():
    """A logger whose records stop at it, as a site's records stop at a root holding only
    our handler (pytest's own handlers sit on the real root)."""
    made = []

    def make(name, *handlers):
        logger = logging.getLogger(name)
        logger.propagate = False
        for handler in handlers:
            logger.addHandler(handler)
        made.append((logger, handlers))
        return logger

    yield make
    for logger, handlers in made:
        for handler in handlers:
            logger.removeHandler(handler)
        logger.propagate = True


def test_a_warning_outside_a_job_reaches_the_last_resort_when_nothing_else_would_show_it(
    monkeypatch, isolated_logger
):
    seen = StringIO()
    monkeypatch.setattr(logging, "lastResort", logging.StreamHandler(seen))
    logger = isolated_logger("jq-plain-site", capture._ThreadLogHandler())

    logger.warning("lease lost id=%s", 7)
    logger.info("chatter")  # below the last resort's level (WARNING), as without us

    assert seen.getvalue() == "lease lost id=7\n"


def test_a_warning_outside_a_job_is_left_to_the_sites_own_handler(monkeypatch, isolated_logger):
    seen, site = StringIO(), StringIO()
    monkeypatch.setattr(logging, "lastResort", logging.StreamHandler(seen))
    logger = isolated_logger("jq-configured-site", capture._ThreadLogHandler(), logging.StreamHandler(site))

    logger.warning("lease lost id=%s", 7)

    assert (seen.getvalue(), site.getvalue()) == ("", "lease lost id=7\n")

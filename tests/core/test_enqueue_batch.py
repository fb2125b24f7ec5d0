"""bulk_enqueue()'s fast paths (options checked once per batch, payloads encoded once,
rows built from a template, COPY on PostgreSQL, shared literals on MariaDB) store and
return what the one-by-one path would, and refuse what it refuses."""

import pytest

from queue_app import bulk_enqueue, enqueue
from queue_app.exceptions import InvalidJob
from queue_app.models import Event, EventType, Job

pytestmark = pytest.mark.django_db


def nothing_written():
    return Job.objects.count() == 0 and Event.objects.count() == 0


def read_back(jobs):
    return {job.id: job for job in Job.objects.filter(id__in=[j.id for j in jobs])}


def test_returned_jobs_match_their_rows_and_each_has_one_enqueued_event():
    specs = [
        {"kind": "echo", "payload": {"n": i, "text": "50% \"off\" 'now' \\ é 😀"}, "priority": i % 3}
        for i in range(1200)
    ]
    specs += [{"kind": "echo", "payload": {"same": "100%"}, "queue_name": "q2"} for _ in range(300)]
    jobs = bulk_enqueue(specs)
    stored = read_back(jobs)
    assert len(stored) == 1500
    for job in jobs:
        row = stored[job.id]
        assert (row.kind, row.payload, row.priority, row.queue_name, row.run_at, row.created_at) == (
            job.kind,
            job.payload,
            job.priority,
            job.queue_name,
            job.run_at,
            job.created_at,
        )
        assert job._state.adding is False and job._state.db == "default"
    assert [j.payload["n"] for j in jobs[:1200]] == list(range(1200))
    assert [j.id for j in jobs] == sorted(j.id for j in jobs)
    events = Event.objects.filter(job_id__in=stored)
    assert (
        events.count() == 1500
        and events.filter(type=EventType.ENQUEUED).values("job_id").distinct().count() == 1500
    )
    assert Event.objects.get(job_id=jobs[1300].id).metadata["queue"] == "q2"


def test_a_returned_job_saves_as_an_update_not_an_insert():
    (job,) = bulk_enqueue([{"kind": "echo"}])
    job.priority = 5
    job.save(update_fields=["priority"])
    assert Job.objects.get(id=job.id).priority == 5 and Job.objects.count() == 1


def test_payloads_are_stored_and_returned_as_json_gives_them_back():
    jobs = bulk_enqueue(
        [{"kind": "echo", "payload": {"t": (1, 2), 3: "x"}}, {"kind": "echo", "payload": [None, 1.5]}]
    )
    assert jobs[0].payload == {"t": [1, 2], "3": "x"} and jobs[1].payload == [None, 1.5]
    stored = read_back(jobs)
    assert [stored[j.id].payload for j in jobs] == [{"t": [1, 2], "3": "x"}, [None, 1.5]]


def test_escaped_looking_text_is_accepted_and_real_nul_and_surrogates_are_refused():
    (job,) = bulk_enqueue([{"kind": "echo", "payload": {"s": "\\u0000 \\ud800 😀"}}])
    assert Job.objects.get(id=job.id).payload == {"s": "\\u0000 \\ud800 😀"}
    for bad, words in (({"s": "a\x00b"}, "NUL"), ({"s": "\ud800"}, "surrogate"), ({"k\x00": 1}, "NUL")):
        with pytest.raises(InvalidJob, match=words):
            bulk_enqueue([{"kind": "echo"}, {"kind": "echo", "payload": bad}])
    assert Job.objects.count() == 1


def test_options_equal_to_an_earlier_entrys_but_of_another_type_are_checked_again():
    with pytest.raises(InvalidJob, match="job 2: priority must be an integer, got True"):
        bulk_enqueue(
            [
                {"kind": "echo", "priority": 1},
                {"kind": "echo", "priority": 1},
                {"kind": "echo", "priority": True},
            ]
        )
    with pytest.raises(InvalidJob, match="job 1: kind"):
        bulk_enqueue([{"kind": "echo"}, {"kind": "bad kind"}])
    assert nothing_written()


def test_a_bad_kind_is_reported_before_a_bad_queue_name_as_enqueue_does():
    with pytest.raises(InvalidJob) as one:
        enqueue("bad kind", {}, queue_name="bad queue")
    with pytest.raises(InvalidJob) as batch:
        bulk_enqueue([{"kind": "bad kind", "queue_name": "bad queue"}])
    assert "kind" in str(one.value) and str(batch.value) == f"job 0: {one.value}"
    assert nothing_written()


def test_a_value_shared_by_every_row_keeps_its_percent_signs_and_quotes():
    from django.db import connection

    from queue_app.engines import rows

    jobs = bulk_enqueue([{"kind": "echo"}, {"kind": "echo"}])
    message = "100% done, 'quoted' \"twice\" %s %%"
    at = connection.ops.adapt_datetimefield_value(jobs[0].created_at)
    rows.insert_events(
        connection,
        [
            rows.event_params(
                connection, job.id, EventType.ENQUEUED, at, 0, "", "", "", message, {"p": "50%"}
            )
            for job in jobs
        ],
    )
    written = Event.objects.filter(message=message)
    assert written.count() == 2 and {e.metadata["p"] for e in written} == {"50%"}

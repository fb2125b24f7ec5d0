"""enqueue() and bulk_enqueue(): what they write, and what they refuse."""

from datetime import UTC, datetime, timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from queue_app import bulk_enqueue, enqueue
from queue_app.exceptions import InvalidJob
from queue_app.models import Event, Job

pytestmark = pytest.mark.django_db


def nothing_written():
    return Job.objects.count() == 0 and Event.objects.count() == 0


def test_enqueue_uses_defaults_from_settings(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "DEFAULT_MAX_ATTEMPTS": 7, "DEFAULT_QUEUE": "main"}
    job = enqueue("echo")
    assert (job.queue_name, job.max_attempts, job.priority, job.payload) == ("main", 7, 0, {})
    assert job.was_created is True


def test_run_after_schedules_relative_to_now():
    before = timezone.now()
    job = enqueue("echo", {}, run_after=timedelta(minutes=5))
    assert before + timedelta(minutes=5) <= job.run_at <= timezone.now() + timedelta(minutes=5)
    assert enqueue("echo", {}, run_after=90).run_at >= before + timedelta(seconds=90)


def test_run_at_is_stored_with_microseconds():
    when = datetime(2030, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
    job = enqueue("echo", {}, run_at=when)
    job.refresh_from_db()
    assert job.run_at == when


def test_same_idempotency_key_returns_the_existing_job():
    first = enqueue("echo", {"n": 1}, idempotency_key="order-42")
    second = enqueue("echo", {"n": 2}, idempotency_key="order-42")
    assert second.id == first.id
    assert second.was_created is False
    assert Job.objects.count() == 1
    assert Event.objects.count() == 1


def test_idempotent_enqueue_inside_an_outer_transaction_leaves_it_usable():
    enqueue("echo", {}, idempotency_key="k")
    with transaction.atomic():
        again = enqueue("echo", {}, idempotency_key="k")
        other = enqueue("echo", {})
    assert again.was_created is False
    assert Job.objects.count() == 2 and other.id


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"colour": "red"}, "unknown field"),
        ({"run_at": datetime(2030, 1, 1, tzinfo=UTC), "run_after": 5}, "not both"),
        ({"priority": 101}, "out of range"),
        ({"priority": -101}, "out of range"),
        ({"priority": "high"}, "integer"),
        ({"priority": True}, "integer"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_attempts": 10**9}, "max_attempts"),
        ({"timeout": -1}, "timeout"),
        ({"timeout": float("inf")}, "timeout"),
        ({"timeout": 10**12}, "timeout"),
        ({"run_after": -5}, "run_after"),
        ({"run_after": 10**12}, "run_after"),
        ({"run_after": datetime(2030, 1, 1, tzinfo=UTC)}, "use run_at"),
        ({"run_at": datetime(2030, 1, 1)}, "timezone-aware"),
        ({"run_at": datetime(9000, 1, 1, tzinfo=UTC)}, "10 years"),
        ({"run_at": datetime(1, 1, 1, 1, tzinfo=timezone.get_fixed_timezone(300))}, "out of range"),
        ({"run_at": datetime(1900, 1, 1, tzinfo=UTC)}, "10 years ago"),
        ({"run_at": "tomorrow"}, "datetime"),
        ({"idempotency_key": "k" * 256}, "256 characters"),
        ({"idempotency_key": ""}, "idempotency_key"),
        ({"concurrency_key": "k" * 256}, "concurrency_key is 256 characters; the limit is 255"),
        ({"concurrency_key": ""}, "concurrency_key must be a non-empty string"),
        ({"concurrency_key": 42}, "concurrency_key must be a non-empty string"),
        ({"concurrency_key": "a\x00b"}, "concurrency_key may not contain the NUL"),
        ({"queue_name": "has space"}, "queue_name"),
        ({"queue_name": "q" * 101}, "queue_name"),
    ],
)
def test_bad_options_are_refused_with_a_message_and_nothing_written(kwargs, message):
    with pytest.raises(InvalidJob, match=message):
        enqueue("echo", {}, **kwargs)
    assert nothing_written()


@pytest.mark.parametrize(
    "kind, payload, message",
    [
        ("", {}, "kind"),
        ("k" * 201, {}, "kind"),
        (None, {}, "kind"),
        ("echo", {"when": datetime.now(UTC)}, "not JSON-serializable"),
        ("echo", {"x": float("nan")}, "not JSON-serializable"),
        ("echo", {"s": {1, 2}}, "not JSON-serializable"),
    ],
)
def test_bad_kind_or_payload_is_refused_and_nothing_written(kind, payload, message):
    with pytest.raises(InvalidJob, match=message):
        enqueue(kind, payload)
    assert nothing_written()


def test_payload_over_the_size_limit_is_refused(settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "MAX_PAYLOAD_BYTES": 100}
    with pytest.raises(InvalidJob, match="limit is 100"):
        enqueue("echo", {"blob": "x" * 200})
    assert nothing_written()


def test_invalid_job_names_the_field():
    with pytest.raises(InvalidJob) as info:
        enqueue("echo", {}, priority=500)
    assert info.value.field == "priority"


def test_bulk_enqueue_inserts_thousands_in_order_with_one_event_each():
    specs = [{"kind": "echo", "payload": {"i": i}, "priority": i % 5} for i in range(3000)]
    jobs = bulk_enqueue(specs)
    assert [j.payload["i"] for j in jobs] == list(range(3000))
    assert len({j.id for j in jobs}) == 3000
    assert Job.objects.count() == 3000
    assert Event.objects.filter(type="enqueued").count() == 3000


def test_bulk_enqueue_with_keys_returns_existing_jobs():
    existing = enqueue("echo", {}, idempotency_key="a")
    jobs = bulk_enqueue(
        [{"kind": "echo", "idempotency_key": "a"}, {"kind": "echo"}, {"kind": "echo", "idempotency_key": "b"}]
    )
    assert jobs[0].id == existing.id
    assert Job.objects.count() == 3


def test_one_bad_entry_refuses_the_whole_batch():
    with pytest.raises(InvalidJob, match="job 2: priority"):
        bulk_enqueue([{"kind": "echo"}, {"kind": "echo"}, {"kind": "echo", "priority": 1000}])
    assert nothing_written()


def test_bulk_entry_without_kind_is_refused():
    with pytest.raises(InvalidJob, match="job 0: kind is required"):
        bulk_enqueue([{"payload": {}}])
    assert nothing_written()


def test_database_refuses_rows_that_break_its_constraints():
    from django.db import IntegrityError

    from tests.factories import JobFactory

    for bad in ({"priority": 500}, {"max_attempts": 0}, {"state": "bogus"}, {"state": "leased"}):
        with pytest.raises(IntegrityError), transaction.atomic():
            JobFactory(**bad)
    assert Job.objects.count() == 0


# --- per-job backoff options ---------------------------------------------------------------


def test_backoff_options_are_stored_on_the_job():
    job = enqueue("echo", {}, backoff_base=3, backoff_max=timedelta(minutes=2), backoff_jitter=True)
    job.refresh_from_db()
    assert (job.backoff_base, job.backoff_max, job.backoff_jitter) == (3.0, 120.0, True)
    [bulk] = bulk_enqueue([{"kind": "echo", "backoff_base": 1.5, "backoff_jitter": False}])
    bulk.refresh_from_db()
    assert (bulk.backoff_base, bulk.backoff_max, bulk.backoff_jitter) == (1.5, None, False)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"backoff_base": 0.5}, r"backoff_base 0.5 is out of range 1..100"),
        ({"backoff_base": 101}, r"backoff_base 101 is out of range 1..100"),
        ({"backoff_base": "2"}, "backoff_base must be a number"),
        ({"backoff_base": True}, "backoff_base must be a number"),
        ({"backoff_base": float("nan")}, "backoff_base must be a number"),
        ({"backoff_max": 0}, "backoff_max must be > 0"),
        ({"backoff_max": -1}, "backoff_max must be > 0"),
        ({"backoff_max": 8 * 24 * 3600}, "backoff_max 691200s is more than the limit of 604800s"),
        ({"backoff_max": "1h"}, "backoff_max must be a number of seconds"),
        ({"backoff_jitter": "yes"}, "backoff_jitter must be true or false"),
        ({"backoff_jitter": 1}, "backoff_jitter must be true or false"),
    ],
)
def test_bad_backoff_options_are_refused_and_nothing_written(kwargs, message):
    with pytest.raises(InvalidJob, match=message) as info:
        enqueue("echo", {}, **kwargs)
    assert info.value.field == next(iter(kwargs))
    with pytest.raises(InvalidJob, match=message):
        bulk_enqueue([{"kind": "echo"}, {"kind": "echo", **kwargs}])
    assert nothing_written()


def test_manage_py_enqueue_takes_backoff_flags_and_the_json_document_form():
    from io import StringIO

    from django.core.management import call_command

    call_command(
        "enqueue",
        "--kind",
        "echo",
        "--backoff-base",
        "3",
        "--backoff-max",
        "10m",
        "--backoff-jitter",
        stdout=StringIO(),
    )
    call_command(
        "enqueue", '{"kind": "echo", "backoff_max": "90s", "backoff_jitter": false}', stdout=StringIO()
    )
    assert list(Job.objects.order_by("id").values_list("backoff_base", "backoff_max", "backoff_jitter")) == [
        (3.0, 600.0, True),
        (None, 90.0, False),
    ]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--backoff-base", "0.5"], "backoff_base 0.5 is out of range"),
        (["--backoff-max", "8d"], "backoff_max 691200.0s is more than the limit"),
        (["--no-backoff-jitter", "--backoff-base", "1000"], "backoff_base 1000.0 is out of range"),
    ],
)
def test_manage_py_enqueue_refuses_bad_backoff_flags_and_writes_nothing(args, message):
    from io import StringIO

    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match=message):
        call_command("enqueue", "--kind", "echo", *args, stdout=StringIO())
    assert nothing_written()


def _api_post(body):
    import json

    from django.test import Client

    from queue_app.web import auth as api_auth

    client = Client(headers={"X-API-Key": api_auth.create("backoff")[1]})
    return client.post("/api/jobs", json.dumps(body), content_type="application/json")


def test_post_api_jobs_takes_backoff_options_and_returns_them():
    r = _api_post({"kind": "echo", "backoff_base": 4, "backoff_max": 300, "backoff_jitter": True})
    assert r.status_code == 201, r.content
    assert {k: r.json()[k] for k in ("backoff_base", "backoff_max", "backoff_jitter")} == {
        "backoff_base": 4.0,
        "backoff_max": 300.0,
        "backoff_jitter": True,
    }
    job = Job.objects.get(id=r.json()["id"])
    assert (job.backoff_base, job.backoff_max, job.backoff_jitter) == (4.0, 300.0, True)


@pytest.mark.parametrize(
    "body, field",
    [
        ({"backoff_base": 0}, "backoff_base"),
        ({"backoff_base": 1e9}, "backoff_base"),
        ({"backoff_max": -5}, "backoff_max"),
        ({"backoff_max": 10**7}, "backoff_max"),
        ({"backoff_jitter": "yes"}, "backoff_jitter"),
        ({"backoff_jitter": 1}, "backoff_jitter"),
    ],
)
def test_post_api_jobs_refuses_bad_backoff_options_with_400_and_writes_nothing(body, field):
    r = _api_post({"kind": "echo", **body})
    assert r.status_code == 400, r.content
    assert r.json()["field"] == field
    assert field in r.json()["error"]
    assert nothing_written()


# --- concurrency key (per-key limits, flow.py) ---------------------------------------------


def test_a_concurrency_key_is_stored_and_named_in_the_enqueued_event_on_every_path():
    plain = enqueue("echo", {}, concurrency_key="customer:42")
    keyed = enqueue("echo", {}, concurrency_key="customer:42", idempotency_key="once")
    # Two or more rows: the multi-row INSERT (COPY on PostgreSQL).
    batch = bulk_enqueue(
        [{"kind": "echo", "concurrency_key": f"customer:{n}"} for n in range(3)] + [{"kind": "echo"}]
    )
    stored = dict(Job.objects.values_list("id", "concurrency_key"))
    assert [stored[j.id] for j in (plain, keyed, *batch)] == [
        "customer:42",
        "customer:42",
        "customer:0",
        "customer:1",
        "customer:2",
        None,
    ]
    assert [j.concurrency_key for j in (plain, keyed, *batch)] == [
        stored[j.id] for j in (plain, keyed, *batch)
    ]
    meta = {e.job_id: e.metadata for e in Event.objects.filter(type="enqueued")}
    assert [meta[j.id].get("concurrency_key") for j in (plain, keyed, *batch)] == [
        "customer:42",
        "customer:42",
        "customer:0",
        "customer:1",
        "customer:2",
        None,
    ]


def test_a_bad_concurrency_key_in_a_batch_refuses_the_whole_batch():
    with pytest.raises(InvalidJob, match="job 1: concurrency_key") as info:
        bulk_enqueue([{"kind": "echo", "concurrency_key": "a"}, {"kind": "echo", "concurrency_key": ["a"]}])
    assert info.value.field == "concurrency_key"
    assert nothing_written()


def test_manage_py_enqueue_takes_a_concurrency_key_as_a_flag_or_in_the_document():
    from io import StringIO

    from django.core.management import call_command

    call_command("enqueue", "--kind", "echo", "--concurrency-key", "customer:42", stdout=StringIO())
    call_command("enqueue", '{"kind": "echo", "concurrency_key": "customer:7"}', stdout=StringIO())
    assert list(Job.objects.order_by("id").values_list("concurrency_key", flat=True)) == [
        "customer:42",
        "customer:7",
    ]
    out = StringIO()
    call_command("history", str(Job.objects.order_by("id").first().id), stdout=out)
    assert "concurrency key: customer:42" in out.getvalue()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--kind", "echo", "--concurrency-key", ""], "concurrency_key must be a non-empty string"),
        (["--kind", "echo", "--concurrency-key", "k" * 256], "concurrency_key is 256 characters"),
        (['{"kind": "echo", "concurrency_key": 42}'], "concurrency_key must be a non-empty string"),
    ],
)
def test_manage_py_enqueue_refuses_a_bad_concurrency_key_with_status_2_and_writes_nothing(args, message):
    from io import StringIO

    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match=message) as err:
        call_command("enqueue", *args, stdout=StringIO())
    assert err.value.returncode == 2
    assert nothing_written()


def _api_client():
    from django.test import Client

    from queue_app.web import auth as api_auth

    return Client(headers={"X-API-Key": api_auth.create("keys")[1]})


def test_post_api_jobs_takes_a_concurrency_key_and_returns_it():
    client = _api_client()
    r = client.post(
        "/api/jobs", {"kind": "echo", "concurrency_key": "customer:42"}, content_type="application/json"
    )
    assert r.status_code == 201, r.content
    assert r.json()["concurrency_key"] == "customer:42"
    assert Job.objects.get(id=r.json()["id"]).concurrency_key == "customer:42"
    unkeyed = client.post("/api/jobs", {"kind": "echo"}, content_type="application/json")
    assert unkeyed.status_code == 201 and unkeyed.json()["concurrency_key"] is None
    bulk = client.post(
        "/api/jobs/bulk",
        {"jobs": [{"kind": "echo", "concurrency_key": "customer:7"}] * 2},
        content_type="application/json",
    )
    assert bulk.status_code == 201, bulk.content
    assert [j["concurrency_key"] for j in bulk.json()] == ["customer:7", "customer:7"]


@pytest.mark.parametrize("value", ["", "k" * 256, 42, ["a"], "a\x00b"])
def test_post_api_jobs_refuses_a_bad_concurrency_key_with_400_and_writes_nothing(value):
    client = _api_client()
    body = {"kind": "echo", "concurrency_key": value}
    r = client.post("/api/jobs", body, content_type="application/json")
    assert r.status_code == 400, r.content
    assert r.json()["field"] == "concurrency_key"
    bulk = client.post("/api/jobs/bulk", {"jobs": [{"kind": "echo"}, body]}, content_type="application/json")
    assert bulk.status_code == 400, bulk.content
    assert nothing_written()


def test_a_run_at_in_the_past_is_ready_now_and_earns_no_aging_head_start():
    before = timezone.now()
    job = enqueue("echo", {}, run_at=before - timedelta(days=30))
    assert before <= job.run_at <= timezone.now()


@pytest.mark.django_db
def test_idempotency_keys_are_exact_strings_on_every_database():
    """MariaDB's default collation would make "Key", "key" and "key " one key (0010)."""
    jobs = [enqueue("echo", idempotency_key=key) for key in ("Key", "key", "key ", "key")]
    assert [job.was_created for job in jobs] == [True, True, True, False]
    assert jobs[3].id == jobs[1].id


# Single enqueues share their validated options within a process (validation._shared_checks):
# what is shared must never let a changed setting, a bad payload or a bad kind through.


def test_shared_option_checks_see_a_changed_default_at_once(settings):
    assert enqueue("echo", {}, priority=3).queue_name == "default"
    settings.JOBQUEUE = {**settings.JOBQUEUE, "DEFAULT_QUEUE": "other", "DEFAULT_MAX_ATTEMPTS": 9}
    job = enqueue("echo", {}, priority=3)
    assert (job.queue_name, job.max_attempts) == ("other", 9)


def test_shared_option_checks_still_check_each_payload_and_kind():
    enqueue("echo", {"a": 1}, priority=5)
    with pytest.raises(InvalidJob, match="payload"):
        enqueue("echo", {"bad": {1, 2}}, priority=5)
    with pytest.raises(InvalidJob, match="kind"):
        enqueue("", {}, priority=5)
    with pytest.raises(InvalidJob, match="priority"):
        enqueue("echo", {}, priority=500)
    assert Job.objects.count() == 1 and Event.objects.count() == 1


def test_shared_option_checks_keep_each_call_its_own_values():
    first = enqueue("echo", {"n": 1}, priority=7, concurrency_key="t1")
    second = enqueue("other", {"n": 2}, priority=7, concurrency_key="t1")
    third = enqueue("echo", {"n": 3}, priority=8, concurrency_key="t2")
    got = [(j.kind, j.payload, j.priority, j.concurrency_key) for j in (first, second, third)]
    assert got == [("echo", {"n": 1}, 7, "t1"), ("other", {"n": 2}, 7, "t1"), ("echo", {"n": 3}, 8, "t2")]

"""The admin through Django's test client: permissions, filters, search, and each
action writing its event (or nothing, when refused)."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from queue_app.models import DeadLetter, Event, Job, State, Worker
from queue_app.ops import actions as operations
from tests.factories import DeadLetterFactory, EventFactory, JobFactory, make_staff
from tests.support import last_event

pytestmark = pytest.mark.django_db

CHANGELIST = "admin:queue_app_job_changelist"


@pytest.fixture
def viewer(client):
    client.force_login(make_staff("viewer", "queue_app.view_job", "queue_app.view_event"))
    return client


@pytest.fixture
def operator(client):
    perms = [
        "view_job",
        "change_job",
        "delete_job",
        "view_event",
        "view_deadletter",
        "view_worker",
        "change_worker",
        "view_unredacted_payload",
    ]
    client.force_login(make_staff("op", *[f"queue_app.{p}" for p in perms]))
    return client


def changelist(query=""):
    return reverse(CHANGELIST) + query


def act(client, action, ids=(), query="", **extra):
    data = {"action": action, "_selected_action": [str(i) for i in ids], "index": "0", **extra}
    return client.post(changelist(query), data, follow=True)


def confirm(client, action, ids=(), query="", **extra):
    """The second step of an action with a form: what the intermediate page posts."""
    data = {"action": action, "_selected_action": [str(i) for i in ids], "confirm": "yes", **extra}
    data["select_across"] = "1" if action.endswith("_matching") else "0"
    return client.post(changelist(query), data, follow=True)


def shown_ids(response):
    return [job.id for job in response.context["cl"].result_list]


# --- access --------------------------------------------------------------------------------


def test_anonymous_visitor_is_sent_to_the_admin_login(client):
    response = client.get(changelist())
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))


def test_staff_without_permission_gets_403(client):
    client.force_login(make_staff("bare"))
    assert client.get(changelist()).status_code == 403


def test_viewer_sees_the_list_but_no_actions(viewer):
    job = JobFactory(kind="email")
    response = viewer.get(changelist())
    assert response.status_code == 200
    assert shown_ids(response) == [job.id]
    assert b"Requeue selected jobs" not in response.content


def test_viewer_posting_an_action_changes_nothing(viewer):
    job = JobFactory()
    act(viewer, "cancel", [job.id])
    assert Job.objects.get(id=job.id).state == State.PENDING
    assert not Event.objects.filter(job=job).exists()


def test_job_change_page_is_read_only_and_shows_the_timeline(operator):
    job = JobFactory()
    EventFactory(job=job, type="enqueued", message="hello timeline")
    url = reverse("admin:queue_app_job_change", args=[job.id])
    response = operator.get(url)
    assert response.status_code == 200
    assert b"hello timeline" in response.content
    assert b'name="_save"' not in response.content
    assert operator.post(url, {"state": "completed"}).status_code == 403
    assert Job.objects.get(id=job.id).state == State.PENDING


def test_jobs_cannot_be_added_from_the_admin(operator):
    assert operator.get(reverse("admin:queue_app_job_add")).status_code == 403


def test_events_are_append_only_in_the_admin(operator):
    event = EventFactory()
    assert operator.get(reverse("admin:queue_app_event_changelist")).status_code == 200
    assert operator.get(reverse("admin:queue_app_event_add")).status_code == 403
    change = reverse("admin:queue_app_event_change", args=[event.id])
    assert operator.post(change, {"type": "completed"}).status_code == 403
    assert (
        operator.post(reverse("admin:queue_app_event_delete", args=[event.id]), {"post": "yes"}).status_code
        == 403
    )
    assert Event.objects.get(id=event.id).type == "enqueued"


# --- list: filters, search, counts -----------------------------------------------------------


def test_status_filter_finds_retrying_scheduled_and_late_jobs(viewer):
    # Retrying is a failed job still waiting out its backoff; once run_at passes it is ready.
    retrying = JobFactory(attempts=1, scheduled=True)
    scheduled = JobFactory(scheduled=True)
    late = JobFactory(run_at=timezone.now() - timedelta(hours=1))
    JobFactory(dead=True)
    assert shown_ids(viewer.get(changelist("?status=retrying"))) == [retrying.id]
    assert shown_ids(viewer.get(changelist("?status=scheduled"))) == [scheduled.id]
    assert shown_ids(viewer.get(changelist("?status=late"))) == [late.id]


def test_search_finds_jobs_by_id_kind_key_and_payload_text(client):
    client.force_login(make_staff("reader", "queue_app.view_job", "queue_app.view_unredacted_payload"))
    a = JobFactory(kind="email.send", idempotency_key="order-77", payload={"to": "ann@example.com"})
    JobFactory(kind="report", payload={"to": "bob@example.com"})
    for term in [str(a.id), f"%23{a.id}", "email", "order-77", "ann@example"]:
        assert shown_ids(client.get(changelist(f"?q={term}"))) == [a.id], term


def test_search_reads_no_payload_for_a_user_who_sees_it_redacted(viewer):
    # Else a search would say which job's redacted password holds the term.
    JobFactory(kind="login", payload={"password": "hunter2"})
    assert shown_ids(viewer.get(changelist("?q=hunter2"))) == []


def test_list_shows_a_capped_count_past_the_threshold(viewer, settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "OPS_COUNT_CAP": 3}
    JobFactory.create_batch(5)
    response = viewer.get(changelist())
    assert b"more than 3 jobs" in response.content


def test_search_and_select_all_say_more_than_the_cap_not_the_cap_plus_one(operator, settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "OPS_COUNT_CAP": 3, "DASHBOARD_PAGE_SIZE": 2}
    JobFactory.create_batch(5, kind="email")
    page = operator.get(changelist("?q=email")).content.decode()
    assert "more than 3 results" in page and "4 results" not in page
    assert "Select all (more than 3) jobs" in page and "All (more than 3) selected" in page


# --- actions ---------------------------------------------------------------------------------


def test_cancel_selected_cancels_only_those_and_writes_events(operator):
    a, b, untouched = JobFactory(), JobFactory(), JobFactory()
    response = act(operator, "cancel", [a.id, b.id])
    assert "Cancel: 2 jobs done." in response.content.decode()
    assert set(Job.objects.filter(state=State.CANCELLED).values_list("id", flat=True)) == {a.id, b.id}
    assert last_event(a).type == "cancelled" and last_event(a).worker == "admin:op"
    assert Job.objects.get(id=untouched.id).state == State.PENDING


def test_requeue_and_retry_now_write_their_events(operator):
    dead = JobFactory(dead=True)
    scheduled = JobFactory(scheduled=True)
    act(operator, "requeue", [dead.id])
    act(operator, "retry_now", [scheduled.id])
    assert Job.objects.get(id=dead.id).state == State.PENDING
    assert last_event(dead).type == "requeued"
    assert Job.objects.get(id=scheduled.id).run_at <= timezone.now()
    assert last_event(scheduled).type == "rescheduled"


def test_an_action_skips_jobs_whose_state_does_not_allow_it(operator):
    pending, done = JobFactory(), JobFactory(state=State.COMPLETED)
    response = act(operator, "cancel", [pending.id, done.id])
    # The operator is told what was done: one job, not two.
    assert "Cancel: 1 job done" in response.content.decode()
    assert Job.objects.get(id=pending.id).state == State.CANCELLED
    assert Job.objects.get(id=done.id).state == State.COMPLETED
    assert not Event.objects.filter(job=done).exists()


def test_cancel_every_job_matching_the_filter_reaches_past_the_page(operator, settings):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "OPS_BATCH_SIZE": 2}
    matching = JobFactory.create_batch(5, kind="email")
    other = JobFactory(kind="report")
    form = act(operator, "cancel_matching", [], query="?kind=email")
    assert "that can take it: 5 jobs" in form.content.decode()
    assert not Event.objects.filter(type="cancelled").exists()  # nothing until confirmed
    response = confirm(operator, "cancel_matching", [], query="?kind=email")
    assert "Cancel: 5 jobs done." in response.content.decode()
    assert all(Job.objects.get(id=j.id).state == State.CANCELLED for j in matching)
    assert Event.objects.filter(type="cancelled").count() == 5
    assert Job.objects.get(id=other.id).state == State.PENDING


@pytest.mark.parametrize(
    "action",
    [
        "cancel_matching",
        "requeue_matching",
        "retry_now_matching",
        "delete_matching",
        "change_priority_matching",
    ],
)
def test_an_action_over_every_matching_job_with_no_filter_is_refused_and_writes_nothing(operator, action):
    JobFactory.create_batch(3, kind="email")
    JobFactory(dead=True)
    before = (Event.objects.count(), Job.objects.count())
    for step in (act, confirm):  # neither the form nor a forged confirmation gets through
        response = step(operator, action, [], priority="5")
        assert "no filter or search is set" in response.content.decode()
    assert (Event.objects.count(), Job.objects.count()) == before
    assert not Job.objects.filter(priority=5).exists()


def test_change_priority_asks_for_the_value_then_writes_events(operator):
    a, b = JobFactory(priority=0), JobFactory(priority=0)
    form = act(operator, "change_priority", [a.id, b.id])
    assert b'name="priority"' in form.content
    assert Job.objects.get(id=a.id).priority == 0  # nothing yet
    confirm(operator, "change_priority", [a.id, b.id], priority="9")
    assert {Job.objects.get(id=j.id).priority for j in (a, b)} == {9}
    assert last_event(a).type == "priority_changed" and last_event(a).metadata == {"from": 0, "to": 9}


def test_change_priority_for_every_matching_job(operator):
    dead = JobFactory.create_batch(3, dead=True)
    JobFactory(priority=0)
    confirm(operator, "change_priority_matching", [], query="?status=dead_letter", priority="-5")
    assert [Job.objects.get(id=j.id).priority for j in dead] == [-5, -5, -5]
    assert Job.objects.filter(priority=-5).count() == 3


@pytest.mark.parametrize(
    "action, field, value, expected",
    [
        ("edit_payload", "payload", '{"broken": ', "payload is not valid JSON"),
        ("change_priority", "priority", "101", "out of range"),
    ],
)
def test_invalid_value_is_refused_with_a_message_and_nothing_written(
    operator, action, field, value, expected
):
    job = JobFactory(priority=1, payload={"keep": 1})
    response = confirm(operator, action, [job.id], **{field: value})
    text = response.content.decode()
    assert expected in text and "Nothing was changed" in text
    job.refresh_from_db()
    assert (job.priority, job.payload) == (1, {"keep": 1})
    assert not Event.objects.filter(job=job).exists()


def test_edit_payload_replaces_it_and_keeps_the_old_one_in_the_event(operator):
    job = JobFactory(payload={"old": True})
    confirm(operator, "edit_payload", [job.id], payload='{"new": [1, 2]}')
    assert Job.objects.get(id=job.id).payload == {"new": [1, 2]}
    event = last_event(job)
    assert event.type == "payload_changed" and event.metadata["previous_payload"] == {"old": True}


def test_delete_asks_first_and_then_removes_jobs_with_their_history(operator):
    job = JobFactory()
    EventFactory(job=job)
    act(operator, "delete", [job.id])
    assert Job.objects.filter(id=job.id).exists()
    confirm(operator, "delete", [job.id])
    assert not Job.objects.filter(id=job.id).exists()
    assert not Event.objects.filter(job_id=job.id).exists()


def test_delete_is_not_offered_without_the_delete_permission(client):
    client.force_login(make_staff("changer", "queue_app.view_job", "queue_app.change_job"))
    job = JobFactory()
    response = client.get(changelist())
    assert b"Cancel selected jobs" in response.content and b"Delete selected jobs" not in response.content
    confirm(client, "delete", [job.id])
    assert Job.objects.filter(id=job.id).exists()


def test_apply_many_stops_at_its_time_budget_and_continues_when_run_again():
    JobFactory.create_batch(5)
    first = operations.apply_many("cancel", Job.objects.all(), batch_size=2, seconds=0)
    assert (first.done, first.more) == (2, True)
    second = operations.apply_many("cancel", Job.objects.all(), batch_size=10, seconds=60)
    assert (second.done, second.more) == (3, False)
    assert Event.objects.filter(type="cancelled").count() == 5


def test_apply_many_refuses_a_bad_value_before_touching_any_job():
    JobFactory.create_batch(3)
    with pytest.raises(ValueError, match="out of range"):
        operations.apply_many("change_priority", Job.objects.all(), 1000)
    assert not Event.objects.exists()


# --- dead letters and workers -----------------------------------------------------------------


def test_dead_letter_admin_requeues_the_jobs(client):
    client.force_login(
        make_staff("dl", "queue_app.view_deadletter", "queue_app.change_job", "queue_app.view_job")
    )
    letter = DeadLetterFactory()
    url = reverse("admin:queue_app_deadletter_changelist")
    client.post(url, {"action": "requeue_jobs", "_selected_action": [letter.id], "index": "0"})
    assert Job.objects.get(id=letter.job_id).state == State.PENDING
    assert DeadLetter.objects.get(id=letter.id).resolution == "requeued"
    assert last_event(letter.job).type == "requeued"


def test_dead_letter_requeue_needs_the_change_job_permission(client):
    client.force_login(make_staff("dlv", "queue_app.view_deadletter"))
    letter = DeadLetterFactory()
    url = reverse("admin:queue_app_deadletter_changelist")
    client.post(url, {"action": "requeue_jobs", "_selected_action": [letter.id], "index": "0"})
    assert Job.objects.get(id=letter.job_id).state == State.DEAD_LETTER


def test_worker_admin_shows_heartbeat_age_and_stops_workers(operator):
    worker = Worker.objects.create(
        name="w1", host="h", pid=5, jobs_in_hand=3, last_heartbeat=timezone.now() - timedelta(hours=2)
    )
    url = reverse("admin:queue_app_worker_changelist")
    response = operator.get(url)
    text = response.content.decode()
    assert "2h 0m ago" in text and "lost" in text
    operator.post(url, {"action": "stop", "_selected_action": [worker.id], "index": "0"})
    assert Worker.objects.get(id=worker.id).stop_requested_at is not None


def test_the_worker_admins_quiet_action_asks_running_workers_only(operator):
    up = Worker.objects.create(name="up", host="h", pid=5)
    leaving = Worker.objects.create(name="leaving", host="h", pid=6, stop_requested_at=timezone.now())
    url = reverse("admin:queue_app_worker_changelist")
    response = operator.post(
        url, {"action": "quiet", "_selected_action": [up.id, leaving.id], "index": "0"}, follow=True
    )
    assert "Quiet requested for 1 worker." in response.content.decode()
    assert Worker.objects.get(id=up.id).quiet_requested_at is not None
    assert Worker.objects.get(id=leaving.id).quiet_requested_at is None


def test_editing_or_requeuing_shell_jobs_needs_the_shell_permission(operator):
    # change_job alone must not let an operator swap a shell job's command and run it.
    shell = JobFactory(dead=True, kind="shell", payload={"command": "echo hi"})
    other = JobFactory(dead=True, payload={"n": 1})

    response = confirm(
        operator, "edit_payload", [shell.id, other.id], payload='{"command": "cat /etc/passwd"}'
    )
    assert "needs the queue_app.enqueue_shell_job permission" in response.content.decode()
    act(operator, "requeue", [shell.id, other.id])

    shell.refresh_from_db()
    other.refresh_from_db()
    assert (shell.payload, shell.state) == ({"command": "echo hi"}, State.DEAD_LETTER)
    assert (other.payload, other.state) == ({"command": "cat /etc/passwd"}, State.PENDING)


def test_a_holder_of_the_shell_permission_may_requeue_a_shell_job(client):
    perms = ["view_job", "change_job", "enqueue_shell_job"]
    client.force_login(make_staff("root-op", *[f"queue_app.{p}" for p in perms]))
    shell = JobFactory(dead=True, kind="shell", payload={"command": "echo hi"})

    act(client, "requeue", [shell.id])

    assert Job.objects.get(id=shell.id).state == State.PENDING


def test_the_delete_page_of_a_job_deletes_through_the_one_delete_and_keeps_the_counts(operator):
    from queue_app import enqueue
    from queue_app.ops import metrics

    # A job with history is refused there (events are append-only in the admin).
    logged = enqueue("echo", {})
    url = reverse("admin:queue_app_job_delete", args=[logged.id])
    assert operator.post(url, {"post": "yes"}).status_code == 403
    job = JobFactory()  # no events: the page may delete it
    metrics.catch_up()  # counted: a delete that bypassed forget_jobs would leave it there
    url = reverse("admin:queue_app_job_delete", args=[job.id])
    assert operator.post(url, {"post": "yes"}, follow=True).status_code == 200
    assert not Job.objects.filter(id=job.id).exists()
    assert metrics.verify() == []

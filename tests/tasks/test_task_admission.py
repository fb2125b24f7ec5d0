"""@task and .using() take the debounce and unique options."""

import pytest
from django.tasks import TaskResultStatus
from django.tasks.exceptions import InvalidTask

from queue_app.models import Event, Job
from queue_app.tasks.backend import with_options
from queue_app.worker.execution import run_one
from tests import sample_tasks as tasks

pytestmark = pytest.mark.django_db


def test_using_debounces_a_task_and_returns_the_one_pending_result():
    debounced = tasks.add.using(debounce_key="sum", debounce_for=30)
    first = debounced.enqueue(1, 2)
    second = debounced.enqueue(3, 4)
    assert second.id == first.id and second.status == TaskResultStatus.READY
    assert second.args == [3, 4]
    assert Job.objects.get().payload == {"args": [3, 4], "kwargs": {}}
    assert Event.objects.filter(type="debounced").count() == 1


def test_a_task_declared_with_a_debounce_window_takes_its_key_per_call():
    windowed = with_options(tasks.add, debounce_for="1m", debounce_mode="keep")
    first = windowed.using(debounce_key="a").enqueue(1, 1)
    windowed.using(debounce_key="a").enqueue(2, 2)
    other = windowed.using(debounce_key="b").enqueue(3, 3)
    assert Job.objects.count() == 2 and other.id != first.id
    assert Job.objects.get(id=first.id).payload["args"] == [1, 1]


def test_using_unique_key_returns_the_pending_job():
    first = tasks.add.using(unique_key="u", unique_while="pending").enqueue(1, 2)
    assert tasks.add.using(unique_key="u", unique_while="pending").enqueue(5, 5).id == first.id
    assert Job.objects.count() == 1


def test_bad_options_are_refused_when_declared_or_at_enqueue_and_nothing_is_written():
    with pytest.raises(InvalidTask, match="debounce_mode must be"):
        tasks.add.using(debounce_key="k", debounce_for=1, debounce_mode="merge")
    with pytest.raises(InvalidTask, match="debounce_key needs debounce_for"):
        tasks.add.using(debounce_key="k").enqueue(1, 2)
    with pytest.raises(TypeError, match="unexpected keyword"):
        tasks.add.using(debounce_seconds=3)
    assert not Job.objects.exists()


def test_using_an_ordering_key_lines_task_calls_up_in_enqueue_order():
    ordered = tasks.add.using(ordering_key="sums", ordering_blocks=True, priority=0)
    results = [ordered.enqueue(n, 1) for n in range(3)]
    urgent = tasks.add.using(ordering_key="sums", priority=50).enqueue(9, 9)
    jobs = {j.id: j for j in Job.objects.all()}
    assert [jobs[int(r.id)].state for r in results] == ["pending", "waiting", "waiting"]
    assert jobs[int(urgent.id)].depends["after"] == int(results[-1].id)
    assert jobs[int(results[1].id)].depends["policy"] == "hold"
    ran = []
    while (job := run_one()) is not None:
        ran.append(job.id)
    assert ran == [int(r.id) for r in [*results, urgent]]
    with pytest.raises(TypeError, match="unexpected keyword"):
        tasks.add.using(ordering="x")

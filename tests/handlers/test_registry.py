"""registry: which modules a django.tasks kind may import, and what a failing import does."""

import sys
import threading
import time

import pytest

from jobqueue_project import tasks as project_tasks
from queue_app.core import enqueueing
from queue_app.handlers import registry
from queue_app.handlers.registry import UnknownTask
from queue_app.models import DeadLetter, State
from queue_app.worker.execution import run_one

TASK_SOURCE = "from django.tasks import task\n\n\n@task\ndef hello():\n    return 'hi'\n"


@pytest.fixture
def package(tmp_path, monkeypatch):
    """Write a package ``name`` with a ``tasks`` module of ``source`` on sys.path; drop it after."""
    written = []

    def make(name, source):
        root = tmp_path / name
        root.mkdir()
        (root / "__init__.py").write_text("")
        (root / "tasks.py").write_text(source)
        written.append(name)
        return root

    monkeypatch.syspath_prepend(str(tmp_path))
    yield make
    for name in written:
        for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[module]


def modules(settings, value):
    settings.JOBQUEUE = {**settings.JOBQUEUE, "TASK_MODULES": value}


def test_by_default_task_modules_are_the_installed_apps_and_the_project_package(settings):
    modules(settings, None)
    found = registry.task_modules()
    assert {"queue_app", "django.contrib.auth", "jobqueue_project"} <= set(found)
    assert "tests" not in found
    assert registry.get("jobqueue_project.tasks.add") is project_tasks.add


@pytest.mark.django_db
def test_a_kind_outside_task_modules_is_dead_lettered_without_importing_its_module(
    settings, package, tmp_path
):
    marker = tmp_path / "imported"
    package("jq_sec_outside", f"open({str(marker)!r}, 'w').close()\n" + TASK_SOURCE)
    modules(settings, None)
    job = enqueueing.enqueue("jq_sec_outside.tasks.hello", {"args": [], "kwargs": {}})
    ran = run_one()
    assert ran.id == job.id and ran.state == State.DEAD_LETTER and ran.attempts == 1
    assert "jq_sec_outside.tasks is outside the TASK_MODULES setting" in ran.last_error["message"]
    assert DeadLetter.objects.get(job=ran).reason == "not_retryable"
    assert not marker.exists() and "jq_sec_outside" not in sys.modules


def test_a_package_listed_in_task_modules_resolves_its_tasks(settings, package):
    package("jq_sec_listed", TASK_SOURCE)
    modules(settings, ["jq_sec_listed"])
    assert registry.is_task(registry.get("jq_sec_listed.tasks.hello"))
    # An entry covers its submodules, not a package whose name merely starts the same.
    package("jq_sec_listed_too", TASK_SOURCE)
    with pytest.raises(UnknownTask, match="outside the TASK_MODULES"):
        registry.get("jq_sec_listed_too.tasks.hello")


def test_an_empty_task_modules_refuses_even_the_project_tasks(settings):
    modules(settings, [])
    with pytest.raises(UnknownTask, match="jobqueue_project.tasks is outside the TASK_MODULES"):
        registry.get("jobqueue_project.tasks.add")


@pytest.mark.parametrize("top_level", ["raise ValueError('broken settings')", "import sys; sys.exit(3)"])
def test_an_import_that_raises_is_an_unknown_task_with_the_cause(settings, package, top_level):
    package("jq_sec_broken", top_level + "\n" + TASK_SOURCE)
    modules(settings, ["jq_sec_broken"])
    with pytest.raises(UnknownTask, match="module jq_sec_broken.tasks does not import") as caught:
        registry.get("jq_sec_broken.tasks.hello")
    assert isinstance(caught.value.__cause__, (ValueError, SystemExit))


@pytest.mark.django_db(transaction=True)
def test_a_real_worker_dead_letters_a_task_whose_module_raises_on_import_and_carries_on(settings, package):
    from tests.worker_support import run_worker

    package("jq_sec_boom", "raise RuntimeError('top-level boom')\n" + TASK_SOURCE)
    modules(settings, ["jq_sec_boom", "tests"])
    broken = enqueueing.enqueue("jq_sec_boom.tasks.hello", {"args": [], "kwargs": {}})
    fine = enqueueing.enqueue("echo", {"n": 1})
    assert run_worker(burst=True, concurrency=1, batch=2, poll=0.02) == 0
    broken.refresh_from_db()
    fine.refresh_from_db()
    assert broken.state == State.DEAD_LETTER and "top-level boom" in broken.last_error["message"]
    assert fine.state == State.COMPLETED


class _JobTaker:
    """A callable handler that compares by value, so it cannot be hashed."""

    def __eq__(self, other):
        return isinstance(other, _JobTaker)

    __hash__ = None

    def __call__(self, payload, job):
        return {"id": job.id, "seen": payload["n"]}


@pytest.mark.django_db
def test_handlers_get_the_job_when_they_ask_for_it_hashable_or_not():
    def plain(payload):
        return payload

    def with_job(payload, job):
        return job.id

    # Asked twice: the remembered answer must stay each function's own.
    for _ in range(2):
        assert registry.wants_job(plain) is False
        assert registry.wants_job(with_job) is True
        assert registry.wants_job(_JobTaker()) is True
    registry.register("unhashable", _JobTaker())
    try:
        job = enqueueing.enqueue("unhashable", {"n": 7})
        done = run_one()
        assert done.state == State.COMPLETED
        assert done.result == {"id": job.id, "seen": 7}
    finally:
        registry.unregister("unhashable")


def test_a_kind_whose_module_another_thread_is_still_importing_waits_for_that_import(settings, package):
    # A module in sys.modules may be half made: another thread is running its top-level
    # code. Resolving a kind from it then must wait, not report the Task missing.
    package("jq_slow_import", "import time\ntime.sleep(1)\n" + TASK_SOURCE)
    modules(settings, ["jq_slow_import"])
    found = {}

    def resolve(name):
        try:
            found[name] = registry.task_for("jq_slow_import.tasks.hello")
        except Exception as exc:  # what the second thread got, for the assertion
            found[name] = exc

    first = threading.Thread(target=resolve, args=("first",))
    first.start()
    deadline = time.monotonic() + 10
    while "jq_slow_import.tasks" not in sys.modules and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "jq_slow_import.tasks" in sys.modules  # the first thread is inside the import
    second = threading.Thread(target=resolve, args=("second",))
    second.start()
    first.join()
    second.join()
    assert found["second"] is found["first"], found
    assert found["first"].module_path == "jq_slow_import.tasks.hello"

"""The layout's rules, checked on the source: one writer of job state, events and dead
letters (core/transitions.py, through the engines); no import inside a function to hide
a cycle; the import-linter contract in pyproject.toml. Each guard is also shown a real
offence, planted in a temporary module, and must catch it."""

import ast
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "queue_app"

# Where job state, events and dead letters may be written: the state machine, the SQL it
# runs (engines/) and the tables' own definitions.
WRITERS = ("queue_app/core/transitions.py", "queue_app/engines/", "queue_app/models.py")

# ORM calls that write rows. With a state= keyword on any model they move a job; on the
# Event and DeadLetter models any of them writes the log.
WRITE_METHODS = {"update", "bulk_update", "create", "bulk_create", "get_or_create", "update_or_create"}
LOG_MODELS = {"Event", "DeadLetter"}
# Worker rows have a state of their own (running, stopping ...): the registry's, not a job's.
OTHER_STATES = {"Worker", "WorkerState"}
# The tables' names, as the engines spell them (rows.JOB_TABLE ...) or as SQL text does.
TABLE_CONSTANTS = {"JOB_TABLE", "EVENT_TABLE", "DEADLETTER_TABLE", "TABLE", "db_table"}
TABLES = ("queue_app_job", "queue_app_event", "queue_app_deadletter")
SQL_WRITES = ("insert into", "update ", "delete from")


def _receiver_model(node):
    """The model a chained ORM call starts from: Event in ``Event.objects.using(db).create``."""
    while isinstance(node, (ast.Attribute, ast.Call)):
        node = node.value if isinstance(node, ast.Attribute) else node.func
    return node.id if isinstance(node, ast.Name) else None


def _assigns_state_and_saves(function):
    """Whether ``function`` sets some object's ``state`` and calls a ``save()``: the ORM
    write by instance (a state set in memory only, for a TaskResult, is not one)."""
    sets = any(
        isinstance(n, ast.Assign)
        and any(isinstance(t, ast.Attribute) and t.attr == "state" for t in n.targets)
        for n in ast.walk(function)
    )
    saves = any(
        isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "save"
        for n in ast.walk(function)
    )
    return sets and saves


def state_writes(source, filename="<module>"):
    """Return "line: what" for every write of job state, events or dead letters in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in WRITE_METHODS:
                model = _receiver_model(func.value)
                state = next((kw.value for kw in node.keywords if kw.arg == "state"), None)
                if state is not None and not {model, _receiver_model(state)} & OTHER_STATES:
                    found.append(f"{node.lineno}: .{func.attr}(state=...)")
                elif model in LOG_MODELS:
                    found.append(f"{node.lineno}: {model}.objects...{func.attr}()")
                elif model == "Job" and any(kw.arg is None for kw in node.keywords):
                    found.append(f"{node.lineno}: Job.objects...{func.attr}(**...)")  # .update(**changes)
            elif isinstance(func, ast.Name) and func.id in LOG_MODELS:
                found.append(f"{node.lineno}: {func.id}(...)")
            elif (
                isinstance(func, ast.Name)
                and func.id == "Job"
                and any(kw.arg in ("state", None) for kw in node.keywords)
            ):
                found.append(f"{node.lineno}: Job(state=...)")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _assigns_state_and_saves(node):
            found.append(f"{node.lineno}: .state = ... then .save()")
        elif isinstance(node, (ast.Name, ast.Attribute)):
            name = node.id if isinstance(node, ast.Name) else node.attr
            if name in TABLE_CONSTANTS and isinstance(node.ctx, ast.Load):
                found.append(f"{node.lineno}: {name}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value.lower()
            if any(t in text for t in TABLES) and any(w in text for w in SQL_WRITES):
                found.append(f"{node.lineno}: SQL {node.value.strip()[:60]!r}")
    return sorted(found, key=lambda hit: int(hit.split(":")[0]))


def function_imports(source, filename="<module>"):
    """Return "line: module" for every import of queue_app made inside a function body."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for inner in ast.walk(node):
                if isinstance(inner, ast.ImportFrom) and (inner.module or "").startswith("queue_app"):
                    found.append(f"{inner.lineno}: from {inner.module} import ...")
                elif isinstance(inner, ast.Import):
                    found += [
                        f"{inner.lineno}: import {a.name}"
                        for a in inner.names
                        if a.name.startswith("queue_app")
                    ]
    return found


def _sources():
    for path in sorted(APP.rglob("*.py")):
        if "migrations" not in path.parts:
            yield path.relative_to(ROOT).as_posix(), path.read_text()


def test_nothing_outside_transitions_and_the_engines_writes_job_state_events_or_dead_letters():
    offenders = [
        f"{name}:{hit}"
        for name, source in _sources()
        if not name.startswith(WRITERS)
        for hit in state_writes(source, name)
    ]

    assert offenders == []


def test_the_write_guard_sees_the_writes_the_state_machine_really_makes():
    # The allowed modules hold the real writes: a guard blind to them would pass anything.
    seen = {name: state_writes(source, name) for name, source in _sources() if name.startswith(WRITERS[:2])}

    assert len(seen["queue_app/core/transitions.py"]) >= 10
    assert any(hits for name, hits in seen.items() if name.startswith("queue_app/engines/"))


PLANTED_WRITES = """
from queue_app.engines import leasing, rows
from queue_app.models import DeadLetter, Event, Job, State


def sneak_complete(job_id, db):
    Job.objects.using(db).filter(
        id=job_id,
        state=State.LEASED,
    ).update(
        result=None,
        state=State.COMPLETED,
    )


def sneak_event(db, job_id):
    Event.objects.using(
        db
    ).bulk_create([])


def sneak_letter(job):
    return DeadLetter(
        job_id=job.id,
    )


def sneak_by_instance(job):
    job.state = State.COMPLETED
    job.save()


def sneak_unpacked(job_id, changes):
    Job.objects.filter(id=job_id).update(**changes)


def sneak_new(now):
    return Job(kind="x", state=State.LEASED, run_at=now)


def sneak_sql(cursor):
    cursor.execute(f"UPDATE {rows.JOB_TABLE} SET state = 'completed'")
    cursor.execute(f"UPDATE {leasing.TABLE} SET state = 'leased'")
    cursor.execute(
        "INSERT INTO queue_app_event (job_id, type)"
        " VALUES (%s, 'completed')",
        [1],
    )
"""


def test_the_write_guard_catches_a_real_multi_line_write_planted_in_a_module(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text(PLANTED_WRITES)

    hits = state_writes(planted.read_text(), str(planted))

    assert [h.split(": ", 1)[1].split(" ")[0] for h in hits] == [
        ".update(state=...)",
        "Event.objects...bulk_create()",
        "DeadLetter(...)",
        ".state",  # = ... then .save()
        "Job.objects...update(**...)",
        "Job(state=...)",
        "JOB_TABLE",
        "TABLE",
        "SQL",
    ]
    assert [int(h.split(":")[0]) for h in hits] == [7, 17, 23, 28, 34, 38, 42, 43, 45]
    # A state set in memory only is no write.
    assert state_writes("def report(job):\n    job.state = 'completed'\n    return job") == []
    # Reads are not writes.
    assert state_writes("Job.objects.filter(state=State.PENDING).count()\nstop = threading.Event()") == []
    assert state_writes("Worker.objects.filter(name=n).update(state=WorkerState.STOPPING)") == []


# The engine calls that write (the contract in engines/base.py): the state machine's alone.
ENGINE_WRITES = {"insert_jobs", "claim", "complete_plain", "notify"}


def _is_engines_of(node):
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "of"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "engines"
    )


def engine_writes(source, filename="<module>"):
    """Return "line: method" for every engine write call in ``source``: on ``engines.of(...)``
    itself or on any name bound to one (``eng = engines.of(c)``)."""
    tree = ast.parse(source, filename)
    bound = {
        target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and _is_engines_of(node.value)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    return [
        f"{node.lineno}: {node.func.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ENGINE_WRITES
        and (
            _is_engines_of(node.func.value)
            or (isinstance(node.func.value, ast.Name) and node.func.value.id in bound)
        )
    ]


def test_only_the_state_machine_calls_the_engines_write_functions():
    calls = {name: engine_writes(source, name) for name, source in _sources()}

    assert {name for name, hits in calls.items() if hits} == {"queue_app/core/transitions.py"}


def test_the_engine_write_guard_catches_a_write_planted_in_a_module():
    source = textwrap.dedent("""
        from django.db import connection
        from queue_app import engines

        def sneak(givens, now):
            eng = engines.of(connection)
            eng.insert_jobs(givens, [], [], now)
            return engines.of(
                connection
            ).claim("w", 1, now, now)

        def fine():
            return engines.of(connection).claim_gates()
    """)

    assert engine_writes(source) == ["7: insert_jobs", "8: claim"]


# Raw SQL goes through a cursor, .raw(), .extra() or RawSQL; a vendor branch reads .vendor.
RAW_SQL_CALLS = {"cursor", "raw", "extra"}


def sql_and_vendor_reads(source, filename="<module>"):
    """Return "line: what" for every raw SQL access and ``.vendor`` read in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in RAW_SQL_CALLS:
                found.append(f"{node.lineno}: .{func.attr}()")
            elif isinstance(func, ast.Name) and func.id == "RawSQL":
                found.append(f"{node.lineno}: RawSQL()")
        elif isinstance(node, ast.Attribute) and node.attr == "vendor" and isinstance(node.ctx, ast.Load):
            found.append(f"{node.lineno}: .vendor")
    return sorted(found, key=lambda hit: int(hit.split(":")[0]))


def test_no_sql_text_or_vendor_branch_outside_the_engines():
    offenders = [
        f"{name}:{hit}"
        for name, source in _sources()
        if not name.startswith("queue_app/engines/")
        for hit in sql_and_vendor_reads(source, name)
    ]

    assert offenders == []


def test_the_sql_guard_catches_a_cursor_and_a_vendor_branch_planted_in_a_module():
    source = textwrap.dedent("""
        from django.db import connection
        from django.db.models.expressions import RawSQL

        def count():
            if connection.vendor == "postgresql":
                with connection.cursor() as cursor:
                    cursor.execute("SELECT count(*) FROM queue_app_job")
            return Job.objects.annotate(n=RawSQL("1", [])).extra(where=["1=1"])
    """)

    assert [h.split(": ")[1] for h in sql_and_vendor_reads(source)] == [
        ".vendor",
        ".cursor()",
        ".extra()",
        "RawSQL()",
    ]
    # The engines are where it belongs: the guard sees it there too.
    assert any(sql_and_vendor_reads(s, n) for n, s in _sources() if n.startswith("queue_app/engines/"))


# Imports inside a function that are not there to dodge a cycle: Django's AppConfig.ready()
# (the app registry must be ready first), the package's lazy public names (importing
# queue_app from settings must not load models) and the example in a module docstring.
FUNCTION_IMPORTS_ALLOWED = {"queue_app/apps.py", "queue_app/__init__.py"}


def test_no_module_imports_queue_app_inside_a_function():
    offenders = [
        f"{name}:{hit}"
        for name, source in _sources()
        if name not in FUNCTION_IMPORTS_ALLOWED
        for hit in function_imports(source, name)
    ]

    assert offenders == []


def test_the_function_import_guard_catches_one_planted_in_a_module():
    source = textwrap.dedent("""
        from queue_app.core import validation

        def follow_up(job):
            from queue_app.core import transitions  # transitions calls us: import on use

            return transitions.enqueue(job)

        class Loop:
            def run(self):
                import queue_app.worker.supervisor
    """)

    assert function_imports(source) == [
        "5: from queue_app.core import ...",
        "11: import queue_app.worker.supervisor",
    ]


def _lint_imports(cwd):
    exe = Path(sys.executable).with_name("lint-imports")
    return subprocess.run(
        [str(exe), "--no-cache"],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(cwd)},
        timeout=120,
    )


@pytest.mark.slow
def test_the_layer_contract_holds_and_fails_on_a_planted_upward_import(tmp_path):
    kept = _lint_imports(ROOT)
    assert kept.returncode == 0, kept.stdout + kept.stderr

    # A copy of the app in which the state machine imports the web layer.
    shutil.copytree(APP, tmp_path / "queue_app", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    ordering = tmp_path / "queue_app" / "core" / "ordering.py"
    ordering.write_text(ordering.read_text() + "\nfrom queue_app.web import api  # noqa: E402,F401\n")

    broken = _lint_imports(tmp_path)

    assert broken.returncode != 0
    assert "queue_app.core.ordering -> queue_app.web.api" in broken.stdout

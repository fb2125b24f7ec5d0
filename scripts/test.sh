#!/usr/bin/env bash
# Run the whole suite once per database: SQLite always; PostgreSQL and MariaDB when
# they answer (JOBQUEUE_REQUIRE_DBS="postgres mariadb" makes a missing one an error,
# as CI does). The three runs go in parallel; each writes a JUnit file that the summary adds up.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
OUT=.test-results
rm -rf "$OUT"; mkdir -p "$OUT"

# Lint, format and the layer contract (pyproject.toml) first: a minute saved when they fail.
echo "checks: ruff check, ruff format --check, lint-imports"
.venv/bin/ruff check --quiet . || { echo "error: ruff check failed (run .venv/bin/ruff check --fix .)" >&2; exit 1; }
.venv/bin/ruff format --check --quiet . || { echo "error: files need formatting (run .venv/bin/ruff format .)" >&2; exit 1; }
.venv/bin/lint-imports --no-cache >"$OUT/lint-imports.log" 2>&1 || { cat "$OUT/lint-imports.log"; echo "error: the layer contract is broken" >&2; exit 1; }

PG_URL="${JOBQUEUE_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/jobqueue}"
MARIADB_URL="${JOBQUEUE_TEST_MARIADB_URL:-mysql://root@127.0.0.1:3306/jobqueue}"
REQUIRE=" ${JOBQUEUE_REQUIRE_DBS:-} "

reachable() {  # reachable <url>: can Django's driver connect?
    DATABASE_URL="$1" $PY - <<'PY' >/dev/null 2>&1
import os, django
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "jobqueue_project.settings")
django.setup()
from django.db import connection
connection.ensure_connection()
PY
}

declare -A URLS=([sqlite]="sqlite:///queue.db")
declare -A PYS=()
# JOBQUEUE_TEST_DJANGO60=1 (CI sets it): the SQLite run once more under Django 6.0, the
# oldest Django the app supports, in its own .venv-django60, to catch a 6.1-only API.
if [ "${JOBQUEUE_TEST_DJANGO60:-}" = 1 ]; then
    V=.venv-django60
    # Made (or brought up to date) by the repeat itself, beside the database suites: in a
    # fresh clone that is 20-odd seconds of pip before them otherwise.
    django60_venv() {
        if [ ! -x $V/bin/python ]; then
            "$($PY -c 'import sys; print(sys._base_executable)')" -m venv $V
        fi
        local stamp="$V/.requirements.$(cat requirements.txt requirements-mariadb.txt | sha256sum | cut -c1-16)"
        if [ ! -f "$stamp" ]; then
            grep -v '^Django==' requirements.txt >"$V/requirements-django60.txt"
            $V/bin/python -m pip install -q --disable-pip-version-check -r "$V/requirements-django60.txt" "Django>=6.0,<6.1" \
                && rm -f $V/.requirements.* && touch "$stamp"
        fi
    }
    URLS[sqlite-django60]="sqlite:///queue.db"
    PYS[sqlite-django60]="$V/bin/python"
fi
skipped=()
if reachable "$PG_URL"; then URLS[postgres]="$PG_URL"; else skipped+=("postgres ($PG_URL not reachable)"); fi
if $PY -c "import MySQLdb" 2>/dev/null && reachable "$MARIADB_URL"; then
    URLS[mariadb]="$MARIADB_URL"
else
    skipped+=("mariadb ($MARIADB_URL not reachable, or mysqlclient not installed)")
fi
for s in "${skipped[@]}"; do
    name="${s%% *}"
    if [[ "$REQUIRE" == *" $name "* ]]; then
        echo "error: $s, and JOBQUEUE_REQUIRE_DBS requires it" >&2
        exit 1
    fi
done

# tests/worker/test_shell_jobs.py: the issue's full 20 workers x 1,000 shell jobs on each
# database (40-80 s of each run on a quiet 2-core machine); 2,000 in the Django 6.0 run,
# which repeats the SQLite one for API compatibility.
export JOBQUEUE_SHELL_TEST_JOBS="${JOBQUEUE_SHELL_TEST_JOBS:-20000}"

# The pytest plugins the suite uses, named instead of autoloaded: pytest marks every module
# of an autoloaded plugin's distribution for assertion rewriting, so each run rewrote
# schemathesis, hypothesis, Faker and anyio whole (about 380 modules, 4-5 s of CPU at every
# start: a third of collecting). Faker's and anyio's plugins give fixtures no test uses.
PLUGINS=(-p pytest_django.plugin -p _hypothesis_pytestplugin -p schemathesis.pytest.plugin)

run_suite() {  # run_suite <name>: one pytest run, its log, exit code and JUnit file in $OUT
    local db="$1"; shift
    local jobs="$JOBQUEUE_SHELL_TEST_JOBS"; [ "$db" = sqlite-django60 ] && jobs=2000
    local properties=0 patience=1; [ "$db" = sqlite-django60 ] && properties=1 patience=4
    DATABASE_URL="${URLS[$db]}" SQLITE_TEST_NAME="$PWD/$OUT/test_$db.db" JOBQUEUE_SHELL_TEST_JOBS="$jobs" \
        JOBQUEUE_TEST_SKIP_PROPERTIES="$properties" JOBQUEUE_TEST_PATIENCE="$patience" PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 \
        "${PYS[$db]:-$PY}" -m pytest -p no:cacheprovider "${PLUGINS[@]}" --junitxml="$OUT/$db.xml" \
        -o junit_suite_name="$db" "$@" >"$OUT/$db.log" 2>&1
    echo $? >"$OUT/$db.rc"
}

# The databases in parallel, and the Django 6.0 repeat beside them (once its venv is
# ready) at nice 19 until the first of them ends, then at its full share: four suites at one priority took no less
# time, and the timing-sensitive worker tests got flaky, but niced it takes only the CPU
# the others leave while they wait on their worker processes and servers.
# The repeat is there to catch a 6.1-only API, so it leaves out what exercises our own
# processes and rules rather than Django's API (the worker-process, browser and chaos
# tests, the slow ones, and the hypothesis ones: JOBQUEUE_TEST_SKIP_PROPERTIES): those
# run, on every database, under the Django the project pins. Niced, its subprocesses can
# wait long for a CPU: its waits for them are 4 times as patient (JOBQUEUE_TEST_PATIENCE),
# and the gunicorn tests, which time how fast a server answers, stay out with the rest.
DJANGO60_SKIP=(--ignore=tests/worker --ignore=tests/browser --ignore=tests/chaos --ignore=tests/web/test_serving.py -m "not slow")
pids=()
for db in "${!URLS[@]}"; do
    [ "$db" = sqlite-django60 ] && continue
    run_suite "$db" "$@" &
    pids+=($!)
done
if [ -n "${PYS[sqlite-django60]:-}" ]; then
    (renice -n 19 -p "$BASHPID" >/dev/null; django60_venv; run_suite sqlite-django60 "${DJANGO60_SKIP[@]}" "$@") &
    repeat=$!
    wait -n "${pids[@]}"
    # pytest and what it starts from now on; a process it started before keeps nice 19.
    renice -n 0 -p "$repeat" $(pgrep -P "$repeat") >/dev/null 2>&1 || true
    pids+=($repeat)
fi
wait "${pids[@]}"

status=0
for db in "${!URLS[@]}"; do
    rc=$(cat "$OUT/$db.rc")
    echo "===================== $db: pytest exit $rc ====================="
    if [ "$rc" != 0 ]; then cat "$OUT/$db.log"; status=1; else tail -n 15 "$OUT/$db.log"; fi
done
for s in "${skipped[@]}"; do echo "SKIPPED DATABASE: $s"; done
$PY scripts/junit_summary.py "$OUT"/*.xml || status=1
exit $status

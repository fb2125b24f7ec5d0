#!/usr/bin/env bash
# Run the whole suite once per database: SQLite always; PostgreSQL and MariaDB when
# they answer (JOBQUEUE_REQUIRE_DBS="postgres mariadb" makes a missing one an error,
# as CI does). The three runs go in parallel; each writes a JUnit file that the summary adds up.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
OUT=.test-results
rm -rf "$OUT"; mkdir -p "$OUT"

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

# tests/test_shell_jobs.py: the issue's full 20 workers x 1,000 shell jobs on PostgreSQL,
# 2,000 on the others (about 40 s of the PostgreSQL run on a quiet 2-core machine).
export JOBQUEUE_SHELL_TEST_JOBS_POSTGRESQL="${JOBQUEUE_SHELL_TEST_JOBS_POSTGRESQL:-20000}"

pids=()
for db in "${!URLS[@]}"; do
    (
        DATABASE_URL="${URLS[$db]}" SQLITE_TEST_NAME="$PWD/$OUT/test_$db.db" \
            $PY -m pytest -p no:cacheprovider --junitxml="$OUT/$db.xml" \
            -o junit_suite_name="$db" "$@" >"$OUT/$db.log" 2>&1
        echo $? >"$OUT/$db.rc"
    ) &
    pids+=($!)
done
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

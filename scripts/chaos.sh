#!/usr/bin/env bash
# make chaos: the chaos scenarios (tests/chaos) at full size, one database after another,
# each scenario's JSON line collected into .test-results/chaos.jsonl and printed as the
# README's table. JOBQUEUE_CHAOS_JOBS sets the size (4000 here; the suite's CI run uses
# the small default). Pass pytest arguments to pick scenarios: make chaos ARGS="-k kills".
set -uo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
OUT=.test-results
mkdir -p "$OUT"
: >"$OUT/chaos.jsonl"
export JOBQUEUE_CHAOS_JOBS="${JOBQUEUE_CHAOS_JOBS:-4000}" JOBQUEUE_CHAOS_OUT="$PWD/$OUT/chaos.jsonl"
declare -A URLS=(
    [sqlite]="sqlite:///queue.db"
    [postgres]="${JOBQUEUE_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/jobqueue}"
    [mariadb]="${JOBQUEUE_TEST_MARIADB_URL:-mysql://root@127.0.0.1:3306/jobqueue}"
)
status=0
for db in sqlite postgres mariadb; do
    echo "== chaos on $db (${JOBQUEUE_CHAOS_JOBS} jobs per scenario)"
    DATABASE_URL="${URLS[$db]}" SQLITE_TEST_NAME="$PWD/$OUT/chaos_$db.db" \
        $PY -m pytest -p no:cacheprovider -q tests/chaos "$@" || status=1
done
$PY scripts/chaos_table.py "$OUT/chaos.jsonl"
exit $status

#!/usr/bin/env bash
# Create .venv with a Python >= 3.12 and install the project's requirements.
# Idempotent: reinstalls only when a requirements file changed.
set -euo pipefail
cd "$(dirname "$0")/.."

find_python() {
    local candidates=()
    [ -n "${PYTHON:-}" ] && candidates+=("$PYTHON")
    candidates+=(python3.14 python3.13 python3.12)
    # pyenv keeps interpreters outside PATH unless selected; look there too.
    if command -v pyenv >/dev/null 2>&1; then
        local root; root="$(pyenv root)"
        for d in $(ls -d "$root"/versions/3.1[2-9]* 2>/dev/null | sort -rV); do
            candidates+=("$d/bin/python3")
        done
    fi
    for d in $(ls -d "$HOME"/.pyenv/versions/3.1[2-9]* 2>/dev/null | sort -rV); do
        candidates+=("$d/bin/python3")
    done
    candidates+=(python3 python)
    for c in "${candidates[@]}"; do
        if "$c" -c 'import sys, venv; sys.exit(0 if sys.version_info >= (3, 12) else 1)' >/dev/null 2>&1; then
            command -v "$c" 2>/dev/null || echo "$c"
            return 0
        fi
    done
    return 1
}

if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import sys; sys.exit(0 if sys.version_info >= (3, 12) else 1)' 2>/dev/null; then
    PY="$(find_python)" || { echo "error: jobqueue needs Python >= 3.12; none found (set PYTHON=/path/to/python3.12)" >&2; exit 1; }
    echo "bootstrap: creating .venv with $PY ($("$PY" --version))" >&2
    rm -rf .venv
    "$PY" -m venv .venv
    .venv/bin/python -m pip install -q --upgrade pip
fi

# mysqlclient compiles against libmariadb; install it only where that library is present
# (CI installs it; a laptop without MariaDB runs the suite on SQLite and PostgreSQL).
want="requirements.txt"
if pkg-config --exists libmariadb 2>/dev/null || pkg-config --exists mysqlclient 2>/dev/null; then
    want="$want requirements-mariadb.txt"
fi
stamp=".venv/.requirements.$(cat $want | sha256sum | cut -c1-16)"
if [ ! -f "$stamp" ]; then
    echo "bootstrap: installing $want" >&2
    args=(); for f in $want; do args+=(-r "$f"); done
    .venv/bin/python -m pip install -q --disable-pip-version-check "${args[@]}"
    rm -f .venv/.requirements.*
    touch "$stamp"
fi

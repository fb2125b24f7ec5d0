# The two commands: `make demo` and `make test`. Each sets up .venv on its own.
.PHONY: demo test setup bench clean

setup:
	@scripts/bootstrap.sh

# The demo makes its own throwaway SQLite database each time, so it tells the same story.
demo: setup
	@.venv/bin/python manage.py demo

test: setup
	@scripts/test.sh

bench: setup
	@.venv/bin/python benchmarks/claim.py

clean:
	rm -rf .venv .test-results queue.db test_queue.db

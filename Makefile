# The two commands: `make demo` and `make test`. Each sets up .venv on its own.
.PHONY: demo test setup bench clean

setup:
	@scripts/bootstrap.sh

# The demo runs on a fresh SQLite file each time, so it tells the same story.
demo: setup
	@rm -f demo.db
	@DATABASE_URL=sqlite:///demo.db .venv/bin/python manage.py demo

test: setup
	@scripts/test.sh

bench: setup
	@.venv/bin/python benchmarks/claim.py

clean:
	rm -rf .venv .test-results queue.db test_queue.db

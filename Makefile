# The two commands: `make demo` and `make test`. Each sets up .venv on its own.
.PHONY: demo test setup bench chaos clean

setup:
	@scripts/bootstrap.sh

# The demo makes its own throwaway SQLite database each time, so it tells the same story.
demo: setup
	@.venv/bin/python manage.py demo

test: setup
	@scripts/test.sh

# W1 drain (batch 100 and 1), W2 enqueue, W3 latency; one JSON line each. SQLite by
# default; BENCH_DB="--db sqlite --db postgres --db mysql" for all three.
BENCH_DB ?= --db sqlite
bench: setup
	@.venv/bin/python benchmarks/worker_throughput.py $(BENCH_DB) --batch 100
	@.venv/bin/python benchmarks/worker_throughput.py $(BENCH_DB) --batch 1 --jobs 5000
	@.venv/bin/python benchmarks/enqueue_throughput.py $(BENCH_DB)
	@.venv/bin/python benchmarks/worker_throughput.py $(BENCH_DB) --latency

# The chaos scenarios (tests/chaos) at full size on each database, then their table.
chaos: setup
	@scripts/chaos.sh $(ARGS)

clean:
	rm -rf .venv .test-results queue.db test_queue.db

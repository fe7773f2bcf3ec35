# The two commands the README opens with:
#   make demo   -- run the main job on the embedded default
#   make test   -- lint, type-check, check import boundaries, run every test
# Both set up everything they need first (scripts/bootstrap.sh).

PY := .venv/bin/python
export PYSPARK_PYTHON := $(abspath .venv/bin/python)
export PYSPARK_DRIVER_PYTHON := $(abspath .venv/bin/python)

.PHONY: demo test bootstrap lint bench cluster cluster-clean chaos soak notebooks docs

bootstrap:
	bash scripts/bootstrap.sh

demo: bootstrap
	$(PY) scripts/demo.py

lint: bootstrap
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/mypy
	$(PY) scripts/check_imports.py

# Test modules spread over worker processes (pytest-xdist; a module's tests share one worker and
# its fixtures).  The suite mostly waits on servers, so three workers pay on two cores.  The run
# ends with its 15 slowest tests and a line of seconds per room of tests/ (tests/conftest.py), so
# creep shows where it starts.
TEST_WORKERS ?= 3
test: lint
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadscope --durations=15

# Every benchmark's --quick run, one after another; the figures go to bench/results/<UTC time>.json
# (bench/RESULTS.md says how to read them).
bench: bootstrap
	$(PY) scripts/run_benchmarks.py

# Execute the notebooks in place, so the outputs committed with them come from a real run.
notebooks: bootstrap
	$(PY) scripts/run_notebooks.py

# The pages of docs/ as a site in site/ (mkdocs; --strict: a broken link or a page left out fails).
docs: bootstrap
	.venv/bin/mkdocs build --strict

# A three-broker cluster on this machine (ZooKeeper, NATS, conf/cluster/*.toml) until Ctrl-C.
cluster: bootstrap
	$(PY) scripts/cluster.py

cluster-clean:
	rm -rf .cluster

# The fault matrix, long: 10 minutes of random faults on a real cluster, then the checker's table
# (make chaos SEED=7 MINUTES=2 for another run); then a leader replicating SOAK_MB megabytes must
# hold no more memory than its followers plus 150 MB.
SEED ?= 1
MINUTES ?= 10
SOAK_MB ?= 1024
chaos: bootstrap
	$(PY) scripts/chaos.py --seed $(SEED) --minutes $(MINUTES)
	$(PY) scripts/soak.py --mb $(SOAK_MB)

# An hour (HOURS=1) at 70% of the cluster's RF3 pipelined peak, with a live tail and a Spark query
# reading; every 10 s each broker's memory, threads and open files, the tail's p99 and the query's
# lag; fails on a lost or duplicated message or growth after the first 10 minutes (WARM_UP seconds).
# Samples and a plot go to bench/results/soak-<UTC time>.{json,png}.  Not part of the suite.
HOURS ?= 1
WARM_UP ?= 600
soak: bootstrap
	$(PY) bench/soak.py --hours $(HOURS) --warm-up $(WARM_UP)

# Palace: two commands on a fresh machine with Python 3.11 — `make demo` and `make test`.
PY ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install tools demo test test-long unit up stop fault audit audit-full bench-ingest bench-search bench-scale bench-pipeline bench-classify bench-enrich bench-entity-dedup soak schemas lint clean

$(STAMP): pyproject.toml dev/pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ./dev -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

## promtool for the alert-rule tests: the binary from Debian's prometheus package, unpacked into the venv
## (no Prometheus server installed or started). Present already: a link to it. No apt: the tests say they skip.
$(BIN)/promtool: | $(STAMP)
	@if command -v promtool >/dev/null 2>&1; then ln -sf "$$(command -v promtool)" $@; \
	elif command -v apt-get >/dev/null 2>&1; then \
	  d=$$(mktemp -d) && cd $$d && { apt-get download prometheus >/dev/null 2>&1 || \
	    { apt-get update -qq >/dev/null 2>&1 && apt-get download prometheus >/dev/null 2>&1; }; } && \
	  dpkg-deb -x prometheus_*.deb root && install -m 0755 root/usr/bin/promtool $(CURDIR)/$@; \
	  rm -rf $$d; \
	fi; test -x $(CURDIR)/$@ || echo "promtool unavailable: the promtool tests will skip"

## chromium for the palace browser test: Debian's package, installed once (already there: nothing to do).
## No apt or no root: the browser test says it skips.
CHROMIUM ?= /usr/bin/chromium
$(CHROMIUM):
	@if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  apt-get install -y -qq chromium >/dev/null 2>&1 || \
	    { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq chromium >/dev/null 2>&1; }; \
	fi; test -x $@ || echo "chromium unavailable: the palace browser test will skip"

tools: $(BIN)/promtool $(CHROMIUM)

## Start embedded PostgreSQL + NATS and every service, publish a sample conversation, show recall.
demo: install
	$(BIN)/palace demo

## How many pytest-xdist workers `make test` runs, each with its own embedded stack (the suite mostly
## waits on servers, so two workers share two cores well). External servers (PALACE_DATABASE_URL) are
## one stack for everyone: one worker then.
TEST_WORKERS ?= $(if $(PALACE_DATABASE_URL),0,2)

## Lint, schema drift check, and the whole test suite against real embedded servers.
test: install tools
	$(BIN)/ruff check .
	$(BIN)/palace schemas --check
	$(BIN)/python tools/audit_deps.py
	$(BIN)/pytest -ra --durations=25 -n $(TEST_WORKERS) --dist loadfile

## The tests whose length is their point, at full length: a producer publishing for ten minutes from the
## moment `palace up` is ready (thirty seconds in `make test`), never a session classified later than 5 s.
test-long: install
	PALACE_STALL_TEST_S=600 $(BIN)/pytest -ra --timeout 900 tests/integration/test_no_stall_int.py

## Unit tests only (no servers).
unit: install tools
	$(BIN)/pytest -ra -m "not integration"

## Run the stack in the foreground until Ctrl-C.
up: install
	$(BIN)/palace up

stop: install
	$(BIN)/palace stack stop

## The fault suite at full size: 10,000 sessions, SIGKILLs, PostgreSQL and NATS restarts (~10 min).
fault: install
	$(BIN)/python -m tests.fault_suite --events 10000

## Known vulnerabilities in the installed dependencies, from PyPI's advisory data (tools/audit_deps.py).
audit: install
	$(BIN)/python tools/audit_deps.py --verbose

## The same with pip-audit (--strict: a dependency it cannot look up fails the audit). Needs PyPI's
## per-release JSON API, which the package mirror of the development machines does not serve.
audit-full: install
	test -x .venv-audit/bin/pip-audit || ($(PY) -m venv .venv-audit && .venv-audit/bin/pip install -q pip-audit)
	.venv-audit/bin/pip-audit --strict --skip-editable --progress-spinner off \
		--path "$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"

bench-ingest: install
	$(BIN)/python bench/ingest.py

bench-search: install
	$(BIN)/python bench/search.py

## Search in a 1M-drawer database of 1,000 workspaces (built once, then reused): the 100k and a 1k workspace
## against bare HNSW over the same workspace; the last line is the summary for the 100k one.
bench-scale: install
	$(BIN)/python bench/search.py --scale

## Pipeline throughput with the model taken out, 1 and 2 replicas per service.
bench-pipeline: install
	$(BIN)/python bench/pipeline.py

## Classification per phase on locomo-dev: throughput (local embedder), share decided, accuracy on the hand
## labels, and the LLM phase batched vs one call per drawer against the test server at a fixed latency.
bench-classify: install
	$(BIN)/python bench/classify_phases.py

## Enrich (episodic.created → entities and facts) in sessions/s, without an LLM and with the test server at a
## fixed latency; and the offline extractor's precision/recall against the hand labels.
bench-enrich: install
	$(BIN)/python bench/enrich.py

## Entity dedup for one 40-entity entity.upserted among 2,000 look-alikes: batched evidence vs the per-pair queries.
bench-entity-dedup: install
	$(BIN)/python bench/entity_dedup.py

## Fixed-rate publishing into a deliberately slower pipeline: per-service peak RSS and growth, backlog, nothing dropped.
soak: install
	$(BIN)/python bench/soak.py

schemas: install
	$(BIN)/palace schemas

lint: install
	$(BIN)/ruff check .

clean:
	-$(BIN)/palace stack stop
	rm -rf .devstack .devstack-test .devstack-test-ext

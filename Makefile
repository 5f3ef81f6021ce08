# Two commands matter: `make run` and `make test`. Everything else is a step of those.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
LOCK := requirements.lock
# etcd's API as stripped by protos/etcd/strip_options.py from etcd's own files (upstream/).
ETCD_PROTO_SOURCES := protos/etcd/etcdserverpb/rpc.proto protos/etcd/mvccpb/kv.proto \
	protos/etcd/authpb/auth.proto
PROTO_SOURCES := $(wildcard protos/oms/v1/*.proto) $(ETCD_PROTO_SOURCES)
PROTO_STAMP := protos/oms/v1/.generated

.PHONY: all install protos protocheck lint typecheck pytest test run bench clean lock debian-packages docs docs-build

all: test

# Every dependency exactly as locked, each file checked against its hash; then the
# project itself, which brings nothing more (`--no-deps`).
$(STAMP): pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --require-hashes -r $(LOCK)
	$(BIN)/pip install --quiet --no-deps -e '.[dev]'
	touch $(STAMP)

# The lock again from pyproject.toml's ranges (the newest releases they allow): review
# the difference, run `make test`, and measure what the grpcio pin says before a new
# grpcio goes in (services/transport/grpc_runtime.py).
lock:
	$(PYTHON) -m venv $(VENV)-lock
	$(VENV)-lock/bin/pip install --quiet uv
	$(VENV)-lock/bin/uv pip compile pyproject.toml --extra dev --generate-hashes --python-version 3.11 \
		--python-platform x86_64-unknown-linux-gnu --no-header -o $(LOCK).new
	{ sed -n '1,3p' $(LOCK); cat $(LOCK).new; } > $(LOCK).tmp && mv $(LOCK).tmp $(LOCK) && rm $(LOCK).new

install: $(STAMP) $(PROTO_STAMP) debian-packages

# Debian packages some tests need, installed where make runs as root with apt-get:
# Prometheus and promtool (tests/observability/test_alert_rules.py, test_prometheus.py),
# fuse3, libfuse3 and fusermount3 (the power-cut filesystem of tests/power_cut/),
# faketime and libfaketime (the clock steps of tests/clock_faults/), nftables and
# iproute2 (the partitions of tests/partitions/ and tests/replication/
# test_leader_partition.py: cgroups and nftables, a network namespace and a veth pair).
# Elsewhere, or if apt fails, those tests skip and pytest's summary says why. Never
# fails the build.
DEBIAN_TOOLS := prometheus promtool fusermount3 faketime nft ip
DEBIAN_PACKAGES := prometheus fuse3 faketime nftables iproute2
debian-packages:
	@missing=$$(for tool in $(DEBIAN_TOOLS); do command -v $$tool >/dev/null || echo $$tool; done); \
	if [ -z "$$missing" ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		export DEBIAN_FRONTEND=noninteractive; \
		apt-get install -y -q --no-install-recommends $(DEBIAN_PACKAGES) >/dev/null \
		|| { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends \
			$(DEBIAN_PACKAGES) >/dev/null; } \
		|| echo "make: apt-get install $(DEBIAN_PACKAGES) failed; the tests needing them will skip"; \
	else echo "make: no $$missing, and not root with apt-get; the tests needing them will skip"; fi

# Generated code is produced here and never edited; it is ignored by git.
$(PROTO_STAMP): $(PROTO_SOURCES) $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m grpc_tools.protoc -I . \
		--python_out=. --grpc_python_out=. --mypy_out=quiet:. --mypy_grpc_out=quiet:. \
		$(PROTO_SOURCES)
	touch $(PROTO_STAMP)

protos: $(PROTO_STAMP)

# The protos checked like a public API (buf.yaml says which rules and why): buf lint, then
# buf breaking, the working tree (committed or not) against the last release tag (v*)
# HEAD descends from, or HEAD~1 while there is none. A clone without that commit
# (shallow, or no git at all) says so in one line and skips the comparison.
protocheck: $(STAMP)
	$(BIN)/buf lint
	@base=$$(git describe --tags --abbrev=0 --match 'v[0-9]*' HEAD 2>/dev/null || echo HEAD~1); \
	if [ -e .git ] && commit=$$(git rev-parse --verify --quiet "$$base^{commit}" 2>/dev/null); then \
		echo "protocheck: buf breaking against $$base ($$commit)"; \
		$(BIN)/buf breaking --against ".git#ref=$$commit" --against-config buf.yaml; \
	else echo "protocheck: no $$base in this checkout (shallow clone, or no git history): buf breaking skipped"; fi

lint: install protocheck
	$(BIN)/ruff check . protos/etcd/strip_options.py
	$(BIN)/ruff format --check . protos/etcd/strip_options.py
	$(BIN)/python protos/etcd/strip_options.py --check
	$(BIN)/lint-imports
	$(BIN)/mypy services gateway bridge persister k8s auditor simulation tests protos/etcd/strip_options.py
	$(MAKE) --no-print-directory docs-build

# The manual (mkdocs.yml, docs/): built with --strict, so a broken link or anchor, or a
# page missing from the nav, fails `make lint`. `make docs` serves it while you edit.
MKDOCS_QUIET := NO_MKDOCS_2_WARNING=1
docs-build: install
	$(MKDOCS_QUIET) $(BIN)/mkdocs build --strict --quiet

docs: install
	$(MKDOCS_QUIET) $(BIN)/mkdocs serve

# The generated reference pages (docs/reference/): commands, settings, metrics and the
# gRPC API, rewritten from the code (services/manual/); a test fails while one differs.
.PHONY: reference
reference: install
	$(BIN)/python -m services.manual

# The slowest tests in every log: the suite must stay under CI's 20 minutes.
pytest: install
	$(BIN)/pytest -q --durations=30

test: lint pytest

run: install
	$(BIN)/oms up

bench: install
	$(BIN)/oms bench runtime

clean:
	rm -rf $(VENV) state site protos/oms/v1/*_pb2*.py* $(PROTO_STAMP)

# Two commands matter: `make run` and `make test`. Everything else is a step of those.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PROTO_SOURCES := $(wildcard protos/oms/v1/*.proto)
PROTO_STAMP := protos/oms/v1/.generated

.PHONY: all install protos lint typecheck pytest test run bench clean

all: test

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP) $(PROTO_STAMP)

# Generated code is produced here and never edited; it is ignored by git.
$(PROTO_STAMP): $(PROTO_SOURCES) $(STAMP)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m grpc_tools.protoc -I . \
		--python_out=. --grpc_python_out=. --mypy_out=quiet:. --mypy_grpc_out=quiet:. \
		$(PROTO_SOURCES)
	touch $(PROTO_STAMP)

protos: $(PROTO_STAMP)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy services gateway bridge persister k8s tests

pytest: install
	$(BIN)/pytest -q

test: lint pytest

run: install
	$(BIN)/oms up

bench: install
	$(BIN)/oms bench runtime

clean:
	rm -rf $(VENV) state protos/oms/v1/*_pb2*.py* $(PROTO_STAMP)

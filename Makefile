# make test: create .venv (Python 3.12 when one can be found), install the package with its
# test extra, lint, and run the test suite. Engine tests skip when sgl_jax is not installed.
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

.PHONY: test lint demo venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@if [ -z "$(PYTHON_312)" ]; then \
		echo "WARNING: no python3.12 found (PATH or pyenv); using $(BASE_PYTHON)." >&2; \
		echo "WARNING: sgl-jax needs 3.12, so engine tests will be skipped." >&2; \
	fi
	@test -x $(PY) || $(BASE_PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]"
	@touch $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: lint
	$(PY) -m pytest -q

# make demo: the environment, the engine when missing (DESIGN.md section 2: from its upstream
# repository at the pinned commit; it is not on PyPI at a usable version), the tiny model,
# then 20 GRPO steps on CPU. DEMO_ARGS passes more options (e.g. DEMO_ARGS="--algo egpo").
SGL_JAX_COMMIT := cddbf6f1cc33cbdd453bd8f36ff7051cf46ca176
SGL_JAX_SPEC := sglang-jax[cpu] @ git+https://github.com/sgl-project/sglang-jax@$(SGL_JAX_COMMIT)\#subdirectory=python
DEMO_ARGS ?=

demo: $(STAMP)
	@$(PY) -c 'import sgl_jax' 2>/dev/null || { \
		echo "make demo: installing sgl-jax $(SGL_JAX_COMMIT) from its upstream repository" >&2; \
		$(PY) -m pip install --quiet "$(SGL_JAX_SPEC)" || { \
			echo "make demo: could not install sgl-jax (needs Python 3.12 and access to github.com)." >&2; \
			echo "Install it by hand: $(PY) -m pip install \"$(SGL_JAX_SPEC)\"" >&2; exit 2; }; }
	@$(PY) -c 'from sgl_jax_rollout.tiny_model import default_model_dir as d; print("tiny model:", d())'
	$(VENV)/bin/sgl-jax-rollout demo --steps 20 --algo grpo --out demo_out $(DEMO_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache

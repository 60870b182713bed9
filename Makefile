# The two commands of the README: `make book` and `make test`. Both set up .venv on a fresh machine.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# nbval re-executes every chapter and compares its outputs with the committed ones by the
# reproducibility contract (tests/conftest.py replaces nbval's string comparison with companion.book.nbcompare).
NBVAL  := --nbval --nbval-current-env

.PHONY: all venv book book-release pdf publish release test test-fast bench execute clean browser lint repro-report reader-runs

all: book

# PYTHON given on the command line (or in the environment) with an existing .venv of another
# Python: say so, instead of silently keeping the old .venv.
ifneq ($(filter command line environment,$(origin PYTHON)),)
PYCHECK := check-python
endif

.PHONY: check-python
check-python:
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; run 'make PYTHON=python3.X ...' with Python >= 3.10"; exit 1; }
	@if [ -x $(PY) ]; then have=$$($(PY) -c 'import sys; print("%d.%d" % sys.version_info[:2])'); \
	  want=$$($(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])'); \
	  [ "$$have" = "$$want" ] || { echo "error: .venv has Python $$have but PYTHON=$(PYTHON) is Python $$want: remove the old environment (rm -rf .venv) and run make again, or leave out PYTHON=$(PYTHON)"; exit 1; }; fi

venv: $(PYCHECK) $(STAMP)

# (Re)install whenever pyproject.toml changes; pip resolves [book] and [test] extras in one go.
$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "error: $(PYTHON) not found; run 'make PYTHON=python3.X ...' with Python >= 3.10"; exit 1; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[book,test]'
	touch $(STAMP)

# Execute every chapter on its defaults (jupyter-cache) and build the HTML; warnings are errors.
# jupyter-cache only sees the notebooks' code, so `companion build` clears it when src/companion changed.
# BUILD=DIR builds into DIR/_build (a read-only checkout).
book: $(PYCHECK) $(STAMP)
	$(VENV)/bin/companion build $(if $(BUILD),-o $(BUILD))

# Release build: execute every chapter afresh.
book-release: $(PYCHECK) $(STAMP)
	$(VENV)/bin/companion build --force

# The whole book as one PDF through LaTeX (xelatex), from the outputs of the last `make book`.
# Needs TeX Live; installed here from Debian's packages when missing and possible (about 1 GB).
TEX_PACKAGES := texlive-xetex texlive-latex-extra texlive-fonts-recommended texlive-fonts-extra \
                texlive-science texlive-plain-generic latexmk xindy fonts-freefont-otf
pdf: $(STAMP)
	@command -v xelatex >/dev/null 2>&1 && command -v xindy >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(TEX_PACKAGES); \
	  else echo "error: the PDF needs TeX Live: apt-get install $(TEX_PACKAGES)"; exit 1; fi; }
	$(VENV)/bin/jupyter-book build . --builder pdflatex
	@echo "PDF: _build/latex/companion.pdf"
	@grep -a -o "Output written on companion.pdf ([0-9]* pages" _build/latex/companion.log | sed 's/.*(/pages: /'

# GitHub Pages by hand (the workflow .github/workflows/deploy.yml does it on every push to main):
# the HTML of the last `make book` pushed to the gh-pages branch (-n: .nojekyll, -p: push, -f: force).
publish: book
	$(PY) -m pip install --quiet -e '.[publish]'
	$(VENV)/bin/ghp-import -n -p -f _build/html

# A citable release: release/companion-<version>.tar.gz with the HTML, the PDF, data/results, the
# executed notebooks, CITATION.cff, .zenodo.json and SHA256SUMS (src/companion/book/release.py).
release: book pdf
	$(PY) -m companion.book.release

# The whole suite: unit, property and doctests, every chapter under nbval, every chapter again with the
# oracles' answers perturbed by 4 ulps and under one of the OpenBLAS kernel types and thread counts
# this CPU runs per chapter, in a rotation that runs every one across the chapters
# (tests/test_reproducibility.py, which prints the reproducibility report), papermill runs with
# non-default parameters, the CLI, `make book` after a library edit, and the offline browser test.
# The serial suite runs with one BLAS thread (unless OPENBLAS_NUM_THREADS is set): the chapter runs that are
# subprocesses of their own (the re-executions, the runs on test parameters, the reader's runs) are jobs of
# the background pool of conftest.py on the other cores, and OpenBLAS threads sharing a core ran a test 3.5x
# slower (tests/test_reproducibility.py).
# At the end it prints where the time went: the 15 slowest tests (--durations), the time by part of the
# suite (conftest.py), and the total of lint, browser set-up and pytest, each apart (test-clock notes the
# start; prerequisites run left to right).
test: $(PYCHECK) $(STAMP) test-clock browser lint
	@t1=$$(date +%s); \
	OPENBLAS_NUM_THREADS=$${OPENBLAS_NUM_THREADS:-1} $(PY) -m pytest tests src/companion book/chapters $(NBVAL) --durations=15; \
	rc=$$?; t0=$$(cat $(VENV)/.test-clock); t2=$$(date +%s); \
	echo "make test: $$((t2 - t0)) s in all ($$((t1 - t0)) s lint and browser set-up, $$((t2 - t1)) s pytest), exit $$rc"; \
	exit $$rc

.PHONY: test-clock
test-clock:
	@date +%s > $(VENV)/.test-clock

# A reader's runs, the whole matrix (make test runs a daily rotation of it): every chapter on seeds 0-9 at its
# defaults and on 20 parameter sets drawn from its declared constraints, each as `companion run` (COMPANION_STRICT=0);
# a run that stops fails, a claim that does not hold is listed at the end (tests/test_reader_runs.py).
# READER_SEEDS=0-4 READER_DRAWS=5: a smaller matrix; READER_DRAWS=0: the seeds' runs only.
READER_SEEDS ?= 0-9
READER_DRAWS ?= 20
reader-runs: $(STAMP)
	COMPANION_READER_SEEDS=$(READER_SEEDS) COMPANION_READER_DRAWS=$(READER_DRAWS) OPENBLAS_NUM_THREADS=$${OPENBLAS_NUM_THREADS:-1} \
	  $(PY) -m pytest tests/test_reader_runs.py -m slow -p no:cacheprovider -o addopts="" -rA

# Every chapter re-executed with perturbed oracle answers and under the rotation of OpenBLAS kernels and
# thread counts (tests/test_reproducibility.py, also part of `make test`), and the report written to
# data/results/reproducibility.json (only when every run passes), which book/reproducibility.md shows.
repro-report: $(STAMP)
	COMPANION_REPRO_REPORT=data/results/reproducibility.json $(PY) -m pytest tests/test_reproducibility.py -q

# ruff (lint, and the format check) and mypy over src/companion, configured in pyproject.toml; the
# format check over the chapters' code cells too, at 88 characters (book/chapters/ruff.toml).
lint: $(STAMP)
	$(VENV)/bin/ruff check src/companion tests
	$(VENV)/bin/ruff format --check src/companion book/chapters
	$(VENV)/bin/mypy

# Headless Chromium for tests/test_browser.py: Debian's package, installed when missing and possible
# (root with apt-get); otherwise that test is skipped with its reason.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian's chromium for the browser test"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	      || echo "could not install chromium: the browser test will be skipped"; \
	  else echo "chromium not found and cannot be installed here: the browser test will be skipped"; fi; }

# The linters, then the unit, property and doc tests without the chapters (seconds).
test-fast: $(PYCHECK) $(STAMP) lint
	$(PY) -m pytest tests src/companion -m "not slow"

# Execute one chapter in place so that its committed outputs are fresh: make execute NB=book/chapters/02_exact_learning.ipynb
# The only command that writes the committed data/results: the chapter publishes into a staging
# folder, copied there only when every cell ran (a failing chapter leaves data/results as it was).
# Strict (COMPANION_STRICT=1): a claim or bound that does not hold stops the chapter, as in make book.
execute: $(PYCHECK) $(STAMP)
	@test -n "$(NB)" || { echo "usage: make execute NB=book/chapters/NN_name.ipynb"; exit 2; }
	@test -z "$$COMPANION_PERTURB_ULPS" || { echo "error: COMPANION_PERTURB_ULPS=$$COMPANION_PERTURB_ULPS is set (the oracles' perturbation test mode); committed outputs are made with exact answers: unset it"; exit 2; }
	@stage=$$(mktemp -d) && \
	  ( cd $(dir $(NB)) && COMPANION_STRICT=1 COMPANION_RESULTS_DIR=$$stage ../../$(VENV)/bin/jupyter execute --inplace --timeout=600 $(notdir $(NB)) ) \
	  && mkdir -p data/results && cp $$stage/*.json data/results/; \
	  rc=$$?; rm -rf $$stage; exit $$rc

# Every benchmark table in one run; a benchmark whose printed target fails exits 1, and so does
# `make bench` (after running the others). benchmarks/run_all.py ends with each benchmark's wall and
# CPU seconds, exit code and load average, and the total against issue 21's bound (20 min here).
# BENCH="bench_exact bench_robust": only those.
bench: $(STAMP)
	$(PY) benchmarks/run_all.py $(BENCH)

clean:
	rm -rf _build .pytest_cache release

# Hand-made mutants of the library against the fast tests (issue 12); writes benchmarks/mutants.md.
# MUTANTS="--generated --shuffle 22 --out benchmarks/mutants_generated_run.md": the tenfold mutant of every
# threshold constant; MUTANTS="--file held_out.toml --out ...": a file of mutants (format: mutants.py's docstring).
.PHONY: mutants
mutants: $(STAMP)
	$(PY) benchmarks/mutants.py $(MUTANTS)

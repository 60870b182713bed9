"""A reader's runs of every chapter: other seeds, and parameters drawn from the declared constraints (issue 32, item 4).

Each run is ``companion run CHAPTER`` as a reader types it, a reader's run (``COMPANION_STRICT=0``):
it must finish (exit 0). A claim or bound of the chapter that does not hold for the run is reported
in the summary at the end of the session, not failed; a run that stops for any other reason fails
its test, with the chapter's error.

**Seeds.** Every chapter runs at its defaults on a seed of the rotation: on day ``k`` of the year
chapter ``i`` (0 for ``01_definitions``) runs seed ``1 + (k + i) % 9``, so that any 5 consecutive
days run each chapter on 5 different seeds, and 9 days on seeds 1-9 (nbval runs seed 0 every
time). ``COMPANION_READER_DAY=k`` picks the day; ``COMPANION_READER_SEEDS=0-9`` (or ``1,4,7``) runs
every chapter on those seeds instead.

**Draws.** Each chapter also runs on parameters drawn by hypothesis from the constraints declared
in its ``parameters`` cell (:mod:`companion.book.parameters`), at sizes that keep a run near its
defaults' time or below: an int at most twice its default (at most 5 above a default of 0; a seed
in [0, 1000]), a float within a factor 10 of its default, a list a sub-list of its default
(possibly with one new element up to its largest, unless its elements must divide another
parameter's), a bound naming an earlier parameter met with its drawn value, a switch that is off by default (a slow
section) left off. The draw is derandomised per day (hypothesis's ``@seed`` of the day and the
chapter: the same draw all day, another tomorrow); hypothesis's first example is its simplest
(every number at its lower end, every list at its shortest). ``COMPANION_READER_DRAWS=n`` makes n
examples per chapter (default 2: the simplest and one random) and draws for every chapter; without
it, a third of the chapters are drawn from each day (chapter ``i`` on days ``k`` with
``(k + i) % 3 == 0``), so that ``make test`` stays a few minutes longer, not more. A draw the chapter refuses (its
``companion.book.parameters`` constraint, or a ``ParameterError`` raised in the chapter) is discarded,
not failed.

The whole matrix, every chapter on seeds 0-9 and 20 draws per chapter (``make reader-runs``)::

    COMPANION_READER_SEEDS=0-9 COMPANION_READER_DRAWS=20 .venv/bin/pytest tests/test_reader_runs.py -m slow

``COMPANION_READER_REPORT=benchmarks/reader_runs.md`` also writes the outcome as a markdown report
(:func:`report`: the code commit, per chapter the counts and seconds per run, the runs that stopped
with their error, the claims and bounds that did not hold with the run's parameters and their text,
measured against the bound). ``COMPANION_READER_LOG=FILE`` appends each run's record to FILE as a
JSON line when the run ends, so that a matrix cut short keeps what finished.

The draws of the 20-draw matrix that stopped a chapter are tests of their own at the end of this
file (session 36, benchmarks/reader_runs.md): each runs the cell that stopped, alone, on the draw.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from companion.book import cli, parameters
from companion.errors import ParameterError

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted(p.stem for p in (ROOT / "book" / "chapters").glob("[0-9][0-9]_*.ipynb"))
ROTATION = range(1, 10)

#: One record per run, printed by the root conftest.py's terminal summary (:func:`summary`).
RUNS: list[dict] = []


def _day() -> int:
    value = os.environ.get("COMPANION_READER_DAY")
    return int(value) if value else _dt.date.today().timetuple().tm_yday


def _seeds_from(text: str) -> list[int]:
    """``"0-9"`` -> 0..9, ``"1,4,7"`` -> [1, 4, 7]."""
    out: list[int] = []
    for part in text.replace(" ", "").split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi) + 1)) if hi else [int(lo)]
    return out


def seed_runs(day: int | None = None, seeds: str | None = None) -> list[tuple[str, int]]:
    """The (chapter, seed) pairs of this session: the rotation of ``day``, or every chapter on ``seeds``."""
    seeds = os.environ.get("COMPANION_READER_SEEDS") if seeds is None else seeds
    if seeds:
        return [(stem, s) for stem in CHAPTERS for s in _seeds_from(seeds)]
    day = _day() if day is None else day
    return [(stem, ROTATION[(day + i) % len(ROTATION)]) for i, stem in enumerate(CHAPTERS)]


def _draws() -> int:
    """Draws per chapter: ``COMPANION_READER_DRAWS`` (a whole number >= 0; 0: the seeds' runs only), else 2."""
    text = os.environ.get("COMPANION_READER_DRAWS", "2")
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise pytest.UsageError(
            f"COMPANION_READER_DRAWS={text!r}: give the draws per chapter as a whole number >= 0 (0: seeds only)")
    return value


def draw_chapters(day: int | None = None) -> list[str]:
    """The chapters drawn from in this session: all with ``COMPANION_READER_DRAWS`` set (none when it is 0),
    else the day's third of them (chapter ``i`` on the days ``k`` with ``(k + i) % 3 == 0``)."""
    if os.environ.get("COMPANION_READER_DRAWS"):
        return list(CHAPTERS) if _draws() > 0 else []
    day = _day() if day is None else day
    return [stem for i, stem in enumerate(CHAPTERS) if (day + i) % 3 == 0]


def run_chapter(stem: str, params: dict, out: Path, run=subprocess.run) -> dict:
    """``companion run`` of ``stem`` with ``params`` as a reader's run; the record of the run.

    ``outcome`` is ``"completed"``, ``"refused"`` (a parameter the chapter refuses) or ``"failed"``
    (with ``error``); ``not_holding`` lists the claims and bounds that did not hold.
    """
    # the background pool's snapshot of the environment (conftest.py) where run is its runner
    env = dict(getattr(run, "environ", os.environ), MPLBACKEND="Agg", OPENBLAS_NUM_THREADS="1", COMPANION_STRICT="0")
    env.pop("COMPANION_RESULTS_DIR", None)        # the results go next to the run's notebook
    env.pop("COMPANION_PERTURB_ULPS", None)
    spec = out / "params.json"
    out.mkdir(parents=True, exist_ok=True)
    spec.write_text(json.dumps(params))           # a JSON file is a YAML file of parameters
    companion = Path(sys.executable).with_name("companion")
    began = time.monotonic()
    proc = run([str(companion), "run", stem, "-f", str(spec), "-o", str(out / "run"), "--no-progress"],
               env=env, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    record = {"chapter": stem, "parameters": params, "seconds": round(time.monotonic() - began, 1),
              "outcome": "completed", "not_holding": [], "error": None}
    results_file = out / "run" / f"{stem}.json"
    if proc.returncode == 0 and results_file.is_file():
        from companion.book.results import not_holding

        entries = not_holding(results_file)
        record["not_holding"] = [e["name"] for e in entries]
        record["details"] = {e["name"]: e["text"] for e in entries}      # "1e-07 (does not hold ...: measured ...)"
    elif proc.returncode == 2 and ("ParameterError" in proc.stderr or "companion: error: chapter" in proc.stderr):
        record.update(outcome="refused", error=proc.stderr.strip().splitlines()[0][:300])
    else:
        record.update(outcome="failed", error=(proc.stderr.strip() or proc.stdout.strip())[-2000:])
    RUNS.append(record)
    log = os.environ.get("COMPANION_READER_LOG")
    if log:                                       # one JSON line per run as it ends: a long matrix cut short keeps them
        with open(log, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
    return record


# -- seeds -------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("stem, seed", seed_runs(), ids=[f"{c}-seed{s}" for c, s in seed_runs()])
def test_a_chapter_completes_on_another_seed(stem, seed, background):
    record = background[("reader", stem, seed)].result()
    assert record["outcome"] == "completed", f"{stem} with seed {seed} did not complete:\n{record['error']}"


# -- draws -------------------------------------------------------------------------------------------


def _parameters_source(stem: str) -> str:
    import nbformat

    nb = nbformat.read(ROOT / "book" / "chapters" / f"{stem}.ipynb", as_version=4)
    return next(c.source for c in nb.cells if "parameters" in c.get("metadata", {}).get("tags", []))


def _interval(spec: list, env: dict):
    """The first ``in [a, b]`` interval of a parameter (or of its elements), as (low, low open, high,
    high open); an end that names another parameter is evaluated with the values drawn before it
    (``env``), and read as infinite if it names one drawn after it."""
    for clause in spec:
        inner = clause[1] if clause[0] == "each" else clause
        if inner[0] == "in" and len(inner[1]) == 1:
            lo_b, a, b, hi_b = inner[1][0]
            ends = []
            for expr, missing in ((a, -math.inf), (b, math.inf)):
                try:
                    ends.append(float(parameters._eval(expr, env)))
                except (ParameterError, TypeError, ValueError, ZeroDivisionError):
                    ends.append(missing)
            return ends[0], lo_b == "(", ends[1], hi_b == ")"
    return -math.inf, False, math.inf, False


def _one_of(spec: list):
    for clause in spec:
        inner = clause[1] if clause[0] == "each" else clause
        if inner[0] == "one of":
            return inner[1]
    return None


def _number(st, name: str, default, spec: list, env: dict, *, top=None):
    """A strategy for one int or float parameter (or list element) near its default."""
    low, low_open, high, high_open = _interval(spec, env)
    if isinstance(default, bool):
        return st.just(False) if default is False else st.booleans()
    if isinstance(default, int):
        if name == "seed":
            return st.integers(0, 1000)
        lo = int(math.ceil(low + (1 if low_open and low == math.ceil(low) else 0))) if math.isfinite(low) else 0
        ceiling = top if top is not None else (2 * default if default > 0 else default + 5)
        hi = min(int(math.floor(high - (1 if high_open and high == math.floor(high) else 0))), int(ceiling)) \
            if math.isfinite(high) else int(ceiling)
        return st.integers(lo, max(lo, hi))
    base = abs(float(default)) or 1.0
    lo = max(low, base / 10) if math.isfinite(low) else base / 10
    hi = min(high, base * 10 if top is None else top) if math.isfinite(high) else (base * 10 if top is None else top)
    return st.floats(lo, max(lo, hi), exclude_min=low_open and lo == low, exclude_max=high_open and hi == high,
                     allow_nan=False, allow_infinity=False)


def strategy(decl: dict):
    """A hypothesis strategy of parameter dicts for a chapter's declarations (the module's docstring),
    drawn in the order of the declarations, so that a bound naming an earlier parameter is met."""
    from hypothesis import strategies as st

    def field(draw, name, info, env):
        default, spec = info["default"], info["spec"]
        choices = _one_of(spec)
        if isinstance(default, bool):
            return draw(_number(st, name, default, spec, env))
        if choices is not None and not isinstance(default, list):
            return draw(st.sampled_from(choices))
        if isinstance(default, list):
            kept = [x for x in default if draw(st.booleans())]
            scalar = [x for x in default if isinstance(x, (int, float)) and not isinstance(x, bool)]
            def allowed(x):                              # by its interval (``each in (0, mu]``: the drawn mu)
                low, low_open, high, high_open = _interval(spec, env)
                return (low < x if low_open else low <= x) and (x < high if high_open else x <= high)

            if scalar and len(scalar) == len(default):
                kept = [x for x in kept if allowed(x)]
            divides = any((c[1] if c[0] == "each" else c)[0] == "divides" for c in spec)
            if scalar and len(scalar) == len(default) and not divides and draw(st.booleans()):
                new = draw(_number(st, name, scalar[0], spec, env, top=max(scalar)))
                if new not in kept:
                    kept = sorted([*kept, new]) if kept == sorted(kept) else [*kept, new]
            if not kept and any(c[0] == "non-empty" for c in spec):
                kept = default[:1] if not scalar or allowed(default[0]) else [
                    draw(_number(st, name, scalar[0], spec, env, top=max(scalar)))]
            return kept
        if isinstance(default, (int, float)):
            return draw(_number(st, name, default, spec, env))
        return default

    @st.composite
    def draws(draw):
        out: dict = {}
        for name, info in decl.items():
            out[name] = field(draw, name, info, out)
        return out

    return draws()


_DONE: dict = {}


def _given_draws(stem: str):
    """The day's hypothesis draws of ``stem``'s parameters, as a decorator of a test of one draw."""
    from hypothesis import HealthCheck, Phase, given, seed, settings

    def decorate(test):
        return seed(_day() * 100 + CHAPTERS.index(stem))(
            settings(max_examples=_draws(), deadline=None, derandomize=False, database=None, phases=[Phase.generate],
                     suppress_health_check=list(HealthCheck), print_blob=False)(
                given(strategy(parameters.declared(_parameters_source(stem))))(test)))

    return decorate


def background_jobs(items):
    """The runs of the selected tests, for the background pool of conftest.py (they overlap the serial
    suite): the seeds' runs, and the draws that hypothesis makes first (the same seed, so the same
    draws, as long as the chapter refuses none of them; a draw after a refusal runs in its test)."""
    for item in items:
        name, params = getattr(item, "originalname", ""), getattr(item, "callspec", None)
        if name == "test_a_chapter_completes_on_another_seed":
            stem, seed = params.params["stem"], params.params["seed"]
            yield {"key": ("reader", stem, seed), "chapter": stem, "kind": "reader's runs, seeds",
                   "fn": lambda run, out, stem=stem, seed=seed: run_chapter(stem, {"seed": seed}, out, run)}
        elif name == "test_a_chapter_completes_on_parameters_drawn_from_its_constraints":
            stem = params.params["stem"]
            for key, drawn in _planned_draws(stem).items():
                yield {"key": ("draw", key), "chapter": stem, "kind": "reader's runs, draws",
                       "fn": lambda run, out, stem=stem, drawn=drawn: run_chapter(stem, drawn, out, run)}


def _planned_draws(stem: str) -> dict:
    """``{key: parameters}`` of the draws the test of ``stem`` makes first (none refused)."""
    from hypothesis import reject

    planned: dict = {}

    @_given_draws(stem)
    def plan(drawn):
        try:
            drawn = cli.check_parameters(stem, drawn)
        except ParameterError:
            reject()
        planned.setdefault(json.dumps([stem, drawn], sort_keys=True), drawn)

    plan()
    return planned


@pytest.mark.slow
@pytest.mark.parametrize("stem", draw_chapters())
def test_a_chapter_completes_on_parameters_drawn_from_its_constraints(stem, tmp_path_factory, background):
    from hypothesis import reject

    @_given_draws(stem)
    def runs(params):
        try:
            params = cli.check_parameters(stem, params)
        except ParameterError:
            reject()                                  # outside the declared constraints: not a reader's run
        key = json.dumps([stem, params], sort_keys=True)
        if key not in _DONE:                          # hypothesis replays a failing example: not the chapter
            job = background.get(("draw", key))       # drawn at collection and run in the background
            _DONE[key] = job.result() if job else run_chapter(stem, params, tmp_path_factory.mktemp(stem))
        record = _DONE[key]
        if record["outcome"] == "refused":
            reject()
        assert record["outcome"] == "completed", (
            f"{stem} did not complete with parameters {params}:\n{record['error']}")

    runs()


# -- the summary -------------------------------------------------------------------------------------


def summary() -> str | None:
    """What ran, for the terminal summary: per run its chapter, parameters, time and outcome, and
    the claims and bounds that did not hold (reported, not failed)."""
    if not RUNS:
        return None
    seeds = os.environ.get("COMPANION_READER_SEEDS")
    head = (f"seeds {seeds} on every chapter" if seeds else
            f"rotation day {_day()}: " + ", ".join(f"{c} seed {s}" for c, s in seed_runs()))
    drawn = draw_chapters()
    lines = [head + (f"; {_draws()} draw(s) from the constraints of {', '.join(drawn)}" if drawn else "; no draws")]
    for r in RUNS:
        params = ", ".join(f"{k}={v!r}" for k, v in r["parameters"].items())
        held = (f"; does not hold: {', '.join(r['not_holding'])}" if r["not_holding"] else
                "; every claim holds" if r["outcome"] == "completed" else "")
        lines.append(f"  {r['chapter']} [{params}]: {r['outcome']} in {r['seconds']:.0f} s{held}")
    false = sum(len(r["not_holding"]) for r in RUNS)
    lines.append(f"{len(RUNS)} runs: {sum(r['outcome'] == 'completed' for r in RUNS)} completed, "
                 f"{sum(r['outcome'] == 'refused' for r in RUNS)} refused by the chapter, "
                 f"{sum(r['outcome'] == 'failed' for r in RUNS)} failed; {false} claim(s) did not hold")
    target = os.environ.get("COMPANION_READER_REPORT")
    if target:                                    # the matrix's notes file, e.g. benchmarks/reader_runs.md
        path = Path(target)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(report(RUNS, head=lines[0]), encoding="utf-8")
        tmp.replace(path)                         # atomic: a reader never sees half a report
        lines.append(f"report written to {path}")
    return "\n".join(lines)


def _commit() -> str:
    """The code commit the runs read (``git describe``-like: the hash, ``-dirty`` with local edits)."""
    def git(*args):
        out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return out.stdout.strip() if out.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    return commit + ("-dirty" if git("status", "--porcelain", "--", "src", "book/chapters") else "")


def report(runs: list[dict], *, head: str = "", commit: str | None = None) -> str:
    """A markdown report of reader's runs: per chapter the counts, then every run that stopped
    (with its error) and every claim or bound that did not hold (with the run's parameters)."""
    commit = _commit() if commit is None else commit
    out = ["# A reader's runs (tests/test_reader_runs.py)", "",
           f"Code commit: `{commit}`; {head or 'runs of this session'}; "
           f"written {_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M} UTC.", "",
           "| chapter | runs | completed | refused | stopped | claims and bounds not holding "
           "| s per run (median, max) |",
           "|---|---|---|---|---|---|---|"]
    for stem in sorted({r["chapter"] for r in runs}):
        rs = [r for r in runs if r["chapter"] == stem]
        n = {k: sum(r["outcome"] == k for r in rs) for k in ("completed", "refused", "failed")}
        seconds = sorted(r["seconds"] for r in rs)
        out.append(f"| {stem} | {len(rs)} | {n['completed']} | {n['refused']} | {n['failed']} | "
                   f"{sum(len(r['not_holding']) for r in rs)} | "
                   f"{seconds[len(seconds) // 2]:.0f}, {seconds[-1]:.0f} |")
    stopped = [r for r in runs if r["outcome"] == "failed"]
    out += ["", "## Runs that stopped", ""] + ([
        f"- {r['chapter']} `{json.dumps(r['parameters'], sort_keys=True)}`: "
        f"{(r['error'] or '').strip().splitlines()[-1][:300] if r['error'] else 'no error text'}"
        for r in stopped] or ["None."])
    held = [r for r in runs if r["not_holding"]]
    out += ["", "## Claims and bounds that did not hold (reported, not failed)", ""] + ([
        f"- {r['chapter']} `{json.dumps(r['parameters'], sort_keys=True)}`: " + "; ".join(
            f"{name}: {r['details'][name]}" if r.get("details", {}).get(name) else name for name in r["not_holding"])
        for r in held] or ["None."])
    return "\n".join(out) + "\n"


# -- the rotation itself (fast) ----------------------------------------------------------------------


def test_the_rotation_gives_every_chapter_5_seeds_in_5_days_and_all_nine_in_9():
    for start in (1, 100, 365):
        days = [seed_runs(day=start + k, seeds="") for k in range(5)]
        for i, stem in enumerate(CHAPTERS):
            assert len({dict(d)[stem] for d in days}) == 5
    nine = [seed_runs(day=k, seeds="") for k in range(9)]
    assert all({dict(d)[stem] for d in nine} == set(ROTATION) for stem in CHAPTERS)
    assert all(len(d) == len(CHAPTERS) for d in nine)                  # one run per chapter a day


def test_the_draws_cover_every_chapter_in_3_days():
    days = [draw_chapters(day=k) for k in range(40, 43)]
    assert sorted(sum(days, [])) == sorted(CHAPTERS) and all(2 <= len(d) <= 3 for d in days)


def test_zero_draws_selects_no_draw_and_a_bad_count_is_a_usage_error(monkeypatch):
    """READER_DRAWS=0 (`make reader-runs READER_DRAWS=0`): the seeds' runs only. Before the fix, the draws'
    tests were still collected and hypothesis's max_examples=0 stopped the session with an INTERNALERROR."""
    monkeypatch.setenv("COMPANION_READER_DRAWS", "0")
    assert draw_chapters() == [] and _draws() == 0
    monkeypatch.setenv("COMPANION_READER_DRAWS", "1")
    assert draw_chapters() == list(CHAPTERS) and _draws() == 1
    for bad in ("-1", "two"):
        monkeypatch.setenv("COMPANION_READER_DRAWS", bad)
        with pytest.raises(pytest.UsageError, match="whole number >= 0"):
            _draws()


def test_the_full_matrix_is_every_chapter_on_seeds_0_to_9():
    pairs = seed_runs(seeds="0-9")
    assert len(pairs) == 10 * len(CHAPTERS) and {s for _, s in pairs} == set(range(10))
    assert _seeds_from("1,4, 7") == [1, 4, 7] and _seeds_from("3") == [3]


@pytest.mark.parametrize("stem", CHAPTERS)
def test_every_draw_is_a_value_the_chapter_declares_or_is_checked(stem):
    """The strategies stay near the defaults; what they draw is checked like a reader's -p values."""
    from hypothesis import HealthCheck, given, settings

    decl = parameters.declared(_parameters_source(stem))
    seen = []

    @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
    @given(strategy(decl))
    def draws(params):
        assert set(params) == set(decl)
        for name, value in params.items():
            default = decl[name]["default"]
            assert type(value) is type(default) or (isinstance(default, float) and isinstance(value, int))
            if isinstance(default, bool) and default is False:
                assert value is False                       # a slow section stays off
            elif isinstance(default, int) and not isinstance(default, bool) and name != "seed":
                assert value <= max(2 * default, default + 5)
            elif isinstance(default, list) and default and all(isinstance(x, (int, float)) for x in default):
                assert len(value) <= len(default) + 1 and all(x <= max(default) for x in value)
        try:
            cli.check_parameters(stem, params)
            seen.append(True)
        except ParameterError:
            seen.append(False)

    draws()
    assert sum(seen) >= len(seen) // 2, f"{stem}: most draws are refused ({seen.count(False)} of {len(seen)})"


def test_the_report_lists_counts_stopped_runs_and_claims_that_did_not_hold():
    runs = [
        {"chapter": "01_definitions", "parameters": {"seed": 3}, "seconds": 9.0, "outcome": "completed",
         "not_holding": ["native_gap"], "error": None},
        {"chapter": "01_definitions", "parameters": {"seed": 4}, "seconds": 9.0, "outcome": "failed",
         "not_holding": [], "error": "Traceback ...\nIndexError: list index out of range"},
        {"chapter": "02_exact_learning", "parameters": {"seed": 0}, "seconds": 5.0, "outcome": "refused",
         "not_holding": [], "error": "ParameterError: ..."},
    ]
    text = report(runs, head="seeds 3-4", commit="abc1234")
    assert "Code commit: `abc1234`; seeds 3-4" in text
    assert "| 01_definitions | 2 | 1 | 0 | 1 | 1 | 9, 9 |" in text
    assert "| 02_exact_learning | 1 | 0 | 1 | 0 | 0 | 5, 5 |" in text
    assert '- 01_definitions `{"seed": 4}`: IndexError: list index out of range' in text
    assert '- 01_definitions `{"seed": 3}`: native_gap' in text
    assert report([runs[2]], commit="x").count("None.") == 2


# -- draws of the 20-draw matrix that stopped, fixed (session 36) -------------------------------------


def _chapter_function(stem: str, name: str, namespace: dict):
    """The function ``name`` defined in a code cell of chapter ``stem``, compiled alone into ``namespace``."""
    import ast

    import nbformat

    nb = nbformat.read(ROOT / "book" / "chapters" / f"{stem}.ipynb", as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code" and f"def {name}(" in cell.source:
            tree = ast.parse(cell.source)
            node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
            exec(compile(ast.Module(body=[node], type_ignores=[]), f"{stem}:{name}", "exec"), namespace)
            return namespace[name]
    raise LookupError(f"{stem} defines no {name}")


@pytest.mark.parametrize("given, refused", [
    # seed 165's draw: mu 0.068 and etas with 0.1, so heads[0] had |v*_2| = 0.095 < eta = 0.1 and the
    # margin section's learner, told mu = eta, raised OracleInconsistentError at cell 14
    ({"mu": 0.0679, "etas": [0.1, 1e-5]}, "etas"),
    ({"mu": 0.1, "etas": [0.1, 1e-5]}, None),                     # eta = mu: just inside
    # seed 1000's and 166's: mu above 1/sqrt(noisy_d) (0.333 > 1/sqrt(10), 0.240 > 1/sqrt(20)), so
    # random_margin_head raised InvalidInputError at cell 27
    ({"mu": 1 / 3, "d": 7, "noisy_d": 10}, "noisy_d"),
    ({"mu": 1 / 3, "d": 7, "noisy_d": 9}, None),                   # 1/sqrt(9) = mu: just inside
    ({"mu": 0.1, "noisy_d": 101}, "noisy_d"),
    ({"mu": 0.1, "noisy_d": 100}, None),                           # the library's mu <= 1/sqrt(100)
    ({"mu": 0.24, "noisy_d": 17, "noisy_nuclear_d": 18}, "noisy_nuclear_d"),
    ({"mu": 0.24, "noisy_d": 17, "noisy_nuclear_d": 17}, None),
    ({"mu": 0.1, "noisy_nuclear_d": 21}, "noisy_nuclear_d"),       # the SDP's own cap, 20
    # the adversarial targets have every |v*_i| = mu: 5 of the 20 draws refused at cell 11, after
    # 6 s of the run (mu 0.35 with adv_d_values [4, 7, 16]); now before any cell
    ({"mu": 0.35012, "adv_d_values": [4, 7, 16]}, "adv_d_values"),
    ({"mu": 0.25, "adv_d_values": [4, 17]}, "adv_d_values"),
    ({"mu": 0.25, "adv_d_values": [4, 16]}, None),                 # d mu^2 = 1: just inside
])
def test_05_refuses_by_name_a_margin_its_sections_cannot_draw(given, refused):
    """Chapter 05's sections draw heads with the margin mu in d, noisy_d and noisy_nuclear_d
    dimensions, and the margin section sets one entry to eta below the others: its parameters
    declare it, so that a reader's run is refused before any cell runs, naming the parameter."""
    from companion.robust import random_margin_head

    if refused is None:
        values = cli.check_parameters("05_robustness", given)
        for dim in ("d", "noisy_d", "noisy_nuclear_d"):         # the library accepts what the chapter does
            if dim in given:
                random_margin_head(values[dim], W_max=4.0, mu=values["mu"], seed=0)
        assert all(dd * values["mu"] ** 2 <= 1 for dd in values.get("adv_d_values", []))   # the chapter's check
    else:
        with pytest.raises(ParameterError, match=f"parameter {refused}="):
            cli.check_parameters("05_robustness", given)


def test_05_counts_a_head_whose_solver_stops_short_as_refused_not_a_crash():
    """Seed 166's simplest draw (noisy_nuclear_d 2, rank 1, tau 1e-6): SCS stopped at 'optimal_inaccurate'
    on the noise-aware nuclear-norm program and learn_low_rank_noisy raised SolverError, which the
    chapter's lr_median did not catch (cell 32). It is a refusal like a failed verification: an
    infinite error for that head, said on stdout."""
    import numpy as np

    from companion import errors, oracles
    from companion.attention import random_single_head

    lr_median = _chapter_function("05_robustness", "lr_median", {
        "np": np, "oracles": oracles, "errors": errors, "lr_heads": []})
    heads = [random_single_head(3, seed=s) for s in range(4)]

    def learn(o, k):
        if k == 1:
            raise errors.SolverError("SCS stopped with status 'optimal_inaccurate' ...")
        if k == 2:
            raise errors.OracleInconsistentError("verification failed ...")
        if k == 3:     # seed 414's draw of the second pass (noisy_nuclear_d 12, rank 2, W_max 33)
            raise errors.PrecisionError("the answers do not determine W at this precision ...")
        o(np.zeros((1, 1, 3)))
        return heads[k]

    median, queries = lr_median(learn, 1e-6, heads=heads)
    assert median == float("inf") and queries == 0                 # errors 0, inf, inf, inf
    assert lr_median(learn, 1e-6, heads=heads[:1])[0] == 0.0
    with pytest.raises(errors.NotIdentifiableError):               # any other error still stops the run
        lr_median(lambda o, k: (_ for _ in ()).throw(errors.NotIdentifiableError("x")), 1e-6, heads=heads)


def _chapter_cell(stem: str, marker: str) -> str:
    """The source of the code cell of chapter ``stem`` that holds ``marker``."""
    import nbformat

    nb = nbformat.read(ROOT / "book" / "chapters" / f"{stem}.ipynb", as_version=4)
    return next(c.source for c in nb.cells if c.cell_type == "code" and marker in c.source)


class _Published:
    """A stand-in for :mod:`companion.book.results` in a chapter cell run alone: what it publishes."""

    def __init__(self):
        self.values: dict = {}

    def publish(self, name, value, **kw):
        self.values[name] = (value, kw)

    def claim(self, name, holds, **kw):
        self.values[name] = (bool(holds), kw)

    @staticmethod
    def round_up(value):
        from companion.book.results import round_up

        return round_up(value)


def test_04_shows_a_head_that_gauss_newton_refuses_in_the_comparison_instead_of_stopping():
    """Seed 160's draw (d_values with 32, compare_rank 1): Gauss-Newton at its default m = 2 r(2d - r)
    stopped with relative residual 0.265 and raised SolverError in the comparison's cell, and the
    run stopped at cell 18. The row now shows NaN, the cell prints the refusal, and the sentence
    'Every learner recovered every head' is a claim that does not hold for that run."""
    import numpy as np

    from companion import attention, errors, exact, lowrank, oracles

    published = _Published()
    no_table = type("P", (), {"table": staticmethod(lambda *a, **k: None)})
    ns = {"np": np, "attention": attention, "errors": errors, "exact": exact, "lowrank": lowrank,
          "oracles": oracles, "results": published, "plotting": no_table,
          "d_values": [16, 32], "compare_rank": 1, "seed": 160, "C_nuc": float("nan")}
    exec(_chapter_cell("04_low_rank", "cmp_refused = []"), ns)
    exec(_chapter_cell("04_low_rank", '"cmp_every_recovered"'), ns)
    assert [(name, dd) for name, dd, _ in ns["cmp_refused"]] == [("rgn", 32)]
    assert ns["cmp_refused"][0][2].startswith(
        "Riemannian Gauss-Newton stopped after 7 iterations with relative residual 0.265")
    assert np.isnan(ns["rows"][1]["rgn"]) and np.isnan(ns["rows"][1]["error rgn"]) and ns["rows"][0]["rgn"] > 0
    assert published.values["cmp_every_recovered"][0] is False
    worst, kw = published.values["cmp_worst_error"]
    assert worst == 1e-12 and 0 < kw["measured"] < 1e-12                   # over the heads recovered
    assert published.values["cmp_sketch_ratio"][0] is True
    # the default seed: every learner recovers every head, and the claim holds
    ns.update(seed=0, results=_Published())
    exec(_chapter_cell("04_low_rank", "cmp_refused = []"), ns)
    exec(_chapter_cell("04_low_rank", '"cmp_every_recovered"'), ns)
    assert ns["cmp_refused"] == [] and ns["results"].values["cmp_every_recovered"][0] is True


@pytest.mark.parametrize("d, count", [(9, 9 + 90 + 9 * 8), (6, 2 * (6 + 36)), (3, 3 + 12 + 3 * 2)])
def test_06_counts_the_orthogonal_learners_queries_by_its_formula_when_the_subspaces_do_not_fill(d, count):
    """Draws with d 3, 9 and 11 (seeds 120, 600, 206) marked 'mh_demo_queries' as not holding: the
    claim compared the count with 2 (d + d^2), the count when the two heads' subspaces fill R^d; at
    odd d they are 1 + 1, 4 + 4 and 5 + 5 dimensional, and the learner asks d + d (d + 1) +
    d sum_h dim S_h (21, 171, 253), as its docstring says. The claim was the bug, not the run."""
    import numpy as np

    from companion import multihead, oracles

    published = _Published()
    ns = {"np": np, "multihead": multihead, "oracles": oracles, "results": published, "d": d, "seed": 120,
          "n_verify": 8, "H_demo": 2, "orth_target": multihead.random_multi_head(d, 2, orthogonal=True, seed=120)}
    exec(_chapter_cell("06_multi_head", '"mh_demo_queries"'), ns)
    assert ns["demo_count"] == count == published.values["mh_demo_2d2"][0]
    assert published.values["mh_demo_queries"][0] is True
    assert ns["rec"].n_learning_queries == count + ns["rec"].diagnostics["n_requeries"]


@pytest.mark.parametrize("rates, verdict", [
    ([0.0], "not compared with (none measured)"),      # seed 0's simplest draw: ratios [1.25], one trial failed
    ([1.0], True),                                     # every trial at 1.25: the default 5 is above it
])
def test_04_compares_the_default_multiple_only_with_a_ratio_the_run_measured(rates, verdict):
    """Draws with a short grid (ratios [1.25] or up to 2.5) where no case succeeded in every trial
    marked 'nuc_default_vs_rho' ("this book's default, above the ratio rho") as not holding: the
    claim compared 5 > NaN. With no ratio measured the sentence now says it compares nothing."""
    import numpy as np

    from companion import lowrank

    published = _Published()
    ns = {"np": np, "lowrank": lowrank, "results": published, "plotting": type("P", (), {"table": staticmethod(
              lambda *a, **k: None)}), "seed": 0, "n_trials": 1, "ratios": [1.25], "rgn_ratios": [1.0],
          "rgn_cases": [[20, 2]], "phase": {("nuclear, ROP", 8, 1): rates, ("rgn, ROP", 20, 2): [1.0]},
          "grid": {("nuclear, ROP", 8, 1): [1.25], ("rgn, ROP", 20, 2): [1.0]}}
    exec(_chapter_cell("04_low_rank", "def first_exact("), ns)
    exec(_chapter_cell("04_low_rank", '"nuc_default_vs_rho"'), ns)
    assert published.values["nuc_default_vs_rho"][0] == verdict
    assert np.isnan(published.values["rho_nuc"][0]) == (verdict is not True)


def test_06_marks_a_head_count_the_counts_route_cannot_fit_as_refused():
    """Seed 21's draw (d_canon 6, H_counts with 4) stopped at cell 26: learn_canonical_rational refused
    H = 4 at d = 6 with InvalidInputError (only 6 query tokens per row fit in 4Hd^2 - 2H + 1 = 569
    queries, d + 1 = 7 needed), which the comparison's _run did not catch. It is now a row marked
    refused, like a failed check, and the claim that every counts run kept to the count is marked."""
    import numpy as np

    from companion import multihead, oracles

    published = _Published()
    no_table = type("P", (), {"table": staticmethod(lambda *a, **k: None)})
    ns = {"np": np, "multihead": multihead, "oracles": oracles, "results": published, "plotting": no_table,
          "seed": 21, "d_canon": 6, "H_counts": []}
    exec(_chapter_cell("06_multi_head", "def _run("), ns)
    row = ns["_run"]("counts", 6, 4, 25)
    assert row["outcome"] == "refused" and row["queries"] == 0 and row["4Hd^2 - 2H + 1"] == 569
    assert ns["_run"]("counts", 7, 4, 25)["outcome"] == "ok"          # d = 7 fits: 8 tokens per row
    ns["route_rows"] = [row, {**row, "route": "robust", "outcome": "ok", "queries": 600, "÷ count": 1.05,
                              "longest query": 9, "rel. error": 1e-12}]
    exec(_chapter_cell("06_multi_head", '"mh_counts_within_count"'), ns)
    assert published.values["mh_counts_within_count"][0] is False
    assert published.values["mh_counts_within_count"][1]["text"] == "0 of 1 runs"


def test_01_accepts_an_unchanged_output_when_both_queries_attend_to_one_token():
    """Seed 291's draw (d 11, r 3) stopped at cell 14 on the exercise's `assert` that moving the last
    token changes the output: both queries put all their weight (to float64) on the same token (scores
    37 apart), so the output is that token's value either way, exactly. The check now accepts that
    case, verified from the attention weights, and still fails an unchanged output otherwise."""
    import numpy as np

    from companion import attention

    u = np.zeros(4)
    u[0] = 1.0
    X0 = np.array([[9.0, 0.1, 0.2, 0.3], [0.5, 1.0, 0.0, 0.0], [0.2, 0.0, 1.0, 0.0],
                   [0.4, 0.0, 0.0, 1.0], [1.0, 0.3, 0.3, 0.3]])
    fixed = type("R", (), {"standard_normal": staticmethod(lambda shape: X0.copy())})
    cell = _chapter_cell("01_definitions", "X0[[2, 0, 3, 1, 4]]")
    saturated = attention.SingleHead(100.0 * np.outer(u, u), np.array([1.0, -2.0, 0.5, 3.0]))
    exec(cell, {"np": np, "attention": attention, "rng": fixed, "d": 4, "head": saturated})   # passes
    weights = attention.attention_weights(np.stack([X0, X0[[4, 0, 1, 2, 3]]]), saturated.W)
    assert weights.max(axis=1).tolist() == [1.0, 1.0] and saturated(X0) == saturated(X0[[4, 0, 1, 2, 3]])
    moving = attention.SingleHead(0.1 * np.outer(u, u) + 0.2 * np.eye(4), saturated.v)
    exec(cell, {"np": np, "attention": attention, "rng": fixed, "d": 4, "head": moving})      # changes: passes
    # an output that does not move although the softmax is not saturated fails the check
    flat = attention.SingleHead(np.zeros((4, 4)), np.array([0.0, 1.0, 1.0, 1.0]))       # uniform weights
    X0[:, 1:] = 1.0                                                  # every token has x^T v = 3
    with pytest.raises(AssertionError):
        exec(cell, {"np": np, "attention": attention, "rng": fixed, "d": 4, "head": flat})


def test_03_a_line_that_crosses_no_hyperplane_has_no_kink_gap_not_a_crash():
    """Seed 128's draw (d 5, m 1) stopped at cell 5 with 'zero-size array to reduction operation
    maximum': the one hyperplane meets the demo's line beyond |t| = 1.1, the search finds no kink, and
    the largest distance over no kinks was taken. It is now 0 (nothing to miss), within the bound."""
    import numpy as np

    from companion import ffn, oracles, transformer

    published = _Published()
    d, m, seed = 5, 1, 128
    rng = np.random.default_rng(seed)
    rng.standard_normal((200, 5, d))                           # cell 3's sequences, drawn first
    ns = {"np": np, "ffn": ffn, "oracles": oracles, "results": published, "rng": rng,
          "d": d, "target": transformer.random_one_layer(d, m, seed=seed)}
    exec(_chapter_cell("03_one_layer_transformer", '"line_kink_gap"'), ns)
    assert ns["kinks"].size == ns["crossings"].size == 0
    assert published.values["line_kink_gap"][1]["measured"] == 0.0
    assert published.values["line_n_kinks"][0] == published.values["line_n_crossings"][0] == 0


@pytest.mark.parametrize("W_max, refused", [(2.0, True), (2.7334, True), (2.7335, False), (13.0, False)])
def test_05_refuses_by_name_a_minilm_W_max_below_the_heads_norm(W_max, refused):
    """Seed 437's draw (minilm_W_max 2.0, minilm_heads [[3, 5]]) stopped at cell 24 on a bare
    `assert` (||W||_F of L3H5 is 2.7335); a reader's bound below the head's norm is now refused by
    name, like chapter 02's mq_W_max, and the check passes just above the norm."""
    import numpy as np

    from companion import errors

    cell = _chapter_cell("05_robustness", '"minilm_vnorm_max"')
    checks = cell.split("minilm_rows = []")[0]                     # the norms and the check, no learner
    ns = {"np": np, "errors": errors, "results": _Published(), "minilm_heads": [[3, 5]], "minilm_W_max": W_max}
    if refused:
        with pytest.raises(errors.ParameterError, match=r"minilm_W_max=2(\.\d+)? is below \|\|W\|\|_F = 2\.73 of L3H5"):
            exec(checks, ns)
    else:
        exec(checks, ns)


@pytest.mark.parametrize("nuc, rgn, verdict", [
    (float("inf"), float("inf"), "more or less (both refused: not compared)"),   # seed 414's draw
    (2e-4, 1e-4, True),
    (1e-4, 2e-4, False),                       # the nuclear program errs less: marked, a true property
])
def test_05_compares_the_nuclear_program_with_gauss_newton_only_where_both_returned(nuc, rgn, verdict):
    """Seed 414's draw of the second pass (noisy_nuclear_d 12, rank 2, one head): both learners refused
    the head (PrecisionError), their medians were inf and 'noisy_nuc_errs_more' compared inf > inf.
    With no estimate on either side the sentence now says it compares nothing."""
    import numpy as np

    cell = _chapter_cell("05_robustness", '"noisy_nuc_errs_more"')
    published = _Published()
    rows = [{"noise": noise, "learner": name, "queries": 1, "median error W": e, "error / tau": e / 1e-5}
            for noise in ("uniform", "worst")
            for name, e in (("noisy ROP, nuclear (SCS)", nuc), ("noisy ROP, rgn", rgn), ("Theorem 6.2", 1.0))]
    ns = {"np": np, "results": published, "nuc_rows": rows, "noisy_nuclear_d": 12, "noisy_tau_fixed": 1e-5,
          "plotting": type("P", (), {"table": staticmethod(lambda *a, **k: None)})}
    exec("by =" + cell.split("\nby =", 1)[1], ns)
    assert published.values["noisy_nuc_errs_more"][0] == verdict

"""The oracles' perturbation test mode (``COMPANION_PERTURB_ULPS``), used by tests/test_reproducibility.py."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from companion import oracles
from companion.attention import random_single_head
from companion.errors import InvalidInputError
from companion.membership import MembershipQueryOracle
from companion.oracles import PERTURB_ENV, ApproxValueQueryOracle, ValueQueryOracle

ROOT = Path(__file__).resolve().parents[1]
EPS = np.finfo(np.float64).eps


@pytest.fixture
def queries():
    rng = np.random.default_rng(1)
    return rng.standard_normal((200, 3, 5))


@pytest.fixture
def target():
    return random_single_head(5, seed=0)


def test_off_by_default(monkeypatch, target, queries):
    monkeypatch.delenv(PERTURB_ENV, raising=False)
    assert oracles.perturbation_ulps() == 0
    assert np.array_equal(ValueQueryOracle(target)(queries), target(queries))
    for off in ("", " ", "0"):
        monkeypatch.setenv(PERTURB_ENV, off)
        assert np.array_equal(ValueQueryOracle(target)(queries), target(queries))


@pytest.mark.parametrize("k", [1, 4, 1000])
def test_magnitude_is_k_ulps_of_one(monkeypatch, target, queries, k):
    monkeypatch.setenv(PERTURB_ENV, str(k))
    exact = target(queries)
    rel = ValueQueryOracle(target)(queries) / exact - 1.0
    # y * (1 + k eps s) rounds once: the relative move is k eps up to one rounding (eps / 2)
    assert np.all(np.abs(np.abs(rel) - k * EPS) <= EPS), np.abs(rel).max() / EPS
    assert np.all(rel != 0.0)


def test_sign_from_the_hash_of_the_query(monkeypatch, target, queries):
    monkeypatch.setenv(PERTURB_ENV, "8")
    exact = target(queries)
    s = np.sign(ValueQueryOracle(target)(queries) / exact - 1.0)
    expected = np.where(oracles._hash_uniform(queries, oracles.PERTURB_SEED) < 0, -1.0, 1.0)
    assert np.array_equal(s, expected)
    # both signs occur, about equally often (200 queries: far from all one way)
    assert 60 < int(np.sum(s > 0)) < 140
    # a query's sign does not depend on its batch: one at a time gives the same answers
    one = np.concatenate([oracles.perturb(np.ones(1), x[None], 8) for x in queries[:20]])
    assert np.array_equal(one, oracles.perturb(np.ones(200), queries, 8)[:20])


def test_deterministic_and_distinct_from_the_noise_seed(monkeypatch, target, queries):
    monkeypatch.setenv(PERTURB_ENV, "4")
    a, b = ValueQueryOracle(target)(queries), ValueQueryOracle(target)(queries)
    assert np.array_equal(a, b)
    # the sign is not the sign of the uniform noise with seed 0 (which would correlate with it)
    s = oracles._hash_uniform(queries, oracles.PERTURB_SEED) < 0
    u = oracles._hash_uniform(queries, 0) < 0
    assert 0 < int(np.sum(s != u)) < len(s)


def test_applies_before_the_noise_of_subclasses(monkeypatch, target, queries):
    monkeypatch.setenv(PERTURB_ENV, "1000")
    exact = target(queries)
    rounded = ApproxValueQueryOracle(target, 0.05, noise="round", digits=3)(queries)
    # rounding to 3 digits (|f*| < 10 here) hides a 1000-ulp move except at a rounding tie
    assert np.all(np.abs(rounded - exact) <= 0.05)
    assert np.array_equal(rounded, oracles.round_significant(exact, 3))
    # a label at a tie flips the way the hash says: threshold = f*(x) exactly, sign -1 pushes it below
    down = np.flatnonzero(oracles._hash_uniform(queries, oracles.PERTURB_SEED) < 0)[0]
    x = queries[down]
    assert MembershipQueryOracle(target, threshold=float(exact[down] * (1 - 1e-12)))(x) == 1.0
    assert MembershipQueryOracle(target, threshold=float(exact[down]))(x) == (-1.0 if exact[down] > 0 else 1.0)


@pytest.mark.parametrize("bad", ["x", "1.5", "-1", "1001", "4 ulps"])
def test_malformed_is_refused(monkeypatch, target, bad):
    monkeypatch.setenv(PERTURB_ENV, bad)
    with pytest.raises(InvalidInputError, match=rf"{PERTURB_ENV}=.*must be an integer.*\[0, 1000\]"):
        ValueQueryOracle(target)(np.ones((1, 5)))


@pytest.mark.parametrize("edge, ok", [("1000", True), ("1001", False), ("0", True), ("-1", False)])
def test_range_edges(monkeypatch, edge, ok):
    monkeypatch.setenv(PERTURB_ENV, edge)
    if ok:
        assert oracles.perturbation_ulps() == int(edge)
    else:
        with pytest.raises(InvalidInputError):
            oracles.perturbation_ulps()


def test_committed_outputs_are_never_made_perturbed(tmp_path):
    """``make execute`` and ``companion build`` refuse while the mode is set, before any work."""
    import os

    env = dict(os.environ, **{PERTURB_ENV: "4"})
    made = subprocess.run(["make", "-s", "-C", str(ROOT), "execute", "NB=book/chapters/01_definitions.ipynb"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert made.returncode == 2 and PERTURB_ENV in made.stdout + made.stderr, made
    built = subprocess.run([sys.executable, "-m", "companion.book.cli", "build"], env=env, cwd=tmp_path,
                           capture_output=True, text=True, timeout=120)
    assert built.returncode == 2 and f"{PERTURB_ENV}=4 is set" in built.stderr, built


def _table_notebook(errors, fmt):
    """A one-cell notebook whose output is the table a chapter prints of solver outputs."""
    from companion.book import plotting

    html = plotting.table([{"instance": k, "error W": e} for k, e in enumerate(errors)], {"error W": fmt})._repr_html_()
    return {"cells": [{"cell_type": "code", "execution_count": 1, "metadata": {}, "source": "",
                       "outputs": [{"output_type": "execute_result", "execution_count": 1, "metadata": {},
                                    "data": {"text/html": html}}]}]}


def test_perturbation_run_fails_a_solver_output_printed_with_one_digit_too_many(monkeypatch):
    """SCS outputs (chapter 05's noise-aware nuclear-norm learner), exact and with 4-ulp answers,
    compared as a committed and a re-run notebook: at the chapter's 3 digits they match; the digits
    the perturbation leaves are found, and one digit more fails. Found by the perturbation alone,
    on any machine: the kernels of the machine at hand need not move these digits."""
    from companion import robust
    from companion.book import nbcompare

    def errors():
        out = []
        for k in range(5):
            head = robust.random_margin_head(8, W_max=4.0, mu=0.2, rank=2, seed=80 + k)
            o = ApproxValueQueryOracle(head, 1e-5, seed=k, noise="worst")
            rec = robust.learn_low_rank_noisy(o, 2, W_max=4.0, method="nuclear", seed=k, verify=0)
            out.append(float(np.linalg.norm(rec.W - head.W)))
        return out

    monkeypatch.delenv(PERTURB_ENV, raising=False)
    committed = errors()
    monkeypatch.setenv(PERTURB_ENV, "4")
    rerun = errors()
    moves = np.abs(np.subtract(rerun, committed)) / np.abs(committed)
    assert np.all(moves > 1e-9), moves          # SCS amplifies 4 ulps far past rounding level

    def differs(digits):
        fmt = f"{{:.{digits - 1}e}}"
        return nbcompare.compare_notebooks(_table_notebook(committed, fmt), _table_notebook(rerun, fmt))

    assert differs(3) == {}                      # chapter 05 prints these errors to 3 digits
    has = max(p for p in range(3, 18) if differs(p) == {})
    assert 3 <= has <= 6, (has, moves)           # an SCS output has some 5 digits, not float64's 16
    found = differs(has + 1)
    assert found and "became" in found[0][0], found


# --- the sign patterns (COMPANION_PERTURB_PATTERN) -------------------------------------------------


def _signs(pattern, queries):
    return np.sign(oracles.perturb(np.ones(len(queries)), queries, 8, pattern) - 1.0)


def test_default_pattern_is_the_hash(monkeypatch, target, queries):
    monkeypatch.delenv(oracles.PERTURB_PATTERN_ENV, raising=False)
    assert oracles.perturbation_pattern() == "hash"
    monkeypatch.setenv(PERTURB_ENV, "8")
    s = np.sign(ValueQueryOracle(target)(queries) / target(queries) - 1.0)
    assert np.array_equal(s, _signs("hash", queries))


@pytest.mark.parametrize("pattern", oracles.PERTURB_PATTERNS)
def test_each_pattern_moves_every_answer_by_k_ulps_both_ways(monkeypatch, target, queries, pattern):
    monkeypatch.setenv(PERTURB_ENV, "4")
    monkeypatch.setenv(oracles.PERTURB_PATTERN_ENV, pattern)
    exact = target(queries)
    a = ValueQueryOracle(target)(queries)
    rel = a / exact - 1.0
    assert np.all(np.abs(np.abs(rel) - 4 * EPS) <= EPS)
    assert 60 < int(np.sum(rel > 0)) < 140          # both signs, about equally often
    assert np.array_equal(a, ValueQueryOracle(target)(queries))  # deterministic
    one = np.concatenate([oracles.perturb(np.ones(1), x[None], 8, pattern) for x in queries[:20]])
    assert np.array_equal(one, oracles.perturb(np.ones(200), queries, 8, pattern)[:20])  # batch-free


def test_patterns_are_independent_functions_of_the_query():
    """Over 4000 random queries each pair of patterns agrees on about half of them (a pattern that
    were the hash with another seed, or a sign flip of another, would agree on 50% too, so also: the
    smooth pattern keeps its sign under a 1e-9 move of the query, the hash and parity do not)."""
    q = np.random.default_rng(7).standard_normal((4000, 2, 5))
    s = {p: _signs(p, q) for p in oracles.PERTURB_PATTERNS}
    for a in s:
        for b in s:
            if a < b:
                agree = float(np.mean(s[a] == s[b]))
                assert 0.45 < agree < 0.55, (a, b, agree)
    near = q + 1e-9
    assert np.mean(_signs("smooth", near) == s["smooth"]) > 0.99
    assert 0.45 < np.mean(_signs("hash", near) == s["hash"]) < 0.55
    assert 0.45 < np.mean(_signs("parity", near) == s["parity"]) < 0.55


def test_parity_is_the_parity_of_the_xored_words():
    x = np.zeros((1, 1, 2))  # words 0, 0 and length 1: one bit set, odd parity
    assert _signs("parity", x)[0] == -1.0
    x = np.array([[[0.0, 1.0]]])  # 1.0 = 0x3FF0000000000000 (10 bits) ^ length 1: odd (11)
    assert _signs("parity", x)[0] == -1.0
    x = np.array([[[-0.0, 1.0]]])  # -0.0 counts as 0.0
    assert _signs("parity", x)[0] == -1.0
    x = np.zeros((1, 3, 1))  # length 3 = 0b11: even
    assert _signs("parity", x)[0] == 1.0


@pytest.mark.parametrize("bad", ["Hash", "sign", "1"])
def test_unknown_pattern_is_refused(monkeypatch, target, bad):
    monkeypatch.setenv(PERTURB_ENV, "4")
    monkeypatch.setenv(oracles.PERTURB_PATTERN_ENV, bad)
    with pytest.raises(InvalidInputError, match=rf"{oracles.PERTURB_PATTERN_ENV}=.*must be one of hash, parity, smooth"):
        ValueQueryOracle(target)(np.ones((1, 5)))
    with pytest.raises(InvalidInputError):
        oracles.perturb(np.ones(1), np.ones((1, 1, 5)), 4, bad)


@pytest.mark.parametrize("pattern", ["hash", "parity", "smooth"])
@pytest.mark.parametrize("fmt", ["float32", "bfloat16"])
def test_a_served_head_is_measured_as_its_format_under_every_pattern(monkeypatch, pattern, fmt):
    """A served head's answers under the perturbation test mode are still rounding of its format: the
    sign pattern is a function of the query as the head receives it (rounded to its format), so a tiny
    step it cannot see leaves its answer unmoved. With the pattern of the raw query, the hash pattern
    made a float32 head 'outside the class' (chapter 07's perturbed run)."""
    from companion.attention import random_single_head
    from companion.oracles import ValueQueryOracle, measure_precision
    from companion.served import ServedHead

    monkeypatch.setenv(PERTURB_ENV, "4")
    monkeypatch.setenv("COMPANION_PERTURB_PATTERN", pattern)
    m = measure_precision(ValueQueryOracle(ServedHead(random_single_head(16, seed=0), fmt)))
    assert (m["kind"], m["format"]) == ("rounding", fmt)
    exact = measure_precision(ValueQueryOracle(random_single_head(16, seed=0)))
    assert exact["kind"] == "float64"

"""One contract for every learner, in the manner of scikit-learn's ``parametrize_with_checks``.

``LEARNERS`` lists every learner of the package once, each with a factory for a small target it
supports, the oracle kind it needs, the documented count of its learning queries, an oracle of the
wrong kind and a target outside its assumptions. Every check below runs against every entry, with
the readable id ``check_<what>[<learner>]``; a new learner gets all of them by being listed once
(``test_every_public_learner_is_listed`` fails until it is).

The checks (DESIGN.md, "One contract for every learner"; STYLE.md §5.3):

* ``n_queries`` is read from the oracle's counter (the oracle has already answered other queries);
* ``n_learning_queries`` equals the documented formula, and ``n_queries`` adds the verification;
* a budget one query short is refused, before the first query for a learner that plans its count;
* the target's arrays and the oracle's state (but its counter) are never mutated;
* the same seed gives the same result, bit for bit;
* verification is on by default and spends its queries;
* an oracle of the wrong kind is refused with a ``TypeError`` before any query;
* a target outside the learner's assumptions raises a specific error, never returns;
* every key the docstring lists under ``diagnostics`` is present, and every key present is listed.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import inspect
import math
import pickle
import pkgutil
import re
from collections.abc import Mapping
from types import MappingProxyType
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pytest

import companion
from companion import exact, ffn, layer, lowrank, membership, multihead, pretrained, robust, transformer
from companion.attention import MultiHead, SingleHead, random_single_head
from companion.errors import (BudgetExceededError, CompanionError, NotIdentifiableError,
                              OracleInconsistentError, SolverError)
from companion.oracles import ApproxValueQueryOracle, ValueQueryOracle, VectorQueryOracle


# ----------------------------------------------------------------------------- targets

def _head(d=4, seed=1, rank=None):
    return random_single_head(d, rank=rank, seed=seed)


def _two_heads(d=4, seed=0):
    a, b = random_single_head(d, seed=seed + 1), random_single_head(d, seed=seed + 2)
    return MultiHead(np.stack([a.W, b.W]), np.stack([a.v, b.v]))


def _margin_head(d=4, rank=None):
    return robust.random_margin_head(d, W_max=3.0, mu=0.2, rank=rank, seed=2)


def _no_margin_head(d=4):
    head = _margin_head(d)
    v = np.array(head.v)
    v[0] = 1e-3                                     # far below mu - tau
    return SingleHead(head.W, v)


def _homogeneous_head(d=4, seed=0):
    rng = np.random.default_rng(seed)
    return SingleHead(rng.standard_normal((d + 1, d + 1)), rng.standard_normal(d + 1))


class _BiasedReLU:
    """A ReLU network with a bias: outside every bias-free FFN learner's model."""

    d = 3

    def __call__(self, X):
        X = np.asarray(X)
        return np.maximum(X[:, -1, :] @ np.array([1.0, -1.0, 0.5]) + 0.3, 0.0) + 0.1 * X.shape[1]


class _LengthTerm:
    """A biased one-layer Transformer plus ``0.01 (N - 1)``: its one-token answers are the block's."""

    def __init__(self, target):
        self.target, self.d = target, target.d

    def __call__(self, X):
        X = np.asarray(X)
        return self.target(X) + 0.01 * (X.shape[1] - 1)


class _Bent:
    """Attention plus a small nonlinearity of the answer: not a sum of heads."""

    def __init__(self, target):
        self.target, self.d = target, target.d

    def __call__(self, X):
        y = np.asarray(self.target(X))
        return y + 1e-3 * np.tanh(y)


class _Gelu:
    """An attention layer followed by an elementwise GELU (tanh form): outside learn_attention_layer's class."""

    def __init__(self, target):
        self.target, self.d, self.d_out = target, target.d, target.d_out

    def __call__(self, X):
        y = self.target(X)
        return 0.5 * y * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (y + 0.044715 * y**3)))


def _vector(target, budget=None):
    return VectorQueryOracle(target, budget=budget)


# ----------------------------------------------------------------------------- the list

@dataclass(frozen=True)
class Learner:
    """One row of the contract: a learner, the target it supports and what it promises."""

    id: str
    learn: Callable[..., Any]               # the public learner: learn(oracle, *args, **kwargs)
    target: Callable[[], Any]               # a small target inside the learner's assumptions
    oracle: Callable[..., Any]              # oracle(target, budget=None): the kind it needs
    learning_count: Callable[[Any, int], int]   # the docstring's formula, (rec, d) -> count
    wrong_oracle: Callable[[Any], Any]      # an oracle of the wrong kind for the same target
    outside: Callable[[], Any]              # an oracle whose target breaks the assumptions
    outside_raises: tuple = (OracleInconsistentError,)
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    planned: bool = True                    # the learner knows its whole count before the first query
    count_is_bound: bool = False            # the docstring promises n_learning_queries <= the formula only
    # keys the docstring lists for other options or methods (absent from this default run)
    conditional: frozenset = frozenset()
    # words the docstring's diagnostics sentence quotes that are not keys
    not_keys: frozenset = frozenset()

    def run(self, oracle, **extra):
        return self.learn(oracle, *self.args, **{**self.kwargs, **extra})


def _exact(target, budget=None):
    return ValueQueryOracle(target, budget=budget)


def _noisy(tau):
    def make(target, budget=None):
        return ApproxValueQueryOracle(target, tau, seed=3, budget=budget)
    return make


def _membership(target, budget=None):
    return membership.MembershipQueryOracle(target, budget=budget)


def _labels(target):
    return membership.MembershipQueryOracle(target)


def _approx(target):
    return ApproxValueQueryOracle(target, 1e-3)


def _not_an_oracle(target):
    return target                                     # the model itself: no counter, no budget


_LOW_RANK_KEYS = {
    "nuclear": {"solver", "status", "solve_iterations", "objective"},
    "rgn": {"iterations", "residual", "residuals", "lsqr_iterations"},
    "sketch": {"cross_size", "core_singular_values", "rank_detected", "rank_used", "rank_tol_used", "kappa_W",
               "floor_W", "floor_v"},
}


def _low_rank(method):
    d, r = 6, 1

    def count(rec, d):
        m = rec.diagnostics["n_measurements"]
        if method == "sketch":
            k = rec.diagnostics["cross_size"]
            assert m == k * (2 * d - k)
        else:
            assert m == math.ceil(lowrank.DEFAULT_OVERSAMPLING[method] * r * (2 * d - r))
        return d + m + rec.diagnostics["n_requeries"]

    others = set().union(*(keys for name, keys in _LOW_RANK_KEYS.items() if name != method))
    return Learner(
        id=f"learn_low_rank[{method}]",
        learn=lowrank.learn_low_rank, args=(r,), kwargs={"method": method},
        target=lambda: _head(d, seed=3, rank=r), oracle=_exact, learning_count=count,
        # d = 10: m = 5 r (2d - r) < d^2 measurements, which do not determine a full-rank W
        wrong_oracle=_approx, outside=lambda: _exact(_head(10, seed=4)),
        outside_raises=(OracleInconsistentError, SolverError),
        conditional=frozenset(others - _LOW_RANK_KEYS[method]),
        not_keys=frozenset({"U", "rank"}))


LEARNERS = [
    Learner(
        id="learn_single_head", learn=exact.learn_single_head, target=_head, oracle=_exact,
        learning_count=lambda rec, d: d + d * d + rec.diagnostics["n_requeries"],
        wrong_oracle=_approx, outside=lambda: _exact(_two_heads()),
        not_keys=frozenset({"c^2 u_l^T W e_j", "l", "j", "u"})),
    _low_rank("nuclear"),
    _low_rank("rgn"),
    _low_rank("sketch"),
    Learner(
        id="learn_robust",
        learn=robust.learn_robust, kwargs={"W_max": 3.0, "mu": 0.2},
        target=_margin_head, oracle=_noisy(1e-5), learning_count=lambda rec, d: d + d * d,
        wrong_oracle=_labels, outside=lambda: _noisy(1e-5)(_no_margin_head()),
        not_keys=frozenset({"inf", "tau > mu/2", "mu"})),
    Learner(
        id="learn_robust_lstsq",
        learn=robust.learn_robust_lstsq, kwargs={"W_max": 3.0},
        target=_margin_head, oracle=_noisy(1e-5),
        learning_count=lambda rec, d: robust.n_queries_lstsq(d, 4),
        wrong_oracle=_labels, outside=lambda: _noisy(1e-5)(_two_heads()),
        not_keys=frozenset()),
    Learner(
        id="learn_low_rank_noisy",
        learn=robust.learn_low_rank_noisy, args=(2,), kwargs={"W_max": 4.0},
        target=lambda: robust.random_margin_head(8, W_max=4.0, mu=0.1, rank=2, seed=0),
        oracle=_noisy(1e-7),
        learning_count=lambda rec, d: d + math.ceil(robust._noisy.NOISY_OVERSAMPLING * 2 * (2 * d - 2)),
        wrong_oracle=_labels,
        outside=lambda: _noisy(1e-7)(robust.random_margin_head(8, W_max=4.0, mu=0.1, seed=1)),
        outside_raises=(OracleInconsistentError, SolverError),
        conditional=frozenset({"solve_iterations", "objective", "status"}),
        not_keys=frozenset()),
    Learner(
        id="learn_orthogonal_heads", learn=multihead.learn_orthogonal_heads,
        target=lambda: multihead.random_multi_head(4, 2, orthogonal=True, seed=6), oracle=_exact,
        learning_count=lambda rec, d: (d + d * (d + 1) + d * sum(rec.diagnostics["head_dims"])
                                       + rec.diagnostics["n_requeries"]),
        wrong_oracle=_approx, outside=lambda: _exact(multihead.random_multi_head(4, 2, seed=0)),
        # planned: d sum_h dim S_h is known only after the Hessian probe, so the learner reserves
        # its largest value, d^2 (the subspaces fill R^d), before the first query
        not_keys=frozenset()),
    Learner(
        id="learn_canonical", learn=multihead.learn_canonical,
        target=lambda: multihead.random_multi_head(4, 2, seed=0), oracle=_exact,
        kwargs={"H": 2},
        learning_count=lambda rec, d: (d + d * math.ceil(2.0 * d) * rec.diagnostics["n_points"]
                                       + (d - 1) * max(3, math.ceil(2 * 2**2 / (4 * 2 + 4)))
                                       * rec.diagnostics["n_points"]),
        wrong_oracle=_approx,
        outside=lambda: ValueQueryOracle(_Bent(multihead.random_multi_head(4, 2, seed=0)), d=4),
        not_keys=frozenset({"4 H d^2 - 2 H + 1"})),
    Learner(
        id="learn_canonical_rational", learn=multihead.learn_canonical_rational,
        target=lambda: multihead.random_multi_head(6, 2, seed=0), oracle=_exact,
        kwargs={"H": 2},
        learning_count=lambda rec, d: multihead.rational_plan(d, 2)["n_queries"], count_is_bound=True,
        wrong_oracle=_approx,
        outside=lambda: ValueQueryOracle(_Bent(multihead.random_multi_head(6, 2, seed=0)), d=6),
        # the moment start's keys (start="moments", tests/test_star.py), absent on the per-pair start
        conditional=frozenset({"start", "n_centres_tried", "centre_amplitude_ratio", "subspace_sv",
                               "taylor_misfit", "jennrich_gap", "n_tracked_rows"}),
        not_keys=frozenset()),
    Learner(
        id="learn_ffn", learn=ffn.learn_ffn,
        target=lambda: ffn.random_feedforward(4, 3, seed=0), oracle=_exact,
        learning_count=lambda rec, d: (rec.diagnostics["n_linear_queries"]
                                       + rec.diagnostics["n_scan_queries"]),
        wrong_oracle=_approx, outside=lambda: _exact(_BiasedReLU()), planned=False,
        not_keys=frozenset()),
    Learner(
        id="learn_relu_network", learn=ffn.learn_relu_network, kwargs={"widths": (8,)},
        target=lambda: ffn.random_relu_network(10, (8,), seed=0), oracle=_exact,
        conditional=frozenset({"refit_rounds", "refit_residual", "refit_thin_sides", "targeted_search",  # depth >= 3
                               "dead_fit_residual", "widths_given"}),  # a layer returned narrower; widths given
        learning_count=lambda rec, d: (rec.diagnostics["n_probe_queries"]
                                       + sum(rec.diagnostics["n_layer_queries"])),
        # a bias-free network of width 12 > d = 10: outside the class (widths that grow)
        wrong_oracle=_approx, outside=lambda: _exact(ffn.random_feedforward(10, 12, seed=0)),
        outside_raises=(OracleInconsistentError, NotIdentifiableError), planned=False,
        not_keys=frozenset({"network"})),
    Learner(
        id="learn_one_layer", learn=transformer.learn_one_layer,
        target=lambda: transformer.random_one_layer(3, 2, seed=0), oracle=_exact,
        learning_count=lambda rec, d: (rec.diagnostics["n_queries_ffn"]
                                       - rec.diagnostics["ffn"]["n_verify_queries"]
                                       + rec.diagnostics["n_queries_attention"]),
        wrong_oracle=_approx, outside=lambda: _exact(_BiasedReLU()), planned=False,
        not_keys=frozenset()),
    Learner(
        id="learn_one_layer_biased", learn=transformer.learn_one_layer_biased,
        target=lambda: transformer.random_biased_one_layer(4, 3, seed=0), oracle=_exact,
        learning_count=lambda rec, d: (rec.diagnostics["n_queries_ffn"]
                                       - rec.diagnostics["ffn"]["n_verify_queries"]
                                       + rec.diagnostics["n_queries_attention"]),
        wrong_oracle=_approx, outside=lambda: _exact(_LengthTerm(transformer.random_biased_one_layer(4, 3, seed=0))),
        planned=False, not_keys=frozenset({"r", "R", "around 0", "far"})),
    Learner(
        id="learn_multi_head_transformer", learn=transformer.learn_multi_head_transformer,
        target=lambda: transformer.random_multi_head_transformer(6, 2, 4, seed=0), oracle=_exact,
        kwargs={"H": 2},
        learning_count=lambda rec, d: (rec.diagnostics["n_queries_ffn"]
                                       - rec.diagnostics["ffn"]["n_verify_queries"]
                                       + rec.diagnostics["n_queries_heads"]
                                       + 2 * d * rec.diagnostics["n_neurons"]),
        wrong_oracle=_approx, planned=False,
        outside=lambda: ValueQueryOracle(
            _Bent(transformer.random_multi_head_transformer(6, 2, 4, seed=0)), d=6),
        not_keys=frozenset({"H d k", "k", "mu", "1", "H d", "A", "v_h"})),
    Learner(
        id="learn_membership",
        learn=membership.learn_membership, kwargs={"W_max": 8.0, "bits": 12},
        target=lambda: _head(3, seed=5), oracle=_membership,
        learning_count=lambda rec, d: membership.membership_query_count(
            d, 12, n_support=rec.diagnostics["n_support"]),
        wrong_oracle=lambda target: ValueQueryOracle(target),
        outside=lambda: _membership(_two_heads()),
        conditional=frozenset(), not_keys=frozenset()),
    Learner(
        id="learn_homogeneous_head", learn=pretrained.learn_homogeneous_head,
        target=_homogeneous_head, oracle=_exact,
        learning_count=lambda rec, d: d * d + rec.diagnostics["n_requeries"],
        wrong_oracle=_approx, outside=lambda: _exact(_two_heads(5)),
        not_keys=frozenset({"W[:d, :], v"})),
    Learner(
        id="learn_attention_layer", learn=layer.learn_attention_layer, kwargs={"H": 2},
        target=lambda: layer.random_attention_layer(6, 2, residual=True, seed=2), oracle=_vector,
        learning_count=lambda rec, d: (rec.diagnostics["n_probe_queries"] + rec.diagnostics["n_lstsq_queries"]
                                       + rec.diagnostics["n_head_queries"] + rec.diagnostics["n_polish_queries"]),
        # a scalar oracle of the same layer: the learner needs the output vector
        wrong_oracle=lambda target: VectorQueryOracle(target).readout(np.ones(target.d_out)),
        outside=lambda: _vector(_Gelu(layer.random_attention_layer(6, 2, residual=True, seed=2))),
        conditional=frozenset({"verify_token_scale", "verify_scaled_max_error"}),  # float32 behind a post-LN
        not_keys=frozenset({"identity", "none", "matrix", "model", "layer"})),
]

IDS = [entry.id for entry in LEARNERS]


# ----------------------------------------------------------------------------- helpers

_RUNS: dict = {}


def _spend(oracle, d):
    """Three queries answered before the learner starts, so that a count must be read as a difference."""
    oracle(np.zeros((3, 1, d)) + 0.25)
    return int(oracle.n_queries)


def default_run(entry):
    """``(rec, oracle, start)`` of the entry's default run, computed once per session."""
    if entry.id not in _RUNS:
        target = entry.target()
        oracle = entry.oracle(target)
        start = _spend(oracle, int(oracle.d))
        _RUNS[entry.id] = (entry.run(oracle), oracle, start, target)
    return _RUNS[entry.id]


def _snapshot(obj):
    """A deep copy of an object's attributes (arrays copied), the query counter and log left out."""
    state = {k: v for k, v in vars(obj).items() if k not in ("n_queries", "log", "_start")}
    return copy.deepcopy(state)


def _same(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (np.shape(a) == np.shape(b)
                and np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if hasattr(a, "__dict__") and type(a) is type(b) and not inspect.isroutine(a):
        return _same(vars(a), vars(b))
    try:
        return bool(a == b)
    except Exception:                                   # objects without ==
        return a is b


def _timeless(diagnostics):
    """Diagnostics without wall-clock times (``*_seconds``), nested dicts included."""
    return {k: _timeless(v) if isinstance(v, dict) else v
            for k, v in dict(diagnostics).items() if "seconds" not in k}


# The words a Returns section quotes that are never diagnostics keys.
_NEVER_KEYS = {"diagnostics", "n_queries", "n_learning_queries", "W", "v", "d", "verify", "inf", "c"}


def documented_keys(entry) -> set:
    """The keys the learner's docstring lists under ``diagnostics`` (its Returns section)."""
    doc = inspect.getdoc(entry.learn)
    section = re.search(r"\nReturns\n-+\n(.*?)(?:\n\n|\n[A-Z][a-z]+\n-+\n|\Z)", doc, re.S).group(1)
    section = section[section.index("diagnostics") - 2:]
    keys = set(re.findall(r'diagnostics\["(\w+)"\]', section))
    for token in re.findall(r"``([^`]+)``", section):
        if re.fullmatch(r"[A-Za-z_]\w*", token):
            keys.add(token)
    return keys - _NEVER_KEYS - set(entry.not_keys)


def _documented_count(entry, rec, d):
    return int(entry.learning_count(rec, d))


# ----------------------------------------------------------------------------- the checks

def check_n_queries_read_from_the_oracle(entry):
    rec, oracle, start, _ = default_run(entry)
    assert start == 3
    assert rec.n_queries == oracle.n_queries - start, (
        f"{entry.id}: n_queries={rec.n_queries}, the oracle answered {oracle.n_queries - start}")


def check_n_learning_queries_is_the_documented_formula(entry):
    rec, oracle, _, _ = default_run(entry)
    d = int(oracle.d)
    if entry.count_is_bound:
        assert 0 < rec.n_learning_queries <= _documented_count(entry, rec, d)
    else:
        assert rec.n_learning_queries == _documented_count(entry, rec, d)
    assert rec.n_queries == rec.n_learning_queries + int(rec.diagnostics["n_verify_queries"])


def check_budget_one_short_is_refused(entry):
    rec, _, _, _ = default_run(entry)
    oracle = entry.oracle(entry.target(), budget=rec.n_queries - 1)
    with pytest.raises(BudgetExceededError):
        entry.run(oracle)
    # A learner that plans its count refuses a budget one short of the plan (the run's count
    # without the re-measurements of saturated probes, which no learner can foresee) up front.
    planned = rec.n_queries - int(rec.diagnostics.get("n_requeries", 0))
    if entry.planned:
        short = entry.oracle(entry.target(), budget=planned - 1)
        with pytest.raises(BudgetExceededError):
            entry.run(short)
        assert short.n_queries == 0, f"{entry.id} asked {short.n_queries} queries before refusing"
    # A budget below any possible run is refused before the first query by every learner.
    tiny = entry.oracle(entry.target(), budget=1)
    with pytest.raises(BudgetExceededError):
        entry.run(tiny)
    assert tiny.n_queries == 0, f"{entry.id} asked {tiny.n_queries} queries of a budget of 1"


def check_target_and_oracle_not_mutated(entry):
    target = entry.target()
    oracle = entry.oracle(target)
    before_target, before_oracle = _snapshot(target), _snapshot(oracle)
    entry.run(oracle)
    assert _same(_snapshot(target), before_target), f"{entry.id} changed its target"
    assert _same(_snapshot(oracle), before_oracle), f"{entry.id} changed its oracle"


def check_same_seed_same_result(entry):
    rec, _, _, _ = default_run(entry)
    again = entry.run(entry.oracle(entry.target()))
    for name in ("W", "v", "n_queries", "message"):
        assert _same(getattr(rec, name), getattr(again, name)), f"{entry.id}: {name} differs"
    assert _same(_timeless(rec.diagnostics), _timeless(again.diagnostics))


def check_verification_on_by_default(entry):
    params = inspect.signature(entry.learn).parameters
    assert "verify" in params, f"{entry.id} has no verify option"
    default = params["verify"].default
    assert isinstance(default, int) and default > 0
    rec, _, _, _ = default_run(entry)
    assert rec.diagnostics["n_verify_queries"] >= default


def check_wrong_oracle_kind_refused_before_any_query(entry):
    wrong = entry.wrong_oracle(entry.target())
    with pytest.raises(TypeError):
        entry.run(wrong)
    assert getattr(wrong, "n_queries", 0) == 0


def check_target_outside_the_assumptions_refused(entry):
    oracle = entry.outside()
    with pytest.raises(entry.outside_raises) as info:
        rec = entry.run(oracle)
        pytest.fail(f"{entry.id} returned a result for a target outside its assumptions: {rec.message}")
    assert isinstance(info.value, CompanionError)


def check_documented_diagnostics_keys_present(entry):
    rec, _, _, _ = default_run(entry)
    documented = documented_keys(entry)
    present = set(rec.diagnostics)
    missing = documented - set(entry.conditional) - present
    undocumented = present - documented
    assert not missing, f"{entry.id}: documented but absent: {sorted(missing)}"
    assert not undocumented, f"{entry.id}: present but not in the docstring: {sorted(undocumented)}"


def _plain(value):
    """``value`` with read-only mappings as dicts, recursively (what a saved result reads back)."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, companion.Recovery):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return value


def _same_result(a, b):
    assert type(a) is type(b)
    for f in dataclasses.fields(a):
        assert _same(_plain(getattr(a, f.name)), _plain(getattr(b, f.name))), f"field {f.name} differs"
        if isinstance(getattr(a, f.name), np.ndarray):
            assert getattr(a, f.name).dtype == getattr(b, f.name).dtype


def check_result_pickles_copies_and_saves(entry, tmp_path_factory):
    rec, _, _, _ = default_run(entry)
    for again in (pickle.loads(pickle.dumps(rec)), copy.deepcopy(rec), copy.copy(rec)):
        _same_result(rec, again)
        assert isinstance(again.diagnostics, MappingProxyType)
    path = tmp_path_factory.mktemp("saved") / f"{entry.id}.safetensors"
    assert rec.save(path, parameters={"learner": entry.id}) == path
    back = companion.load(path)
    _same_result(rec, back)
    assert isinstance(back.diagnostics, MappingProxyType)
    assert back.provenance["parameters"] == {"learner": entry.id}
    assert back.provenance["library_version"] == companion.__version__
    assert repr(back) == repr(rec)
    assert [p.name for p in path.parent.iterdir()] == [path.name]     # no temporary file left


CHECKS = [check_n_queries_read_from_the_oracle, check_n_learning_queries_is_the_documented_formula,
          check_budget_one_short_is_refused, check_target_and_oracle_not_mutated,
          check_same_seed_same_result, check_verification_on_by_default,
          check_wrong_oracle_kind_refused_before_any_query,
          check_target_outside_the_assumptions_refused, check_documented_diagnostics_keys_present]


@pytest.mark.parametrize("check", CHECKS, ids=[c.__name__ for c in CHECKS])
@pytest.mark.parametrize("entry", LEARNERS, ids=IDS)
def test_learner_contract(entry, check):
    check(entry)


@pytest.mark.parametrize("entry", LEARNERS, ids=IDS)
def test_learner_contract_saved_results(entry, tmp_path_factory):
    """``check_result_pickles_copies_and_saves``: every result pickles, deep-copies, saves and loads."""
    check_result_pickles_copies_and_saves(entry, tmp_path_factory)


def _public_learners():
    found = set()
    for info in pkgutil.iter_modules(companion.__path__):
        if info.name.startswith("_"):  # packages too: multihead, pretrained (their __init__ re-exports)
            continue
        module = importlib.import_module(f"companion.{info.name}")
        for name, obj in vars(module).items():
            # a module's own learners, or a package's (issue 34: lowrank/, robust/, transformer/
            # re-export the learners of their private modules)
            home = getattr(obj, "__module__", "")
            if (name.startswith("learn_") and inspect.isfunction(obj)
                    and (home == module.__name__ or (info.ispkg and home.startswith(module.__name__ + ".")))):
                found.add(name)
    return found


def test_every_public_learner_is_listed():
    listed = {entry.learn.__name__ for entry in LEARNERS}
    assert _public_learners() - listed == set(), "list the new learner in LEARNERS"
    assert listed <= _public_learners()


# ----------------------------------------------------------------------------- the default tolerance

class _OffByRelative:
    """The target, plus ``kappa * rtol * max_i |x_i^T v|`` on every sequence longer than 2 tokens.

    The single-head learners learn from sequences of length 1 and 2 only, so they recover the target
    exactly; their verification (lengths 1 to 8) then sees a relative disagreement of exactly
    ``kappa * rtol`` on its longer queries.
    """

    def __init__(self, target, rtol, kappa):
        self.target, self.d, self.shift = target, target.d, kappa * rtol
        self.v = np.asarray(target.v)

    def __call__(self, X):
        X = np.asarray(X)
        y = np.asarray(self.target(X), dtype=np.float64)
        if X.shape[1] > 2:
            y = y + self.shift * np.max(np.abs(X @ self.v), axis=1)
        return y


_SINGLE_HEAD_EXACT = [entry for entry in LEARNERS if entry.id in (
    "learn_single_head", "learn_low_rank[nuclear]", "learn_low_rank[rgn]", "learn_low_rank[sketch]",
    "learn_homogeneous_head")]


@pytest.mark.parametrize("kappa, accepted", [(0.5, True), (2.0, False)], ids=["inside", "outside"])
@pytest.mark.parametrize("entry", _SINGLE_HEAD_EXACT, ids=[e.id for e in _SINGLE_HEAD_EXACT])
def test_default_verify_rtol_just_inside_and_outside(entry, kappa, accepted):
    """A disagreement of half the documented verify_rtol is accepted, of twice it refused.

    The tolerance is read from the docstring (``verify_rtol : float, default=...``), so that a
    changed default in the signature alone fails here instead of moving the test with it.
    """
    documented = re.search(r"verify_rtol : float, default=([0-9.e+-]+)", inspect.getdoc(entry.learn))
    rtol = float(documented.group(1))
    oracle = ValueQueryOracle(_OffByRelative(entry.target(), rtol, kappa))
    if accepted:
        rec = entry.run(oracle)
        assert 0.4 * rtol < rec.diagnostics["verify_max_error"] <= 0.5 * rtol * (1 + 1e-6)
    else:
        with pytest.raises(OracleInconsistentError, match="verification"):
            entry.run(oracle)

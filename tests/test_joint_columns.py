"""The joint heads' column start (``companion.layer._joint._start_C_columns``): which fits are one head, when the
starts stop, and a row of twelve heads whose poles lie as close as MiniLM's (this book's own construction)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment

import companion.layer._joint as J
from companion.errors import OracleInconsistentError
from companion.layer import random_attention_layer
from companion.layer._float32 import joint_options
from companion.layer._norm import one_token_affine
from companion.oracles import VectorQueryOracle


def _two_fits(distance, mis):
    """Two fits' phi values ``distance`` apart (root mean square), both of misfit ``mis``."""
    Y = np.zeros((2, 100))
    Y[1] = distance
    return Y, np.array([mis, mis])


@pytest.mark.parametrize("factor, distinct", [(0.99, False), (1.01, True)])
def test_fits_at_rounding_are_one_head_within_column_same_times_their_misfit(factor, distinct):
    mis = 1e-15
    Y, m = _two_fits(factor * J.COLUMN_SAME * mis, mis)
    assert len(J._distinct(Y, m, 2)) == (2 if distinct else 1)


@pytest.mark.parametrize("factor, distinct", [(0.99, False), (1.01, True)])
def test_fits_of_large_misfit_are_one_head_within_column_distinct(factor, distinct):
    """Float32's fits (misfits far above rounding): COLUMN_DISTINCT decides, as it did before COLUMN_SAME."""
    Y, m = _two_fits(factor * J.COLUMN_DISTINCT, 1e-4)
    assert len(J._distinct(Y, m, 2)) == (2 if distinct else 1)


def test_distinct_takes_fits_by_misfit_and_stops_at_h():
    Y = np.array([[0.0], [1.0], [2.0], [0.0]])
    mis = np.array([3e-16, 1e-15, 5e-16, 1e-16])
    assert J._distinct(Y, mis, 2) == [3, 2]  # fit 0 is fit 3's head (distance 0); fit 1 is not reached


@pytest.mark.parametrize("spread, batches", [(0.99, 1), (1.01, 2)])
def test_the_column_start_takes_more_starts_while_its_h_fits_misfit_unalike(monkeypatch, spread, batches):
    """After the first COLUMN_START_TOKENS tokens' starts the H best distinct fits are kept only when their misfits
    lie within COLUMN_SPREAD (MiniLM's row had a spurious twelfth at 2.1e-4 among heads at 1e-15)."""
    H = 2
    calls = []

    def fit(Z, B, r, iters=30):
        calls.append(len(B))
        Q = np.linalg.qr(np.random.default_rng(len(calls)).standard_normal((H, H)))[0]
        B = Q[np.arange(len(B)) % H]  # distinct fits, new ones each batch (their phi values Z b differ)
        mis = np.full(len(B), 1e-15)
        mis[1::2] = spread * J.COLUMN_SPREAD * 1e-15
        return B, mis

    monkeypatch.setattr(J, "_fit_columns", fit)
    r = (lambda nm: nm[0] / nm[1])(J._ratios(H))
    Z = np.random.default_rng(0).standard_normal((2 * J.COLUMN_START_TOKENS, len(r), H))
    assert J._start_C_columns(Z, r, H) is not None
    assert len(calls) == batches


def test_twelve_heads_with_close_poles_are_started_from_the_columns():
    """A synthetic row like MiniLM's (d = 384, H = 12 at the joint stage's token scale): twelve poles per token
    whose log-poles spread by about 0.2, exact float64 answers. No token's pencil starts it; the columns' start
    finds C, rows matched, to 1e-9 (measured 2026-12-04: 5.3e-13) where COLUMN_DISTINCT alone found fewer than
    twelve distinct heads."""
    H, K, d = 12, 64, 16
    rng = np.random.default_rng(0)
    r = (lambda nm: nm[0] / nm[1])(J._ratios(H))
    Xt = np.concatenate([rng.standard_normal((K, d)) * 2 / np.sqrt(d), np.ones((K, 1))], axis=1)
    p = np.exp(Xt @ (0.05 * rng.standard_normal((H, d + 1))).T)
    C = rng.standard_normal((H, H))
    Z = J._phi(r, p) @ C
    assert J._start_C(Z, r, H) is None
    found = J._start_C_columns(Z, r, H)
    rows, cols = linear_sum_assignment(np.linalg.norm(C[:, None] - found[None], axis=2))
    assert np.max(np.linalg.norm(C[rows] - found[cols], axis=1) / np.linalg.norm(C[rows], axis=1)) < 1e-9


@pytest.mark.parametrize("factor, moves", [(0.9, False), (1.1, True)])
def test_a_column_fit_stops_at_column_floor(factor, moves):
    """A start whose rms misfit is below COLUMN_FLOOR (float64's rounding) is left as it is; one above is fitted."""
    H, K = 2, 8
    rng = np.random.default_rng(1)
    r = (lambda nm: nm[0] / nm[1])(J._ratios(H))
    p = np.exp(0.5 * rng.standard_normal((K, H)))
    C = rng.standard_normal((H, H))
    Z = J._phi(r, p) @ C
    b = np.linalg.inv(C)[:, 0]
    e = rng.standard_normal(H)

    def rms(x):
        logp = J._column_poles(np.einsum("krh,sh->skr", Z, x[None]), r)
        return float(np.sqrt(J._column_misfits(Z, x[None], logp, r)[0] / (K * len(r))))

    t = 1e-13
    start = b + factor * J.COLUMN_FLOOR * (t / rms(b + t * e)) * e  # the misfit is linear in a small step
    assert rms(start) == pytest.approx(factor * J.COLUMN_FLOOR, rel=0.05)
    B, mis = J._fit_columns(Z, start[None], r)
    assert (not np.array_equal(B[0], start)) == moves
    assert mis[0] <= factor * J.COLUMN_FLOOR * 1.05


def _ladder(monkeypatch, sep, q99, misfit=1e-15, H=3):
    """The token scales _token_scale asks, with each row's fit stubbed to the given separation, |shift| q99 and
    misfit (the scale's rule alone)."""
    asked = []

    def row(oracle, delta, X, o1, H_, r, rank_tol, out=None):
        asked.append(float(np.sqrt(np.mean(X**2) * X.shape[1])))  # the tokens' rms norm: the scale
        return None, np.ones(H + 1), H, None, np.zeros((4, 2 * H, H))

    monkeypatch.setattr(J, "_row", row)
    monkeypatch.setattr(J, "_start_C", lambda Z, r, H: np.eye(H))
    monkeypatch.setattr(J, "_als", lambda Z, C, r: (C, np.ones((1, 4, H)), None, np.array([misfit]), None))
    monkeypatch.setattr(J, "_restarted", lambda Z, r, H, fit, *a: fit)  # no further starts
    monkeypatch.setattr(J, "joint_separation", lambda shifts: (sep, q99))
    X0 = np.random.default_rng(0).standard_normal((400, 8))
    scale, _ = J._token_scale(None, None, X0, None, H, None, None, None, J.TOKEN_SCALE, 1e-9)
    return scale, asked


@pytest.mark.parametrize("factor, steps", [(0.99, J.JOINT_SCALE_STEPS), (1.01, 1)])
def test_the_token_scale_doubles_while_the_closest_heads_are_within_joint_separation(monkeypatch, factor, steps):
    scale, asked = _ladder(monkeypatch, factor * J.JOINT_SEPARATION, 0.1)
    assert len(asked) == steps and scale == J.TOKEN_SCALE * 2 ** (steps - 1)
    assert asked == pytest.approx([J.TOKEN_SCALE * 2**k for k in range(steps)], rel=0.05)


@pytest.mark.parametrize("factor, steps", [(0.99, J.JOINT_SCALE_STEPS), (1.01, 1)])
def test_the_token_scale_stops_where_twice_the_shifts_would_leave_the_ratios_window(monkeypatch, factor, steps):
    H = 3
    scale, asked = _ladder(monkeypatch, 0.0, factor * np.log(2 * H) / 2, H=H)
    assert len(asked) == steps


def test_the_token_scale_doubles_while_the_first_row_misfits(monkeypatch):
    scale, asked = _ladder(monkeypatch, 1.0, 0.1, misfit=1e-3)
    assert len(asked) == J.JOINT_SCALE_STEPS and scale == J.TOKEN_SCALE * 2 ** (J.JOINT_SCALE_STEPS - 1)


def test_separation_is_the_closest_heads_rms_shift_difference():
    shifts = np.array([[0.0, 0.3, 1.0], [0.0, -0.3, 2.0]])  # heads 0 and 1 differ by 0.3 at both tokens
    sep, q99 = J.joint_separation(shifts)
    assert sep == pytest.approx(0.3) and q99 == pytest.approx(np.quantile([0, 0.3, 1, 0, 0.3, 2], 0.99))
    assert J.joint_separation(shifts[:, :1])[0] == np.inf


def _restart_calls(monkeypatch, misfits, pencil, fitted, used=4, need=0):
    """The starts :func:`J._restarted` asks for rows of the given misfits (tol 1e-3, each row using ``used`` of its 4
    tokens): each start's fit is stubbed to misfit ``fitted[early]``, a fit of C on every token to ``fitted["all"]``
    (with every token used)."""
    H, tol, calls = 2, 1e-3, []

    def columns(Z, r, H_, early=True, first=0):
        calls.append((int(Z[0, 0, 0]), early) if first == 0 else (int(Z[0, 0, 0]), early, first))
        return np.eye(H)

    def als(Z, C, r, lm_tokens=J.LM_TOKENS):
        if lm_tokens != J.LM_TOKENS:
            calls.append(("all", lm_tokens))
        m = fitted["all" if lm_tokens != J.LM_TOKENS else calls[-1][1]]
        return (
            C,
            np.ones((1, 4, H)),
            np.ones((1, 4, H)),
            np.array([m]),
            np.array([4 if lm_tokens != J.LM_TOKENS else used]),
        )

    monkeypatch.setattr(J, "_start_C_columns", columns)
    monkeypatch.setattr(J, "_als", als)
    B = len(misfits)
    Z = np.arange(B, dtype=float)[:, None, None, None] * np.ones((B, 4, 2 * H, H))  # Z[i, 0, 0, 0] = i
    fit = (np.zeros((B, H, H)), np.ones((B, 4, H)), np.ones((B, 4, H)), np.array(misfits, float), np.full(B, used))
    out = J._restarted(Z, None, H, fit, tol, np.array(pencil), need)
    return calls, out[3]


@pytest.mark.parametrize("factor, restarted", [(0.99, False), (1.01, True)])
def test_a_row_is_fitted_again_only_when_it_misfits_above_tol(monkeypatch, factor, restarted):
    calls, mis = _restart_calls(monkeypatch, [1e-7, factor * 1e-3], [True, True], {True: 1e-7, False: 1e-7, "all": 1.0})
    assert calls == ([(1, True)] if restarted else [])
    assert mis[0] == 1e-7 and mis[1] == (1e-7 if restarted else factor * 1e-3)


def test_a_restart_takes_the_columns_then_every_start_and_keeps_the_best_fit(monkeypatch):
    """A row the pencils started: the column start with its early stop, then without; a row the column start
    started: without its early stop only. A restart's fit replaces the row's only where it misfits less, and the
    first row that still misfits ends the restarts."""
    calls, mis = _restart_calls(monkeypatch, [0.5, 0.5], [True, False], {True: 0.7, False: 2e-4, "all": 1.0})
    assert calls == [(0, True), ("all", 4), (0, False), (1, False)]  # a start's fit above tol: C on every token
    assert list(mis) == [2e-4, 2e-4]
    calls, mis = _restart_calls(monkeypatch, [0.5, 0.5], [True, True], {True: 0.7, False: 0.6, "all": 0.65})
    assert list(mis) == [0.5, 0.5]  # no start did better: the row keeps its fit
    assert calls == [(0, True), ("all", 4), (0, False), ("all", 4)]  # the stage refuses it: row 1 is not restarted


def test_a_restart_then_takes_the_column_start_on_the_next_tokens(monkeypatch):
    """MiniLM in float32 (row 362, measured 2026-12-05): no start of its first COLUMN_TOKENS = 64 tokens reached
    one head (whose column fits them at 1.6e-5), and the row misfit by 1.45e-2 after both column starts; the column
    start on tokens 64 to 127 found all twelve heads and the row fitted at 1.7e-4 (403 of 409 tokens used). The
    windows are whole: a row of 4 tokens at COLUMN_TOKENS = 2 has one more, from token 2."""
    monkeypatch.setattr(J, "COLUMN_TOKENS", 2)
    fitted = {True: 0.7, False: 0.6, "all": 0.65}
    calls, mis = _restart_calls(monkeypatch, [0.5], [True], fitted)
    assert calls == [(0, True), ("all", 4), (0, False), ("all", 4), (0, False, 2), ("all", 4)]
    assert list(mis) == [0.5]


@pytest.mark.parametrize("used, refitted", [(4, False), (3, True)])
def test_a_row_within_tol_that_uses_too_few_tokens_fits_c_on_every_token(monkeypatch, used, refitted):
    """MiniLM in float32 (row 20, measured 2026-12-05): misfit 1.1e-4 within tol, but C fitted on LM_TOKENS tokens
    left 15 tokens at 10 to 20 times the median misfit, and the row used 394 of 409 tokens, below the 397 it needs;
    C on every token from that fit: 1.2e-5, all 409 used."""
    calls, mis = _restart_calls(monkeypatch, [1e-4], [False], {False: 1.0, "all": 1e-5}, used=used, need=4)
    assert calls == ([("all", 4)] if refitted else []) and mis[0] == (1e-5 if refitted else 1e-4)


def test_float32_rows_started_at_a_local_minimum_are_fitted_again(monkeypatch):
    """A random block (d = 32, H = 8, seed 0) whose answers are rounded to float32, at the float32 route's settings
    (joint_options): the tokens' pencils start three rows' fits at local minima (measured 2026-12-05: relative
    misfits 0.49 to 0.53), where the truth's poles and C fit at 1e-7. Without restarts the stage refuses such a row;
    restarted from the column start it learns the heads (measured: every row at 2.5e-7 or below, heads 7.8e-7 off)."""
    layer = random_attention_layer(32, 8, seed=0)
    oracle = VectorQueryOracle(lambda X: layer(X).astype(np.float32).astype(np.float64), d=32, d_out=32)
    o1 = one_token_affine(oracle(np.concatenate([np.zeros((1, 1, 32)), np.eye(32)[:, None, :]])))
    opts = joint_options(2.0**-24)
    Ws, info = J.learn_heads_joint(oracle, o1, 8, np.random.default_rng(0), **opts)
    assert info["joint_max_row_misfit"] < 1e-6  # tol (FLOAT32_HEADS_TOL) is 1e-3
    truth = layer.canonical().Ws[:, :32, :]
    cost = np.linalg.norm(truth[:, None] - Ws[None, :, :32, :], axis=(2, 3))
    rows, cols = linear_sum_assignment(cost)
    assert np.linalg.norm(truth[rows] - Ws[cols, :32, :]) / np.linalg.norm(truth) < 1e-5
    monkeypatch.setattr(J, "_restarted", lambda Z, r, H, fit, *a: fit)  # the stage as it was
    with pytest.raises(OracleInconsistentError, match=r"row \d+: .* misfits by \d\.\d+e-01"):
        J.learn_heads_joint(oracle, o1, 8, np.random.default_rng(0), **opts)

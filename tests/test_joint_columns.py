"""The joint heads' column start (``companion.layer._joint._start_C_columns``): which fits are one head, when the
starts stop, and a row of twelve heads whose poles lie as close as MiniLM's (this book's own construction)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment

import companion.layer._joint as J


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

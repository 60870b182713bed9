"""Pinned documented constants and acceptance rule of ``companion.multihead._rowstart`` (light: it is being
rewritten this round). ``ACCEPT``, the rule ``misfit <= accept * max |G|``, the strictness of
:func:`trimmed_rows` (a head needs more than ``d`` tokens), and exact recovery on exact data."""

from __future__ import annotations

import numpy as np

from companion.multihead import _rowstart as rs
from companion.numerics.rational import ratio_design


def sig(x):
    return 1.0 / (1.0 + np.exp(-x))


def test_accept_is_1e_9():
    assert rs.ACCEPT == 1e-9


def _row(K=12, d=2, seed=0, amp=3.0):
    rng = np.random.default_rng(seed)
    n, m = ratio_design(2)
    s = np.log(n / m)
    X = rng.standard_normal((K, d))
    R = np.array([[0.8, -0.3], [-0.5, 0.6]])
    gamma = amp * np.array([1.0, -0.4])
    L = X @ R.T
    G = np.einsum("ksh,h->ks", sig(s[None, :, None] + L[:, None, :]), gamma)
    return s, G, X, gamma, R, L


def test_shared_amplitude_shifts_recover_exact_shifts_and_accept_them():
    s, G, X, gamma, R, L = _row()
    L_hat, ok = rs.shared_amplitude_shifts(s, G, gamma)
    assert ok.all()
    np.testing.assert_allclose(L_hat, L, atol=1e-7)


def test_acceptance_is_misfit_at_most_accept_times_the_largest_answer(monkeypatch):
    s, G, X, gamma, R, L = _row(K=3, amp=7.0)
    top = float(np.max(np.abs(G)))
    cut = 1e-9 * top
    real = rs.polish_pairs

    def fake(s_, G_, g_, l_, *, fixed_gamma=False, **kw):
        out = real(s_, G_, g_, l_, fixed_gamma=fixed_gamma, **kw)
        if not fixed_gamma:
            return out
        return out[0], out[1], np.array([cut, float(np.nextafter(cut, 1.0)), 0.5 * cut])

    monkeypatch.setattr(rs, "polish_pairs", fake)
    _, ok = rs.shared_amplitude_shifts(s, G, gamma)
    assert ok.tolist() == [True, False, True]


def test_trimmed_rows_needs_more_than_d_tokens_per_head_when_strict():
    rng = np.random.default_rng(1)
    K, d = 10, 3
    X = rng.standard_normal((K, d))
    R = rng.standard_normal((2, d))
    L = X @ R.T
    use = np.ones((K, 2), bool)
    use[d + 1 :, 1] = False  # head 1 at exactly d + 1 tokens: enough
    np.testing.assert_allclose(rs.trimmed_rows(X, L, use), R, atol=1e-10)
    use[d:, 1] = False  # d tokens: refused
    assert rs.trimmed_rows(X, L, use) is None
    R_ns = rs.trimmed_rows(X, L, use, strict=False)  # a minimum-norm prediction instead
    np.testing.assert_allclose(X[:d] @ R_ns[1], L[:d, 1], atol=1e-10)


def test_trimmed_rows_drops_outliers():
    rng = np.random.default_rng(2)
    K, d = 40, 2
    X = rng.standard_normal((K, d))
    R = np.array([[1.0, -2.0]])
    L = X @ R.T
    L[[3, 17, 29], 0] += np.array([0.5, -1.0, 2.0])  # swapped or misfitted shifts
    np.testing.assert_allclose(rs.trimmed_rows(X, L, np.ones((K, 1), bool)), R, atol=1e-10)


def test_shared_amplitude_start_returns_the_amplitudes_and_rows():
    s, G, X, gamma, R, L = _row(K=14)
    out = rs.shared_amplitude_start(s, G, X, gamma, window=float(np.max(np.abs(s))))
    assert out is not None
    np.testing.assert_array_equal(out[0], gamma)
    np.testing.assert_allclose(out[1], R, atol=1e-7)

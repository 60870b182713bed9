"""The skeleton every learner shares: check, reserve, verify, build the Recovery (private).

A learner's body shows only its own steps; the common path around them lives here:

1. :func:`check_verify` normalises the ``verify`` / ``verify_rtol`` options (``verify=0`` opts out);
2. :func:`reserve` asks the oracle for the whole budget (learning plus verification) before the
   first query, and returns the oracle's counter at the start;
3. :func:`verify_outputs` (exact oracles) or :func:`verify_noisy` (approximate oracles) compares
   the recovered model with the oracle on fresh random queries, never used for learning, and raises
   :class:`~companion.errors.OracleInconsistentError` with the measured disagreement;
4. :func:`build` makes the :class:`~companion.recovery.Recovery`: ``n_queries`` read from the
   oracle (verification included) and ``diagnostics["n_verify_queries"]`` apart, so that
   ``Recovery.n_learning_queries`` is the theorem's own count.

The verification is this book's, not the paper's: the paper's learners trust their assumptions.

Layer: below every learner, which all import it; it imports no learner, only the shared numerics
(:mod:`companion.numerics.rop`, the rank-one projections of :func:`verify_noisy`).
"""

from __future__ import annotations

import numpy as np

from ._validation import check_int, check_real
from .errors import MESSAGES, OracleInconsistentError

#: Fresh random queries every learner spends on its default verification.
DEFAULT_VERIFY = 32

#: Longest verification query (lengths are uniform in 1 .. VERIFY_MAX_LEN).
VERIFY_MAX_LEN = 8

_TINY = float(np.finfo(float).tiny)


def check_verify(verify, verify_rtol) -> tuple[int, float]:
    """``verify`` as an int ``>= 0`` and ``verify_rtol`` as a float ``> 0``."""
    return (check_int(verify, "verify", minimum=0),
            check_real(verify_rtol, "verify_rtol", minimum=0.0, strict=True))


def reserve(oracle, n, learner: str) -> int:
    """Raise :class:`~companion.errors.BudgetExceededError` now if ``n`` queries do not fit.

    Returns the oracle's counter ``oracle.n_queries`` before the learner's first query.
    """
    if hasattr(oracle, "require"):
        oracle.require(int(n), learner=learner)
    return int(oracle.n_queries)


def random_queries(d, n, *, seed, scale=1.0, max_len=VERIFY_MAX_LEN, unit_ball=False):
    """``n`` random sequences of lengths 1 .. ``max_len`` with tokens ``N(0, scale^2 I_d / d)``.

    With ``unit_ball`` every token longer than 1 is scaled back to norm 1 (§6's setting).
    """
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, max_len + 1, size=n)
    X = [rng.standard_normal((int(m), d)) * (scale / np.sqrt(d)) for m in lengths]
    if unit_ball:
        X = [x / np.maximum(1.0, np.linalg.norm(x, axis=1))[:, None] for x in X]
    return X


def verify_outputs(oracle, predict, out_scale, n, *, rtol, seed, scale=1.0, what="the model"):
    """Compare ``oracle`` with ``predict`` on ``n`` fresh random queries (exact oracles).

    The disagreement on a query ``X`` is ``|VQ(X) - predict(X)| / out_scale(X)``, where
    ``out_scale(X)`` is the output scale of the recovered model on ``X`` (e.g. ``max_i |x_i^T v|``),
    floored at the smallest positive float.

    Returns
    -------
    dict
        ``n_verify_queries`` (``n``) and ``verify_max_error`` (the largest disagreement).

    Raises
    ------
    OracleInconsistentError
        If the largest disagreement exceeds ``rtol``: the oracle is not ``what``.
    """
    if n == 0:
        return {"n_verify_queries": 0}
    d = int(oracle.d)
    X = random_queries(d, n, seed=seed, scale=scale)
    y = np.asarray(oracle(X), dtype=np.float64)
    y_hat = np.asarray(predict(X), dtype=np.float64)
    s = np.array([out_scale(x) for x in X])
    err = np.abs(y - y_hat) / np.maximum(s, _TINY)
    worst = float(np.max(err))
    if not worst <= rtol:
        raise OracleInconsistentError(MESSAGES["verify_failed"].format(
            n=n, err=worst, tol=rtol, what=what))
    return {"n_verify_queries": n, "verify_max_error": worst}


def verify_noisy(oracle, W, v, n, *, tau, W_max, tau_v=None, allowed_W=None, allowed_v=None,
                 rtol, seed, what="the model"):
    """Certify, on ``n`` fresh queries, how wrong a head ``(W, v)`` learned from a noisy oracle is.

    An answer within ``tau`` of ``f*`` cannot prove small errors, but it can prove large ones:

    * a length-1 query ``[x^T]`` (``||x|| = 1``) answers ``x^T v* +- tau``, so
      ``||v - v*||_2 >= |AVQ([x^T]) - x^T v| - tau``;
    * a rank-one projection ``c [(a + b)^T; b^T]`` at the scale of
      :func:`companion.robust.rop_scales` (logits within ``[-1/2, 1/2]`` for every
      ``||W*||_F <= W_max``) gives ``t`` with ``|t - a^T W* b| <= delta``
      (:func:`companion.robust.rop_error_bound`, with ``v``'s error at most ``tau_v``), so
      ``||W - W*||_F >= (|t - a^T W b| - delta) / (||a|| ||b||)``. This needs ``v`` within
      ``tau_v`` of ``v*`` in every entry, as a ``v`` read off length-1 queries is.

    A quarter of the queries (at least one) are length-1, the rest rank-one projections. The
    largest lower bounds are the certified errors. The model is refused if a certified error
    exceeds what the learner allows: ``max(allowed_W, rtol min(||W||_F, W_max))`` and
    ``max(allowed_v, rtol ||v||)`` (plus 1e-9 of the norm and 1e-12 for rounding), where
    ``allowed_W``, ``allowed_v`` are the learner's own error bounds, if it has any.

    Returns
    -------
    dict
        ``n_verify_queries``, ``verify_error_W`` and ``verify_error_v`` (the certified lower bounds
        on ``||W - W*||_F`` and ``||v - v*||_2``, 0 when nothing is certified), ``verify_allowed_W``
        and ``verify_allowed_v``.

    Raises
    ------
    OracleInconsistentError
        If a certified error exceeds its allowance: the oracle is not a single head within
        ``tau`` with ``||W*||_F <= W_max``, or the learner failed.
    """
    if n == 0:
        return {"n_verify_queries": 0}
    from .numerics.rop import _gaussian_rop_design, rop_error_bound, rop_queries, rop_scales

    d = int(oracle.d)
    tau_v = tau if tau_v is None else tau_v
    # The allowance is the larger of the learner's own bound and rtol times the norm, plus a
    # rounding floor (an exact oracle, tau = 0, still leaves float64 rounding in t).
    nW, nv = min(float(np.linalg.norm(W)), float(W_max)), float(np.linalg.norm(v))
    allowed_W = max(rtol * nW, 0.0 if allowed_W is None else float(allowed_W)) + 1e-9 * nW + 1e-12
    allowed_v = max(rtol * nv, 0.0 if allowed_v is None else float(allowed_v)) + 1e-9 * nv + 1e-12
    rng = np.random.default_rng(seed)
    n_v = max(1, n // 4)
    n_w = n - n_v
    x = rng.standard_normal((n_v, d))
    x /= np.linalg.norm(x, axis=1)[:, None]
    err_v = float(np.max(np.abs(np.asarray(oracle(x[:, None, :])) - x @ v))) - tau
    err_W, spent = -np.inf, n_v
    if n_w and np.any(v):
        spent = n
        A, B = _gaussian_rop_design(d, n_w, v, rng)
        c = rop_scales(A, B, W_max=W_max)
        y = np.asarray(oracle(rop_queries(A, B, c)), dtype=np.float64)
        av = A @ v
        alpha = (y / c - B @ v) / av
        from scipy.special import expit, logit

        lo = float(expit(-0.5))
        t = logit(np.clip(alpha, lo, 1 - lo)) / c**2
        delta, _ = rop_error_bound(alpha, tau=max(tau, tau_v), c=c, A=A, B=B, av_hat=av)
        gap = np.abs(t - np.einsum("kd,kd->k", A @ W, B)) - delta
        err_W = float(np.max(gap / (np.linalg.norm(A, axis=1) * np.linalg.norm(B, axis=1))))
    info = {"n_verify_queries": spent, "verify_error_W": max(err_W, 0.0),
            "verify_error_v": max(err_v, 0.0), "verify_allowed_W": allowed_W,
            "verify_allowed_v": allowed_v}
    for name, err, allowed in (("W", err_W, allowed_W), ("v", err_v, allowed_v)):
        if err > allowed:
            raise OracleInconsistentError(MESSAGES["verify_noisy_failed"].format(
                n=n, name=name, err=err, allowed=allowed, tau=tau, W_max=W_max, what=what))
    return info


def verified_message(info) -> str:
    """The clause a learner appends to its message after a verification."""
    n = info.get("n_verify_queries", 0)
    if not n:
        return ""
    if "verify_max_error" in info:
        return f"; verified on {n} fresh queries (largest disagreement {info['verify_max_error']:.1e})"
    return (f"; verified on {n} fresh queries (certified errors at least "
            f"{info['verify_error_W']:.1e} in W, {info['verify_error_v']:.1e} in v)")


def build(cls, oracle, start, *, verification=None, message="", diagnostics=None, **fields):
    """The learner's result: ``cls(**fields)`` with ``n_queries`` read from the oracle.

    ``verification`` (what :func:`verify_outputs` or :func:`verify_noisy` returned, or None) goes
    into ``diagnostics``, always with ``n_verify_queries`` (0 when not verified), and its clause
    into ``message``.
    """
    diagnostics = dict(diagnostics or {})
    info = dict(verification or {"n_verify_queries": 0})
    diagnostics.update(info)
    return cls(n_queries=int(oracle.n_queries) - int(start), message=message + verified_message(info),
               diagnostics=diagnostics, **fields)


#: Where each learner lives, for :func:`verification_defaults`.
_LEARNERS = {
    "learn_single_head": "exact",
    "learn_low_rank": "lowrank",
    "learn_robust": "robust",
    "learn_robust_lstsq": "robust",
    "learn_low_rank_noisy": "robust",
    "learn_ffn": "ffn",
    "learn_one_layer": "transformer",
    "learn_orthogonal_heads": "multihead",
}


def verification_defaults(names) -> dict:
    """Each learner's default verification: ``{name: (verify, verify_rtol)}``, read from its signature.

    Chapters cite these numbers instead of typing them.

    Parameters
    ----------
    names : sequence of str
        Learner names, e.g. ``["learn_single_head"]``; see ``_LEARNERS`` for the known ones.

    Raises
    ------
    InvalidInputError
        If a name is not a learner with a ``verify`` parameter.

    Examples
    --------
    >>> verification_defaults(["learn_single_head", "learn_ffn"])
    {'learn_single_head': (32, 1e-06), 'learn_ffn': (64, 1e-09)}
    """
    import importlib
    import inspect

    from .errors import InvalidInputError

    out = {}
    for name in names:
        if name not in _LEARNERS:
            raise InvalidInputError(f"{name!r} is not a learner with a default verification; "
                                    f"choose from {sorted(_LEARNERS)}.")
        params = inspect.signature(getattr(importlib.import_module(f"companion.{_LEARNERS[name]}"),
                                           name)).parameters
        out[name] = (int(params["verify"].default), float(params["verify_rtol"].default))
    return out

"""Learning a head from homogeneous queries, and the layer probe of the counts route (private).

Part of :mod:`companion.pretrained`; the public names are re-exported there.
"""

import numpy as np

from .._validation import check_int, check_real
from ..errors import InvalidInputError
from ..exact import TokenPart, check_exact_oracle, learn_single_head
from .._learner import DEFAULT_VERIFY
from ._weights import D_MODEL, N_HEADS, load_head
from ._bert import BertAttentionTarget


# --------------------------------------------------------------------------------------------
# Learning a head from homogeneous queries
# --------------------------------------------------------------------------------------------


def learn_homogeneous_head(
    oracle, *, probes="basis", scale=1.0, verify=DEFAULT_VERIFY, verify_rtol=1e-6, seed=0, precision=None
):
    """Recover a head from value queries whose tokens all end in 1 (homogeneous coordinates).

    A thin alias of ``learn_single_head(TokenPart(oracle), bias=True)``
    (:func:`companion.exact.learn_single_head`, :class:`companion.exact.TokenPart`), for an oracle
    whose tokens carry the 1 themselves, as the MiniLM heads of this module do. A model whose
    oracle takes the token part only (a layer with biases) is learned by
    ``learn_single_head(oracle, bias=True)`` directly.

    Parameters
    ----------
    oracle : ValueQueryOracle
        Exact oracle for ``f_{W~, v~}`` in ``d + 1 = oracle.d`` dimensions; the learner only asks
        sequences of length 1 and 2 whose tokens have last coordinate exactly 1, as a BERT head
        with biases is defined only there (module docstring). Its budget must allow
        ``(d + 1)**2`` queries.
    probes : {"basis", "gaussian"}, default="basis"
        Probe vectors in R^d, as :func:`companion.exact.probe_matrix` builds them from ``v``
        (the first ``d`` entries of ``v~``).
    scale : float, default=1.0
        Starting scale ``t > 0`` of the token part (``t`` of chapter 07's homogeneous queries). A probe whose
        attention weight leaves ``[SATURATION, 1 - SATURATION]`` is re-measured at a smaller ``t`` (one extra query
        each, in ``diagnostics["n_requeries"]``).
    verify : int, default=32
        Fresh random homogeneous queries (lengths 1 to 8, every token ending in 1; never used for
        learning) on which the recovered head is compared with the oracle; 0 opts out. It turns an
        oracle that is not a single head on homogeneous inputs into an
        :class:`~companion.errors.OracleInconsistentError` instead of a wrong ``W``.
    verify_rtol : float, default=1e-6
        Largest relative disagreement ``|VQ(X) - f_hat(X)| / max_i |x~_i^T v~|`` the check accepts.
    seed : int, default=0
        Seed of the Gaussian probes (and, plus 1, of the verification queries).
    precision : None, "measure", str or float, default=None
        The answers' relative rounding, as in :func:`companion.exact.learn_single_head`: it
        widens the saturation band and sets the verification tolerance.

    Returns
    -------
    Recovery
        ``W`` of shape (d + 1, d + 1): the identifiable first ``d`` rows, and a zero last row
        (the canonical representative); ``v`` of shape (d + 1,). ``n_queries`` equals
        ``(d + 1)**2`` plus re-measurements, the precision measurement's queries
        (``n_precision_queries``, where ``u`` is measured) and ``verify`` (``n_learning_queries`` leaves out
        the last two). ``diagnostics``: ``probes`` (d, d), ``cond_probes``, ``n_requeries``,
        ``n_scale_queries`` (0: the homogeneous probes keep their scale), ``max_abs_logit``,
        ``identifiable`` (the string ``"W[:d, :], v"``), ``n_verify_queries``
        and, with ``verify``, ``verify_max_error`` and ``verify_tolerance``; the answers'
        precision: ``precision``, ``precision_source``, ``precision_format``,
        ``n_precision_queries``, ``precision_kind``, ``kappa_W``, ``floor_W`` and ``floor_v``.
        ``cond_probes`` is LAPACK's 1-norm condition estimate from the LU factors (an SVD of a
        384 x 384 matrix would cost more than the learner).

    Raises
    ------
    TypeError
        If the oracle is approximate (``tau > 0``).
    InvalidInputError
        For ``oracle.d < 2``, an unknown ``probes`` or a bad ``scale``.
    NotIdentifiableError
        If the token part ``v = v~[:d]`` is 0: then every answer equals ``v~[d]`` and nothing
        about ``W~`` is revealed.
    BudgetExceededError
        If the budget is below ``(d + 1)**2 + verify``; raised before the first query.
    OracleInconsistentError
        If an attention weight stays saturated after 40 re-measurements, or the verification
        queries disagree with the recovered head (the oracle is not a single head on homogeneous
        inputs).

    Notes
    -----
    Theorem 4.1 of [1]_ adapted to tokens ``x~ = (x, 1)``. Write ``W~ = [[W, w], [r^T, s]]``
    (``W`` (d, d), ``w`` (d,)) and ``v~ = (v, v0)``.

    1. ``[(0, 1)]`` returns ``v0``; ``[(e_i, 1)]`` returns ``v_i + v0``: ``d + 1`` queries.
    2. ``[(c u, 1); (0, 1)]`` has logit ``(x~_1 - x~_2)^T W~ x~_2 = c u^T w`` and answer
       ``v0 + sigma(c u^T w) c u^T v``: ``d`` queries give ``w``.
    3. ``[(c (u + e_j), 1); (c e_j, 1)]`` has logit ``c^2 u^T W e_j + c u^T w`` and answer
       ``c v_j + v0 + sigma(logit) c u^T v``: ``d`` probes give column ``j`` of ``W``; ``d^2``
       queries in all.

    Total ``(d + 1) + d + d^2 = (d + 1)^2``, the number of identifiable unknowns. Every logit is
    a difference ``(x~_i - x~_N)^T W~ x~_N`` whose left factor ends in 0, so ``(r, s)`` never
    enters: the last row of ``W~`` is not identifiable and does not change the function on
    homogeneous inputs.

    References
    ----------
    .. [1] Bhattamishra, Shah, Hahn, Kanade, "Provably Learning Attention with Queries", ICML 2026.

    Examples
    --------
    >>> import numpy as np
    >>> from companion.oracles import ValueQueryOracle
    >>> target = load_head(0, 1)
    >>> rec = learn_homogeneous_head(ValueQueryOracle(target))
    >>> rec.n_learning_queries == 385**2, homogeneous_errors(rec, target)["W"] < 1e-10
    (True, True)
    """
    d1 = check_exact_oracle(oracle, "learn_homogeneous_head")
    if d1 < 2:
        raise InvalidInputError(
            f"oracle.d={d1} must be >= 2: a homogeneous head has d >= 1 token coordinates plus the 1."
        )
    return learn_single_head(
        TokenPart(oracle),
        bias=True,
        probes=probes,
        scale=scale,
        verify=verify,
        verify_rtol=verify_rtol,
        seed=seed,
        precision=precision,
    )


def homogeneous_errors(rec, target) -> dict:
    """Relative errors of a homogeneous recovery on the identifiable part.

    Parameters
    ----------
    rec : Recovery
        With ``W`` (d + 1, d + 1) and ``v`` (d + 1,).
    target : SingleHead
        The true head (e.g. from :func:`load_head`).

    Returns
    -------
    dict
        ``"W"``: ``||W^[:d] - W~[:d]||_F / ||W~[:d]||_F`` (first ``d`` rows, all columns);
        ``"v"``: ``||v^ - v~||_2 / ||v~||_2``. Python floats.
    """
    d = target.d - 1
    Wt, Wr = np.asarray(target.W)[:d], np.asarray(rec.W)[:d]
    return {
        "W": float(np.linalg.norm(Wr - Wt) / np.linalg.norm(Wt)),
        "v": float(np.linalg.norm(np.asarray(rec.v) - target.v) / np.linalg.norm(target.v)),
    }


def layer_counts_probe(layer=0, *, n_pairs=8, delta_norm=10.0, token_norm=20.0, match_tol=1e-6, seed=0, path=None):
    """Where the follow-up's counts route meets a whole BERT layer: one pair at a time (this book's).

    :func:`~companion.multihead.learn_canonical_rational` rests on pairs: for a token ``x~ = (x, 1)``
    and a direction ``delta~ = (delta, 0)``, the ``2 H = 24`` queries of ``n`` copies of
    ``x~ + delta~`` then ``m`` copies of ``x~`` (``n + m <= 25``,
    ``companion.numerics.rational.ratio_design``) sample ``G(r) = sum_h gamma_h r / (r + p_h)`` with
    ``gamma_h = delta~^T v~_h`` and ``log p_h = -delta~^T W~_h x~``, which a type-(12, 12) rational
    interpolation inverts. Its joint row fit starts from the pairs whose own interpolation resolves
    every head. This asks ``25 n_pairs`` queries of the full layer (:class:`BertAttentionTarget`,
    homogeneous tokens only) and reports, per pair, what the interpolation resolves; the true heads
    (:func:`load_head`) are read only to say why.

    Parameters
    ----------
    layer : int, default=0
        Layer, ``0 <= layer <= 5``.
    n_pairs : int, default=8
        Pairs ``(x, delta)`` probed, ``>= 1``.
    delta_norm, token_norm : float, default=10.0, 20.0
        Norms of ``delta`` and of the token part ``x`` (about that of a LayerNorm output, ``sqrt 384``).
    match_tol : float, default=1e-6
        A fitted shift matches a head if it is within this of the head's true shift.
    seed : int, default=0
        Seed of the tokens and directions.
    path : str or Path, default=None
        The npz file.

    Returns
    -------
    dict
        ``rows`` (one dict per pair: ``terms found`` by the free fit
        :func:`~companion.multihead.fit_logistic_sum`, ``interpolation resolved`` (all 12 poles
        real and negative, each within ``match_tol`` of a true shift), ``terms matching a head``,
        ``closest true shifts`` (smallest gap between two heads' ``delta~^T W~_h x~``),
        ``rank of J`` (the numerical rank of ``J``, the Jacobian of the 24 samples in the 24
        unknowns ``(gamma, l)`` at the true heads, by numpy's criterion: singular values above
        ``24 eps sigma_max(J)``; below 24, some combination of the unknowns moves the samples by
        less than float64 rounding of ``J``, so float64 answers do not determine it. The rank is
        the same under every BLAS kernel tried, where ``eps max|G| / sigma_min(J)``, the first-order
        sensitivity, is itself rounding noise, since ``sigma_min(J)`` is below what float64 resolves
        in ``J``)), ``n_queries``, ``oracle_seconds`` (the oracle's time for them), ``n_heads`` (12).

    Examples
    --------
    >>> probe = layer_counts_probe(0, n_pairs=1)
    >>> row = probe["rows"][0]
    >>> probe["n_queries"], row["interpolation resolved"], row["terms found"] < 12, row["rank of J"]
    (25, False, True, 19)
    """
    import time

    from ..numerics.rational import interpolate_pairs, logistic_jacobian, ratio_design
    from ..multihead import fit_logistic_sum
    from ..oracles import ValueQueryOracle

    n_pairs = check_int(n_pairs, "n_pairs", minimum=1)
    delta_norm = check_real(delta_norm, "delta_norm", minimum=0.0, strict=True)
    token_norm = check_real(token_norm, "token_norm", minimum=0.0, strict=True)
    match_tol = check_real(match_tol, "match_tol", minimum=0.0, strict=True)
    oracle = ValueQueryOracle(BertAttentionTarget(layer, None, path=path))
    heads = [load_head(layer, h, path=path) for h in range(N_HEADS)]
    H = len(heads)
    n, m = ratio_design(H)
    r = n / m
    s = np.log(r)
    rng = np.random.default_rng(check_int(seed, "seed", minimum=0))
    rows, seconds = [], 0.0
    for _ in range(n_pairs):
        x = np.append(rng.standard_normal(D_MODEL) * token_norm / np.sqrt(D_MODEL), 1.0)
        delta = rng.standard_normal(D_MODEL)
        delta = np.append(delta * delta_norm / np.linalg.norm(delta), 0.0)
        seqs = [x[None]] + [
            np.vstack([np.repeat((x + delta)[None], a, 0), np.repeat(x[None], b, 0)]) for a, b in zip(n, m)
        ]
        t0 = time.perf_counter()
        y = np.asarray(oracle(seqs), dtype=np.float64)
        seconds += time.perf_counter() - t0
        g = y[1:] - y[0]
        l_true = np.array([delta @ h.W @ x for h in heads])
        c_true = np.array([delta @ h.v for h in heads])
        c_fit, l_fit, _ = fit_logistic_sum(s, g)
        _, l_int = interpolate_pairs(r, g[None], H)
        l_int = l_int[0]
        resolved = bool(np.all(np.isfinite(l_int)) and all(np.min(np.abs(l_true - li)) <= match_tol for li in l_int))
        # Jacobian of G(s_t) = sum_h c_h sigma(s_t + l_h) in (c, l) at the true heads
        J = logistic_jacobian(s, c_true, l_true)
        rows.append(
            {
                "terms found": int(c_fit.size),
                "interpolation resolved": resolved,
                "terms matching a head": int(sum(np.min(np.abs(l_true - li)) <= match_tol for li in l_fit)),
                "closest true shifts": float(np.min(np.diff(np.sort(l_true)))),
                "rank of J": int(np.linalg.matrix_rank(J)),
            }
        )
    return {"rows": rows, "n_queries": int(oracle.n_queries), "oracle_seconds": seconds, "n_heads": H}

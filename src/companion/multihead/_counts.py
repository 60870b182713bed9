"""The counts route: general heads in canonical form at the follow-up's count (private).

:func:`companion.multihead.learn_canonical_rational` (this book's derivation of the follow-up's
abstract); its plans are in :mod:`._route`, its starts in :mod:`._pairstart` and :mod:`._moments`.
"""

from __future__ import annotations

from .._learner import DEFAULT_VERIFY, check_verify, resolve_heads
from .._validation import check_int, check_real
from ..errors import InvalidInputError
from ..exact import check_exact_oracle
from ._common import fits_name_rounding
from ._moments import learn_moments
from ._pairstart import learn_pairs
from ._route import MOMENT_FROM, CountsOptions, moment_plan


@fits_name_rounding
def learn_canonical_rational(
    oracle,
    H=None,
    *,
    H_bound=None,
    start="auto",
    scale=3.0,
    spread=1.5,
    tol=1e-9,
    verify=DEFAULT_VERIFY,
    verify_rtol=1e-6,
    seed=0,
):
    """Canonical form of a general multi-head target from ``<= 4 H d^2 - 2 H + 1`` value queries.

    The route at the follow-up's count [2]_: every query is ``n`` copies of a token ``u`` followed
    by ``m`` copies of the query token ``x`` with ``n + m <= 2 H + 1``. Use :func:`learn_canonical`
    (the robust route: longer queries, several times the queries) when this one refuses, which it
    does where float64 cannot separate ``H`` heads from ``2 H`` samples per pair (measured: see
    ``benchmarks/bench_multihead.py``).

    Parameters
    ----------
    oracle : ValueQueryOracle
        Exact oracle of dimension ``d`` for ``f = sum_h f_{W_h, v_h}`` (any heads).
    H : int, default=None
        Number of heads of the canonical form, if known.
    H_bound : int, default=None
        A known upper bound ``H_0`` on it, used when ``H`` is not given: the learner then asks
        ``<= 4 H_0 d^2 - 2 H_0 + 1`` queries of length ``<= 2 H_0 + 1`` and finds the number of
        heads on row 0: the smallest ``h`` whose interpolation through ``2 h`` of the ``2 H_0``
        samples fits all of them for a quarter of the pairs and for at least half as many pairs
        as the ``h`` that fits the most (with fewer terms than heads, the pairs along which a
        head's term is flat still fit; with more, the surplus poles are complex at most pairs).
        Exactly one of ``H`` and ``H_bound`` must be given.
    start : {"auto", "pairs", "moments"}, default="auto"
        How each row's joint fit is started. ``"pairs"``: from the pairs' own interpolations
        (below), the design of rows ``delta_i`` in an orthonormal basis. ``"moments"``: this book's
        moment start (:mod:`companion.multihead._star`, :func:`moment_plan`): one centre row solved from the
        heads' span and Jennrich's algorithm on Taylor moments, the other rows a star around it
        started from the centre's solution; needs ``H <= d`` and ``2 H >= 4`` samples per token.
        With only ``H_bound``, ``H`` is then the number of singular values of the gradients above
        ``RANK_TOL`` = 1e-7 of the largest. ``"auto"``: ``"moments"`` from ``H`` (or ``H_bound``)
        ``>= MOMENT_FROM`` = 9 where :func:`moment_plan` accepts ``d``, else ``"pairs"``.
    scale : float, default=3.0
        Median norm of the query tokens ``x`` (``0 < scale <= 100``); the shifts
        ``(u - x)^T W_h x`` grow with it. Tune it to ``||W_h||``: about 3 for entries of order 1.
    spread : float, default=1.5
        Token norms are log-uniform in ``[scale / spread, scale * spread]`` (``>= 1``). Measured
        (``benchmarks/bench_multihead.py``, seed 0): ``spread = 1.5`` recovers ``H = 6`` at
        ``d = 8, 16, 32, 64``; at ``H = 7`` it fails (a row's joint fit does not converge from its
        start). With the per-head start (below) ``spread = 3.0`` also recovers ``H = 6`` at
        ``d = 16`` (seeds 0, 1), where the whole-pair start refused.
    tol : float, default=1e-9
        Largest relative misfit of a row's joint fit (``0 < tol <= 1e-2``).
    verify : int, default=32
        Fresh random queries of lengths 1 to 8 on which the result is checked, counted apart
        (``n_learning_queries`` is the follow-up's count); ``0`` opts out.
    verify_rtol : float, default=1e-6
        Largest relative disagreement accepted by the check.
    seed : int, default=0
        Seed of the directions ``u - x`` and the query tokens.

    Returns
    -------
    MultiHeadRecovery
        ``Ws``, ``vs`` of the canonical form. ``n_learning_queries <= 4 H d^2 - 2 H + 1``
        (``rational_plan(d, H)["n_queries"]``). ``diagnostics``: ``n_heads``, ``max_len``
        (``<= 2 H + 1``), ``kim_count``, ``plan``, ``resolved_fraction`` (pairs of the worst row
        whose own interpolation resolved every head), ``max_row_residual``, ``max_link_error``, ``n_redrawn_rows``,
        ``n_shared_start_rows`` (rows learned from the shared-amplitude start, where the per-head
        start failed), ``n_verify_queries`` and, with ``verify``, ``verify_max_error`` and
        ``verify_tolerance``.
        With the moment start, instead of the pair and link fields: ``start`` (``"moments"``),
        ``n_centres_tried``, ``centre_amplitude_ratio`` (the chosen centre's smallest
        ``|gamma_h| / max |gamma|``: the result's error grows as it falls), ``subspace_sv``,
        ``taylor_misfit``, ``jennrich_gap``, ``n_tracked_rows`` (rows that needed the
        continuation), ``n_redrawn_rows`` and ``max_row_residual``.

    Raises
    ------
    PrecisionError
        If the fits refuse and the answers' precision (stated, or measured with 24 more queries)
        is far coarser than float64's (float32 or coarser): the rounding, not ``H`` or the model, is the cause.
    TypeError
        If the oracle is approximate.
    InvalidInputError
        If neither or both of ``H``, ``H_bound`` are given, a parameter is out of range, or ``d``
        is too small for ``H`` (:func:`rational_plan`).
    BudgetExceededError
        If the budget is below the plan's count plus ``verify``; raised before the first query.
    NotIdentifiableError
        If the answers show no head at all (``f`` is ``x^T v`` on every query: the values cancel).
    OracleInconsistentError
        If too few pairs of a row are resolved by their own interpolation to start the joint fit
        (float64 conditioning; the message gives the numbers, and names too small an ``H`` or
        ``H_bound`` instead when the pairs' fits are well conditioned, rounding sensitivity at
        most ``WELL_CONDITIONED`` = 1e-4, yet disagree), a row's joint fit does not reach
        ``tol``, two rows cannot be linked, or the verification fails.

    Notes
    -----
    This book's derivation from the follow-up's abstract [2]_ (its algorithm is not public).
    For a query of ``n`` copies of ``u = x + delta`` followed by ``m`` copies of ``x`` (the query
    token last), head ``h`` puts weight ``n e^{a_h}`` on the copies of ``u`` and ``m e^{b_h}`` on
    those of ``x`` (``a_h = u^T W_h x``, ``b_h = x^T W_h x``), so with ``r = n / m``::

        VQ = sum_h (r e^{a_h} u^T v_h + e^{b_h} x^T v_h) / (r e^{a_h} + e^{b_h})
           = x^T v + sum_h gamma_h r / (r + p_h),   gamma_h = delta^T v_h,
             p_h = exp(-delta^T W_h x),   v = sum_h v_h,

    a rational function of ``r`` of type ``(H, H)`` with ``2 H + 1`` parameters, fixed by ``2 H + 1``
    samples (``r = 0``, the query ``x`` alone, and ``2 H`` ratios with ``n + m <= 2 H + 1``). Its
    poles ``-p_h`` give ``delta^T W_h x`` and its residues ``-gamma_h p_h`` the value terms.
    Here ``x^T v`` comes from ``d`` length-1 queries ``e_j`` (then ``G(0) = 0`` is known for every
    pair), and every pair costs ``2 H`` queries.

    Rows ``delta_i`` (an orthonormal basis) share the tokens ``x_k``; within a row the amplitudes
    ``gamma_h = delta_i^T v_h`` are the same for every token and label the heads, and the shifts
    ``delta_i^T W_h x_k`` are linear in ``x_k``. Each pair is interpolated on its own
    (``companion.numerics.rational.interpolate_pairs``, then Levenberg-Marquardt where the interpolant
    misfits its own samples), batched over all pairs; the amplitudes shared by the pairs whose
    ``H`` terms agree, and for each head the shifts of every pair with a term of that head's
    amplitude (to ``MATCH_TOL``), start the joint fit of the row over all its tokens (Gauss-Newton batched
    over the rows, ``companion.numerics.rational.fit_rows_joint``; a row that misfits after it gets
    ``companion.numerics.rational.fit_row_joint``, then a new direction), which is far better
    conditioned than any single pair: a collision of two poles at one token is resolved by the
    others. Rows are linked to row 0 through ``n_link`` pairs at ``delta_0 + delta_i``, whose
    answers are linear in the ``H^2`` candidate terms (head ``h`` of row 0 with head ``g`` of row ``i``). Then
    ``v_h = sum_i gamma_h(i) delta_i`` and ``W_h = sum_i delta_i (delta_i^T W_h)``. Heads with equal
    ``W`` give one term, so the result is the canonical form.

    A pair that misses some heads (a shift outside the window, two colliding) still gives the
    others: head ``h``'s start row is a least-squares fit over every pair with a term of ``h``'s
    amplitude (to ``MATCH_TOL``, mutually nearest, within a third of the gap to the next head's
    amplitude). A row whose joint fit misfits from that start gets each head refitted alone against
    the others' start terms (``repair_start``) and one more joint fit.

    Float64 limits the start, not the joint fit: a single pair's interpolation of ``H`` logistic
    terms from ``2 H`` samples in ``|log r| <= log 2H`` loses about a digit per head, so fewer
    tokens per head are resolved by their own pair as ``H`` grows, and a head's start row needs
    more than ``d`` of the ``K ~ 1.8 d`` tokens. Measured at ``d = 64``
    (``benchmarks/bench_multihead.py``): the fewest resolved per head, over 4 rows, is ``1.5 d``
    at ``H = 6``, ``1.1 d`` at ``H = 8``, ``0.55 d`` at ``H = 10`` and ``0.11 d`` at ``H = 12``,
    while the rounding sensitivity of the row's joint fit stays ``<= 1e-7`` (``3.3e-10`` at
    ``H = 8``, :func:`counts_conditioning`). The largest ``H`` from the per-head start alone is 7 at ``d = 16, 32, 64``
    and 6 at ``d = 8`` (seed 0, the Haswell kernel; 5 under SkylakeX, where row 2 of ``H = 6``
    misfits by 2.3e-8), 8 at ``d = 64`` with the shared-amplitude start below.

    Where a row's per-head start fails (after its repair), this book's shared-amplitude start
    (:mod:`companion.multihead._rowstart`) uses all of the row's pairs together: their amplitudes
    ``gamma_h`` are shared (the poles are not), and with them fixed a pair's shifts have a rounding
    sensitivity of 5e-11 at ``H = 8`` against 0.09 free (:func:`counts_conditioning`). Every pair is
    refitted so, the pairs not accepted are refitted again from the shifts that the accepted ones
    predict through ``X R^T``, and ``R_h`` is a least trimmed squares fit; the row's batched joint fit
    follows (``n_shared_start_rows`` counts the rows it learned). It does not reach ``H = 12``: the
    joint fit's basin there is about 3 %, and the starts tried are listed with their measured errors
    in :func:`counts_start_coverage`.

    The moment start (``start="moments"``, the default from ``H = 9``; this book's own,
    :mod:`companion.multihead._star`) needs no pair to resolve its heads: one centre row is solved from the
    heads' span (central differences) and Jennrich's algorithm on the Taylor moments of small
    tokens, and a star of rows around it is started from the centre's solution (with a continuation
    in the data where a row misfits). Measured 2026-12-02 (verification off, one BLAS thread, the
    SkylakeX kernel): at ``d = 64``, ``H = 12`` it learns seeds 0 to 5 with 169,840 to 191,440
    queries of the count 196,585 (length at most 25), the ``W_h`` to 1.3e-9 to 2.7e-9 relative and
    the ``v_h`` to 6e-12 to 3e-11, in 6.4 to 8.8 s (two runs side by side on the two cores; 13.4 s
    on seed 5, whose second centre leaves 18 rows to the continuation); the benchmark's time
    against the oracle's, and its seeds, are in
    ``data/results/bench_multihead.json``. The star's rows differ by ``STAR_EPS`` = 0.01, so their
    errors are divided by it, and the rows of a head weak at the centre are the least determined
    (``centre_amplitude_ratio`` 0.016 to 0.049): the rows' joint fits must end at rounding level.
    Stopping them as soon as their mean misfit was within 100 eps (before 2026-12-02) left the
    ``W_h`` at 7.0e-9, 4.8e-8, 5.6e-7 and 1.1e-7 on seeds 0 to 3. The verification checks the
    function to ``verify_rtol``.

    References
    ----------
    .. [1] Bhattamishra, Shah, Hahn, Kanade, "Provably Learning Attention with Queries", ICML 2026.
    .. [2] Kim, Kim, Guo, "Provably Learning Multi-Head Attention with Queries", arXiv 2608.03294,
       2026 (abstract).

    Examples
    --------
    >>> from companion.oracles import ValueQueryOracle
    >>> target = random_multi_head(6, 2, seed=0)
    >>> rec = learn_canonical_rational(ValueQueryOracle(target), H=2)
    >>> rec.n_heads, rec.n_learning_queries <= follow_up_count(6, 2), rec.diagnostics["max_len"]
    (2, True, 5)
    >>> equivalent(rec.model, target, atol=1e-8)
    True
    """
    d = check_exact_oracle(oracle, "learn_canonical_rational")
    opts = check_options(
        H, H_bound, scale=scale, spread=spread, tol=tol, verify=verify, verify_rtol=verify_rtol, seed=seed
    )
    return STARTS[choose_start(start, d, opts.H_plan)](oracle, d, opts)


def check_options(H, H_bound, *, scale, spread, tol, verify, verify_rtol, seed) -> CountsOptions:
    """The options of :func:`learn_canonical_rational`, checked (the H / H_bound rule is
    :func:`companion._learner.resolve_heads`'s)."""
    H, H_bound, H_plan = resolve_heads(H, H_bound, exactly_one=True)
    scale = check_real(scale, "scale", minimum=0.0, strict=True, maximum=100.0)
    spread = check_real(spread, "spread", minimum=1.0)
    tol = check_real(tol, "tol", minimum=0.0, strict=True, maximum=1e-2)
    verify, verify_rtol = check_verify(verify, verify_rtol)
    seed = check_int(seed, "seed", minimum=0)
    return CountsOptions(H_plan, H is not None, scale, spread, tol, verify, verify_rtol, seed)


def choose_start(start, d, H_plan) -> str:
    """The start to run: ``start`` checked, ``"auto"`` resolved (``"moments"`` from ``MOMENT_FROM``
    heads where :func:`moment_plan` accepts ``d``, else ``"pairs"``)."""
    if start not in ("auto", *STARTS):
        raise InvalidInputError(f"start must be 'auto', 'pairs' or 'moments'; got start={start!r}.")
    if start == "auto":
        start = "pairs"
        if H_plan >= MOMENT_FROM:
            try:
                moment_plan(d, H_plan)
                start = "moments"
            except InvalidInputError:
                pass
    if start == "moments" and 2 * H_plan < 4:
        raise InvalidInputError(
            f"start='moments' needs 2H >= 4 samples per token for its Taylor fit; got H={H_plan}. Use start='pairs'."
        )
    return start


#: The starts of :func:`learn_canonical_rational`: ``start=`` -> the route ``(oracle, d, opts)``.
STARTS = {"pairs": learn_pairs, "moments": learn_moments}

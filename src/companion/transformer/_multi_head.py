"""One-layer Transformers with several heads: ``TF(X) = w_o^T ReLU(sum_h alpha(X, W_h)^T X B_h)``
(private; re-exported by :mod:`companion.transformer`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._learner import (
    QueryCount,
    resolve_heads,
    DEFAULT_VERIFY,
    build,
    check_verify,
    names_rounding,
    refuse_stated_rounding,
    reserve,
    verify_outputs,
)
from .._validation import (
    SequenceModel,
    as_float_array,
    check_choice,
    check_int,
    check_real,
    frozen,
)
from ..attention import MultiHead, attention_weights
from ..errors import InvalidInputError, NotIdentifiableError, OracleInconsistentError
from ..exact import check_exact_oracle
from ..ffn import FeedForward, learn_ffn
from ..oracles import AntisymmetrisedOracle
from ..recovery import Recovery
from ._one_layer import (
    TINY,
    ZERO_TOL,
    ReusedAnswers,
    checks_clause,
    no_linear_part,
)

# --------------------------------------------------------------------------------------------
# Several heads: TF(X) = w_o^T ReLU(sum_h alpha(X, W_h)^T X B_h)
# --------------------------------------------------------------------------------------------


def _pooled(X, Ws):
    """``alpha(X, W_h)^T X`` for every head: shape (H, B, d) for a batch ``X`` of shape (B, N, d)."""
    return np.stack([np.einsum("bn,bnd->bd", attention_weights(X, W), X) for W in Ws])


@dataclass(frozen=True, eq=False)
class MultiHeadTransformer(SequenceModel):
    """A one-layer Transformer with ``H`` heads and a bias-free ReLU FFN, in merged form.

    ``TF(X) = w_o^T ReLU(sum_h alpha(X, W_h)^T X B_h)``: head ``h`` pools the tokens with its
    softmax weights, and its value-output-FFN matrix ``B_h`` maps the pooled token to the FFN's
    ``m`` pre-activations. No bias, residual or LayerNorm (the setting of §4.1 with several heads).

    Parameters
    ----------
    Ws : array-like of shape (H, d, d)
        Merged query-key matrices ``K_h^T Q_h``.
    Bs : array-like of shape (H, d, m)
        Merged matrices ``V_h^T O_h^T W_1^T`` (``O_h`` the head's block of the output projection).
    w_o : array-like of shape (m,)
        Output weights of the FFN.

    Attributes
    ----------
    d, m, n_heads : int
        Input dimension, FFN width, number of heads.
    attention : MultiHead
        ``MultiHead(Ws, Bs @ w_o)``: the sum of heads the antisymmetrised oracle
        ``VQ(X) - VQ(-X)`` sees.
    network : FeedForward
        ``FeedForward(sum_h B_h, w_o)``: what one-token queries see.

    Raises
    ------
    InvalidInputError
        If the shapes disagree or an entry is NaN or inf.

    Examples
    --------
    >>> import numpy as np
    >>> tf = MultiHeadTransformer(np.zeros((2, 1, 1)), np.ones((2, 1, 1)), np.array([1.0]))
    >>> tf(np.array([[1.0], [3.0]]))                # both heads pool the mean, 2; ReLU(2 + 2)
    4.0
    """

    Ws: np.ndarray
    Bs: np.ndarray
    w_o: np.ndarray

    def __post_init__(self):
        Ws = as_float_array(self.Ws, "Ws", ndim=3)
        H, d, d2 = Ws.shape
        if d != d2 or H == 0 or d == 0:
            raise InvalidInputError(f"Ws must have shape (H, d, d) with H, d >= 1; got Ws.shape={Ws.shape}.")
        Bs = as_float_array(self.Bs, "Bs", ndim=3, shape=(H, d, None))
        w_o = as_float_array(self.w_o, "w_o", ndim=1, shape=(Bs.shape[2],))
        for name, a in (("Ws", Ws), ("Bs", Bs), ("w_o", w_o)):
            object.__setattr__(self, name, frozen(a))

    @property
    def d(self) -> int:
        return self.Ws.shape[1]

    @property
    def m(self) -> int:
        return self.Bs.shape[2]

    @property
    def n_heads(self) -> int:
        return self.Ws.shape[0]

    @property
    def attention(self) -> MultiHead:
        return MultiHead(self.Ws, self.Bs @ self.w_o)

    @property
    def network(self) -> FeedForward:
        return FeedForward(self.Bs.sum(axis=0), self.w_o)

    def _batch(self, X: np.ndarray) -> np.ndarray:
        z = np.einsum("hbd,hdm->bm", _pooled(X, self.Ws), self.Bs)
        return np.maximum(z, 0.0) @ self.w_o

    def __repr__(self):
        return f"MultiHeadTransformer(n_heads={self.n_heads}, d={self.d}, m={self.m})"


def random_multi_head_transformer(d, n_heads, m, *, seed) -> MultiHeadTransformer:
    """A random multi-head Transformer: the heads of :func:`~companion.multihead.random_multi_head`.

    ``Ws`` are those heads' query-key matrices (entries of variance about 1), ``Bs`` have entries
    ``N(0, 1/d)`` and ``w_o`` entries ``N(0, 1/m)``.

    Parameters
    ----------
    d, n_heads, m : int
        Input dimension, number of heads and FFN width, ``>= 1``.
    seed : int
        Seed of ``numpy.random.default_rng`` (the heads use ``seed`` too).

    Examples
    --------
    >>> tf = random_multi_head_transformer(6, 2, 4, seed=0)
    >>> tf.Ws.shape, tf.Bs.shape, tf.w_o.shape
    ((2, 6, 6), (2, 6, 4), (4,))
    """
    from ..multihead import random_multi_head

    d = check_int(d, "d", minimum=1)
    H = check_int(n_heads, "n_heads", minimum=1)
    m = check_int(m, "m", minimum=1)
    seed = check_int(seed, "seed", minimum=0)
    heads = random_multi_head(d, H, seed=seed)
    rng = np.random.default_rng([seed, 1])
    Bs = rng.standard_normal((H, d, m)) / np.sqrt(d)
    return MultiHeadTransformer(heads.Ws, Bs, rng.standard_normal(m) / np.sqrt(m))


@dataclass(frozen=True, eq=False, repr=False)
class MultiHeadTransformerRecovery(Recovery):
    """:class:`~companion.recovery.Recovery` of a :class:`MultiHeadTransformer`.

    Adds ``Ws`` (H, d, d), ``Bs`` (H, d, k) and ``w_o`` (k,); ``W`` is ``sum_h W_h`` and ``v`` the
    length-1 network's linear part ``sum_h B_h w_o``.
    """

    Ws: np.ndarray = None  # type: ignore[assignment]
    Bs: np.ndarray = None  # type: ignore[assignment]
    w_o: np.ndarray = None  # type: ignore[assignment]

    @property
    def n_heads(self) -> int:
        return int(self.Ws.shape[0])

    @property
    def model(self) -> MultiHeadTransformer:
        """The recovered Transformer as a model."""
        return MultiHeadTransformer(self.Ws, self.Bs, self.w_o)


def region_anchors(A, *, n_candidates=None, seed=0):
    """Directions whose activation patterns span ``R^k``, each with the largest margin found.

    The FFN's neurons ``a_j`` (unit columns of ``A``) cut ``R^d`` into cones; the pattern of a
    direction ``s`` is the indicator ``1[a_j^T s > 0]``. This draws ``n_candidates`` random unit
    directions (no query) and keeps, in order of decreasing margin ``min_j |a_j^T s|``, each one
    whose pattern is not in the span of those kept, until ``k`` are kept.

    Parameters
    ----------
    A : array-like of shape (d, k)
        Unit-norm neuron directions.
    n_candidates : int, default=None
        Random directions drawn; ``None`` means ``max(4096, 64 k)``.
    seed : int, default=0
        Seed of the draw.

    Returns
    -------
    S : ndarray of shape (k, d)
        The kept directions (unit norm).
    M : ndarray of shape (k, k)
        Their patterns as rows (0 or 1), invertible.
    margins : ndarray of shape (k,)
        ``min_j |a_j^T s|`` of each.

    Raises
    ------
    NotIdentifiableError
        If the drawn directions show fewer than ``k`` independent patterns (at ``d = 1`` there are
        only two, ``s`` and ``-s``): the neurons' parts of the heads cannot be told apart this way.

    Examples
    --------
    >>> import numpy as np
    >>> S, M, margins = region_anchors(np.eye(3))
    >>> M.shape, round(float(abs(np.linalg.det(M))), 6) > 0
    ((3, 3), True)
    """
    A = as_float_array(A, "A", ndim=2)
    d, k = A.shape
    n = max(4096, 64 * k) if n_candidates is None else check_int(n_candidates, "n_candidates", minimum=1)
    rng = np.random.default_rng(check_int(seed, "seed", minimum=0))
    cand = rng.standard_normal((n, d))
    cand /= np.linalg.norm(cand, axis=1)[:, None]
    proj = cand @ A
    margin = np.min(np.abs(proj), axis=1, initial=np.inf)
    patterns = (proj > 0).astype(float)
    kept, basis = [], np.zeros((0, k))  # basis: orthonormal rows spanning the kept patterns
    for i in np.argsort(-margin, kind="stable"):
        if len(kept) == k:
            break
        r = patterns[i] - basis.T @ (basis @ patterns[i])
        norm = float(np.linalg.norm(r))
        if norm > 1e-6:
            kept.append(i)
            basis = np.vstack([basis, r / norm])
    if len(kept) < k:
        raise NotIdentifiableError(
            f"the k={k} neurons' hyperplanes show only {len(kept)} linearly independent activation "
            f"patterns among n_candidates={n} directions in d={d} (need k): the neurons' parts of the "
            "heads' value matrices are not separable by activation regions; more directions may help "
            "if the regions are thin."
        )
    kept = np.asarray(kept)
    return cand[kept], patterns[kept], margin[kept]


#: Put a refusal down to the answers' rounding when they are float32 or coarser.
_names_precision = names_rounding(
    lambda learner, prec, err: (
        f"{learner} refused, and {prec.describe()}: its FFN step locates kinks and its "
        "head step fits logistic sums, both from answers exact to float64 rounding, so this "
        f"refusal is the answers' rounding, not the model. (The step said: {err})"
    )
)


@_names_precision
def learn_multi_head_transformer(
    oracle,
    H=None,
    *,
    H_bound=None,
    route="rational",
    margin=100.0,
    signs="auto",
    milp_time_limit=10.0,
    verify=DEFAULT_VERIFY,
    verify_rtol=1e-6,
    seed=0,
    **ffn_options,
):
    """Recover a one-layer Transformer with several heads and a bias-free ReLU FFN from value queries.

    The target is ``TF(X) = w_o^T ReLU(sum_h alpha(X, W_h)^T X B_h)``
    (:class:`MultiHeadTransformer`). This book's own construction (see Notes): the FFN learner on
    one-token queries, a canonical-form learner on the antisymmetrised oracle, then ``H d k``
    queries inside ``k`` activation regions of the FFN, where the model is linear in the ``B_h``.

    Parameters
    ----------
    oracle : ValueQueryOracle
        Exact oracle of dimension ``d``.
    H : int, default=None
        Number of heads of the canonical form (distinct ``W_h`` with ``B_h w_o != 0``), if known.
    H_bound : int, default=None
        A known bound on it instead (route ``"rational"`` only). Exactly one of ``H``, ``H_bound``.
    route : {"rational", "robust"}, default="rational"
        The heads' learner on ``VQ(X) - VQ(-X)``:
        :func:`~companion.multihead.learn_canonical_rational` (the follow-up's count) or
        :func:`~companion.multihead.learn_canonical` (more queries, longer; use it where the
        rational route refuses).
    margin : float, default=100.0
        ``kappa``: region queries are ``R s + Delta`` with ``R = sqrt(kappa / mu)`` (``mu`` the
        direction's smallest ``|a_j^T s|``) and tokens of ``Delta`` of norm about ``1 / R``, so a
        pre-activation moves by about ``1 / kappa`` of its distance to its kink
        (``1 <= kappa <= 1e6``). Larger is safer and loses ``log10 kappa`` digits.
    signs, milp_time_limit
        Passed to :func:`~companion.ffn.learn_ffn`.
    verify : int, default=32
        Fresh random queries (lengths 1 to 8) on which the recovered Transformer is checked, on
        top of the FFN learner's 64 one-token checks; 0 opts out.
    verify_rtol : float, default=1e-6
        Largest accepted disagreement, relative to ``sum_k |w_k| max_i sum_h |x_i^T B_h e_k|``.
    seed : int, default=0
        Seed of the FFN learner, the heads' learner, the regions and the verification.
    **ffn_options
        Passed to :func:`~companion.ffn.learn_ffn` (``refine``, ``max_planes``; ``ffn_verify``
        as its ``verify``).

    Returns
    -------
    MultiHeadTransformerRecovery
        ``Ws`` (H, d, d) of the canonical heads, ``Bs`` (H, d, k) and ``w_o`` (k,) with the FFN
        learner's neurons: ``sum_h B_h`` has the unit-norm columns of
        :func:`~companion.ffn.canonical_form`. ``n_learning_queries`` is
        ``diagnostics["n_queries_ffn"]`` (which includes the FFN learner's own checks,
        ``diagnostics["ffn"]["n_verify_queries"]``, subtracted here)
        ``+ diagnostics["n_queries_heads"] + diagnostics["n_queries_regions"]``; the last is
        ``H d k``. ``n_verify_queries`` counts both the FFN's checks and ``verify``. ``diagnostics`` also holds
        ``n_reused`` (one-token answers the heads' learner got from the FFN's), ``n_heads``,
        ``n_neurons`` (``k``), ``max_len`` (longest query), ``region_margins`` (``mu`` per
        region), ``region_condition`` (largest condition number of a region's ``H d`` x ``H d``
        system), ``value_mismatch`` (largest ``|sum_k B_h e_k w_k - v_h|`` against the heads'
        learner's ``v_h``), ``sum_mismatch`` (largest ``|sum_h B_h - A|`` against the FFN's
        ``A``), ``pattern_slack`` (the smallest ratio of a neuron's distance to its kink to its
        move, over the region queries, by the recovered model; must exceed 1), the two
        learners' diagnostics (``ffn``, ``heads``), ``n_verify_queries``, ``verify_max_error``
        and ``verify_tolerance``.

    Raises
    ------
    TypeError
        If ``oracle`` is not an exact value-query oracle.
    InvalidInputError
        For a bad option, or ``H`` too large for ``d`` on the rational route.
    BudgetExceededError
        Before the first query if the budget cannot hold the heads' plan (twice
        :func:`~companion.multihead.rational_plan`'s count, a bound the run may not reach, or
        ``2 (d + d^2)`` on the robust route) plus ``H d`` region queries and ``verify``; after the
        FFN step (``k`` known) if it cannot hold the plan less the ``2 d`` reused answers, the
        ``H d k`` region queries and ``verify``.
    NotIdentifiableError
        If ``A w_o = 0`` (the antisymmetrised oracle is 0: ``||A w_o||_inf`` below ``ZERO_TOL``
        times the largest answer to ``[+-e_j^T]``, as :func:`learn_one_layer`'s ``zero_tol``),
        or the neurons show fewer than ``k``
        independent activation patterns (:func:`region_anchors`).
    PrecisionError
        Before the first query if the oracle states a precision of float32 or coarser; or if a
        step refuses and the answers, measured with 24 more queries, are that coarse: the
        rounding is the cause.
    OracleInconsistentError
        If a step refuses (one-token answers not a bias-free ReLU network, antisymmetrised answers
        not ``H`` heads, e.g. more than ``H`` or ``H_bound`` of them), a region query crossed a
        kink (raise ``margin``), or the verification fails (e.g. a head with ``B_h w_o = 0``,
        which the antisymmetrised oracle cannot see; two neurons whose directions
        ``sum_h B_h e_j`` are parallel, which the FFN step merges; a residual connection or
        LayerNorm). A verification failure within what the heads' step's own inconsistency
        (``max_link_error`` of the rational route) can cause through the region solves
        (``region_condition``) is put down to that step's float64 conditioning instead, with
        advice to use ``route="robust"``.

    Notes
    -----
    This book's own construction; the follow-up [2]_ states (abstract only) that its method
    extends to this model without a separate FFN learner, and how is not public. Here:

    1. One-token queries: ``VQ([x^T]) = w_o^T ReLU(A^T x)`` with ``A = sum_h B_h``, a bias-free
       ReLU network; :func:`~companion.ffn.learn_ffn` returns its neurons ``a_j`` (unit norm) and
       ``w_j``. This is the only use of the FFN learner: it tells which activation region a query
       is in, and that region's linear part.
    2. Scores are unchanged by ``X -> -X`` and ``ReLU(z) - ReLU(-z) = z``, so
       ``VQ(X) - VQ(-X) = sum_h alpha(X, W_h)^T X (B_h w_o)``: a sum of heads with value vectors
       ``v_h = B_h w_o``. A canonical-form learner returns the distinct ``W_h``.
    3. Within an activation region with pattern ``S`` (``a_j^T x > 0`` exactly for ``j`` in
       ``S``), ``TF = sum_h p_h(X)^T u_h^S`` with ``p_h(X) = alpha(X, W_h)^T X`` (known, ``W_h``
       known) and ``u_h^S = sum_{j in S} w_j B_h e_j``. A query ``X = R s + Delta`` (every token
       near ``R s``) keeps every pre-activation on the side of ``R s``, and since the weights sum
       to 1, ``TF(X) - w_S^T A_S^T R s = sum_h (alpha(X, W_h)^T Delta)^T u_h^S``: ``H d`` queries
       give ``u^S`` by one linear solve. ``k`` directions whose patterns ``M`` (k x k) are
       independent give ``C_h = [w_j B_h e_j]_j`` from ``U = C M^T``; ``B_h e_j = C_h e_j / w_j``.
       Queries are ``N = H + 1`` tokens long, so that the ``H`` weight vectors
       ``alpha(X, W_h)`` in ``R^N`` can be linearly independent (a choice of this book; the
       ``H d`` x ``H d`` system's conditioning is reported, ``region_condition``). "Keeps every
       pre-activation on the side of ``R s``" is not automatic: a pre-activation's distance to
       its kink is at least ``R mu`` and its move is about ``||B_h e_j|| / R``, so
       ``R = sqrt(kappa / mu)`` keeps it for value matrices of moderate norm, and the
       recovered model is checked afterwards (``pattern_slack``).

    What is identified: the distinct ``W_h`` (step 2 merges equal ones, summing their ``B_h``)
    exactly, and, when the neurons' directions ``sum_h B_h e_j`` are pairwise non-parallel
    (the FFN step would merge parallel ones, whose per-head parts differ), each neuron's
    ``(B_1 e_j, ..., B_H e_j, w_j)`` up to the FFN's symmetries:
    permutation of neurons and ``(B_h e_j, w_j) -> (c B_h e_j, w_j / c)``, ``c > 0`` (fixed here by
    ``||sum_h B_h e_j|| = 1``). A head with ``B_h w_o = 0`` but ``B_h != 0`` is invisible to
    step 2, and the verification refuses such a target. Queries:
    ``Q_FFN + 2 Q_heads - 2 d + H d k`` (the heads' ``d`` one-token antisymmetrised queries
    reuse the FFN's ``2 d`` answers ``[+-e_j^T]``, :class:`ReusedAnswers`), with
    ``Q_heads <= 4 H d^2 - 2 H + 1`` on the rational route, whose longest query is
    ``2 H + 1`` (``H_bound`` in place of ``H`` with a bound; the robust route's are longer).

    References
    ----------
    .. [1] Bhattamishra, Shah, Hahn, Kanade, "Provably Learning Attention with Queries", ICML 2026.
    .. [2] Kim, Kim, Guo, "Provably Learning Multi-Head Attention with Queries", arXiv 2608.03294,
       2026 (abstract).

    Examples
    --------
    >>> import numpy as np
    >>> from companion.oracles import ValueQueryOracle
    >>> tf = random_multi_head_transformer(6, 2, 4, seed=0)
    >>> rec = learn_multi_head_transformer(ValueQueryOracle(tf), H=2)
    >>> rec.n_heads, rec.diagnostics["n_queries_regions"], rec.diagnostics["max_len"]
    (2, 48, 5)
    >>> X = np.random.default_rng(1).standard_normal((20, 4, 6)) / 3
    >>> bool(np.max(np.abs(rec.model(X) - tf(X))) < 1e-8 * np.max(np.abs(tf(X))))
    True
    """
    d = check_exact_oracle(oracle, "learn_multi_head_transformer")
    plan = _plan_mht(oracle, d, H, H_bound, route, margin, verify, verify_rtol, seed)
    if "ffn_verify" in ffn_options:
        ffn_options["verify"] = ffn_options.pop("ffn_verify")
    start = reserve(oracle, plan.n_heads_plan + plan.H_plan * d + plan.verify, "learn_multi_head_transformer")
    base, oracle = oracle, ReusedAnswers(oracle)
    count = QueryCount(oracle)
    with count.stage("ffn"):  # 1. the FFN from one-token queries
        ffn = learn_ffn(oracle, signs=signs, milp_time_limit=milp_time_limit, seed=plan.seed, **ffn_options)
    A, w, k = ffn.A, ffn.w_o, ffn.A.shape[1]
    if no_linear_part(ffn, d, ZERO_TOL):
        raise NotIdentifiableError(
            "A w_o = 0: the antisymmetrised oracle VQ(X) - VQ(-X) = sum_h alpha(X, W_h)^T X B_h w_o "
            "is identically 0, so it reveals no head (the FFN part was extracted)."
        )
    reserve(base, plan.n_heads_plan - 2 * d + plan.H_plan * d * k + plan.verify, "learn_multi_head_transformer")
    with count.stage("heads"):  # 2. the heads from the antisymmetrised oracle
        heads = _heads_stage(AntisymmetrisedOracle(oracle), plan)
    Ws = heads.Ws
    Hh = Ws.shape[0]
    with count.stage("regions"):  # 3. H d queries in each of k activation regions
        regions = _regions_stage(oracle, A, w, Ws, plan)
    Bs = regions.Bs
    slack = _pattern_slack(regions, A, Ws, plan.margin)
    model = MultiHeadTransformer(Ws, Bs, w)
    checked = _verify_mht(oracle, model, plan, heads, regions.cond, Hh)
    clause = checks_clause(ffn, checked, ffn_options)
    checked["n_verify_queries"] += int(ffn.diagnostics["n_verify_queries"])
    diagnostics = {
        "n_queries_ffn": count["ffn"],
        "n_queries_heads": count["heads"],
        "n_queries_regions": count["regions"],
        "n_reused": oracle.n_reused,
        "n_heads": Hh,
        "n_neurons": k,
        "max_len": int(max(Hh + 1, heads.diagnostics.get("max_len", 2))),
        "region_margins": regions.mus,
        "region_condition": regions.cond,
        "value_mismatch": float(np.max(np.abs(np.einsum("hdk,k->hd", Bs, w) - heads.vs))),
        "sum_mismatch": float(np.max(np.abs(Bs.sum(axis=0) - A))),
        "pattern_slack": slack,
        "ffn": dict(ffn.diagnostics),
        "heads": dict(heads.diagnostics),
    }
    message = (
        f"FFN: {k} neurons from {count['ffn']} one-token queries; heads: {Hh} from the antisymmetrised oracle "
        f"({plan.route} route, {count['heads']} queries, {oracle.n_reused} answers reused); value matrices: "
        f"{count['regions']} queries in {k} activation regions (H d k = {Hh * d * k})"
    )
    return build(
        MultiHeadTransformerRecovery,
        oracle,
        start,
        verification=checked,
        verified=clause,
        message=message,
        diagnostics=diagnostics,
        W=Ws.sum(axis=0),
        v=ffn.v,
        Ws=Ws,
        Bs=Bs,
        w_o=w,
    )


@dataclass(frozen=True)
class _MHTPlan:
    """The checked options of one :func:`learn_multi_head_transformer` run.

    ``H``, ``H_bound`` as given (checked), ``H_plan`` the heads the queries are planned for, and
    ``n_heads_plan`` the FFN's and heads' queries (twice the heads learner's, antisymmetrised).
    """

    H: int | None
    H_bound: int | None
    H_plan: int
    route: str
    margin: float
    verify: int
    verify_rtol: float
    seed: int
    n_heads_plan: int


def _plan_mht(oracle, d, H, H_bound, route, margin, verify, verify_rtol, seed) -> _MHTPlan:
    """Stage 1: the shared ``H`` / ``H_bound`` rule (:func:`~companion._learner.resolve_heads`), a
    stated float32 (or coarser) rounding refused, the route and the other options; before any query."""
    from ..multihead import rational_plan

    H, H_bound, H_plan = resolve_heads(H, H_bound)
    refuse_stated_rounding(
        oracle,
        "the FFN step locates kinks and the head step fits logistic sums from answers exact to float64 rounding",
    )
    route = check_choice(route, "route", ("rational", "robust"))
    if route == "robust" and H is None:
        raise InvalidInputError("route='robust' needs H (learn_canonical takes no bound); got H=None.")
    margin = check_real(margin, "margin", minimum=1.0, maximum=1e6)
    verify, verify_rtol = check_verify(verify, verify_rtol)
    seed = check_int(seed, "seed", minimum=0)
    n = 2 * rational_plan(d, H_plan)["n_queries"] if route == "rational" else 2 * (d + d * d)
    return _MHTPlan(H, H_bound, H_plan, route, margin, verify, verify_rtol, seed, n)


def _heads_stage(anti, plan):
    """Stage 2: the canonical form of the heads on ``anti`` = VQ(X) - VQ(-X), by the plan's route
    (:func:`~companion.multihead.learn_canonical_rational` or, ``"robust"``,
    :func:`~companion.multihead.learn_canonical`); a refusal says which ``H`` it was given."""
    from ..multihead import learn_canonical, learn_canonical_rational  # per call: tests replace them

    try:
        if plan.route == "rational":
            return learn_canonical_rational(anti, H=plan.H, H_bound=plan.H_bound, verify=0, seed=plan.seed)
        return learn_canonical(anti, H=plan.H, verify=0, seed=plan.seed)
    except OracleInconsistentError as err:
        given = f"H={plan.H}" if plan.H is not None else f"H_bound={plan.H_bound}"
        other = (
            " The counts route also refuses where float64 cannot separate the heads (its "
            "conditioning grows with H): try route='robust'."
            if plan.route == "rational"
            else ""
        )
        raise OracleInconsistentError(
            f"the heads' step on VQ(X) - VQ(-X) refused with {given}: a target with more distinct "
            f"heads (W_h with B_h w_o != 0) than that is refused this way too.{other} "
            f"(It said: {err})"
        ) from err


@dataclass(frozen=True)
class _Regions:
    """The value matrices' stage: ``Bs`` (H, d, k), the anchors ``S`` (k, d) with patterns ``M``, the
    margins ``mus`` (k,), the largest condition number ``cond`` of a region's solve, and each
    region's radius and queries ``queries = [(R, X), ...]``."""

    Bs: np.ndarray
    S: np.ndarray
    mus: np.ndarray
    cond: float
    queries: list


def _regions_stage(oracle, A, w, Ws, plan) -> _Regions:
    """Stage 3: ``H d`` queries near the anchor of each of the ``k`` activation regions
    (:func:`region_anchors`), where the model is linear in the ``u_h^S``; ``Bs`` from ``U = C M^T``."""
    Hh, d, k = Ws.shape[0], A.shape[0], A.shape[1]
    S, M, mus = region_anchors(A, seed=plan.seed + 2)
    rng = np.random.default_rng([plan.seed, 3])
    N = Hh + 1
    U = np.empty((Hh * d, k))
    cond, queries = 0.0, []
    for p in range(k):
        R = np.sqrt(plan.margin / mus[p])
        D = rng.standard_normal((Hh * d, N, d)) / (np.sqrt(d) * R)
        X = R * S[p] + D
        on = M[p] > 0
        y = np.asarray(oracle(X), dtype=np.float64) - R * (S[p] @ A[:, on]) @ w[on]
        # sum_h alpha(X, W_h)^T Delta: the weights of X (Delta's would differ) pool Delta
        Phi = np.concatenate([np.einsum("bn,bnd->bd", attention_weights(X, W), D) for W in Ws], axis=1)
        cond = max(cond, float(np.linalg.cond(Phi)))
        U[:, p] = np.linalg.solve(Phi, y)
        queries.append((R, X))
    C = np.linalg.solve(M, U.T).T.reshape(Hh, d, k)  # U = C M^T
    return _Regions(C / w, S, mus, cond, queries)


def _pattern_slack(regions, A, Ws, margin) -> float:
    """Stage 4: every region query must sit on its region's side of every kink, by the recovered
    model; returns the smallest slack (> 1) or raises :class:`OracleInconsistentError`."""
    slack = np.inf
    for p, (R, X) in enumerate(regions.queries):
        z0 = R * (regions.S[p] @ A)
        move = np.einsum("hbd,hdm->bm", _pooled(X, Ws), regions.Bs) - z0
        slack = min(slack, float(np.min(np.abs(z0) / np.maximum(np.max(np.abs(move), axis=0), TINY))))
    if not slack > 1.0:
        raise OracleInconsistentError(
            f"a region query crossed a kink by the recovered model (pattern_slack={slack:.3g} <= 1): "
            f"either the value matrices are larger than margin={margin:g} allows for (raise margin), or "
            "the region fits missed a head, as one with B_h w_o = 0 (invisible to VQ(X) - VQ(-X)) is "
            "missed, or the oracle is not a multi-head Transformer with a bias-free ReLU FFN."
        )
    return slack


def _verify_mht(oracle, model, plan, heads, cond, Hh) -> dict:
    """Stage 5: :func:`verify_outputs` on fresh queries; a miss within what the heads' own
    inconsistency can cause through the region solves (``max_link_error * region_condition``) is
    put down to the route's float64 conditioning, with that advice."""
    Bs, absw = model.Bs, np.abs(model.w_o)
    try:
        return verify_outputs(
            oracle,
            model,
            lambda x: float(absw @ np.max(np.sum(np.abs(x @ Bs), axis=0), axis=0)),
            plan.verify,
            rtol=plan.verify_rtol,
            seed=plan.seed + 1,
            what=(
                "a one-layer Transformer w_o^T ReLU(sum_h alpha(X, W_h)^T X B_h) with every head "
                "visible (B_h w_o != 0), no two neurons' directions sum_h B_h e_j parallel (the FFN "
                "step merges them), and no bias, residual or LayerNorm"
            ),
        )
    except OracleInconsistentError as err:
        # The heads' own inconsistency, carried through the region solves (condition number
        # region_condition), bounds what the heads' step alone can cost, to first order.
        link = float(heads.diagnostics.get("max_link_error", 0.0))
        found = getattr(err, "max_error", np.inf)
        if found <= link * cond:
            raise OracleInconsistentError(
                f"verification failed by {found:.3g} (verify_rtol={plan.verify_rtol:g}), within what the "
                f"heads' step's own inconsistency (max_link_error={link:.2g}) can cause through the "
                f"region solves (region_condition={cond:.2g}, product {link * cond:.2g}): float64 "
                f"conditioning of the {plan.route} route at H={Hh}, not the model, is the likelier cause; "
                "use route='robust', or a larger verify_rtol."
            ) from err
        raise


class ServedMultiHeadTransformer(SequenceModel):
    """A :class:`MultiHeadTransformer` served in float32: weights, tokens and every operation.

    Its oracle states ``precision = unit_roundoff("float32")`` when built with
    ``ValueQueryOracle(served, precision=served.precision)``.

    Examples
    --------
    >>> import numpy as np
    >>> tf = random_multi_head_transformer(6, 2, 4, seed=0)
    >>> X = np.random.default_rng(1).standard_normal((5, 3, 6))
    >>> gap = np.max(np.abs(ServedMultiHeadTransformer(tf)(X) - tf(X))) / np.max(np.abs(tf(X)))
    >>> bool(1e-9 < gap < 1e-5)
    True
    """

    fmt = "float32"

    def __init__(self, model):
        if not isinstance(model, MultiHeadTransformer):
            raise InvalidInputError(f"model must be a MultiHeadTransformer; got {type(model).__name__}.")
        from ..oracles import unit_roundoff

        self.model, self.d = model, model.d
        self.precision = unit_roundoff("float32")
        self._Ws, self._Bs = model.Ws.astype(np.float32), model.Bs.astype(np.float32)
        self._w = model.w_o.astype(np.float32)

    def _batch(self, X: np.ndarray) -> np.ndarray:
        X = X.astype(np.float32)
        z = np.zeros((X.shape[0], self._w.size), dtype=np.float32)
        for W, B in zip(self._Ws, self._Bs):
            s = np.einsum("bnd,bd->bn", X, X[:, -1] @ W.T)
            a = np.exp(s - s.max(axis=1, keepdims=True))
            a /= a.sum(axis=1, keepdims=True)
            z += np.einsum("bn,bnd->bd", a, X) @ B
        return (np.maximum(z, np.float32(0)) @ self._w).astype(np.float64)


def evaluate_multi_head(rec, target, *, n=1000, seed=0) -> dict:
    """Errors of a :class:`MultiHeadTransformerRecovery` against its target (evaluation only).

    Heads are matched by :func:`~companion.multihead.match_heads` on ``(W_h, B_h w_o)``, neurons by
    the direction of ``sum_h B_h e_j``; each target neuron is rescaled to the recovered one's
    normalisation (``||sum_h B_h e_j|| = 1``) before comparing.

    Returns
    -------
    dict
        ``n_heads``, ``n_neurons`` (recovered), ``W_error`` (largest relative Frobenius error of a
        matched ``W_h``), ``B_error`` (largest ``|B_hat_h e_j - B_h e_j / c_j|``), ``w_error``
        (largest relative error of ``w_j c_j``), ``output_gap`` (largest ``|TF_hat - TF| / max |TF|``
        on ``n`` random queries of lengths 1 to 8, tokens ``N(0, I_d / d)``, drawn with ``seed``)
        and ``matched`` (every head and neuron matched).
    """
    from scipy.optimize import linear_sum_assignment

    from ..multihead import match_heads

    heads = match_heads(target.attention, rec.model.attention)
    A_t = target.Bs.sum(axis=0)
    c = np.linalg.norm(A_t, axis=0)
    A_hat = rec.Bs.sum(axis=0)
    cost = -np.abs((A_t / c).T @ A_hat)
    rows, cols = linear_sum_assignment(cost)
    pairs = heads["pairs"]
    B_err = max(float(np.max(np.abs(rec.Bs[e][:, cols] - target.Bs[r][:, rows] / c[rows]))) for r, e in pairs)
    w_t = target.w_o[rows] * c[rows]
    W_err = max(float(np.linalg.norm(rec.Ws[e] - target.Ws[r]) / np.linalg.norm(target.Ws[r])) for r, e in pairs)
    rng = np.random.default_rng(check_int(seed, "seed", minimum=0))
    lengths = rng.integers(1, 9, size=check_int(n, "n", minimum=1))
    X = [rng.standard_normal((int(n), target.d)) / np.sqrt(target.d) for n in lengths]
    y = target(X)
    return {
        "n_heads": rec.n_heads,
        "n_neurons": int(rec.w_o.size),
        "W_error": W_err,
        "B_error": B_err,
        "w_error": float(np.max(np.abs(rec.w_o[cols] - w_t) / np.abs(w_t))),
        "output_gap": float(np.max(np.abs(rec.model(X) - y)) / np.max(np.abs(y))),
        "matched": bool(len(pairs) == target.n_heads == rec.n_heads and rows.size == target.m == rec.w_o.size),
    }

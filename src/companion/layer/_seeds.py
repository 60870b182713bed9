"""try_seeds: the learner's advice on a refusal ("try seed=s + 1"), followed (this book's own)."""

from __future__ import annotations

from dataclasses import dataclass

from .._validation import check_int
from ..errors import CompanionError, InvalidInputError, OracleInconsistentError, PrecisionError, SolverError
from ..oracles import VectorQueryOracle
from ._learn import LayerRecovery, learn_attention_layer

__all__ = ["SeedOutcome", "SeedRun", "try_seeds", "SEED_REFUSALS"]

#: The refusals after which another learner seed is worth a try: each names its cause, and a block in the class
#: can end there at one seed's queries (a head too faint in the readout, a post-LN's gap, a pre-LN's reach).
SEED_REFUSALS = (OracleInconsistentError, PrecisionError, SolverError)


@dataclass(frozen=True)
class SeedOutcome:
    """One learner seed's outcome: its recovery, or the refusal that named its cause.

    Attributes
    ----------
    seed : int
        The learner seed (``learn_attention_layer(..., seed=seed)``).
    recovery : LayerRecovery or None
        The verified result, None when refused.
    error : CompanionError or None
        The refusal (one of ``SEED_REFUSALS``), None when learned.
    """

    seed: int
    recovery: LayerRecovery | None = None
    error: CompanionError | None = None

    @property
    def learned(self) -> bool:
        return self.recovery is not None

    @property
    def kind(self) -> str:
        """``"learned"``, or the refusal's class name (e.g. ``"PrecisionError"``)."""
        return "learned" if self.error is None else type(self.error).__name__


@dataclass(frozen=True)
class SeedRun:
    """The outcomes of :func:`try_seeds`, in the order the seeds were tried.

    Attributes
    ----------
    outcomes : tuple of SeedOutcome
    """

    outcomes: tuple[SeedOutcome, ...]

    @property
    def recovery(self) -> LayerRecovery | None:
        """The first learned seed's recovery, None if every seed tried was refused."""
        return next((o.recovery for o in self.outcomes if o.learned), None)

    @property
    def refused(self) -> list[int]:
        """The seeds refused before the first learned one (all of them when none learned)."""
        out = []
        for o in self.outcomes:
            if o.learned:
                break
            out.append(o.seed)
        return out

    @property
    def learned_seed(self) -> int | None:
        """The first learned seed, None if every seed tried was refused."""
        return next((o.seed for o in self.outcomes if o.learned), None)

    @property
    def summary(self) -> str:
        """One clause for prose: ``"learned at the first learner seed"``, ``"refused at learner seed
        0 and learned at seed 1"``, ``"refused at learner seeds 0 and 1 and learned at seed 2"``, or
        ``"refused at every learner seed tried (0 to 7)"``.

        >>> from companion.errors import PrecisionError
        >>> no, yes = SeedOutcome(0, error=PrecisionError("gap")), SeedOutcome(1, recovery=object())
        >>> SeedRun((no, yes)).summary
        'refused at learner seed 0 and learned at seed 1'
        """
        refused, learned = self.refused, self.learned_seed
        if learned is None:
            tried = [o.seed for o in self.outcomes]
            return f"refused at every learner seed tried ({tried[0]} to {tried[-1]})" if tried else "not tried"
        if not refused:
            return "learned at the first learner seed"
        listed = str(refused[0]) if len(refused) == 1 else ", ".join(map(str, refused[:-1])) + f" and {refused[-1]}"
        return f"refused at learner seed{'s' * (len(refused) > 1)} {listed} and learned at seed {learned}"


def try_seeds(oracle, seeds, *, until_learned=True, require=False, **options) -> SeedRun:
    """Run :func:`learn_attention_layer` at learner seeds in turn, as its refusals advise.

    A refusal that an in-class block can meet at one seed's queries (a head too faint in the
    readout, a post-LN's gap, a pre-LN's heads' stage out of reach, float32 heads off) ends with
    "try seed=s + 1"; this follows that advice over the given seeds and keeps every outcome.

    Parameters
    ----------
    oracle : VectorQueryOracle
        The layer's oracle, asked at every seed (its count runs on; each recovery's ``n_queries`` is
        its own seed's, and a budget covers all the seeds tried).
    seeds : iterable of int
        Learner seeds, tried in this order, each ``>= 0``.
    until_learned : bool, default=True
        Stop at the first seed learned; ``False`` tries every seed (e.g. to show that a target outside
        the class is refused at each).
    require : bool, default=False
        If True and no seed tried is learned, raise the last refusal again (its class and message name
        the cause), its message ending with every seed's outcome.
    **options
        Passed to :func:`learn_attention_layer` (``H``, ``H_bound``, ``residual``, ``layernorm``, ...),
        except ``seed``.

    Returns
    -------
    SeedRun
        ``outcomes`` (a :class:`SeedOutcome` per seed tried: ``seed``, ``recovery`` or ``error``,
        ``learned``, ``kind``); ``recovery`` and ``learned_seed`` of the first seed learned (None if
        none), ``refused`` (the seeds refused before it).

    Raises
    ------
    TypeError
        If ``oracle`` is not a :class:`~companion.oracles.VectorQueryOracle`.
    InvalidInputError
        If ``seeds`` is empty or holds a negative or non-integer seed, or ``options`` hold ``seed``
        (raised before the first query). A refusal of :func:`learn_attention_layer` raised before its first query
        (bad options, a stated precision it cannot use) is about the input, not the seed: it is raised at once, as
        is a size out of the heads' learner's reach at any seed (an InvalidInputError after the queries) and a
        refusal marked ``any_seed`` (found from the first answers: their precision, a float32 post-LN beyond the
        polish's cap; or a target that sees positions, ``layer._determinism.order_dependence``). A ``seeds`` that is
        not an iterable of int is an InvalidInputError too.
    OracleInconsistentError, PrecisionError, SolverError
        With ``require=True``, the last seed's refusal when no seed is learned. An oracle found not deterministic
        (``companion.layer._determinism``; the error's ``nondeterministic`` is True) is no seed's luck: raised at
        once.
    CompanionError
        Any other error of :func:`learn_attention_layer` (a budget exceeded, ...), at once.

    Examples
    --------
    Chapter 09's PyTorch-eps block (d = 8, H = 2, eps = 1e-5, weights' seed 0), on the readout route alone
    (by default the norms from the row space follow such a refusal), is refused at learner seeds 0 and 1 for
    its LayerNorm's gap and learned at seed 2:

    >>> from companion.layer import random_attention_layer
    >>> from companion.oracles import VectorQueryOracle
    >>> block = random_attention_layer(8, 2, layernorm="post", residual=True, eps=1e-5, seed=0)
    >>> run = try_seeds(VectorQueryOracle(block), range(4), H=2, heads="readout")
    >>> [o.kind for o in run.outcomes], run.refused, run.learned_seed
    (['PrecisionError', 'PrecisionError', 'learned'], [0, 1], 2)
    >>> run.recovery.diagnostics["verify_max_error"] < 1e-9
    True
    """
    if not isinstance(oracle, VectorQueryOracle):
        raise TypeError(f"try_seeds needs a companion.oracles.VectorQueryOracle; got {type(oracle).__name__}.")
    if "seed" in options:
        raise InvalidInputError("try_seeds sets the learner's seed itself: pass the seeds as `seeds`.")
    try:
        seeds = [check_int(s, "seed", minimum=0) for s in seeds]
    except TypeError:  # not iterable
        raise InvalidInputError(f"seeds must be an iterable of int (e.g. range(4)); got {seeds!r}.") from None
    if not seeds:
        raise InvalidInputError("seeds is empty: give at least one learner seed (e.g. range(4)).")
    outcomes = []
    for s in seeds:
        asked = int(oracle.n_queries)
        try:
            outcomes.append(SeedOutcome(s, recovery=learn_attention_layer(oracle, seed=s, **options)))
        except SEED_REFUSALS as exc:
            if int(oracle.n_queries) == asked or getattr(exc, "nondeterministic", False) or getattr(exc, "any_seed", 0):
                # not this seed's draws: about the input, an oracle not deterministic, or every seed's refusal
                raise
            outcomes.append(SeedOutcome(s, error=exc))
            continue
        if until_learned:
            break
    run = SeedRun(tuple(outcomes))
    if require and run.recovery is None:
        last = outcomes[-1].error
        assert last is not None
        listing = "; ".join(f"seed {o.seed}: {o.kind}" for o in outcomes)
        err = type(last)(f"{last} (try_seeds: refused at every learner seed tried: {listing}.)")
        err.__dict__.update(last.__dict__)  # e.g. a post-LN's smallest_gap
        raise err from last
    return run

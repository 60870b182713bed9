"""Executable companion to "Provably Learning Attention with Queries".

Bhattamishra, Shah, Hahn, Kanade, ICML 2026 (arXiv 2601.16873). A learner talks to an oracle, never
to the model: :mod:`companion.attention` holds the models, :mod:`companion.oracles` the value-query
oracles, and one module per paper section holds its learner (:mod:`companion.exact` for
Theorem 4.1, ...). Every learner returns a :class:`~companion.recovery.Recovery`, which
:meth:`~companion.recovery.Recovery.save` writes and ``companion.load``
(:func:`~companion._saved.load`) reads back.

The layout shows the paper's sections over shared numerics, and imports go down only: the
sections (``exact`` §4, ``ffn``/``transformer`` §4.1, ``lowrank`` §5, ``robust`` §6,
``multihead`` §7, and ``pretrained``, ``membership`` beyond the paper) over the skeleton every
learner shares (``_learner``, ``recovery``, ``errors``, ``attention``, ``oracles``) over
:mod:`companion.numerics` (rank-one projections and Riemannian Gauss-Newton), which imports nothing
from ``companion``. ``tests/test_architecture.py`` checks it.
"""

from ._learner import VERIFY_MAX_LEN, verification_defaults
from ._saved import load
from .recovery import Recovery

__version__ = "0.1.0"
__all__ = ["Recovery", "load", "verification_defaults", "VERIFY_MAX_LEN", "__version__"]

"""The result type every learner returns (like ``scipy.optimize.OptimizeResult``)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, Mapping

import numpy as np

from .errors import InvalidInputError

__all__ = ["Recovery"]


def _summary(value) -> str:
    if isinstance(value, np.ndarray):
        if value.size <= 6:
            return np.array2string(value, precision=6, separator=", ")
        return f"<ndarray of shape {value.shape}>"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {_summary(v)}" for k, v in sorted(value.items())) + "}"
    return repr(value)


def relative_error(est, ref) -> float:
    """``||est - ref|| / ||ref||`` (Frobenius), the absolute error where ``ref`` is 0: ``relative_errors``' entries."""
    ref = np.asarray(ref, dtype=np.float64)
    err = float(np.linalg.norm(np.asarray(est, dtype=np.float64) - ref))
    nrm = float(np.linalg.norm(ref))
    return err / nrm if nrm > 0 else err


@dataclass(frozen=True, eq=False)
class Recovery:
    """What a learner recovered from an oracle, with the queries it spent.

    Attributes
    ----------
    W : ndarray of shape (d, d)
        Estimate of the merged query-key matrix.
    v : ndarray of shape (d,)
        Estimate of the value vector.
    n_queries : int
        Queries the learner sent, read from the oracle's counter (never computed by hand),
        including its verification queries (``diagnostics["n_verify_queries"]``).
    n_learning_queries : int
        ``n_queries`` without the verification queries: the count the theorem is about.
    message : str
        One line on how the recovery went.
    diagnostics : mapping
        Learner-specific details (probe scales, re-queries, logits, verification error, solver
        status); each learner's docstring lists its keys.

    Subclasses add fields: the one-layer Transformer learner adds ``A`` and ``w_o``.
    The repr lists every field sorted by name, arrays by shape.

    A result pickles and deep-copies (``diagnostics`` travels as a dict and is read-only again
    after), and :meth:`save` writes it to a file that ``companion.load``
    (:func:`~companion._saved.load`) reads back without pickle (safetensors plus JSON, with
    provenance; :mod:`companion._saved` documents the format).
    """

    W: np.ndarray
    v: np.ndarray
    n_queries: int
    message: str = ""
    diagnostics: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "n_queries", int(self.n_queries))
        object.__setattr__(self, "diagnostics", MappingProxyType(dict(self.diagnostics)))

    def __getstate__(self):
        from ._saved import plain_state

        return plain_state(self.__dict__)

    def __setstate__(self, state):
        state = dict(state)
        state["diagnostics"] = MappingProxyType(dict(state.get("diagnostics", {})))
        self.__dict__.update(state)

    def save(self, path, *, parameters=None):
        """Write this result to ``path``: arrays as safetensors, the rest as JSON, with provenance.

        Parameters
        ----------
        path : str or path-like
            The file to write (conventionally ``*.safetensors``); written atomically (a temporary
            file renamed over it), its folder created if needed.
        parameters : mapping, default=None
            JSON-able facts about the run to keep with it (the learner, its options, the target),
            stored under ``provenance["parameters"]`` beside the library version and git commit.

        Returns
        -------
        pathlib.Path
            The path written.

        Raises
        ------
        InvalidInputError
            If a diagnostic is of a type the format does not hold (not an array, number, string,
            list, tuple, dict or Recovery), or ``parameters`` is not JSON.

        Examples
        --------
        >>> import tempfile, pathlib
        >>> import companion
        >>> from companion.attention import random_single_head
        >>> from companion.exact import learn_single_head
        >>> from companion.oracles import ValueQueryOracle
        >>> rec = learn_single_head(ValueQueryOracle(random_single_head(3, seed=0)))
        >>> path = rec.save(pathlib.Path(tempfile.mkdtemp()) / "head.safetensors")
        >>> companion.load(path).diagnostics["n_verify_queries"]
        32
        """
        from ._saved import save

        return save(self, path, parameters=parameters)

    @property
    def d(self) -> int:
        return int(np.shape(self.W)[0])

    @property
    def n_learning_queries(self) -> int:
        """``n_queries`` minus ``diagnostics["n_verify_queries"]`` (0 if absent): the learner's own count.

        Queries spent measuring the answers' precision are counted in ``n_verify_queries``.
        """
        return self.n_queries - int(self.diagnostics.get("n_verify_queries", 0))

    def relative_errors(self, target) -> dict:
        """Relative errors against a known target, for evaluation only (learners never see it).

        Parameters
        ----------
        target : object with attributes ``W`` (d, d) and ``v`` (d,)
            E.g. the :class:`~companion.attention.SingleHead` behind the oracle.

        Returns
        -------
        dict
            ``{"W": ||W_hat - W||_F / ||W||_F, "v": ||v_hat - v||_2 / ||v||_2}`` as Python floats;
            a zero reference gives the absolute error instead.

        Raises
        ------
        InvalidInputError
            If the shapes of the estimate and the target differ.
        """
        out = {}
        for name in ("W", "v"):
            ref = np.asarray(getattr(target, name), dtype=np.float64)
            est = np.asarray(getattr(self, name), dtype=np.float64)
            if ref.shape != est.shape:
                raise InvalidInputError(
                    f"cannot compare: the recovered {name} has shape {est.shape}, the target's "
                    f"{ref.shape}; pass the target the oracle was built on."
                )
            out[name] = relative_error(est, ref)
        return out

    def __repr__(self):
        names = sorted(f.name for f in fields(self))
        width = max(len(n) for n in names)
        lines = [f"{n.rjust(width)}: {_summary(getattr(self, n))}" for n in names]
        return f"{type(self).__name__}(\n" + "\n".join(lines) + "\n)"

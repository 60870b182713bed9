"""Input checks shared by the models, oracles and learners, and the models' calling convention (private).

Each check converts to float64 first, then rejects bad input with an
:class:`~companion.errors.InvalidInputError` naming the argument, the offending value and a fix,
before any work is done (the habit of scikit-learn's ``check_array``).
"""

from __future__ import annotations

import numbers
from typing import Sequence

import numpy as np

from .errors import InvalidInputError


def check_int(
    value, name: str, *, minimum: int | None = None, maximum: int | None = None, maximum_name: str | None = None
) -> int:
    """Return ``value`` as a Python ``int``; reject bools, non-integral floats and out-of-range values.

    ``maximum_name``: what the bound is (e.g. ``"d"``), named in the message: ``rank=20 must be <= d = 8``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise InvalidInputError(f"{name} must be an integer; got {value!r} of type {type(value).__name__}.")
    value = int(value)
    if minimum is not None and value < minimum:
        raise InvalidInputError(f"{name}={value} must be >= {minimum}.")
    if maximum is not None and value > maximum:
        bound = f"{maximum_name} = {maximum}" if maximum_name else f"{maximum}"
        raise InvalidInputError(f"{name}={value} must be <= {bound}.")
    return value


def check_real(
    value, name: str, *, minimum: float | None = None, strict: bool = False, maximum: float | None = None
) -> float:
    """Return ``value`` as a finite Python ``float`` within the given range."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise InvalidInputError(f"{name} must be a real number; got {value!r} of type {type(value).__name__}.")
    value = float(value)
    if not np.isfinite(value):
        raise InvalidInputError(f"{name}={value!r} must be finite.")
    if minimum is not None and (value <= minimum if strict else value < minimum):
        raise InvalidInputError(f"{name}={value!r} must be {'>' if strict else '>='} {minimum}.")
    if maximum is not None and value > maximum:
        raise InvalidInputError(f"{name}={value!r} must be <= {maximum}.")
    return value


def check_choice(value, name: str, choices: Sequence[str]) -> str:
    """Reject a ``value`` that is not one of ``choices``, listing them."""
    if value not in choices:
        listed = ", ".join(repr(c) for c in choices)
        raise InvalidInputError(f"{name}={value!r} is not one of {{{listed}}}.")
    return value


def as_float_array(a, name: str, *, ndim: int | tuple[int, ...], shape=None) -> np.ndarray:
    """Convert ``a`` to a float64 array, checking its number of dimensions, shape and finiteness.

    ``shape`` may contain ``None`` for a free axis, e.g. ``(None, d)``.
    """
    try:
        arr = np.asarray(a)
        if arr.dtype.kind == "c":
            raise InvalidInputError(
                f"{name} must be a real array; got a complex one ({arr.dtype}), whose imaginary parts "
                f"would be dropped: pass its real part ({name}.real) if that is what you mean."
            )
        arr = arr.astype(np.float64, copy=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(f"{name} must be a real array; could not convert it: {exc}") from None
    ndims = (ndim,) if isinstance(ndim, int) else ndim
    if arr.ndim not in ndims:
        want = " or ".join(str(n) for n in ndims)
        raise InvalidInputError(f"{name} must have {want} dimensions; got {name}.shape={arr.shape}.")
    if shape is not None:
        if len(shape) != arr.ndim or any(s is not None and s != t for s, t in zip(shape, arr.shape)):
            want = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
            raise InvalidInputError(f"{name} must have shape {want}; got {name}.shape={arr.shape}.")
    # a finite sum has no NaN or inf among its terms (one pass, no temporary): the element-wise check only where
    # the sum is not finite (a bad entry, or an overflow of finite ones)
    if arr.size and not np.isfinite(arr.sum()) and not np.all(np.isfinite(arr)):
        bad = np.argwhere(~np.isfinite(arr))[0]
        raise InvalidInputError(
            f"{name} contains NaN or inf (first at index {tuple(int(i) for i in bad)}); "
            "queries and parameters must be finite."
        )
    return arr


def as_sequences(X, d: int, name: str = "X"):
    """Normalise queries to either one float64 batch ``(B, N, d)`` or a list of ``(N_i, d)`` arrays.

    Returns ``(batch_or_list, single)`` where ``single`` is True when ``X`` was one ``(N, d)``
    sequence. A list of sequences of equal length is stacked into one batch.
    """
    if isinstance(X, (list, tuple)):
        if len(X) == 0:
            raise InvalidInputError(f"{name} is an empty list; give at least one sequence.")
        seqs = [as_float_array(x, f"{name}[{i}]", ndim=2, shape=(None, d)) for i, x in enumerate(X)]
        for i, x in enumerate(seqs):
            if x.shape[0] == 0:
                raise InvalidInputError(f"{name}[{i}] is an empty sequence (N=0); every query needs N >= 1 tokens.")
        if len({x.shape[0] for x in seqs}) == 1:
            return np.stack(seqs), False
        return seqs, False
    arr = as_float_array(X, name, ndim=(2, 3))
    if arr.shape[-1] != d:
        raise InvalidInputError(
            f"{name} must have last axis d={d} (shape (N, d) or (B, N, d)); got {name}.shape={arr.shape}."
        )
    if arr.shape[-2] == 0:
        raise InvalidInputError(
            f"{name} has sequences of length N=0 ({name}.shape={arr.shape}); every query needs N >= 1 tokens."
        )
    if arr.ndim == 2:
        return arr[None], True
    if arr.shape[0] == 0:
        raise InvalidInputError(f"{name} is an empty batch ({name}.shape={arr.shape}); give at least one sequence.")
    return arr, False


def apply_by_length(X, batch_fn) -> np.ndarray:
    """Apply ``batch_fn`` ((B, N, d) -> (B,) or (B, d_out)) to a batch, or to a list of sequences grouped by length.

    ``X`` is what :func:`as_sequences` returns. Sequences of equal length are stacked and evaluated
    in one call; the answers come back in the order of ``X``.
    """
    if isinstance(X, np.ndarray):
        return np.asarray(batch_fn(X), dtype=np.float64)
    out = None
    lengths = np.array([x.shape[0] for x in X])
    for n in np.unique(lengths):
        idx = np.flatnonzero(lengths == n)
        y = np.asarray(batch_fn(np.stack([X[i] for i in idx])), dtype=np.float64)
        if out is None:  # (B,) answers, or (B, d_out) for a vector-valued batch_fn
            out = np.empty((len(X),) + y.shape[1:])
        out[idx] = y
    assert out is not None  # X is a non-empty list
    return out


def frozen(a) -> np.ndarray:
    """A read-only float64 copy of ``a``: the array fields of the frozen model dataclasses."""
    a = np.array(a, dtype=np.float64, copy=True)
    a.flags.writeable = False
    return a


class SequenceModel:
    """Shared calling convention of the models: one sequence, a batch, or a list of sequences.

    Subclasses implement ``_batch``, a float64 batch ``(B, N, d)`` -> ``(B,)``, and ``d``.
    """

    def __call__(self, X):
        """Evaluate on ``(N, d)`` (returns float), ``(B, N, d)`` or a list (returns ``(B,)``)."""
        seqs, single = as_sequences(X, self.d)
        out = apply_by_length(seqs, self._batch)
        return float(out[0]) if single else out

"""Streaming two-token queries to an oracle in bounded chunks (private).

The learners ask up to ``d**2`` queries of two tokens each. Building them all at once costs
``2 d`` floats per query (6.5 GB for the 128,000 queries of a ``d = 1024``, ``r = 64`` sketch);
here every query batch is built in one reusable buffer of at most :data:`CHUNK_BYTES` bytes and
sent to the oracle chunk by chunk, so the memory above the learner's own ``O(d^2)`` arrays is
``O(chunk * d)``. Query ``k`` of a rank-one projection is ``c_k [(a_k + b_k)^T; b_k^T]`` with
``a_k = A[rows[k]]`` and ``b_k = B[cols[k]]``; the values are bit-for-bit those of
:func:`companion.lowrank.rop_queries` (``(a + b) * c`` and ``b * c``), whatever the chunk size.

The buffer is reused between oracle calls: an oracle must not keep a reference to the array it
is given (:class:`~companion.oracles.ValueQueryOracle` copies what it logs, and hands the batch to
the library's models, which only read it).
"""

from __future__ import annotations

import numpy as np

#: Largest query batch built at once, in bytes (float64 tokens). Small enough to stay in a core's
#: L2 cache while the oracle makes its passes over the batch; tests shrink it.
CHUNK_BYTES = 4 * 2**20


def chunk_queries(d: int, n_tokens: int = 2) -> int:
    """Queries of ``n_tokens`` tokens of dimension ``d`` per chunk (at least 1)."""
    return max(1, CHUNK_BYTES // (8 * n_tokens * d))


def _select(M, idx, s, e):
    """Rows ``M[idx[s:e]]`` as a broadcast row, a slice (no copy) or a gather; with a reuse key.

    ``idx=None`` means the rows ``s:e`` of ``M`` themselves.
    """
    if idx is None:
        return M[s:e], ("range", s, e - s)
    i = idx[s:e]
    i0 = int(i[0])
    if np.all(i == i0):
        return M[i0], ("const", i0, e - s)
    if int(i[-1]) - i0 == e - s - 1 and np.all(np.diff(i) == 1):
        return M[i0 : i0 + e - s], ("range", i0, e - s)
    return M[i], None


def _bounds(m, segments, n):
    """``(start, end)`` of every chunk: the segments (each split to at most ``n``), else every ``n``."""
    if segments is None:
        return [(s, min(m, s + n)) for s in range(0, m, n)]
    out, s = [], 0
    for length in np.asarray(segments, dtype=np.int64).tolist():
        for t in range(s, s + length, n):
            out.append((t, min(s + length, t + n)))
        s += length
    if s != m:
        raise ValueError(f"segments sum to {s}, not to the {m} measurements")
    return out


def answer_rop(oracle, A, B, c=1.0, *, rows=None, cols=None, segments=None) -> np.ndarray:
    """Answers to the rank-one-projection queries ``c_k [(a_k + b_k)^T; b_k^T]``, chunk by chunk.

    Parameters
    ----------
    oracle : callable
        Value-query oracle; called once per chunk with a batch ``(n, 2, d)``, ``n`` at most
        :func:`chunk_queries` ``(d)``.
    A, B : ndarray of shape (p, d) and (q, d)
        Sources of the left and right vectors.
    c : float or ndarray of shape (m,), default=1.0
        Scale of each query.
    rows, cols : ndarray of shape (m,) of int, default=None
        ``a_k = A[rows[k]]``, ``b_k = B[cols[k]]``; ``None`` means ``A[k]`` (``B[k]``).
    segments : sequence of int, default=None
        Lengths of consecutive runs of measurements in which ``rows`` and ``cols`` are each
        constant or consecutive (a row or a column of a cross): chunks never straddle a run, so a
        chunk is built from slices and broadcast rows, without gathers; and a chunk whose right
        vectors equal the previous chunk's (same ``cols``, ``c = 1``) rewrites only the first token.

    Returns
    -------
    ndarray of shape (m,)
        The answers, in the order of the measurements.
    """
    d = A.shape[1]
    m = len(rows) if rows is not None else (len(cols) if cols is not None else A.shape[0])
    y = np.empty(m)
    if m == 0:
        return y
    n = chunk_queries(d)
    c = np.asarray(c, dtype=np.float64)
    unit = c.ndim == 0 and float(c) == 1.0
    buf = np.empty((min(n, m), 2, d))
    previous = None
    for s, e in _bounds(m, segments, n):
        a, _ = _select(A, rows, s, e)
        b, key = _select(B, cols, s, e)
        X = buf[: e - s]
        if not (unit and key is not None and key == previous):
            X[:, 1, :] = b
        np.add(a, X[:, 1, :], out=X[:, 0, :])  # a + b, as rop_queries computes it
        if unit:
            previous = key
        else:
            X *= c if c.ndim == 0 else c[s:e, None, None]
            previous = None
        y[s:e] = oracle(X)
    return y

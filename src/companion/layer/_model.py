"""The attention layer as a model: heads on homogeneous tokens, output map, skip, LayerNorm (this book's own)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._validation import apply_by_length, as_float_array, as_sequences, check_choice, check_int, check_real
from ..errors import InvalidInputError
from ..recovery import Recovery, relative_error

__all__ = [
    "LayerRecovery",
    "AttentionLayer",
    "random_attention_layer",
    "information_floor",
    "identifiable_parameters",
    "layer_norm",
    "post_ln_symmetry",
    "pre_ln_symmetry",
    "softmax",
    "centre",
]


def softmax(S: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, shifted by the maximum."""
    S = S - S.max(axis=-1, keepdims=True)
    E = np.exp(S)
    return E / E.sum(axis=-1, keepdims=True)


def layer_norm(U, gamma, beta, eps) -> np.ndarray:
    """``gamma * (u - mean(u)) / sqrt(var(u) + eps) + beta`` over the last axis, as ``torch.nn.LayerNorm``.

    ``var`` is the biased variance (the mean of squared deviations), as PyTorch, BERT and Keras use.

    Parameters
    ----------
    U : ndarray of shape (..., n)
    gamma, beta : ndarray of shape (n,)
    eps : float

    Returns
    -------
    ndarray of shape (..., n)

    Examples
    --------
    >>> layer_norm(np.array([1.0, 3.0]), np.ones(2), np.zeros(2), 0.0).tolist()
    [-1.0, 1.0]
    """
    C = U - U.mean(axis=-1, keepdims=True)
    return gamma * C / np.sqrt((C * C).mean(axis=-1, keepdims=True) + eps) + beta


def centre(n: int) -> np.ndarray:
    """``P = I - 1 1^T / n``, the projection that a LayerNorm applies before its scaling."""
    return np.eye(n) - np.full((n, n), 1.0 / n)


class AttentionLayer:
    """A multi-head attention layer with biases, output projection, skip and LayerNorm, on homogeneous tokens.

    ``u(X) = sum_h alpha(X, W~_h)^T X~ M_h^T + b_O + S x_N`` with ``x~ = (x, 1)`` and
    ``alpha(X, W~)_i = softmax_i(x~_i^T W~ x~_N)``: the output at the last token (module docstring).
    With ``layernorm="post"`` (BERT, MiniLM) the layer returns ``LN(u(X))``; with ``"pre"``
    (GPT-2) the heads read the normalised tokens ``LN(x_i)`` and the skip reads the raw ``x_N``:
    ``S x_N + sum_h alpha(Z, W~_h)^T Z~ M_h^T + b_O`` with ``z_i = LN(x_i)``. ``LN`` is
    :func:`layer_norm` with ``gamma``, ``beta`` and ``eps``. This book's own formulation of a
    deployed layer (the paper's heads have no biases, no output projection, no residual and no
    LayerNorm).

    Parameters
    ----------
    Ws : array-like of shape (H, d + 1, d + 1)
        The heads' score matrices on homogeneous tokens (row index: the key token).
    Ms : array-like of shape (H, d_out, d + 1)
        The heads' value-and-output maps.
    b_O : array-like of shape (d_out,)
        The output bias.
    skip : array-like of shape (d_out, d), default=None
        The skip matrix ``S`` (the identity for a residual block); ``None`` means none.
    layernorm : {None, "post", "pre"}, default=None
    gamma, beta : array-like of shape (d_out,) for "post", (d,) for "pre"
        The LayerNorm's scale and shift (required with ``layernorm``).
    eps : float, default=None
        The LayerNorm's ``eps >= 0`` (required with ``layernorm``).

    Attributes
    ----------
    d, d_out, n_heads : int
    residual : bool
        Whether ``skip`` is exactly the identity.

    Raises
    ------
    InvalidInputError
        For arrays of inconsistent shapes or with NaN or inf, a LayerNorm without its parameters
        (or parameters without a LayerNorm), and, when called, for a bad ``X``.

    Examples
    --------
    >>> import numpy as np
    >>> layer = AttentionLayer(np.zeros((1, 3, 3)), np.ones((1, 2, 3)), np.zeros(2), skip=np.eye(2))
    >>> layer(np.array([[1.0, 0.0], [0.0, 2.0]])).tolist()  # uniform attention: mean (1/2, 1, 1)
    [2.5, 4.5]
    >>> post = AttentionLayer(layer.Ws, layer.Ms, layer.b_O, skip=layer.skip, layernorm="post",
    ...                       gamma=np.ones(2), beta=np.zeros(2), eps=0.0)
    >>> post(np.array([[1.0, 0.0], [0.0, 2.0]])).tolist()  # LN((2.5, 4.5))
    [-1.0, 1.0]
    """

    #: ``_batch`` only reads its input: an oracle may hand it a validated batch without a copy.
    _reads_only = True

    def __init__(self, Ws, Ms, b_O, skip=None, *, layernorm=None, gamma=None, beta=None, eps=None):
        Ws = as_float_array(Ws, "Ws", ndim=3)
        if Ws.shape[1] < 2 or Ws.shape[1] != Ws.shape[2]:
            raise InvalidInputError(f"Ws must have shape (H, d + 1, d + 1) with d >= 1; got Ws.shape={Ws.shape}.")
        d1 = Ws.shape[1]
        b_O = as_float_array(b_O, "b_O", ndim=1)
        Ms = as_float_array(Ms, "Ms", ndim=3, shape=(Ws.shape[0], b_O.shape[0], d1))
        if b_O.shape[0] < 1:
            raise InvalidInputError("b_O must have d_out >= 1 entries.")
        self.Ws, self.Ms, self.b_O = Ws.copy(), Ms.copy(), b_O.copy()
        self.skip = None if skip is None else as_float_array(skip, "skip", ndim=2, shape=(b_O.shape[0], d1 - 1)).copy()
        self.layernorm = layernorm
        self.gamma = self.beta = None
        self.eps = None
        if layernorm is None:
            if gamma is not None or beta is not None or eps is not None:
                raise InvalidInputError("gamma, beta and eps belong to a LayerNorm; pass layernorm='post' or 'pre'.")
        else:
            check_choice(layernorm, "layernorm", ("post", "pre"))
            n = b_O.shape[0] if layernorm == "post" else d1 - 1
            if n < 2 or gamma is None or beta is None or eps is None:
                raise InvalidInputError(
                    f"layernorm={layernorm!r} needs gamma and beta of shape ({n},) and eps >= 0, over {n} >= 2 "
                    f"entries; got gamma {'given' if gamma is not None else 'None'}, beta "
                    f"{'given' if beta is not None else 'None'}, eps={eps!r}."
                )
            self.gamma = as_float_array(gamma, "gamma", ndim=1, shape=(n,)).copy()
            self.beta = as_float_array(beta, "beta", ndim=1, shape=(n,)).copy()
            self.eps = check_real(eps, "eps", minimum=0.0)
        for a in (self.Ws, self.Ms, self.b_O, self.skip, self.gamma, self.beta):
            if a is not None:
                a.flags.writeable = False

    @property
    def d(self) -> int:
        return int(self.Ws.shape[1] - 1)

    @property
    def d_out(self) -> int:
        return int(self.b_O.shape[0])

    @property
    def n_heads(self) -> int:
        return int(self.Ws.shape[0])

    @property
    def residual(self) -> bool:
        return self.skip is not None and self.skip.shape[0] == self.d and bool(np.all(self.skip == np.eye(self.d)))

    @classmethod
    def from_native(
        cls,
        Q,
        b_q,
        K,
        b_k,
        V,
        b_v,
        W_O,
        b_O,
        *,
        scale=None,
        residual=False,
        layernorm=None,
        gamma=None,
        beta=None,
        eps=None,
    ):
        """The layer from per-head query, key, value weights and biases and the output projection.

        As Keras ``MultiHeadAttention`` and BERT compute it: ``q_h = Q_h x_N + b_q,h``,
        ``k_h,i = K_h x_i + b_k,h``, ``v_h,i = V_h x_i + b_v,h``, scores ``scale * q_h^T k_h,i``,
        ``z_h = sum_i alpha_h,i v_h,i`` and ``o = W_O concat_h(z_h) + b_O`` (``+ x_N`` with
        ``residual``; then ``LN(.)`` with ``layernorm="post"``, as ``BertAttention``).

        Parameters
        ----------
        Q, K, V : array-like of shape (H, d_h, d)
        b_q, b_k, b_v : array-like of shape (H, d_h)
        W_O : array-like of shape (d_out, H * d_h)
            Columns ``h * d_h`` to ``(h + 1) * d_h - 1`` read head ``h`` (Keras's output kernel
            ``(H, d_h, d_out)`` reshaped to ``(H * d_h, d_out)`` and transposed).
        b_O : array-like of shape (d_out,)
        scale : float, default=None
            Score scale; ``None`` means ``1 / sqrt(d_h)``, as Keras and BERT use.
        residual : bool, default=False
            Add ``x_N`` (needs ``d_out == d``).
        layernorm, gamma, beta, eps
            As for :class:`AttentionLayer`.

        Returns
        -------
        AttentionLayer
            ``W~_h = scale [K_h, b_k,h]^T [Q_h, b_q,h]`` and ``M_h = W_O,h [V_h, b_v,h]``.

        Raises
        ------
        InvalidInputError
            For inconsistent shapes, or ``residual`` with ``d_out != d``.

        Examples
        --------
        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> H, dh, d = 2, 3, 4
        >>> Q, K, V = (rng.standard_normal((H, dh, d)) for _ in range(3))
        >>> bq, bk, bv = (rng.standard_normal((H, dh)) for _ in range(3))
        >>> layer = AttentionLayer.from_native(Q, bq, K, bk, V, bv, rng.standard_normal((d, H * dh)), np.zeros(d))
        >>> layer.n_heads, layer.d, layer.d_out, layer.Ws.shape
        (2, 4, 4, (2, 5, 5))
        """
        Q = as_float_array(Q, "Q", ndim=3)
        H, dh, d = Q.shape
        K = as_float_array(K, "K", ndim=3, shape=(H, dh, d))
        V = as_float_array(V, "V", ndim=3, shape=(H, dh, d))
        b_q, b_k, b_v = (
            as_float_array(b, n, ndim=2, shape=(H, dh)) for b, n in ((b_q, "b_q"), (b_k, "b_k"), (b_v, "b_v"))
        )
        W_O = as_float_array(W_O, "W_O", ndim=2, shape=(None, H * dh))
        b_O = as_float_array(b_O, "b_O", ndim=1, shape=(W_O.shape[0],))
        scale = 1.0 / np.sqrt(dh) if scale is None else check_real(scale, "scale", minimum=0.0, strict=True)
        Kt = np.concatenate([K, b_k[:, :, None]], axis=2)  # (H, d_h, d + 1)
        Qt = np.concatenate([Q, b_q[:, :, None]], axis=2)
        Vt = np.concatenate([V, b_v[:, :, None]], axis=2)
        Ws = scale * np.einsum("hka,hkb->hab", Kt, Qt)
        Ms = np.einsum("ohk,hkb->hob", W_O.reshape(-1, H, dh), Vt)
        if residual and W_O.shape[0] != d:
            raise InvalidInputError(f"residual=True adds x_N, so d_out={W_O.shape[0]} must equal d={d}.")
        skip = np.eye(d) if residual else None
        return cls(Ws, Ms, b_O, skip=skip, layernorm=layernorm, gamma=gamma, beta=beta, eps=eps)

    def _attend(self, X: np.ndarray, Z: np.ndarray) -> np.ndarray:
        """``sum_h alpha(Z, W~_h)^T Z~ M_h^T + b_O + S x_N``: the heads read ``Z``, the skip ``X``."""
        Zt = np.concatenate([Z, np.ones(Z.shape[:2] + (1,))], axis=2)  # (B, N, d + 1)
        out = np.broadcast_to(self.b_O, (Z.shape[0], self.d_out)).copy()
        for W, M in zip(self.Ws, self.Ms):
            q = Zt[:, -1, :] @ W.T  # (B, d + 1): W z~_N
            alpha = softmax(np.einsum("bnk,bk->bn", Zt, q))
            out += np.einsum("bn,bnk->bk", alpha, Zt) @ M.T
        if self.skip is not None:
            out += X[:, -1, :] @ self.skip.T
        return out

    def _batch(self, X: np.ndarray) -> np.ndarray:
        if self.layernorm == "pre":
            return self._attend(X, layer_norm(X, self.gamma, self.beta, self.eps))
        out = self._attend(X, X)
        return out if self.layernorm is None else layer_norm(out, self.gamma, self.beta, self.eps)

    def __call__(self, X):
        """Evaluate on ``(N, d)`` (returns ``(d_out,)``), ``(B, N, d)`` or a list (returns ``(B, d_out)``)."""
        seqs, single = as_sequences(X, self.d)
        out = apply_by_length(seqs, self._batch)
        return out[0] if single else out

    def with_(self, **changes) -> "AttentionLayer":
        """A copy with some of ``Ws, Ms, b_O, skip, layernorm, gamma, beta, eps`` replaced."""
        names = ("Ws", "Ms", "b_O", "skip", "layernorm", "gamma", "beta", "eps")
        unknown = set(changes) - set(names)
        if unknown:
            raise InvalidInputError(f"unknown fields {sorted(unknown)}; the layer's fields are {names}.")
        kw = {n: changes[n] if n in changes else getattr(self, n) for n in names}
        return AttentionLayer(kw.pop("Ws"), kw.pop("Ms"), kw.pop("b_O"), **kw)

    def canonical(self, *, atol=1e-9) -> "AttentionLayer":
        """The canonical form: what the layer's outputs determine, in a fixed order (this book's own).

        Without LayerNorm: the last row of every ``W~_h`` is set to 0 (a score term of the query
        token alone, removed by the softmax), the last column of every ``M_h`` is moved into
        ``b_O`` (a constant, as the weights sum to 1), heads whose ``W~`` agree within
        ``atol * max(1, ||W~||_F)`` are merged (their ``M`` summed), heads with
        ``||M_h||_F <= atol * max(1, largest ||M||_F)`` are dropped, and the rest are sorted
        lexicographically by the entries of ``W~`` (then ``M``). A skip matrix of zeros becomes ``None``.

        Post-LN (:func:`post_ln_symmetry`): the output maps, ``b_O`` and the skip are projected on
        the sum-zero vectors (``P = I - 1 1^T / d_out``); a skip with ``P S = c P`` becomes the
        identity (outputs divided by ``c``, ``eps`` by ``c**2``, ``gamma`` times ``sign(c)``);
        any other skip (or none) leaves a scale free, fixed by ``eps = 1`` (or, for ``eps = 0``, a
        unit norm of the outputs' parameters), and a sign, fixed by ``sum(gamma) >= 0``.
        Pre-LN (:func:`pre_ln_symmetry`): ``gamma`` and ``beta`` are folded into the heads
        (``gamma = 1``, ``beta = 0``) and the heads' token blocks projected on the sum-zero vectors.

        Parameters
        ----------
        atol : float, default=1e-9

        Returns
        -------
        AttentionLayer
            The same function (exactly, up to rounding) in canonical form.

        Examples
        --------
        >>> import numpy as np
        >>> W = np.arange(9.0).reshape(3, 3)
        >>> two = AttentionLayer(np.stack([W, W]), np.ones((2, 1, 3)), np.zeros(1))
        >>> c = two.canonical()
        >>> c.n_heads, c.Ms.tolist(), c.b_O.tolist(), c.Ws[0, -1].tolist()
        (1, [[[2.0, 2.0, 0.0]]], [2.0], [0.0, 0.0, 0.0])
        """
        atol = check_real(atol, "atol", minimum=0.0)
        layer = self
        if self.layernorm == "post":
            layer = _canonical_post(self, atol)
        elif self.layernorm == "pre":
            layer = _canonical_pre(self)
        return _canonical_heads(layer, atol)

    def __repr__(self):
        skip = "none" if self.skip is None else ("identity" if self.residual else "matrix")
        ln = "" if self.layernorm is None else f", layernorm={self.layernorm!r}"
        return f"AttentionLayer(d={self.d}, d_out={self.d_out}, n_heads={self.n_heads}, skip={skip}{ln})"


def _canonical_heads(layer: AttentionLayer, atol: float) -> AttentionLayer:
    """The canonical steps of the heads (last rows, constant columns, merge, drop, sort)."""
    d = layer.d
    Ws = layer.Ws.copy()
    Ws[:, -1, :] = 0.0
    b = layer.b_O + layer.Ms[:, :, -1].sum(axis=0)
    Ms = layer.Ms.copy()
    Ms[:, :, -1] = 0.0
    groups: list[list[int]] = []
    for h in range(Ws.shape[0]):
        for g in groups:
            if np.linalg.norm(Ws[h] - Ws[g[0]]) <= atol * max(1.0, float(np.linalg.norm(Ws[g[0]]))):
                g.append(h)
                break
        else:
            groups.append([h])
    merged = [(Ws[g].mean(axis=0), Ms[g].sum(axis=0)) for g in groups]
    mscale = max([1.0] + [float(np.linalg.norm(M)) for _, M in merged])
    merged = [(W, M) for W, M in merged if np.linalg.norm(M) > atol * mscale]
    merged.sort(key=lambda wm: wm[0].ravel().tolist() + wm[1].ravel().tolist())
    Wc = np.array([w for w, _ in merged]).reshape(-1, d + 1, d + 1)
    Mc = np.array([m for _, m in merged]).reshape(-1, layer.d_out, d + 1)
    skip = None if layer.skip is None or not np.any(layer.skip) else layer.skip
    return layer.with_(Ws=Wc, Ms=Mc, b_O=b, skip=skip)


def _canonical_post(layer: AttentionLayer, atol: float) -> AttentionLayer:
    P = centre(layer.d_out)
    Ms, b = np.einsum("op,hpk->hok", P, layer.Ms), P @ layer.b_O
    S = None if layer.skip is None else P @ layer.skip
    gamma, eps = layer.gamma, layer.eps
    c = None
    if S is not None and layer.d_out == layer.d:
        c = float(np.trace(S)) / (layer.d - 1)
        if not (abs(c) > 0 and np.linalg.norm(S - c * P) <= atol * max(1.0, float(np.linalg.norm(S)))):
            c = None
    if c is not None:  # a residual block: the skip fixes the scale and the sign
        Ms, b, S, eps, gamma = Ms / c, b / c, np.eye(layer.d), eps / c**2, np.sign(c) * gamma
    else:
        parts = [Ms.ravel(), b] + ([] if S is None else [S.ravel()])
        size = float(np.linalg.norm(np.concatenate(parts)))
        lam = 1.0 / np.sqrt(eps) if eps > 0 else (1.0 / size if size > 0 else 1.0)
        if np.sum(gamma) < 0:
            lam, gamma = -lam, -gamma
        Ms, b, S = lam * Ms, lam * b, None if S is None else lam * S
        eps = eps * lam**2 if eps > 0 else 0.0
    return layer.with_(Ms=Ms, b_O=b, skip=S, gamma=gamma, eps=eps)


def _canonical_pre(layer: AttentionLayer) -> AttentionLayer:
    d = layer.d
    A = np.eye(d + 1)  # z~ = A n~: the LayerNorm's scale and shift on homogeneous tokens
    A[:d, :d] = np.diag(layer.gamma)
    A[:d, d] = layer.beta
    Pt = np.eye(d + 1)
    Pt[:d, :d] = centre(d)  # the normalised tokens sum to 0: their block is seen only through P
    A = A @ Pt
    Ws = np.einsum("ka,hkl,lb->hab", A, layer.Ws, A)
    Ms = layer.Ms @ A
    return layer.with_(Ws=Ws, Ms=Ms, gamma=np.ones(d), beta=np.zeros(d))


def post_ln_symmetry(layer, *, scale=1.0, seed=0) -> AttentionLayer:
    """Another post-LN layer with the same outputs and other parameters (this book's own).

    The LayerNorm sees ``u(X) = sum_h alpha_h^T X~ M_h^T + b_O + S x_N`` only through
    ``P u / sqrt(|P u|^2 / d_out + eps)`` with ``P = I - 1 1^T / d_out``. Hence (a) adding
    ``1 r_h^T`` to every ``M_h``, ``rho 1`` to ``b_O`` and ``1 s^T`` to ``S`` changes nothing (``P``
    removes it), and (b) ``u -> lambda u`` with ``eps -> lambda^2 eps`` and
    ``gamma -> sign(lambda) gamma`` changes nothing. A residual block (``S = I``) stays one under
    (a) with ``s = 0``, but not under (b) with ``lambda != 1``: there the skip fixes the scale.

    Parameters
    ----------
    layer : AttentionLayer
        With ``layernorm="post"``.
    scale : float, default=1.0
        ``lambda`` (non-zero).
    seed : int, default=0
        Seed of the random ``r_h``, ``rho`` (and ``s`` when ``scale != 1`` or the layer has no
        identity skip).

    Returns
    -------
    AttentionLayer
        Different ``Ms``, ``b_O`` (``skip``, ``eps``, ``gamma``), the same outputs.

    Raises
    ------
    InvalidInputError
        If the layer has no post-LN, or ``scale`` is 0.

    Examples
    --------
    >>> layer = random_attention_layer(4, 2, residual=True, layernorm="post", seed=0)
    >>> other = post_ln_symmetry(layer, scale=-2.0)
    >>> X = np.random.default_rng(1).standard_normal((3, 5, 4))
    >>> bool(np.allclose(layer(X), other(X), rtol=0, atol=1e-12)), bool(np.allclose(layer.Ms, other.Ms))
    (True, False)
    """
    if not isinstance(layer, AttentionLayer) or layer.layernorm != "post":
        raise InvalidInputError("post_ln_symmetry needs an AttentionLayer with layernorm='post'.")
    lam = check_real(scale, "scale")
    if lam == 0.0:
        raise InvalidInputError("scale must be non-zero (a LayerNorm of 0 is its shift beta alone).")
    rng = np.random.default_rng(check_int(seed, "seed", minimum=0))
    one = np.ones(layer.d_out)
    Ms = lam * layer.Ms + one[None, :, None] * rng.standard_normal((layer.n_heads, 1, layer.d + 1))
    b = lam * layer.b_O + rng.standard_normal() * one
    S = layer.skip
    if S is not None:
        S = lam * S
        if not (lam == 1.0 and layer.residual):
            S = S + np.outer(one, rng.standard_normal(layer.d))
    return layer.with_(Ms=Ms, b_O=b, skip=S, eps=layer.eps * lam**2, gamma=np.sign(lam) * layer.gamma)


def pre_ln_symmetry(layer, *, seed=0) -> AttentionLayer:
    """Another pre-LN layer with the same outputs and other parameters (this book's own).

    The heads read ``z~_i = A n~_i`` with ``n_i = P x_i / sqrt(|P x_i|^2 / d + eps)`` (a sum-zero
    vector) and ``A = [[diag(gamma), beta], [0, 1]]``: the LayerNorm's ``gamma`` and ``beta`` fold
    into the heads (``W~_h -> A^T W~_h A``, ``M_h -> M_h A``, then ``gamma = 1``, ``beta = 0``), and
    the heads' token blocks are seen only on sum-zero vectors, so adding ``1 p^T`` or ``q 1^T`` to
    a ``W~_h``'s block, or ``m 1^T`` to an ``M_h``'s, changes nothing. ``eps`` and the skip (on the
    raw ``x_N``) are not touched.

    Parameters
    ----------
    layer : AttentionLayer
        With ``layernorm="pre"``.
    seed : int, default=0
        Seed of the random ``p``, ``q``, ``m``.

    Returns
    -------
    AttentionLayer
        ``gamma = 1``, ``beta = 0``, other heads, the same outputs.

    Raises
    ------
    InvalidInputError
        If the layer has no pre-LN.

    Examples
    --------
    >>> layer = random_attention_layer(4, 2, residual=True, layernorm="pre", seed=0)
    >>> other = pre_ln_symmetry(layer)
    >>> X = np.random.default_rng(1).standard_normal((3, 5, 4))
    >>> bool(np.allclose(layer(X), other(X), rtol=0, atol=1e-12)), other.gamma.tolist()
    (True, [1.0, 1.0, 1.0, 1.0])
    """
    if not isinstance(layer, AttentionLayer) or layer.layernorm != "pre":
        raise InvalidInputError("pre_ln_symmetry needs an AttentionLayer with layernorm='pre'.")
    rng = np.random.default_rng(check_int(seed, "seed", minimum=0))
    d, H = layer.d, layer.n_heads
    A = np.eye(d + 1)
    A[:d, :d] = np.diag(layer.gamma)
    A[:d, d] = layer.beta
    Ws = np.einsum("ka,hkl,lb->hab", A, layer.Ws, A)
    one = np.zeros(d + 1)
    one[:d] = 1.0
    Ws = Ws + one[None, :, None] * rng.standard_normal((H, 1, d + 1))  # 1 p^T: row sums of the block
    Ws = Ws + rng.standard_normal((H, d + 1, 1)) * one[None, None, :]  # q 1^T
    Ms = layer.Ms @ A + rng.standard_normal((H, layer.d_out, 1)) * one[None, None, :]
    return layer.with_(Ws=Ws, Ms=Ms, gamma=np.ones(d), beta=np.zeros(d))


def random_attention_layer(
    d, H, *, d_out=None, head_dim=None, residual=False, bias_scale=0.5, layernorm=None, eps=1e-3, seed
):
    """A random layer from native Gaussian weights (for tests and examples).

    Parameters
    ----------
    d, H : int
        Input dimension and number of heads (``>= 1``).
    d_out : int, default=None
        Output dimension (``d`` when None).
    head_dim : int, default=None
        ``d_h`` (``max(1, d // H)`` when None).
    residual : bool, default=False
    bias_scale : float, default=0.5
        Standard deviation of every bias.
    layernorm : {None, "post", "pre"}, default=None
        With a LayerNorm, ``gamma = 1 + N(0, 0.1^2)`` and ``beta = N(0, 0.1^2)`` per entry.
    eps : float, default=1e-3
        The LayerNorm's ``eps`` (Keras's default; PyTorch's is 1e-5, BERT's 1e-12).
    seed : int

    Returns
    -------
    AttentionLayer
        :meth:`AttentionLayer.from_native` of ``Q, K, V`` with entries ``N(0, 1)`` (scores scaled
        by ``1 / sqrt(d_h)``), ``W_O`` with entries ``N(0, 1 / (H d_h))``.
    """
    d = check_int(d, "d", minimum=1)
    H = check_int(H, "H", minimum=1)
    d_out = d if d_out is None else check_int(d_out, "d_out", minimum=1)
    dh = max(1, d // H) if head_dim is None else check_int(head_dim, "head_dim", minimum=1)
    rng = np.random.default_rng(check_int(seed, "seed", minimum=0))
    Q, K, V = (rng.standard_normal((H, dh, d)) for _ in range(3))
    bq, bk, bv = (bias_scale * rng.standard_normal((H, dh)) for _ in range(3))
    W_O = rng.standard_normal((d_out, H * dh)) / np.sqrt(H * dh)
    b_O = bias_scale * rng.standard_normal(d_out)
    ln = {}
    if layernorm is not None:
        n = d_out if layernorm == "post" else d
        ln = {"gamma": 1.0 + 0.1 * rng.standard_normal(n), "beta": 0.1 * rng.standard_normal(n), "eps": eps}
    return AttentionLayer.from_native(Q, bq, K, bk, V, bv, W_O, b_O, residual=residual, layernorm=layernorm, **ln)


def information_floor(d, H, d_out, *, skip="matrix", layernorm=None) -> int:
    """A dimension count: the fewest vector queries that can identify a generic layer (this book's own).

    ``ceil(p / f)``, with ``p`` the number of identifiable parameters of the canonical form of the
    layer's kind and ``f`` the free numbers in one answer. ``n`` answers are ``n f`` numbers, and a
    smooth map from a ``p``-dimensional parameter set to ``n f`` numbers is not injective on an open
    set when ``n f < p``: fewer queries cannot identify a generic layer of that kind. It is a lower
    bound, not a plan; the learner asks far more (its heads' stage reads one scalar per answer).

    Parameters
    ----------
    d, H, d_out : int
        Token dimension, number of heads, output dimension.
    skip : {"matrix", "identity", "none"}, default="matrix"
        The skip as known before the queries: a matrix to learn, the identity (a residual block:
        nothing to learn) or absent. ``True`` / ``False`` mean ``"matrix"`` / ``"none"``.
    layernorm : {None, "post", "pre"}, default=None

    Returns
    -------
    int
        ``ceil(p / f)``.

    Notes
    -----
    Without LayerNorm (``f = d_out``): ``p = H d (d + 1)`` (``W~_h`` less its last row)
    ``+ H d_out d`` (``M_h`` less its last column) ``+ d_out`` (``b_O``) ``+ d_out d`` (a skip matrix).

    Post-LN: the answers lie on the hyperplane ``sum_i (y_i - beta_i) / gamma_i = 0``, so
    ``f = d_out - 1``; the all-ones components of ``M_h``, ``b_O`` and ``S`` are not seen, so each
    column counts ``d_out - 1``: ``p = H d (d + 1) + H (d_out - 1) d + (d_out - 1) + 2 d_out``
    (``gamma``, ``beta``) plus, with ``skip="identity"``, ``1`` (``eps``; the skip's multiple of
    ``I`` is fixed to 1), with a skip matrix ``(d_out - 1) d`` (``eps`` set to 1 fixes the scale),
    with none ``0`` (likewise).

    Pre-LN (``f = d_out``): ``gamma`` and ``beta`` fold into the heads, whose token blocks are seen
    on the ``d - 1`` sum-zero directions: ``p = H (d - 1) d + H d_out (d - 1) + d_out + 1``
    (``eps``) ``+ d_out d`` (a skip matrix).

    Examples
    --------
    >>> information_floor(8, 2, 8)
    43
    >>> information_floor(6, 2, 6, skip="identity", layernorm="post")  # 162 parameters, 5 per answer
    33
    >>> information_floor(384, 12, 384, skip="identity", layernorm="post")  # MiniLM: 3,540,096 / 383
    9244
    """
    d, H, d_out = (check_int(x, n, minimum=1) for x, n in ((d, "d"), (H, "H"), (d_out, "d_out")))
    if skip is True or skip is False or skip is None:
        skip = "matrix" if skip else "none"
    check_choice(skip, "skip", ("matrix", "identity", "none"))
    if layernorm is not None:
        check_choice(layernorm, "layernorm", ("post", "pre"))
    p, f = identifiable_parameters(d, H, d_out, skip=skip, layernorm=layernorm)
    return -(-p // f)


def identifiable_parameters(d, H, d_out, *, skip="matrix", layernorm=None) -> tuple[int, int]:
    """``(p, f)`` of :func:`information_floor`: identifiable parameters, free numbers per answer.

    Examples
    --------
    >>> identifiable_parameters(6, 2, 6, skip="identity", layernorm="post")
    (162, 5)
    """
    if layernorm == "post":
        c = d_out - 1
        p = H * d * (d + 1) + H * c * d + c + 2 * d_out
        p += {"identity": 1, "matrix": c * d, "none": 0}[skip]
        return p, c
    if layernorm == "pre":
        p = H * (d - 1) * d + H * d_out * (d - 1) + d_out + 1 + (d_out * d if skip == "matrix" else 0)
        return p, d_out
    p = H * d * (d + 1) + H * d_out * d + d_out + (d_out * d if skip == "matrix" else 0)
    return p, d_out


@dataclass(frozen=True, eq=False, repr=False)
class LayerRecovery(Recovery):
    """A :class:`~companion.recovery.Recovery` for an attention layer.

    Attributes
    ----------
    Ws : ndarray of shape (H, d + 1, d + 1)
        The canonical heads' score matrices (last rows 0).
    Ms : ndarray of shape (H, d_out, d + 1)
        Their value-and-output maps (last columns 0).
    b_O : ndarray of shape (d_out,)
        The output bias of the canonical form.
    skip : ndarray of shape (d_out, d) or None
        The skip matrix found (the identity for a residual block), None when it is 0.
    layernorm : {None, "post", "pre"}
    gamma, beta : ndarray of shape (d_out,) (post-LN), (d,) (pre-LN) or None
        The LayerNorm's scale and shift; a pre-LN's are folded into the heads in canonical form (ones and
        zeros, :func:`pre_ln_symmetry`).
    eps : float or None
        The LayerNorm's ``eps``; a post-LN's is 1 by convention when the block has no identity skip (then it
        is not identifiable, :func:`post_ln_symmetry`).
    W : ndarray of shape (d + 1, d + 1)
        ``sum_h W~_h``.
    v : ndarray of shape (d_out,)
        ``b_O``.
    n_queries, message, diagnostics
        As for :class:`~companion.recovery.Recovery`; counted on the vector oracle.
    """

    Ws: np.ndarray = None  # type: ignore[assignment]  # always given; a default because Recovery's fields have them
    Ms: np.ndarray = None  # type: ignore[assignment]
    b_O: np.ndarray = None  # type: ignore[assignment]
    skip: np.ndarray | None = None
    layernorm: str | None = None
    gamma: np.ndarray | None = None
    beta: np.ndarray | None = None
    eps: float | None = None

    @property
    def layer(self) -> AttentionLayer:
        """The recovered layer (canonical form) as an :class:`AttentionLayer`."""
        return AttentionLayer(
            self.Ws,
            self.Ms,
            self.b_O,
            skip=self.skip,
            layernorm=self.layernorm,
            gamma=self.gamma,
            beta=self.beta,
            eps=self.eps,
        )

    @property
    def model(self) -> AttentionLayer:
        """Same as :attr:`layer`."""
        return self.layer

    @property
    def n_heads(self) -> int:
        return int(self.Ws.shape[0])

    def relative_errors(self, target) -> dict:
        """Relative errors against a known layer, canonical form against canonical form (evaluation only).

        Both layers are put in canonical form (:meth:`AttentionLayer.canonical`) and their heads matched
        by the smallest total ``||W~_g - W~_h||_F`` (the canonical form is unique up to the heads' order;
        its lexicographic sort can order two close heads differently).

        Parameters
        ----------
        target : AttentionLayer
            The layer behind the oracle, in any form (e.g. :meth:`AttentionLayer.from_native`).

        Returns
        -------
        dict
            Python floats ``||est - ref||_F / ||ref||_F`` (the absolute error for a zero reference) for
            ``"Ws"`` (all heads), ``"Ms"``, ``"b_O"``, and, where the target has them, ``"skip"``,
            ``"gamma"``, ``"beta"`` and ``"eps"``.

        Raises
        ------
        InvalidInputError
            If ``target`` is not an :class:`AttentionLayer`, or its canonical form differs from the
            recovered one in ``d``, ``d_out``, its number of heads, its skip or its LayerNorm.

        Examples
        --------
        >>> from companion.layer import learn_attention_layer, random_attention_layer
        >>> from companion.oracles import VectorQueryOracle
        >>> target = random_attention_layer(8, 2, seed=0)
        >>> rec = learn_attention_layer(VectorQueryOracle(target), H=2)
        >>> errors = rec.relative_errors(target)
        >>> sorted(errors), errors["Ws"] < 1e-8
        (['Ms', 'Ws', 'b_O'], True)
        """
        from scipy.optimize import linear_sum_assignment

        if not isinstance(target, AttentionLayer):
            raise InvalidInputError(
                f"relative_errors compares against an AttentionLayer; got {type(target).__name__}. Build one "
                "from the target's weights with AttentionLayer.from_native."
            )
        ref, est = target.canonical(), self.layer.canonical()
        mine = (est.d, est.d_out, est.n_heads, est.skip is None, est.layernorm)
        theirs = (ref.d, ref.d_out, ref.n_heads, ref.skip is None, ref.layernorm)
        if mine != theirs:
            raise InvalidInputError(
                "cannot compare: (d, d_out, heads, no skip, layernorm) of the recovered layer's canonical form "
                f"are {mine}, the target's {theirs}; pass the layer the oracle was built on."
            )
        cost = np.linalg.norm(est.Ws[:, None] - ref.Ws[None], axis=(2, 3))
        order = linear_sum_assignment(cost)[1]  # est head i matches ref head order[i]
        pairs = {"Ws": (est.Ws, ref.Ws[order]), "Ms": (est.Ms, ref.Ms[order]), "b_O": (est.b_O, ref.b_O)}
        for name in ("skip", "gamma", "beta", "eps"):
            if getattr(ref, name) is not None:
                pairs[name] = (getattr(est, name), getattr(ref, name))
        return {name: relative_error(e, r) for name, (e, r) in pairs.items()}

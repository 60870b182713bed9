"""A prototype, not the library (this book's own): the matrix-free polish with Theta's head blocks factored too,
``M_h = P_h Q_h^T``, beside ``_fit.polish_directions_free`` (heads factored, Theta full), on one directions problem.

Run: .venv/bin/python benchmarks/factored_maps_prototype.py D H HEAD_DIM QUERIES NOISE [f32]

A ``random_attention_layer(D, H, head_dim=HEAD_DIM, residual=True, seed=1)`` in canonical form, its answers' centred
directions on QUERIES queries of lengths 2 to 32, started at its heads and Theta plus NOISE times their largest
entry (Gaussian); both polishes take six Gauss-Newton steps by LSMR (tolerance 1e-3), products in float32, one BLAS
thread. No LayerNorm unknowns and no weights (the library's float32 route has both). The prototype's unknowns:
the heads' factors, ``P_h`` (``(d, s)``), ``Q_h`` (``(d_out, s)``), and the skip's and bias's rows ``Sb`` whole;
preconditioned per head by the Cholesky factors of ``xbar_h``'s Gram matrix (``dP_h``, over ``|Q_h|``'s columns)
and of ``xbar_h P_h``'s (``dQ_h``), ``Sb`` by its features' (scaled); the factors balanced after each step.
Theta's products cost ``B (2 H d s + 2 H s d_out + (d + 1) d_out)`` multiply-adds each, not ``B p d_out``.

Measured (2026-12-07, SkylakeX, one BLAS thread, the machine shared with two MiniLM runs):

* d = 64, H = 8, head_dim 8, 2,000 queries, noise 1e-4, float64 answers: the library 4.8 CPU s, LSMR 20 to 26
  iterations a step, residual 5.3e-4 to 1.2e-13; the prototype 4.8 CPU s, LSMR 25 to 28, 3.9e-4 to 4.0e-13.
* MiniLM's size, d = 384, H = 12, head_dim 32, 8,000 queries, noise 1e-5: the library 748 CPU s, LSMR 28, 50, 47,
  49, 52 and 54 (280), residual 5.7e-5 to 7.0e-11; the prototype 344 CPU s, LSMR 30, 34, 35, 37, 38 and 39 (213),
  about 1.0 to 1.1 CPU s an iteration, residual 3.8e-5 to 2.0e-12.
"""

import sys
import time

import numpy as np
from scipy.linalg import solve_triangular
from scipy.sparse.linalg import LinearOperator, lsmr

from companion.layer._fit import _Factored, _PolishOperator, polish_directions_free


class Maps:
    """Theta = [P_1 Q_1^T; ...; P_H Q_H^T; Sb]: P (H, d, s), Q (H, d_out, s), Sb (d + 1, d_out)."""

    def __init__(self, Theta, H, s):
        p, d_out = Theta.shape
        d = (p - 1) // (H + 1)
        self.H, self.d, self.s = H, d, s
        M = Theta[: H * d].reshape(H, d, d_out)
        U, sv, Vt = np.linalg.svd(M, full_matrices=False)
        r = np.sqrt(sv[:, None, :s])
        self.P, self.Q = U[:, :, :s] * r, Vt[:, :s, :].transpose(0, 2, 1) * r
        self.Sb = Theta[H * d :].copy()

    def Theta(self):
        return np.concatenate([(self.P @ self.Q.transpose(0, 2, 1)).reshape(-1, self.Q.shape[1]), self.Sb])

    def sizes(self):
        return self.P.size, self.Q.size, self.Sb.size

    def split(self, x):
        a, b, _ = self.sizes()
        return x[:a].reshape(self.P.shape), x[a : a + b].reshape(self.Q.shape), x[a + b :].reshape(self.Sb.shape)

    def moved(self, x):
        dP, dQ, dSb = self.split(x)
        out = Maps.__new__(Maps)
        out.H, out.d, out.s = self.H, self.d, self.s
        QA, RA = np.linalg.qr(self.P + dP)
        QB, RB = np.linalg.qr(self.Q + dQ)
        U, sv, Vt = np.linalg.svd(RA @ RB.transpose(0, 2, 1))
        r = np.sqrt(sv[:, None, :])
        out.P, out.Q = QA @ (U * r), QB @ (Vt.transpose(0, 2, 1) * r)
        out.Sb = self.Sb + dSb
        return out


def products(op, heads, maps):
    """matvec / rmatvec on (heads' factors, P, Q, Sb), from the operator's features (op built with factors)."""
    H, d = op.H, op.d
    dtype = op.M.dtype
    P, Q = maps.P.astype(dtype), maps.Q.astype(dtype)
    s = P.shape[2]
    Qs = Q.transpose(1, 0, 2).reshape(Q.shape[1], H * s)  # (d_out, H s)
    E = [np.matmul(phi[:, : H * d].reshape(-1, H, d).transpose(1, 0, 2), P) for (_, _, _, phi, *_r) in op.batches]

    def matvec(xh, dP, dQ, dSb):
        A = op.factors[0]
        dA, dB = (F.astype(dtype) for F in xh)
        dAA, dBf = np.concatenate([dA, A], axis=2), dB.transpose(1, 0, 2).reshape(d + 1, -1)
        dP, dQ, dSb = dP.astype(dtype), dQ.astype(dtype), dSb.astype(dtype)
        QQ = np.concatenate([Q, dQ], axis=2).transpose(0, 2, 1).reshape(H * 2 * s, -1)  # rows [Q_h^T; dQ_h^T]
        out = []
        for i, (X, xN, alpha, phi, W, nv, _) in enumerate(op.batches):
            B = X.shape[0]
            xdB = (xN @ dBf).reshape(B, H, -1).transpose(1, 0, 2)
            a = (np.concatenate([op.xB[i], xdB], axis=2) @ dAA.transpose(0, 2, 1)).transpose(1, 0, 2)
            g = alpha * (a @ X.transpose(0, 2, 1))
            xbar = phi[:, : H * d].reshape(B, H, d)
            dxbar = g @ X - g.sum(axis=2)[:, :, None] * xbar
            c = np.matmul(dxbar.transpose(1, 0, 2), P) + np.matmul(xbar.transpose(1, 0, 2), dP)  # (H, B, s)
            ce = np.concatenate([c, E[i]], axis=2).transpose(1, 0, 2).reshape(B, -1)  # (B, H 2s)
            du = ce @ QQ + phi[:, H * d :] @ dSb
            out.append(op._proj(du.astype(float), W, nv).reshape(-1))
        return np.concatenate(out)

    def rmatvec(y):
        A, Bf = op.factors
        gA, gB = np.zeros(A.shape), np.zeros((H, d + 1, A.shape[2]))
        gP, gQ, gSb = np.zeros(P.shape), np.zeros(Q.shape), np.zeros((d + 1, Q.shape[1]))
        i = 0
        for k, (X, xN, alpha, phi, W, nv, _) in enumerate(op.batches):
            B = X.shape[0]
            z = op._proj_t(y[i : i + B * op.d_out].reshape(B, op.d_out), W, nv).astype(dtype)
            i += B * op.d_out
            zQ = (z @ Qs).reshape(B, H, s).transpose(1, 0, 2)  # (H, B, s)
            xbar = phi[:, : H * d].reshape(B, H, d)
            gP += xbar.transpose(1, 2, 0) @ zQ  # (H, d, s)
            gQ += (z.T @ E[k].transpose(1, 0, 2).reshape(B, -1)).reshape(-1, H, s).transpose(1, 0, 2)
            gSb += phi[:, H * d :].T @ z
            m = np.matmul(zQ, P.transpose(0, 2, 1)).transpose(1, 0, 2)  # M_h z, (B, H, d)
            e = alpha * (m @ X.transpose(0, 2, 1) - np.einsum("bha,bha->bh", xbar, m)[:, :, None])
            Eh = (e @ X).transpose(1, 2, 0)
            gA += Eh @ op.xB[k]
            EA = (A.transpose(0, 2, 1) @ Eh).transpose(2, 0, 1).reshape(B, -1)
            gB += (xN.T @ EA).reshape(d + 1, H, -1).transpose(1, 0, 2)
        return (gA, gB), gP, gQ, gSb

    def grams():
        """Per head: xbar_h's Gram (d, d) and E_h's (s, s), weighted by 1/|v|^2; Sb's features' Gram (d+1, d+1)."""
        Gx = np.zeros((H, d, d))
        Ge = np.zeros((H, s, s))
        Gs = np.zeros((d + 1, d + 1))
        for k, (X, xN, alpha, phi, W, nv, _) in enumerate(op.batches):
            w = (1.0 / nv)[:, None]
            xb = (phi[:, : H * d].astype(float) * w).reshape(-1, H, d).transpose(1, 0, 2)
            Gx += xb.transpose(0, 2, 1) @ xb
            ew = E[k].astype(float) * w[None]
            Ge += ew.transpose(0, 2, 1) @ ew
            f = phi[:, H * d :].astype(float) * w
            Gs += f.T @ f
        return Gx, Ge, Gs

    return matvec, rmatvec, grams


def _step(op, heads, maps, sF, r, tol, lsmr_iters):
    """One Gauss-Newton step by LSMR, preconditioned: ``((heads' step, dP, dQ, dSb), istop, iterations)``."""
    d = op.d
    d_out, s = maps.Q.shape[1], maps.P.shape[2]
    matvec, rmatvec, grams = products(op, heads, maps)
    Gx, Ge, Gs = grams()
    tiny = np.finfo(float).tiny
    qn = np.maximum(np.linalg.norm(maps.Q, axis=1), tiny)  # (H, s)
    Lx = np.linalg.cholesky(Gx + 1e-10 * np.trace(Gx, axis1=1, axis2=2)[:, None, None] / d * np.eye(d))
    Le = np.linalg.cholesky(Ge + 1e-10 * np.trace(Ge, axis1=1, axis2=2)[:, None, None] / s * np.eye(s))
    Ds = np.sqrt(np.maximum(np.diag(Gs), tiny))
    Ls = np.linalg.cholesky(Gs / np.outer(Ds, Ds) + 1e-13 * np.eye(d + 1))
    nA = sF.size
    nP, nQ, nS = maps.sizes()

    def pre(x):  # preconditioned variables -> (heads' step, dP, dQ, dSb)
        xh = heads.tangent(x[:nA] * sF)
        dP = np.linalg.solve(Lx.transpose(0, 2, 1), x[nA : nA + nP].reshape(maps.P.shape)) / qn[:, None, :]
        yQ = x[nA + nP : nA + nP + nQ].reshape(maps.Q.shape)
        dQ = np.linalg.solve(Le, yQ.transpose(0, 2, 1)).transpose(0, 2, 1)  # yQ Le^-T
        dS = solve_triangular(Ls, x[nA + nP + nQ :].reshape(d + 1, d_out), lower=True, trans="T") / Ds[:, None]
        return xh, dP, dQ, dS

    def rmv(y):
        gh, gP, gQ, gS = rmatvec(y)
        a = heads.adjoint(gh) * sF
        b = np.linalg.solve(Lx, gP / qn[:, None, :])
        c = np.linalg.solve(Le, gQ.transpose(0, 2, 1)).transpose(0, 2, 1)
        e = solve_triangular(Ls, gS / Ds[:, None], lower=True)
        return np.concatenate([a, b.ravel(), c.ravel(), e.ravel()])

    A = LinearOperator((r.size, nA + nP + nQ + nS), matvec=lambda x: matvec(*pre(x)), rmatvec=rmv, dtype=float)
    x, istop, its = lsmr(A, -r, atol=tol, btol=tol, maxiter=lsmr_iters)[:3]
    return pre(x), istop, its


def polish_proto(Ws, Theta, Xs, What, rank, s, iters=6, lsmr_iters=100, tol=1e-3, log=print):
    H, d = Ws.shape[0], Ws.shape[1] - 1
    prods = [X.astype(np.float32) for X in Xs]
    heads = _Factored(Ws[:, :d, :], rank)
    maps = Maps(Theta, H, s)
    Ws = Ws.copy()
    Ws[:, :d, :] = heads.W()
    data = {"What": [W / np.linalg.norm(W, axis=1, keepdims=True) for W in What]}
    scale = np.sqrt(sum(W.shape[0] for W in What))
    op = _PolishOperator(Ws, maps.Theta(), Xs, products=prods, factors=heads.factors(), **data)
    r = op.residual()
    best = float(np.linalg.norm(r)) / scale
    log(f"proto start {best:.3e}")
    sF = heads.scales(op.column_norms())
    steps = []
    for it in range(iters):
        c0 = time.process_time()
        (xh, dP, dQ, dS), istop, its = _step(op, heads, maps, sF, r, tol, lsmr_iters)
        cpu = time.process_time() - c0
        flat_h = np.concatenate([xh[0].ravel(), xh[1].ravel()])
        new_heads = heads.moved(flat_h)
        new_maps = maps.moved(np.concatenate([dP.ravel(), dQ.ravel(), dS.ravel()]))
        W_new = Ws.copy()
        W_new[:, :d, :] = new_heads.W()
        op_new = _PolishOperator(W_new, new_maps.Theta(), Xs, products=prods, factors=new_heads.factors(), **data)
        r_new = op_new.residual()
        res = float(np.linalg.norm(r_new)) / scale
        log(f"proto step {it}: lsmr {its} its ({istop}), {cpu:.2f} CPU s ({cpu / max(its, 1):.3f}/it), res {res:.3e}")
        steps.append((its, cpu, res))
        if not res < best:
            break
        gain = best / res
        heads, maps, Ws, op, r, best = new_heads, new_maps, W_new, op_new, r_new, res
        sF = heads.scales(op.column_norms())
        if gain < 1.01:
            break
    return Ws, maps.Theta(), best, steps


if __name__ == "__main__":
    from companion.layer import random_attention_layer
    from companion.layer._fit import group_by_length
    from companion.layer._model import centre
    from threadpoolctl import threadpool_limits

    d, H, hd, n, noise = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))
    block = random_attention_layer(d, H, head_dim=hd, residual=True, seed=1).canonical()
    rng = np.random.default_rng(0)
    Xs = [rng.standard_normal((int(m), d)) / np.sqrt(d) for m in rng.integers(2, 33, size=n)]
    batches, answers = group_by_length(Xs, block(Xs))
    if len(sys.argv) > 6 and sys.argv[6] == "f32":
        answers = [a.astype(np.float32).astype(float) for a in answers]
    What = [a @ centre(d) for a in answers]
    # the polish's Theta: [M_1^T ... ; S^T; b]: from the block's canonical parameters through fit_outputs
    from companion.layer._fit import features

    Ws0 = block.Ws
    Theta0 = np.concatenate([block.Ms[:, :, :d].transpose(0, 2, 1).reshape(H * d, -1), block.skip.T, block.b_O[None]])
    ff = np.concatenate([features(Ws0, X) @ Theta0 for X in batches])
    print("Theta0 reproduces the answers to", np.abs(ff - np.concatenate(answers)).max())
    Ws = Ws0 + noise * np.abs(Ws0).max() * rng.standard_normal(Ws0.shape)
    Ws[:, d, :] = 0
    Theta = Theta0 + noise * np.abs(Theta0).max() * rng.standard_normal(Theta0.shape)
    M = Theta0[: H * d].reshape(H, d, -1)
    print("Theta head blocks' singular values (head 0):", np.round(np.linalg.svd(M[0], compute_uv=False)[: hd + 2], 6))
    with threadpool_limits(1):
        c0 = time.process_time()
        out = polish_directions_free(Ws, Theta, batches, What, rank=hd, iters=6)
        its = out[4]["lsmr_iterations"]
        print(f"library: {time.process_time() - c0:.2f} CPU s, lsmr {its}, res {out[2]:.3e} -> {out[3]:.3e}")
        c0 = time.process_time()
        got = polish_proto(Ws, Theta, batches, What, hd, hd)
        print(f"proto: {time.process_time() - c0:.2f} CPU s, res -> {got[2]:.3e}")

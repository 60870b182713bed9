"""The joint heads' links (``companion.layer._joint._link``): a row's heads matched to row 0's by least-squares
coefficients, or, where those miss a permutation, by the permutation's own fit against every transposition of it
(``LINK_SWAP_RATIO``, this book's own rule)."""

from __future__ import annotations

import numpy as np
import pytest

import companion.layer._joint as J
from companion.errors import OracleInconsistentError
from companion.layer import learn_attention_layer, random_attention_layer
from companion.oracles import VectorQueryOracle

TOL_LINK = np.sqrt(1e-3)  # the float32 route's sqrt(FLOAT32_HEADS_TOL)


def _pairs(H=4, L=8, d_out=16, close=0.03, noise=2e-3, seed=1, same=False):
    """Pair answers ``GL`` ``(L, 2 H, d_out)`` of two rows' heads, matched by the permutation ``pi``, with their
    candidate terms' ``Phi`` ``(L, 2 H, H, H)`` and amplitudes ``(H, H, d_out)``: the heads' shifts lie ``close``
    apart (root mean square) around a common one, the answers carry relative noise ``noise``. With ``same`` row 0's
    first two heads have one shift and row i's heads one shift, so swapping any two of them changes no term's
    shift."""
    rng = np.random.default_rng(seed)
    r = (lambda nm: nm[0] / nm[1])(J._ratios(H))
    base = rng.standard_normal((L, 1))
    s0, si = base + close * rng.standard_normal((2, L, H))
    if same:
        s0[:, 1] = s0[:, 0]
        si[:] = si[:, :1]
    g0, gi = rng.standard_normal((2, H, d_out))
    pi = rng.permutation(H)
    shifts = s0[:, :, None] + si[:, None, :]
    Phi = r[None, :, None, None] / (r[None, :, None, None] + np.exp(-shifts)[:, None])
    amp = g0[:, None] + gi[None]
    GL = sum(Phi[:, :, h, pi[h]][..., None] * amp[h, pi[h]] for h in range(H))
    GL = GL + noise * np.linalg.norm(GL) / np.sqrt(GL.size) * rng.standard_normal(GL.shape)
    return Phi, amp, GL, pi


def _fit_and_swap(Phi, amp, GL, perm):
    """The relative residuals of ``perm``'s terms (coefficients one) and of its best transposition, by brute force."""
    H = len(perm)

    def resid(p):
        pred = sum(Phi[:, :, h, p[h]][..., None] * amp[h, p[h]] for h in range(H))
        return np.linalg.norm(GL - pred) / np.linalg.norm(GL)

    swaps = []
    for a in range(H):
        for b in range(a + 1, H):
            q = perm.copy()
            q[a], q[b] = q[b], q[a]
            swaps.append(resid(q))
    return resid(perm), min(swaps)


def test_coefficients_near_a_permutation_link_without_the_fit():
    """Well separated heads (shifts 0.3 apart): coefficients 1.0e-3 from the permutation (measured 2026-12-05)."""
    Phi, amp, GL, pi = _pairs(close=0.3, noise=1e-3, seed=0)
    perm, linked, st = J._link(Phi, amp, GL, TOL_LINK)
    assert linked and np.array_equal(perm, pi) and set(st) == {"coef"}
    assert st["coef"] < 2e-3


def test_the_fit_and_its_best_transposition_are_the_brute_force_residuals():
    """Shifts 0.03 apart, noise 2e-3: coefficients 0.038 from the permutation, above sqrt(tol) = 0.032 (measured
    2026-12-05); the closed form's residuals are the brute force's."""
    Phi, amp, GL, pi = _pairs()
    perm, linked, st = J._link(Phi, amp, GL, TOL_LINK)
    assert np.array_equal(perm, pi) and st["coef"] > TOL_LINK
    fit, swap = _fit_and_swap(Phi, amp, GL, perm)
    assert st["fit"] == pytest.approx(fit, rel=1e-9) and st["swap"] == pytest.approx(swap, rel=1e-9)
    assert st["fit"] == pytest.approx(2e-3, rel=0.05)
    assert not linked  # its best transposition fits 2.8 times worse, below LINK_SWAP_RATIO = 3


def test_link_swap_ratio_is_three():
    assert J.LINK_SWAP_RATIO == 3.0


@pytest.mark.parametrize("factor, linked", [(0.99, True), (1.01, False)])
def test_the_swap_ratio_just_inside_and_outside(monkeypatch, factor, linked):
    Phi, amp, GL, pi = _pairs()
    st = J._link(Phi, amp, GL, TOL_LINK)[2]
    monkeypatch.setattr(J, "LINK_SWAP_RATIO", factor * st["swap"] / st["fit"])
    assert J._link(Phi, amp, GL, TOL_LINK)[1] is linked


@pytest.mark.parametrize("factor, linked", [(1.01, True), (0.99, False)])
def test_the_permutations_fit_just_inside_and_outside_the_links_tolerance(monkeypatch, factor, linked):
    Phi, amp, GL, pi = _pairs()
    st = J._link(Phi, amp, GL, TOL_LINK)[2]
    monkeypatch.setattr(J, "LINK_SWAP_RATIO", 1.0)  # the fit's bound alone decides
    assert J._link(Phi, amp, GL, factor * st["fit"])[1] is linked


def test_heads_the_answers_cannot_tell_apart_are_not_linked():
    """Two heads of row 0 with one shift, and row i's heads with one shift: swapping them changes no shift, and the
    amplitudes are additive, so a swap of those two fits the answers exactly as well, whatever the coefficients."""
    Phi, amp, GL, pi = _pairs(close=0.3, noise=1e-3, same=True)
    perm, linked, st = J._link(Phi, amp, GL, TOL_LINK)
    assert not linked
    assert st["swap"] == pytest.approx(st["fit"], rel=1e-6)


def test_the_stage_stops_at_the_first_row_it_cannot_link_and_names_its_numbers(monkeypatch):
    """A residual block (d = 8, H = 3, seed 0) whose third row's link is refused, to row 0 and through the rows
    before it (rows 2 and 1: LINK_RETRIES reaches back to row 1): the stage asks no later row's link queries, and the
    message gives the row, the three numbers and each try's."""
    block = random_attention_layer(8, 3, residual=True, seed=0)
    oracle = VectorQueryOracle(block)
    link, calls = J._link, []

    def refuse_row_3(Phi, amp, GL, tol_link):
        calls.append(1)
        perm, _, st = link(Phi, amp, GL, tol_link)
        if len(calls) < 3:
            return perm, True, st
        return perm, False, {"coef": 0.25, "fit": 1.5e-3, "swap": 2.5e-3}

    monkeypatch.setattr(J, "_link", refuse_row_3)
    with pytest.raises(OracleInconsistentError) as info:
        learn_attention_layer(oracle, H=3)
    message = str(info.value) + str(info.value.__cause__)
    assert "row 3 could not be linked to row 0" in message
    assert "miss a permutation by 2.50e-01" in message and "fits them to 1.50e-03" in message
    assert "best transposition to 2.50e-03" in message and "LINK_SWAP_RATIO = 3" in message
    told = "coefficients 2.50e-01 off, fit 1.50e-03, best transposition 2.50e-03"
    assert f"Nor through the rows before it (LINK_RETRIES = 3): row 2: {told}; row 1: {told}." in message
    assert len(calls) == 5  # rows 1, 2 and 3, then row 3 through rows 2 and 1; none after


@pytest.mark.parametrize("refused", [3, 6])
def test_a_row_that_cannot_link_to_row_0_is_linked_through_a_row_before_it(monkeypatch, refused):
    """LINK_RETRIES (this book's rule; MiniLM served in float32 stopped at row 297, 2026-12-06): row 3's (or 6's)
    link to row 0 refused, it links through the row just before it, already in row 0's order, with one try's
    2 H L = 48 queries more (H = 3, the row-space route's L = 8 link tokens), and the block learned is the one learned without the refusal
    (a post-LN block at BERT's eps: its norms from the row space, whose route reports the joint stage's links)."""
    assert J.LINK_RETRIES == 3
    block = random_attention_layer(8, 3, residual=True, layernorm="post", eps=1e-12, seed=0)
    plain = learn_attention_layer(VectorQueryOracle(block), H=3)
    link, calls = J._link, []

    def refuse_row_0_link(Phi, amp, GL, tol_link):
        calls.append(1)
        perm, linked, st = link(Phi, amp, GL, tol_link)
        if len(calls) == refused:  # the refused row's link to row 0 (rows 1, 2, ... before it)
            return perm, False, {"coef": 0.25, "fit": 1.5e-3, "swap": 2.5e-3}
        return perm, linked, st

    monkeypatch.setattr(J, "_link", refuse_row_0_link)
    rec = learn_attention_layer(VectorQueryOracle(block), H=3)
    assert rec.diagnostics["joint_links_through"] == 1 and plain.diagnostics["joint_links_through"] == 0
    from companion.layer._directions import LINK_TOKENS

    assert LINK_TOKENS == 8 and rec.n_queries == plain.n_queries + 2 * 3 * LINK_TOKENS and len(calls) == 7 + 1
    assert np.array_equal(rec.model.Ws, plain.model.Ws)
    assert rec.diagnostics["verify_max_error"] == plain.diagnostics["verify_max_error"] < 1e-11


def test_link_retries_stop_where_the_budget_has_fewer_queries_left():
    """A try needs 2 H L queries: with fewer left none is asked, and the row is refused as before."""
    class Few:
        remaining = 2 * 3 * 2 - 1

    perm, tried, j = J._linked_through(Few(), None, None, 5, np.zeros((2, 4)), [np.zeros((3, 5))] * 6, None, None, 0.1)
    assert perm is None and tried == [] and j is None


@pytest.mark.parametrize(
    "d, layernorm, learner",
    [(8, "post", "joint, norms from the row space"), (8, None, "joint"), (16, "pre", "joint"), (21, "post", "joint")],
    ids=["post-ln-row-space", "no-layernorm", "pre-ln", "post-ln-gap"],
)
def test_a_learned_block_reports_its_links(d, layernorm, learner):
    """Every route that runs the joint stage passes its diagnostics (links, token scale) to the recovery: at float64
    every row links by its coefficients (measured 2026-12-05, d = 8, H = 3, eps 1e-12, seed 0, behind a post-LN).
    Until 2026-12-06 only the post-LN row-space route passed them; the others dropped them."""
    eps = 1e-12 if d == 8 and layernorm == "post" else 1e-3
    block = random_attention_layer(d, 3, residual=True, layernorm=layernorm, eps=eps if layernorm else None, seed=0)
    rec = learn_attention_layer(VectorQueryOracle(block), H=3)
    diag = rec.diagnostics
    assert diag["heads_learner"] == learner
    assert diag["joint_links_by_fit"] == 0 and diag["joint_link_swap_ratio"] == np.inf
    assert diag["joint_links_through"] == 0 and "amplitudes" not in diag
    assert diag["joint_link_misfit"] <= np.sqrt(1e-9) and diag["joint_token_scale"] >= J.TOKEN_SCALE


def test_link_rounding_is_the_stated_bound():
    """``LINK_ROUNDING_LAMBDA sqrt(n + H^2) kappa u |coef|`` to first order, on a Gram matrix of condition 1e6."""
    G = np.diag([1.0, 1.0, 1.0, 1e-6])
    coef = np.array([3.0, 0.0, 4.0, 0.0])
    size = 10.0 * np.sqrt(12 + 4) * 2.0**-53
    assert J.LINK_ROUNDING_LAMBDA == 10.0
    assert J.link_rounding(G, coef, 12) == pytest.approx(1e6 * size / (1 - 1e6 * size) * 5.0, rel=1e-9)
    assert J.link_rounding(np.diag([1.0, 0.0, 1.0, 1.0]), coef, 12) == np.inf  # singular: no bound


def test_coefficients_far_from_every_permutation_skip_the_designs_qr(monkeypatch):
    """The fit-route case above: coefficients 0.038 from the permutation, 6e-3 beyond sqrt(tol), against a rounding
    bound near 1e-9: the design's QR is not formed, and the verdict and numbers are the QR route's."""
    Phi, amp, GL, pi = _pairs()
    monkeypatch.setattr(J, "link_rounding", lambda *a: np.inf)  # no bound: the QR decides, as before the rule
    forced = J._link(Phi, amp, GL, TOL_LINK)
    monkeypatch.undo()

    def no_qr(*a, **k):
        raise AssertionError("the design's QR was formed")

    monkeypatch.setattr(J, "lstsq", no_qr)
    skipped = J._link(Phi, amp, GL, TOL_LINK)
    assert np.array_equal(skipped[0], forced[0]) and skipped[1] is forced[1] is False
    assert skipped[2]["coef"] == pytest.approx(forced[2]["coef"], abs=1e-9)
    assert skipped[2]["fit"] == forced[2]["fit"] and skipped[2]["swap"] == forced[2]["swap"]


@pytest.mark.parametrize("factor, qr", [(0.99, False), (1.01, True)])
def test_the_qr_is_skipped_just_inside_and_formed_just_outside_the_rounding_margin(monkeypatch, factor, qr):
    """The QR is skipped where the coefficients miss the permutation by more than twice the rounding bound beyond
    sqrt(tol): the bound set at ``factor`` times half that margin."""
    Phi, amp, GL, pi = _pairs()
    err = J._link(Phi, amp, GL, TOL_LINK)[2]["coef"]
    monkeypatch.setattr(J, "link_rounding", lambda *a: factor * (err - TOL_LINK) / 2)
    calls = []
    lstsq = J.lstsq
    monkeypatch.setattr(J, "lstsq", lambda *a, **k: calls.append(1) or lstsq(*a, **k))
    J._link(Phi, amp, GL, TOL_LINK)
    assert bool(calls) is qr

"""Dead neurons in :func:`~companion.ffn.deep.learn_relu_network` (this book's stage): a layer short
of its given width is returned narrower when the network without its missing neurons fits every
answer already spent and passes the verification (Carlini et al. 2020: a neuron never active on the
input domain is unrecoverable and functionally absent).

Private to :mod:`companion.ffn.deep`, apart only to keep that module within the project's size
limit; it needs nothing but numpy.
"""

from __future__ import annotations

import numpy as np

from ..errors import NotIdentifiableError

#: Largest residual on the answers already spent, relative to the largest answer, at which a layer
#: short of its given width is taken as having dead neurons (the network without them fits every
#: answer); then the verification on fresh points decides. This book's choice: the last layer's
#: refit counts an answer fit at 2^-40 (``refit_last_layer``'s ``tol``). Measured 2026-12-04 on
#: seeds 13 and 18 of (10; 8, 8, 8), each with a layer-2 neuron active on none of 200,000
#: ``N(0, I)`` inputs: the narrower networks leave 1.5e-13 and 7.5e-14 (2^-40 = 9.1e-13).
DEAD_FIT_RTOL = 2.0**-40


def may_drop(opts) -> bool:
    """Whether a layer read where the earlier layers are all active may be returned narrower than
    its given width (its missing neurons taken as dead): only when the verification will decide."""
    return opts.widths is not None and opts.verify > 0


def detected_last_cap(layers) -> int:
    """Widths detected: the most neurons the last layer of a deep network is read with, the widest
    layer before it. The class's widths do not grow, but a dead neuron (never active: no query shows
    it) narrows the layer detected without narrowing the one after (seed 13 of
    ``random_relu_network(10, (8, 8, 8))``: layer 2 detected 7 wide, layer 3 has 8 live neurons)."""
    return max(W.shape[1] for W, _ in layers)


def dropped_text(dropped, returned, given) -> str:
    """What was left out: ``'widths (8, 7, 8) of the (8, 8, 8) given, ...: layer 2 short by 1 (...)'``."""
    parts = []
    for dr in dropped:
        how = (
            "never crossed by a line of the last layer's search"
            if dr["last"]
            else "no hyperplane met where the earlier layers are all active"
        )
        parts.append(f"layer {dr['layer']} short by {dr['given'] - dr['returned']} ({how})")
    head = (
        f"widths {tuple(returned)} of the {tuple(given)} given, the missing neurons taken as dead on the inputs "
        "asked (the queries and the verification's fresh points; a neuron active only beyond them is not seen): "
    )
    return head + "; ".join(parts)


def check_dead_fit(dropped, net, given, X, y, rtol) -> float:
    """The residual ``max |net(x) - y| / max |y|`` on the answered points ``X`` (n, d) (no query) of a
    network returned narrower; raises NotIdentifiableError, naming a missing neuron as live, above
    ``rtol``."""
    ref = max(float(np.max(np.abs(y))), np.finfo(float).tiny)
    fit = float(np.max(np.abs(net.forward(X) - y))) / ref
    if not fit <= rtol:
        raise NotIdentifiableError(
            f"{dropped_text(dropped, net.widths, given)}: the network without them leaves {fit:.3g} of "
            f"the answers (> DEAD_FIT_RTOL = 2^{np.log2(rtol):.1f}) on the {X.shape[0]} answered points, "
            "so a missing neuron is live, not dead: its hyperplane was not met where the earlier layers are "
            "all active (it may be active only far out, or on every input). Raise n_lines or max_batches."
        )
    return fit


def verify_refusal(dropped, returned, given, fit, rel, verify_rtol, n_verify) -> NotIdentifiableError:
    """The refusal of a network returned narrower that fits the answers but fails the verification."""
    return NotIdentifiableError(
        f"{dropped_text(dropped, returned, given)}: the network without them fits the answers already spent "
        f"(to {fit:.3g}) but disagrees with the oracle by {rel:.3g} > verify_rtol={verify_rtol:.3g} on "
        f"{n_verify} fresh points, so a missing neuron is live, not dead (or another stage failed). Raise "
        "n_lines or max_batches."
    )

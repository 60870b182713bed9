"""companion.book.plotting: figures whose labels a reader can read."""

import numpy as np
import pytest

from companion.book import plotting


def _visible_tick_labels(ax, axis="x"):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig = ax.figure
    canvas = FigureCanvasAgg(fig)      # plotting closes its figures: draw them on an Agg canvas
    canvas.draw()
    renderer = canvas.get_renderer()
    ticks = (ax.xaxis if axis == "x" else ax.yaxis).get_ticklabels(which="both")
    lo, hi = sorted(ax.get_xlim() if axis == "x" else ax.get_ylim())
    shown = []
    for t in ticks:
        pos = t.get_position()[0 if axis == "x" else 1]
        if t.get_visible() and t.get_text() and lo <= pos <= hi:
            shown.append((t.get_text(), t.get_window_extent(renderer)))
    return shown


@pytest.mark.parametrize(
    "x", [[4, 8, 16, 32, 64], [20, 30, 40, 50, 60, 70, 80], np.arange(10, 200, 10), [2.0**-24, 2.0**-11, 2.0**-8]]
)
def test_log_x_tick_labels_do_not_overlap(x):
    """Figures 2.1 and 2.2 (d = 4 ... 64 on a log axis) showed '3×10¹4×10¹': minor-tick labels."""
    fig = plotting.lines(x, {"a": np.linspace(1, 2, len(x))}, xlabel="d", ylabel="y", logx=True)
    shown = _visible_tick_labels(fig.axes[0])
    assert len(shown) >= 2
    boxes = sorted((b.x0, b.x1, text) for text, b in shown)
    for (a0, a1, ta), (b0, b1, tb) in zip(boxes, boxes[1:]):
        assert a1 <= b0, f"tick labels {ta!r} and {tb!r} overlap"


def test_few_log_abscissae_are_labelled_as_the_data():
    fig = plotting.lines([4, 8, 16, 32, 64], {"a": [1, 2, 3, 4, 5]}, xlabel="d", ylabel="y", logx=True)
    assert [t for t, _ in _visible_tick_labels(fig.axes[0])] == ["4", "8", "16", "32", "64"]


def test_a_table_shows_long_text_cells_whole():
    """Chapter 02's saturation table cut its outcome at 50 characters ('weight rounded to...')."""
    outcome = "refused: sigma^-1 undefined (weight rounded to 0 or 1 at every query scale)"
    t = plotting.table([{"scale": 1, "outcome": outcome}])
    assert outcome in repr(t) and outcome in t._repr_html_()
    assert "..." not in repr(t)
    assert type(t.head(1)).__name__ == "DataFrame" and t.to_dict("records") == [{"scale": "1", "outcome": outcome}]


def test_unit_roundoffs_are_labelled_as_powers_of_two():
    """Chapter 07's served formats: '0.000488281' and '0.00390625' ran into each other (an outside reader)."""
    fig = plotting.lines([2.0**-24, 2.0**-11, 2.0**-8], {"a": [1, 2, 3]}, xlabel="u", ylabel="y", logx=True)
    assert [t for t, _ in _visible_tick_labels(fig.axes[0])] == ["$2^{-24}$", "$2^{-11}$", "$2^{-8}$"]


def test_more_spectra_than_colours_differ_in_line_style():
    """Twelve heads on ten colours: heads 0 and 10 shared a colour and a style."""
    fig = plotting.singular_values({f"head {k}": np.logspace(0, -3, 5) * (k + 1) for k in range(12)})
    styles = {(line.get_color(), line.get_linestyle()) for line in fig.axes[0].get_lines()}
    assert len(styles) == 12

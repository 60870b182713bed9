"""One figure and table style for every chapter.

Every chapter figure is drawn by a function here, so that fonts, sizes, colours and markers agree
across the book. Each function returns the ``matplotlib.figure.Figure`` and draws nothing else; the
chapter's cell displays it, and cell metadata gives it a caption and a name for ``{numref}``.
Figures are deterministic: no timestamps, and the Agg backend's PNG output depends only on the data.

In a Jupyter kernel, importing this module makes a figure display as a PNG whatever the
matplotlib backend (:func:`show_figures_in`): with ``MPLBACKEND=Agg``, common on headless machines
and CI, IPython would otherwise show only ``<Figure size 640x360 with 1 Axes>`` and the chapter
would lose its figures.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np

__all__ = ["STYLE", "figure", "lines", "bars", "singular_values", "table", "FLOAT64_EPS", "show_figures_in"]

#: Machine epsilon of float64, drawn as a reference line on error plots.
FLOAT64_EPS = float(np.finfo(np.float64).eps)

#: The rcParams applied to every companion figure.
STYLE: dict[Any, Any] = {
    "figure.figsize": (6.4, 3.6),
    "figure.dpi": 100,
    "savefig.dpi": 100,
    "font.size": 10,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.frameon": False,
    "lines.markersize": 5,
    "svg.hashsalt": "companion",
}

_MARKERS = "osD^vP*X"

#: The MIME types IPython can render a figure as (``InlineBackend.figure_formats``).
_FIGURE_MIMES = ("image/png", "image/jpeg", "image/svg+xml", "application/pdf", "image/retina")


def show_figures_in(shell=None) -> bool:
    """Make ``shell`` display every matplotlib figure as a PNG, whatever the backend.

    The inline backend (the Jupyter default) registers a figure formatter with IPython; any other
    backend, e.g. ``MPLBACKEND=Agg``, leaves a figure with its text repr only. This registers
    IPython's own PNG formatter (``IPython.core.pylabtools.select_figure_formats``, with the
    inline backend's ``bbox_inches="tight"``) when the shell has no figure formatter yet, and
    leaves an existing one (``%config InlineBackend.figure_formats``) as it is. Called when this
    module is imported in a Jupyter kernel.

    Parameters
    ----------
    shell : IPython.core.interactiveshell.InteractiveShell, default=None
        The shell; by default the running kernel's (a terminal IPython or plain Python: nothing).

    Returns
    -------
    bool
        True if the shell displays figures (it did already, or now does), False without a shell.

    Examples
    --------
    >>> show_figures_in(None)          # plain Python: no shell, nothing to do
    False
    """
    if shell is None:
        try:
            from IPython import get_ipython
        except ImportError:
            return False
        shell = get_ipython()
        if shell is None or getattr(shell, "kernel", None) is None:
            return False
    from matplotlib.figure import Figure

    formatters = shell.display_formatter.formatters
    for mime in _FIGURE_MIMES:
        if mime in formatters:
            try:
                formatters[mime].lookup_by_type(Figure)
                return True
            except KeyError:
                pass
    from IPython.core.pylabtools import select_figure_formats

    select_figure_formats(shell, {"png"}, bbox_inches="tight")
    return True


def figure(ncols: int = 1, *, width: float | None = None, height: float | None = None):
    """A new figure with ``ncols`` axes side by side in the companion style.

    Returns
    -------
    fig : matplotlib.figure.Figure
    axes : list of matplotlib.axes.Axes
    """
    with plt.rc_context(STYLE):
        w, h = STYLE["figure.figsize"]
        fig, axes = plt.subplots(
            1, ncols, figsize=(width or w * (1 if ncols == 1 else 0.75 * ncols), height or h), squeeze=False
        )
    plt.close(fig)  # the chapter displays the returned figure itself; no second copy
    return fig, list(axes[0])


def _canvas(ax):
    """``(figure, axes)``: the given axes and their figure, or a new single-axes figure."""
    if ax is None:
        fig, (ax,) = figure()
        return fig, ax
    return ax.figure, ax


def _finish(fig, ax, *, xlabel, ylabel, logy, title) -> None:
    """The book's finish of a chart: log y-axis if asked, labels, title, legend, tight layout."""
    if logy:
        ax.set_yscale("log")
    if xlabel is not None:
        ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()


def _tick_label(v: float) -> str:
    """``"4"``, ``"1e-07"``; a power of two below 1 as ``2^-k`` (a unit roundoff: ``0.000488281`` and ``0.00390625``
    ran into each other on chapter 07's axis, an outside reader found)."""
    if 0 < v < 1 and np.log2(v) == np.round(np.log2(v)):
        return f"$2^{{{int(np.round(np.log2(v)))}}}$"
    return f"{v:g}"


def _log_ticks_at(axis, values, max_ticks: int = 8) -> None:
    """Label a log axis at the data's own abscissae (``4 8 16 32 64``) when there are few of them,
    and never at minor ticks: over about one decade matplotlib labels the minor ticks too, and
    their labels run into each other ("3×10¹4×10¹")."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    vals = np.unique(values[np.isfinite(values) & (values > 0)])
    if 1 < len(vals) <= max_ticks:
        axis.set_major_locator(FixedLocator(vals.tolist()))
        axis.set_major_formatter(FuncFormatter(lambda v, _pos: _tick_label(v)))
    axis.set_minor_formatter(NullFormatter())


def lines(
    x,
    series: Mapping[str, Sequence[float]],
    *,
    xlabel: str,
    ylabel: str,
    title=None,
    logx=False,
    logy=True,
    hlines: Mapping[str, float] | None = None,
    ax=None,
):
    """Plot one marked line per entry of ``series`` against ``x``.

    Parameters
    ----------
    x : array-like of shape (n,)
        Common abscissa, or a mapping with the same keys as ``series`` for per-series abscissae.
    series : mapping of str to array-like of shape (n,)
        Legend label to values. Non-positive values are dropped on a log axis.
    xlabel, ylabel : str
        Axis labels, with units where there are any.
    logx, logy : bool
        Logarithmic axes (``logy`` defaults to True: errors span many decades).
    hlines : mapping of str to float, optional
        Labelled horizontal reference lines (e.g. ``{"float64 eps": FLOAT64_EPS}``).
    ax : matplotlib.axes.Axes, optional
        Draw into these axes instead of a new figure.

    Returns
    -------
    matplotlib.figure.Figure
    """
    with plt.rc_context(STYLE):
        fig, ax = _canvas(ax)
        for k, (label, values) in enumerate(series.items()):
            xs = np.asarray(x[label] if isinstance(x, Mapping) else x, dtype=float)
            y = np.asarray(values, dtype=float)
            keep = np.isfinite(y) & ((y > 0) if logy else True)
            ax.plot(xs[keep], y[keep], marker=_MARKERS[k % len(_MARKERS)], label=label)
        for k, (label, value) in enumerate((hlines or {}).items()):
            ax.axhline(value, color="0.4", linestyle=("--", ":", "-.")[k % 3], linewidth=1, label=label)
        if logx:
            ax.set_xscale("log")
            _log_ticks_at(
                ax.xaxis,
                np.concatenate(
                    [np.asarray(v, dtype=float).ravel() for v in (x.values() if isinstance(x, Mapping) else [x])]
                ),
            )
        _finish(fig, ax, xlabel=xlabel, ylabel=ylabel, logy=logy, title=title)
    return fig


def bars(labels: Sequence[str], series: Mapping[str, Sequence[float]], *, ylabel: str, logy=True, title=None, ax=None):
    """Grouped bar chart: one group per label, one bar per entry of ``series``.

    Returns
    -------
    matplotlib.figure.Figure
    """
    with plt.rc_context(STYLE):
        fig, ax = _canvas(ax)
        n = len(series)
        width = 0.8 / max(n, 1)
        pos = np.arange(len(labels))
        for k, (name, values) in enumerate(series.items()):
            ax.bar(pos + (k - (n - 1) / 2) * width, values, width, label=name)
        ax.set_xticks(pos, labels)
        _finish(fig, ax, xlabel=None, ylabel=ylabel, logy=logy, title=title)
    return fig


def singular_values(
    spectra: Mapping[str, Sequence[float]], *, rank_line: int | None = None, ylabel="singular value", ax=None
):
    """Singular values in decreasing order, one line per entry, on a log axis.

    ``rank_line`` draws a vertical line after that many values (e.g. the head dimension).

    Returns
    -------
    matplotlib.figure.Figure
    """
    with plt.rc_context(STYLE):
        fig, ax = _canvas(ax)
        for k, (label, values) in enumerate(spectra.items()):
            s = np.sort(np.asarray(values, dtype=float))[::-1]
            # the colour cycle has 10 colours: lines beyond it are dashed, then dotted (12 heads shared colours)
            style = ("-", "--", ":")[(k // 10) % 3]
            ax.semilogy(np.arange(1, len(s) + 1), np.maximum(s, FLOAT64_EPS * 1e-3), style, label=label)
        if rank_line is not None:
            ax.axvline(rank_line + 0.5, color="0.4", linestyle="--", linewidth=1, label=f"rank {rank_line}")
        ax.set_xlabel("index")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=8)
        fig.tight_layout()
    return fig


def table(rows, formats=None, *, columns=None):
    """A pandas DataFrame of ``rows`` with floats formatted as strings, for deterministic display.

    Parameters
    ----------
    rows : list of dict or pandas.DataFrame
        One dict per row (keys are column names).
    formats : mapping of str to str, default=None
        Column to format string, e.g. ``{"rel_error_W": "{:.1e}"}``; other float columns get
        ``"{:.3g}"``, integers thousands separators. Strings and bools are left as they are.
    columns : mapping of str to str, default=None
        Column renames for display, applied after formatting.

    Returns
    -------
    pandas.DataFrame
        All cells are strings, so the notebook shows exactly the formatted text; unlike a pandas
        ``Styler``, its HTML has no random element ids, so re-executed outputs compare equal.

    Examples
    --------
    >>> table([{"d": 4, "err": 1.23456e-15}], {"err": "{:.1e}"}).to_dict("records")
    [{'d': '4', 'err': '1.2e-15'}]
    """
    import numbers

    import pandas as pd

    df = pd.DataFrame(rows).copy()
    formats = dict(formats or {})
    for col in df.columns:
        fmt = formats.get(col)

        def cell(x, fmt=fmt):
            if fmt is not None and isinstance(x, (numbers.Number, np.number)) and not isinstance(x, bool):
                return fmt.format(x)
            if isinstance(x, (bool, np.bool_)):
                return str(bool(x))
            if isinstance(x, (numbers.Integral, np.integer)):
                return f"{int(x):,}"
            if isinstance(x, (numbers.Real, np.floating)):
                return f"{float(x):.3g}"
            return str(x)

        df[col] = [cell(x) for x in df[col]]
    if columns:
        df = df.rename(columns=dict(columns))
    return _full_width(df)


_TABLE_CLASS = None


def _full_width(df):
    """``df`` as a DataFrame whose display never truncates a cell (pandas cuts text cells at
    ``display.max_colwidth`` = 50 characters with "...", which hid the outcome of chapter 02's
    saturation table). Only the display changes; any operation on it gives a plain DataFrame."""
    global _TABLE_CLASS
    import pandas as pd

    if _TABLE_CLASS is None:

        class Table(pd.DataFrame):
            @property
            def _constructor(self):
                return pd.DataFrame

            def _repr_html_(self):
                with pd.option_context("display.max_colwidth", None):
                    return super()._repr_html_()

            def __repr__(self):
                with pd.option_context("display.max_colwidth", None):
                    return super().__repr__()

        _TABLE_CLASS = Table
    return _TABLE_CLASS(df)


show_figures_in()

"""Compare a re-executed chapter's outputs with its committed outputs, by the reproducibility contract.

The contract (README, *Reproducibility*; the book's page ``book/reproducibility.md``):

* Text is compared exactly, except that runs of white space count as one space (a table re-aligns
  when one of its numbers gets a digit more) and timings, memory addresses and absolute paths are
  replaced first (``SANITIZE``).
* Every number in the text is compared **exactly** (as printed) unless one of three rules gives it a
  tolerance; then a re-run may print any ``t`` with
  ``|t - r| <= atol + rtol * |r| + h(r) + h(t)`` for the committed ``r``, where ``h`` is half a
  unit of the last printed digit of a float (the rounding of the print itself; an integer is
  exact). The same number printed at two precisions (``0.6004158``, ``0.600416``) matches.

  1. **Rounding level**: a number below :data:`ROUNDING_LEVEL` (1e-9) in magnitude in both outputs
     is at rounding level (an error of a float64 computation) and matches any other such number.
     A rounding-level error that grows to 1e-8 or 1e-3 fails.
  2. **Published values**: the glued output of ``results.publish(name, ..., rtol=, atol=)`` is
     compared with that value's tolerance (read from the results JSON of the run).
  3. **Cell metadata**: a code cell's ``metadata["companion"]["tolerance"]`` holds one rule or a
     list of rules ``{"rtol": r, "atol": a}`` (either may be left out: 0), each with optional
     selectors. A rule applies to the numbers printed with a decimal point or an exponent
     (floats), or to every number with ``"integers": true``, and only to those its selectors pick:
     ``"column": NAME`` (a table column, or a list of names), ``"glue": NAME`` (a published
     value's glued output, or a list), ``"match": REGEX`` (numbers inside a match of the regex in
     the committed text, e.g. ``"[\\d.]+ bits"``). Numbers no rule reaches stay exact.

A table (an output with an HTML ``<table>``) is compared through its HTML, cell by cell; its plain
text rendering, which wraps columns, is not compared.

Images (PNG, JPEG, SVG) are not compared pixel by pixel; their presence is (:func:`compare_figures`):
a re-run that lacks a figure the committed output has (e.g. a figure shown only as
``<Figure size 640x360 with 1 Axes>`` under a non-inline matplotlib backend) differs.

For example (a rounding-level error, a changed error, a tolerance in bits, a count):

>>> compare_text("error 3.1e-16, 20 queries", "error 0.0e+00, 20 queries")
[]
>>> compare_text("error 3.1e-16, 20 queries", "error 1.0e-03, 20 queries")
['3.1e-16 became 1.0e-03 (exact unless a tolerance applies)']
>>> compare_text("47.0 bits", "46.9 bits", rules=[{"atol": 0.5}])
[]
>>> compare_text("20 queries", "21 queries", rules=[{"atol": 0.5}])
['20 became 21 (exact unless a tolerance applies)']
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

__all__ = [
    "ROUNDING_LEVEL",
    "SANITIZE",
    "compare_text",
    "compare_outputs",
    "compare_notebooks",
    "cell_rules",
    "glue_tolerances",
    "compare_figures",
    "FIGURE_MIMES",
    "NumberStat",
    "summarize",
]

#: Numbers below this magnitude in both outputs are at rounding level and match (rule 1).
ROUNDING_LEVEL = 1e-9

#: Replaced before any comparison: (regex, replacement). They carry no number the book cites.
SANITIZE = [
    (r"\d+(\.\d+)?\s?(s|ms|µs|us|seconds)\b", "<TIME>"),  # timings
    (r"0x[0-9a-fA-F]+", "<ADDR>"),  # memory addresses
    (r"(/[\w.\-]+){2,}/?", "<PATH>"),  # absolute paths
]

_NUMBER = re.compile(
    r"(?<![\w.])[-+−]?(?:inf\b|nan\b|(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?)"
    r"(?![\w])"
)
_SKIPPED_MIME = ("image/png", "image/jpeg", "image/svg+xml", "application/vnd.jupyter.widget-view+json")
#: The MIME types of a figure: their presence and number is compared, not their bytes.
FIGURE_MIMES = ("image/png", "image/jpeg", "image/svg+xml")


def _sanitize(text: str) -> str:
    for regex, repl in SANITIZE:
        text = re.sub(regex, repl, text)
    return text


def _split(text: str):
    """(pieces of text between numbers, numbers as (string, start offset))."""
    pieces, numbers, last = [], [], 0
    for m in _NUMBER.finditer(text):
        pieces.append(text[last : m.start()])
        numbers.append((m.group(), m.start()))
        last = m.end()
    pieces.append(text[last:])
    return pieces, numbers


def _value(token: str) -> float:
    return float(token.replace(",", "").replace("−", "-"))


def _half_unit(token: str) -> float:
    """Half a unit of the last printed digit: 0.05 for '47.0', 5e-18 for '3.1e-16'; 0 for an integer.

    An integer ('7158', '4,160') is taken as exact: a count, not a rounded float.
    """
    t = token.replace(",", "").lstrip("+-−").lower()
    if t in ("inf", "nan") or not _is_float_token(t):
        return 0.0
    mantissa, _, exponent = t.partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 0.5 * 10.0 ** (int(exponent or 0) - decimals)


def _is_float_token(token: str) -> bool:
    return "." in token or "e" in token.lower()


def _table_columns(html: str):
    """(start, end, header) of every body cell of the HTML tables in ``html`` (pandas' layout)."""
    spans = []
    for table in re.finditer(r"<table.*?</table>", html, re.S):
        head = re.search(r"<thead>(.*?)</thead>", table.group(), re.S)
        rows = re.findall(r"<tr[^>]*>(.*?)</tr>", head.group(1), re.S) if head else []
        headers = (
            [re.sub(r"<[^>]+>", "", h).strip() for h in re.findall(r"<th[^>]*>(.*?)</th>", rows[-1], re.S)]
            if rows
            else []
        )
        for row in re.finditer(r"<tr[^>]*>(.*?)</tr>", table.group(), re.S):
            if head and head.start() <= row.start() < head.end():
                continue
            for k, cell in enumerate(re.finditer(r"<t[hd][^>]*>(.*?)</t[hd]>", row.group(1), re.S)):
                at = table.start() + row.start(1) + cell.start(1)
                spans.append((at, at + len(cell.group(1)), headers[k] if k < len(headers) else None))
    return spans


def _rules_for(rules, text: str, start: int, token: str, *, glue=None, columns=()):
    for rule in rules:
        if not (rule.get("integers") or _is_float_token(token)):
            continue
        if "glue" in rule:
            names = [rule["glue"]] if isinstance(rule["glue"], str) else list(rule["glue"])
            if glue not in names:
                continue
        if "column" in rule:
            names = [rule["column"]] if isinstance(rule["column"], str) else list(rule["column"])
            if not any(a <= start < b and h in names for a, b, h in columns):
                continue
        pattern = rule.get("match")
        if pattern and not any(m.start() <= start < m.end() for m in re.finditer(pattern, text)):
            continue
        yield rule


def _number_matches(r: str, t: str, rules) -> bool:
    if r == t:
        return True
    try:
        x, y = _value(r), _value(t)
    except ValueError:
        return False
    if math.isnan(x) or math.isnan(y) or math.isinf(x) or math.isinf(y):
        return False
    if abs(x) < ROUNDING_LEVEL and abs(y) < ROUNDING_LEVEL:
        return True
    slack = _half_unit(r) + _half_unit(t)
    if abs(y - x) < slack * (1 - 1e-9):  # one number printed at two precisions: 0.6004158, 0.600416
        return True
    return any(
        abs(y - x) <= float(rule.get("atol", 0.0)) + float(rule.get("rtol", 0.0)) * abs(x) + slack for rule in rules
    )


def compare_text(reference: str, test: str, *, rules=(), glue=None, stats=None) -> list[str]:
    """Differences between a committed output text and a re-run's, by the contract.

    Parameters
    ----------
    reference, test : str
        The committed and the re-computed text of one output.
    rules : list of dict, default=()
        Tolerance rules (see the module docstring).
    glue : str, default=None
        The glue name of the output, for rules with ``"glue"``.
    stats : list, default=None
        If given, one :class:`NumberStat` per number of the committed text is appended to it
        (how it was compared and how far it moved), when both texts have the same words.

    Returns
    -------
    list of str
        One line per difference; empty if the texts match.
    """
    reference, test = _sanitize(reference), _sanitize(test)
    if reference == test and stats is None:
        return []
    ref_pieces, ref_numbers = _split(reference)
    test_pieces, test_numbers = _split(test)
    ref_words = [" ".join(p.split()) for p in ref_pieces]
    test_words = [" ".join(p.split()) for p in test_pieces]
    if len(ref_numbers) != len(test_numbers) or ref_words != test_words:
        for i, (a, b) in enumerate(zip(ref_words, test_words)):
            if a != b:
                return [f"text differs: {a[:80]!r} became {b[:80]!r}"]
        return [f"the output has {len(test_numbers)} numbers where {len(ref_numbers)} are committed"]
    columns = _table_columns(reference) if "<table" in reference else ()
    out = []
    for (r, start), (t, _) in zip(ref_numbers, test_numbers):
        applicable = list(_rules_for(rules, reference, start, r, glue=glue, columns=columns))
        if stats is not None:
            stats.append(_stat(r, t, applicable))
        if not _number_matches(r, t, applicable):
            why = f"beyond the tolerance {applicable}" if applicable else "exact unless a tolerance applies"
            out.append(f"{r} became {t} ({why})")
    return out


class NumberStat(tuple):
    """``(kind, move, texts)`` of one compared number: ``kind`` is ``"exact"`` (no rule reaches it),
    ``"tolerance"`` (a cell or published tolerance applies) or ``"rounding"`` (below
    :data:`ROUNDING_LEVEL` in both texts); ``move`` is ``|t - r| / |r|`` as printed (``inf`` if
    ``r`` is 0 and ``t`` is not; ``None`` at rounding level or for a non-finite number);
    ``texts`` is ``(r, t)``, the number as the committed output and the re-run print it."""

    __slots__ = ()

    @property
    def texts(self) -> tuple:
        return self[2]

    @property
    def kind(self) -> str:
        return self[0]

    @property
    def move(self):
        return self[1]


def _stat(r: str, t: str, applicable) -> NumberStat:
    x, y = _value(r), _value(t)
    if not (math.isfinite(x) and math.isfinite(y)):
        return NumberStat(("exact", None, (r, t)))
    if abs(x) < ROUNDING_LEVEL and abs(y) < ROUNDING_LEVEL:
        return NumberStat(("rounding", None, (r, t)))
    move = abs(y - x) / abs(x) if x else (0.0 if y == x else math.inf)
    return NumberStat(("tolerance" if applicable else "exact", move, (r, t)))


def cell_rules(cell) -> list[dict]:
    """The tolerance rules in a cell's ``metadata["companion"]["tolerance"]`` (rule 3), as a list."""
    rules = cell.get("metadata", {}).get("companion", {}).get("tolerance", [])
    return [rules] if isinstance(rules, dict) else list(rules)


def glue_tolerances(*results_files) -> dict:
    """``{name: {"rtol", "atol"}}`` for every value published with a tolerance in results JSONs.

    With several files (the committed chapter's, then a re-run's), a name takes the tolerance of
    the last file that publishes one for it; a missing file adds nothing.
    """
    out: dict = {}
    for results_file in results_files:
        path = Path(results_file)
        if not path.is_file():
            continue
        values = json.loads(path.read_text(encoding="utf-8")).get("values", {})
        # A published tolerance covers the glued text however it is formatted ("{:.0f}" prints 14).
        out.update(
            (k, {**v["tolerance"], "integers": True})
            for k, v in values.items()
            if isinstance(v, dict) and v.get("tolerance")
        )
    return out


def _flatten(outputs):
    """key -> list of texts: stream text by stream name, rich outputs by MIME type (as nbval does)."""
    flat: dict = {}
    streams: dict = {}
    for out in outputs:
        kind = out.get("output_type")
        if kind == "stream":
            streams[out["name"]] = streams.get(out["name"], "") + _text(out.get("text", ""))
        elif kind in ("display_data", "execute_result"):
            glued = (out.get("metadata") or {}).get("scrapbook", {}).get("name")
            for mime, data in (out.get("data") or {}).items():
                if mime in _SKIPPED_MIME:
                    continue
                flat.setdefault(mime, []).append((_text(data), glued))
        elif kind == "error":
            flat.setdefault("error", []).append((f"{out.get('ename')}: {out.get('evalue')}", None))
    for name, text in streams.items():
        flat.setdefault(name, []).append((text, None))
    return flat


def _text(data) -> str:
    if isinstance(data, list):
        return "".join(data)
    if isinstance(data, str):
        return data
    return json.dumps(data, sort_keys=True)


def _figure_counts(outputs) -> dict:
    counts: dict = {}
    for out in outputs:
        if out.get("output_type") in ("display_data", "execute_result"):
            for mime in FIGURE_MIMES:
                if mime in (out.get("data") or {}):
                    counts[mime] = counts.get(mime, 0) + 1
    return counts


def compare_figures(reference_outputs, test_outputs) -> list[str]:
    """Figures the committed outputs of one code cell have and a re-run's lack (or adds), by kind.

    Only the kinds (``image/png``, ``image/jpeg``, ``image/svg+xml``) and the number of figure
    outputs are compared, never their pixels: a re-run under another matplotlib or FreeType draws
    other bytes, but a figure that went missing (a backend that shows only the figure's repr) is
    a difference.

    Parameters
    ----------
    reference_outputs, test_outputs : list of dict
        nbformat outputs of one code cell, the committed ones first.

    Returns
    -------
    list of str
        One line per figure kind whose count differs; empty if both have the same figures.

    Examples
    --------
    >>> png = {"output_type": "execute_result", "data": {"image/png": "iVBO", "text/plain": "<Figure>"}}
    >>> repr_only = {"output_type": "execute_result", "data": {"text/plain": "<Figure>"}}
    >>> compare_figures([png], [png])
    []
    >>> compare_figures([png], [repr_only])
    ['figures: 0 image/png outputs where 1 are committed (a figure is missing)']
    """
    ref, test = _figure_counts(reference_outputs), _figure_counts(test_outputs)
    out = []
    for mime in FIGURE_MIMES:
        r, t = ref.get(mime, 0), test.get(mime, 0)
        if r != t:
            why = "a figure is missing" if t < r else "a figure more than committed"
            out.append(f"figures: {t} {mime} outputs where {r} are committed ({why})")
    return out


def compare_outputs(reference_outputs, test_outputs, *, rules=(), glue=None, stats=None) -> list[str]:
    """Differences between the committed outputs of one code cell and a re-run's.

    Parameters
    ----------
    reference_outputs, test_outputs : list of dict
        nbformat outputs (streams are joined by name, as nbval does).
    rules : list of dict, default=()
        The cell's tolerance rules (:func:`cell_rules`).
    glue : dict, default=None
        Tolerances of published values by glue name (:func:`glue_tolerances`).
    stats : list, default=None
        Collects a :class:`NumberStat` per compared number (:func:`compare_text`).

    Returns
    -------
    list of str
        One line per difference; empty if the outputs match. Missing figures come first
        (:func:`compare_figures`).
    """
    figures = compare_figures(reference_outputs, test_outputs)
    if figures:
        return figures
    glue = glue or {}
    ref, test = _flatten(reference_outputs), _flatten(test_outputs)
    if any("<table" in text for text, _ in ref.get("text/html", [])):
        ref.pop("text/plain", None)  # a table is compared through its HTML, by column
        test.pop("text/plain", None)
    if set(ref) != set(test):
        return [f"output kinds differ: committed {sorted(ref)}, re-run {sorted(test)}"]
    out = []
    for key in ref:
        if len(ref[key]) != len(test[key]):
            out.append(f"{key}: {len(test[key])} outputs where {len(ref[key])} are committed")
            continue
        for (r, name), (t, _) in zip(ref[key], test[key]):
            extra = [glue[name]] if name in glue else []
            out += [
                f"{key}{f' (glue {name})' if name else ''}: {d}"
                for d in compare_text(r, t, rules=[*rules, *extra], glue=name, stats=stats)
            ]
    return out


def compare_notebooks(reference_nb, test_nb, *, glue=None, stats=None) -> dict[int, list[str]]:
    """Differences between two executions of one notebook, by code cell index (0-based among code cells).

    Parameters
    ----------
    reference_nb, test_nb : dict
        Notebooks as read by ``nbformat.read`` (the committed one first).
    glue : dict, default=None
        Tolerances of published values by glue name (:func:`glue_tolerances` of the re-run).
    stats : dict, default=None
        If given, filled with code cell index -> list of :class:`NumberStat` (see :func:`summarize`).

    Returns
    -------
    dict
        Code cell index -> list of differences, for the cells that differ.
    """
    ref_cells = [c for c in reference_nb["cells"] if c["cell_type"] == "code"]
    test_cells = [
        c
        for c in test_nb["cells"]
        if c["cell_type"] == "code" and "injected-parameters" not in c.get("metadata", {}).get("tags", [])
    ]
    if len(ref_cells) != len(test_cells):
        return {-1: [f"{len(test_cells)} code cells where {len(ref_cells)} are committed"]}
    found = {}
    for i, (rc, tc) in enumerate(zip(ref_cells, test_cells)):
        if rc.get("execution_count") is None and not rc.get("outputs"):
            continue
        cell_stats = None if stats is None else stats.setdefault(i, [])
        diffs = compare_outputs(
            rc.get("outputs", []), tc.get("outputs", []), rules=cell_rules(rc), glue=glue, stats=cell_stats
        )
        if diffs:
            found[i] = diffs
    return found


def format_move(move, cell=None, texts=None, *, cell_label="cell ") -> str:
    """A largest move of :func:`summarize` as the reproducibility report prints it.

    A finite move prints as a relative number (``4.9e+01``); a move from a number printed 0 (an
    infinite relative move) prints as the change itself (``0 -> 2``), which says what it was; no
    comparison at all prints ``-``. The code cell follows in parentheses when something moved.

    Parameters
    ----------
    move : float or None
        ``max_move`` of :func:`summarize`.
    cell : int, default=None
        ``max_move_cell``.
    texts : sequence of two str, default=None
        ``max_move_texts``: the number as committed and as re-run.
    cell_label : str, default="cell "
        Written before the cell's index.

    Examples
    --------
    >>> format_move(49.0, 14), format_move(float("inf"), 17, ["0", "2"]), format_move(0.0), format_move(None)
    ('4.9e+01 (cell 14)', '0 -> 2 (cell 17)', '0.0e+00', '-')
    """
    if move is None:
        return "-"
    text = f"{texts[0]} -> {texts[1]}" if math.isinf(move) and texts else f"{move:.1e}"
    return text + (f" ({cell_label}{cell})" if move and cell is not None else "")


def summarize(stats: dict) -> dict:
    """Counts and the largest move of a :func:`compare_notebooks` ``stats`` dict.

    Returns
    -------
    dict
        ``exact``, ``tolerance``, ``rounding``: how many numbers were compared each way;
        ``max_move``: the largest relative move ``|t - r| / |r|`` of a number above rounding
        level (0.0 if none moved; ``inf`` for a number printed 0 that the re-run prints
        otherwise), ``max_move_cell``: the code cell it is in (or None), and
        ``max_move_texts``: that number as the committed output and the re-run print it
        (``[r, t]``, or None), which says what an infinite move was.

    Examples
    --------
    >>> stats = {}
    >>> ref = {"cells": [{"cell_type": "code", "execution_count": 1, "metadata": {},
    ...         "outputs": [{"output_type": "stream", "name": "stdout", "text": "20 queries, 0.5, 3e-16"}]}]}
    >>> new = {"cells": [{"cell_type": "code", "execution_count": 1, "metadata": {},
    ...         "outputs": [{"output_type": "stream", "name": "stdout", "text": "20 queries, 0.5, 1e-15"}]}]}
    >>> compare_notebooks(ref, new, stats=stats), summarize(stats)
    ({}, {'exact': 2, 'tolerance': 0, 'rounding': 1, 'max_move': 0.0, 'max_move_cell': None, 'max_move_texts': None})
    """
    counts = {"exact": 0, "tolerance": 0, "rounding": 0}
    largest, where, texts = 0.0, None, None
    for cell, numbers in stats.items():
        for stat in numbers:
            counts[stat.kind] += 1
            if stat.move is not None and stat.move > largest:
                largest, where, texts = stat.move, cell, list(stat.texts)
    return {**counts, "max_move": largest, "max_move_cell": where, "max_move_texts": texts}

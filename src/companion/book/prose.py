"""Read a chapter's prose for numbers typed by hand and verdicts that no check backs.

The book's rule (DESIGN.md, "Claims are code"): a number the prose cites is published with
:func:`companion.book.results.publish` and shown through ``{glue:text}`name```; a verdict ("every trial
succeeds", "exactly d + d² queries") is a :func:`companion.book.results.claim`, checked when the chapter
runs. This module finds the sentences that break the rule, so that a test can fail on them:

* :func:`hand_typed_numbers`: a digit in the prose outside maths, glue roles, citations,
  cross-references, code, labels and headings' section numbers, and outside the generic references
  of :data:`ALLOWED` (theorem numbers, dtype names, years, ...); a number typed *inside* inline maths
  that equals a constant the library defines (:func:`library_constants`: a default multiple, a
  tolerance, a count); and any number at all in a sentence that states a default, which must be
  glued from the library.
* :func:`unbacked_verdicts`: a sentence with a verdict word (:data:`VERDICT_WORDS`: every, all,
  always, never, exactly, only, at most, at least, within, N times, fails, succeeds, matches, a
  comparison) about a result of a run (:data:`RESULT_WORDS`: queries, errors, trials, ...) that
  shows no glued value.
* :func:`unbacked_trends`: a sentence stating a trend, a comparison or a cause (:data:`TREND_WORDS`:
  grows, falls, converges, amplified, need fewer, follows, more accurate, N-fold, why, because, ...)
  about a result that shows no *checked* glued value (a claim, or a bound checked against what it
  bounds) and does not say that it is not measured (issue 38).

Statement boxes (``prf:theorem`` and its kin) quote the paper and are skipped by the verdict check;
exercise statements are questions and are skipped too. Solutions are prose like any other.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import math
import numbers
import re
from pathlib import Path

__all__ = [
    "Finding",
    "markdown_cells",
    "hand_typed_numbers",
    "unbacked_verdicts",
    "unbacked_trends",
    "source_kinds",
    "library_constants",
    "check_markdown",
    "ALLOWED",
    "VERDICT_WORDS",
    "RESULT_WORDS",
    "REASONING",
    "TREND_WORDS",
    "TREND_SUBJECTS",
    "HEDGES",
    "TREND_REASONING",
]


@dataclasses.dataclass(frozen=True)
class Finding:
    """One sentence that breaks the rule: where it is, what was found, and the sentence itself."""

    where: str  # e.g. "04_low_rank.ipynb c8"
    rule: str  # "digit in prose", "library constant in maths", "number in a default", "unbacked verdict"
    found: str  # the offending token (a number, a verdict word)
    sentence: str  # the sentence, maths shown as $...$

    def __str__(self) -> str:
        return f"{self.where}: {self.rule} {self.found!r} in: {self.sentence}"


#: Generic references whose digits are names, not results (each with its reason).
ALLOWED = {
    r"\b(?:Theorems?|Lemmas?|Propositions?|Corollary|Definitions?|Sections?|Appendix|Assumptions?|Algorithm|"
    r"Remark|Example|Figure|Table|Steps?|step|Part|Eq\.|Exercise|Chapter|Thm|Prop|item|items)\s+"
    r"[A-Z]?\d+(?:\.\d+)*(?:\s*(?:and|,|to|–|-)\s*[A-Z]?\d+(?:\.\d+)*)*": "a numbered item of the paper or book",
    r"§\s*\d+(?:\.\d+)*(?:\s*(?:and|,|to|–|-)\s*\d+(?:\.\d+)*)*": "a section of the paper",
    r"\b(?:b?float|int|uint)\d+\b": "a dtype name",
    r"\bv\d\b": "an arXiv version (v1, v2)",
    r"\barXiv[:\s]\s*\d{4}\.\d{4,5}(?:v\d)?": "an arXiv identifier",
    r"\b(?:19|20)\d\d[a-z]?\b": "a year (of a citation or a version)",
    r"\bL\d+H\d+\b": "a MiniLM head's name (layer, head)",
    r"\b[Ll]ayers? \d+\b": "a layer's name",
    r"\b\d+_[a-z_]+\b": "a chapter's file stem",
    r"\bO\(": "big-O notation (its argument is maths)",
    r"\bℓ\d\b|\bL\d\b": "a norm's name",
    r"\bMiniLM-L\d+\b|\ball-MiniLM-L\d+-v\d\b|\bbert-base\b": "a model's name",
    r"\b[A-Za-z]+\d+[A-Za-z]*\b": "an identifier with digits (ICML, a package name)",
    (
        r"\b(?:length|rank|width|threshold|one|two)-\d+\b"
        r"|\b\d+-(?:norm|bit|token|layer|class)\b|\b0-1\b|\b\d+B-class\b"
    ): "a compound name (length-1 query, 0-1 program, 1-norm, 7B-class model)",
    r"\b\d{1,2} (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)\w* (?:19|20)\d\d\b": "a date",
    r"\([ivx]+\)": "a roman-numbered list item",
}

#: Words that make a sentence a verdict (checked only together with a word of :data:`RESULT_WORDS`):
#: the issue's list, and comparisons of two numbers.
VERDICT_WORDS = (
    r"\bevery\b",
    r"\ball\b",
    r"\balways\b",
    r"\bnever\b",
    r"\bexactly\b",
    r"\bonly\b",
    r"\bat most\b",
    r"\bat least\b",
    r"\bwithin\b",
    r"\btimes (?:fewer|more|larger|smaller)\b",
    r"\bfails\b",
    r"\bsucceeds\b",
    r"\bmatch(?:es)?\b",
    r"\bmore than\b",
    r"\bfewer than\b",
    r"\bless than\b",
    r"\blarger than\b",
    r"\bsmaller than\b",
    r"\bequal to\b",
)

#: Words that make a verdict one about a run's results (a count, an error, a trial, an outcome).
RESULT_WORDS = (
    r"\bquer(?:y|ies)\b",
    r"\bcounts?\b",
    r"\berrors?\b",
    r"\btrials?\b",
    r"\bmeasurements\b",
    r"\brecover(?:s|ed)\b",
    r"\blabels\b",
    r"\biterations?\b",
    r"\bdisagree(?:s|ment)?\b",
    r"\bfloor\b",
    r"\bratio\b",
    r"\bsuccess\b",
    r"\bfail(?:s|ed|ure)\b",
    r"\bsucceeds?\b",
    r"\bneurons?\b",
    r"\bre-learn",
)

#: A sentence of reasoning rather than of a run's outcome: about the paper's statement, a condition,
#: or what must or would happen. Such a sentence is not a verdict on this chapter's outputs.
REASONING = (
    r"\b(?:[Tt]heorem|paper|proof|proves?|guarantee|with probability|almost surely|must|would|"
    r"could|might|[Ii]f|[Ww]hen(?:ever)?|[Uu]nless|assumes?|needs?|requires?|exercise|therefore|hence|because|since)\b"
)

#: Words that make a sentence state a trend, a comparison or a cause (issue 38): "grows", "falls",
#: "converges", "amplified", "need fewer", "follows" (a law), "more accurate", "-fold", "why", "because".
#: Such a sentence about a run's results (:data:`RESULT_WORDS`, :data:`TREND_SUBJECTS`) must show a
#: *checked* glued value (a ``results.claim`` or a bound checked against its measured value), or say in
#: the sentence that it is not measured (:data:`HEDGES`), or have an allowlist entry with its reason.
TREND_WORDS = (
    r"\bgrow(?:s|n|ing)?\b",
    r"\bfall(?:s|ing)?\b(?! (?:outside|inside|within|into|in|on)\b)",
    r"\brises?\b",
    r"\bshrinks?\b",
    r"\b(?:de|in)creas(?:es|ing)\b",
    r"\bconverg(?:es?|ing)\b",
    r"\bamplif(?:y|ies|ied)\b",
    r"\bneeds? (?:fewer|more|less)\b",
    r"(?<!as )\bfollows\b(?! from| that)",
    r"\b(?:more|less) accurate\b",
    r"\b(?:faster|slower|better|worse) than\b",
    r"-fold\b",
    r"\bwhy\b",
    r"\bbecause\b",
    r"\bcomes? from\b",
    r"\bdue to\b",
)

#: Subjects of a trend besides :data:`RESULT_WORDS`: what a chapter measures.
TREND_SUBJECTS = (
    r"\bsensitivity\b",
    r"\bamplification\b",
    r"\bconditioning\b",
    r"\bconverges?\b",
    r"\blength bound\b",
    r"\bcores?\b",
    r"\bsingular values?\b",
    r"\baccurate\b",
    r"\bfewer\b",
    r"\brounding\b",
)

#: A sentence that says itself that what it states is not measured here (a hedge the reader sees).
HEDGES = (
    r"\bnot measured\b|\bneither measured\b|\bnot shown here\b|\bheuristic\b|\bconjecture\b|"
    r"\ban explanation\b|\bnot (?:re-)?run here\b|\bone reading\b|\bby (?:that|its) abstract\b"
)

#: Reasoning that a trend sentence may state without a run: the paper's statement and hypotheticals.
TREND_REASONING = r"\b(?:[Tt]heorem|proof|proves?|guarantee|would|could|can|might|[Ii]f|[Uu]nless|must)\b"

_DIRECTIVE = re.compile(r"^(?P<fence>`{3,}|:{3,})\s*\{(?P<name>[\w:-]+)\}(?P<arg>[^\n]*)$", re.M)
_STATEMENT_BOXES = (
    "prf:theorem",
    "prf:lemma",
    "prf:proposition",
    "prf:definition",
    "prf:corollary",
    "prf:assumption",
    "prf:conjecture",
    "prf:axiom",
    "exercise",
)
_ROLE = re.compile(r"\{(?P<role>[\w:-]+)\}`(?P<arg>[^`]*)`")
_NUMBER = re.compile(r"(?<![\w.])\d+(?:[.,]\d+)*(?:[eE][-+]?\d+)?%?")


def markdown_cells(path) -> list[tuple[str, str]]:
    """``[(where, source), ...]``: every markdown cell of a notebook, or the whole of a ``.md`` file."""
    path = Path(path)
    if path.suffix == ".md":
        return [(path.name, path.read_text(encoding="utf-8"))]
    import nbformat

    nb = nbformat.read(path, as_version=4)
    return [(f"{path.name} c{i}", c.source) for i, c in enumerate(nb.cells) if c.cell_type == "markdown"]


def _blocks(source: str):
    """Split a cell into (kind, text) blocks: 'prose', 'statement' (a quoted box) or 'skip'."""
    out = []
    lines = source.split("\n")
    i = 0
    prose: list[str] = []
    while i < len(lines):
        line = lines[i]
        m = _DIRECTIVE.match(line)
        fence = re.match(r"^(`{3,}|~{3,})", line)
        if m or fence:
            if prose:
                out.append(("prose", "\n".join(prose)))
                prose = []
            marker = m.group("fence") if m else fence.group(1)  # type: ignore[union-attr]
            name = m.group("name") if m else ""
            body, i = [], i + 1
            while i < len(lines) and not lines[i].startswith(marker):
                body.append(lines[i])
                i += 1
            i += 1
            text = "\n".join(l for l in body if not re.match(r"^:\w[\w-]*:", l))
            if not m or name in ("math", "code-cell", "code", "code-block"):
                out.append(("skip", text))
            elif name in _STATEMENT_BOXES:
                out.append(("statement", text))
            else:  # admonitions, solutions, figures: prose inside
                out.extend(_blocks(text))
            continue
        if line.startswith("    ") and (not prose or not prose[-1].strip() or prose[-1] == "\0"):
            out.append(("skip", line))  # an indented code block
            prose.append("\0")
        else:
            prose.append(line)
        i += 1
    if prose:
        out.append(("prose", "\n".join(prose)))
    return [(k, t.replace("\0", "")) for k, t in out]


def _clean(text: str):
    """Prose with maths, roles, code, links and labels replaced; returns (text, inline maths list)."""
    maths = []
    text = re.sub(r"\$\$.*?\$\$", " ", text, flags=re.S)

    def keep_math(m):
        maths.append(m.group(1))
        return f"$M{len(maths) - 1}$"

    text = re.sub(r"(?<!\\)\$([^$]+?)(?<!\\)\$", keep_math, text)

    def role(m):
        if m.group("role").startswith("glue"):
            glued.append(m.group("arg"))
            return f" ⟦glue{len(glued) - 1}⟧ "
        return " ⟦ref⟧ "

    glued: list = []
    text = _ROLE.sub(role, text)
    text = re.sub(r"``.*?``|`[^`]*`", " ⟦code⟧ ", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)  # link targets
    text = re.sub(r"<https?://[^>]*>|https?://\S+", " ⟦url⟧ ", text)
    text = re.sub(r"^\([\w:-]+\)=\s*$", " ", text, flags=re.M)  # labels
    text = re.sub(r"^#+\s*(?:\d+(?:\.\d+)*\.?\s)?", "", text, flags=re.M)  # headings' section numbers
    text = re.sub(r"^\s*(?:\d+\.|[-*+])\s+", "", text, flags=re.M)  # list markers
    return text, maths, glued


def _sentences(text: str):
    text = re.sub(r"\s+", " ", text)
    return [s.strip() for s in re.split(r"(?<=[.!?;])\s+(?=[A-Z(*$`{])|(?<=:)\s+(?=[A-Z])", text) if s.strip()]


def _show(sentence: str, maths, glued=()) -> str:
    sentence = re.sub(r"⟦glue(\d+)⟧", lambda m: "{glue:text}`" + glued[int(m.group(1))] + "`", sentence)
    sentence = sentence.replace("⟦ref⟧", "{ref}").replace("⟦code⟧", "`code`").replace("⟦url⟧", "URL")
    return re.sub(r"\$M(\d+)\$", lambda m: f"${maths[int(m.group(1))]}$", sentence)


def _math_numbers(tex: str):
    """(value, is_coefficient) for every numeric literal of an inline formula, ``10^{-3}`` read as 1e-3."""
    out = []
    tex = tex.replace("{,}", "")
    for m in re.finditer(r"10\^\{?(-?\d+)\}?|(?<![\w^_{.])(\d+(?:\.\d+)?)(?![\d.])", tex):
        if m.group(1) is not None:
            out.append((10.0 ** int(m.group(1)), False))
            continue
        before = tex[: m.start()]
        if re.search(r"[\^_]\{?-?$", before):  # an exponent or a subscript
            continue
        after = tex[m.end() :]
        coefficient = bool(re.match(r"\s*(?:\\,|\\cdot|\\times)?\s*r\b", after))  # a multiple of r(2d - r)
        out.append((float(m.group(2)), coefficient))
    return out


_CONSTANTS: dict | None = None


def library_constants() -> dict:
    """``{value: [names]}`` of the numbers the library defines, which prose must not retype.

    Module-level constants in capitals (``DEFAULT_OVERSAMPLING``, ``SATURATION``, ``DEFAULT_VERIFY``,
    ...; the values of a dict constant each), the verification defaults of every learner
    (:func:`companion.verification_defaults`) and the numeric keyword defaults of the learners'
    public functions (tolerances, counts). Values 0, 1 and -1 are left out: they are structure.
    """
    global _CONSTANTS
    if _CONSTANTS is not None:
        return _CONSTANTS
    import companion

    found: dict = {}

    def add(value, name):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            return
        value = float(value)
        if not math.isfinite(value) or value in (0.0, 1.0, -1.0):
            return
        found.setdefault(value, []).append(name)

    modules = (
        "attention",
        "oracles",
        "exact",
        "lowrank",
        "robust",
        "ffn",
        "transformer",
        "multihead",
        "pretrained",
        "membership",
        "_learner",
        "_streaming",
        "recovery",
    )
    for mod_name in modules:
        try:
            mod = importlib.import_module(f"companion.{mod_name}")
        except ImportError:
            continue
        for name, value in vars(mod).items():
            if re.fullmatch(r"[A-Z][A-Z0-9_]+", name):
                if isinstance(value, dict):
                    for k, v in value.items():
                        add(v, f"{mod_name}.{name}[{k!r}]")
                else:
                    add(value, f"{mod_name}.{name}")
        for name, fn in vars(mod).items():
            if name.startswith("learn_") and callable(fn) and getattr(fn, "__module__", "") == mod.__name__:
                for p in inspect.signature(fn).parameters.values():
                    if p.kind is p.KEYWORD_ONLY and isinstance(p.default, float) and 0 < p.default < 1:
                        add(p.default, f"{mod_name}.{name}({p.name}=)")  # a tolerance
    try:
        for learner, (n, rtol) in companion.verification_defaults().items():
            add(n, f"verification_defaults()[{learner!r}] count")
            add(rtol, f"verification_defaults()[{learner!r}] tolerance")
    except Exception:
        pass
    _CONSTANTS = found
    return found


def _constant_names(value: float, constants: dict):
    for known, names in constants.items():
        if math.isclose(value, known, rel_tol=1e-9):
            return names
    return None


def _allowed_spans(sentence: str, allow):
    spans = []
    for pattern in list(ALLOWED) + list(allow):
        for m in re.finditer(pattern, sentence):
            spans.append((m.start(), m.end()))
    return spans


def hand_typed_numbers(source: str, where: str = "", *, allow=()) -> list[Finding]:
    r"""Numbers typed by hand in one markdown cell (see the module's docstring for the rule).

    Parameters
    ----------
    source : str
        The cell's MyST markdown.
    where : str
        Where the cell is, for the findings (e.g. ``"04_low_rank.ipynb c8"``).
    allow : iterable of str
        Extra regular expressions, matched against a sentence (maths shown as ``$M0$``), whose digits
        are allowed: the short allowlist of a test, each entry with its reason.

    Returns
    -------
    list of Finding
        One per offending number, in the order of the cell.

    Examples
    --------
    >>> [f.found for f in hand_typed_numbers("Queries of lengths 1 to 8, as in Theorem 4.1.")]
    ['1', '8']
    >>> [f.rule for f in hand_typed_numbers("It draws $m = 3\\,r(2d - r)$ measurements by default.")]
    ['number in a default']
    >>> hand_typed_numbers("The learner asked {glue:text}`n` queries, $d + d^2$ in §4.")
    []
    """
    constants = library_constants()
    findings = []
    for kind, block in _blocks(source):
        if kind == "skip":
            continue
        text, maths, glued = _clean(block)
        for sentence in _sentences(text):
            shown = _show(sentence, maths, glued)
            spans = _allowed_spans(sentence, allow)
            bare = re.sub(r"\$M\d+\$", " ", sentence)
            for m in _NUMBER.finditer(sentence):
                if any(a <= m.start() and m.end() <= b for a, b in spans):
                    continue
                if kind == "statement":
                    continue  # a statement box quotes the paper's own numbers
                findings.append(Finding(where, "digit in prose", m.group(0), shown))
            default = re.search(r"\bdefaults?\b|\bby default\b", bare)
            for j in (int(k) for k in re.findall(r"\$M(\d+)\$", sentence)):
                for value, coefficient in _math_numbers(maths[j]):
                    names = _constant_names(value, constants)
                    if names and value == int(value):  # an integer: only a default multiple of r(...)
                        names = [n for n in names if "OVERSAMPLING" in n or "MULTIPLE" in n] if coefficient else []
                    if kind != "statement" and default and value not in (0.0, 1.0, 2.0):
                        findings.append(Finding(where, "number in a default", f"{value:g} in ${maths[j]}$", shown))
                    elif names and kind != "statement":
                        findings.append(
                            Finding(
                                where,
                                f"library constant ({', '.join(names[:3])}) in maths",
                                f"{value:g} in ${maths[j]}$",
                                shown,
                            )
                        )
    return findings


def unbacked_verdicts(source: str, where: str = "", *, allow=(), values=None) -> list[Finding]:
    """Verdict sentences about a run's results that show no glued value (see the module's docstring).

    ``allow``: regular expressions matched against a sentence; a match exempts it (a sentence of
    reasoning, not of results, each with its reason in the test's allowlist). ``values``: the
    chapter's published values (``results.load(chapter)["values"]``); a verdict sentence whose glued
    value is a bare yes/no (or True/False) published with ``publish``, not ``claim``, is a finding:
    "(no)" renders without stopping the chapter.

    Examples
    --------
    >>> [f.found for f in unbacked_verdicts("With $k = r$ the count is exactly the floor.")]
    ['exactly']
    >>> unbacked_verdicts("The count is exactly {glue:text}`k0` (checked when the chapter runs).")
    []
    >>> values = {"ok": {"value": "no", "text": "no", "kind": "exact"}}
    >>> [f.rule for f in unbacked_verdicts("Every run was exact: {glue:text}`ok`.", values=values)]
    ['verdict glued as yes/no, not a claim']
    """
    findings = []
    for kind, block in _blocks(source):
        if kind != "prose":
            continue
        text, maths, glued = _clean(block)
        for sentence in _sentences(text):
            names = [glued[int(j)] for j in re.findall(r"⟦glue(\d+)⟧", sentence)]
            if names:
                for name in names:  # a verdict glued as yes/no is not checked (issue 19, item 1)
                    entry = (values or {}).get(name)
                    if (
                        isinstance(entry, dict)
                        and entry.get("kind") != "claim"
                        and str(entry.get("value")).lower() in ("yes", "no", "true", "false")
                    ):
                        findings.append(
                            Finding(where, "verdict glued as yes/no, not a claim", name, _show(sentence, maths, glued))
                        )
                continue
            bare = re.sub(r"\$M\d+\$", " MATH ", sentence)
            verdict = next((w for w in VERDICT_WORDS if re.search(w, bare, re.I)), None)
            if verdict is None or not any(re.search(w, bare, re.I) for w in RESULT_WORDS):
                continue
            if re.search(REASONING, sentence):
                continue
            shown = _show(sentence, maths, glued)
            if any(re.search(p, shown) for p in allow):
                continue
            word = re.search(verdict, bare, re.I).group(0)  # type: ignore[union-attr]
            findings.append(Finding(where, "unbacked verdict", word, shown))
    return findings


def source_kinds(path) -> dict:
    """``{name: {"kind": "claim" | "bound"}}`` for the values a notebook's code cells check, read
    from its source: each ``results.claim("name", ...)``, and each ``results.publish("name", ...,
    kind="bound", ...)`` with a literal name. A claim added to a chapter is known before the chapter
    is re-executed and its results file rewritten."""
    import ast

    import nbformat

    found: dict = {}
    nb = nbformat.read(Path(path), as_version=4)
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if not (node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
                continue
            name = node.args[0].value
            kind = {k.arg: k.value for k in node.keywords}.get("kind")
            if node.func.attr == "claim":
                found[name] = {"kind": "claim"}
            elif node.func.attr == "publish" and isinstance(kind, ast.Constant) and kind.value == "bound":
                found[name] = {"kind": "bound"}
    return found


def check_markdown(path, *, allow_numbers=(), allow_verdicts=(), allow_trends=(), values=None) -> list[Finding]:
    """The three checks on every markdown cell of a chapter (or a ``.md`` page); ``values`` as for
    :func:`unbacked_verdicts` and :func:`unbacked_trends`. For a notebook, the claims and bounds its
    code cells make (:func:`source_kinds`) count as checked for :func:`unbacked_trends` even before
    its results file is rewritten."""
    out = []
    trend_values = values
    if values is not None and Path(path).suffix == ".ipynb":
        trend_values = {**values, **source_kinds(path)}
    for where, source in markdown_cells(path):
        out += hand_typed_numbers(source, where, allow=allow_numbers)
        out += unbacked_verdicts(source, where, allow=allow_verdicts, values=values)
        out += unbacked_trends(source, where, allow=allow_trends, values=trend_values)
    return out


def _checked(name, values) -> bool:
    """Whether a glued value was checked when the chapter ran: a claim, or a bound with its measured
    value (``values`` unknown: any glued value counts)."""
    if values is None:
        return True
    entry = values.get(name)
    return isinstance(entry, dict) and (entry.get("kind") == "claim" or entry.get("kind") == "bound")


def unbacked_trends(source: str, where: str = "", *, allow=(), values=None) -> list[Finding]:
    """Sentences stating a trend, a comparison or a cause about a run's results without a checked value.

    A sentence with a word of :data:`TREND_WORDS` ("grows", "falls", "converges", "amplified", "need
    fewer", "follows", "more accurate", "-fold", "why", "because", ...) about a result
    (:data:`RESULT_WORDS` or :data:`TREND_SUBJECTS`) must show a glued value that was *checked* when
    the chapter ran: a :func:`companion.book.results.claim`, or a bound published with the value it bounds
    (with ``values``, the chapter's published values; without, any glued value). A sentence that
    states the paper's theorem or a hypothetical (:data:`TREND_REASONING`), or says itself that it is
    not measured here (:data:`HEDGES`), is not a finding; ``allow``: regular expressions, each an
    allowlist entry with its reason in the test. Exercise statements are read too (a question may
    state a trend as a premise); the paper's statement boxes are not.

    Examples
    --------
    >>> [f.found for f in unbacked_trends("The error with Gaussian probes grows with $d$.")]
    ['grows']
    >>> values = {"g": {"value": 6.6, "text": "6.6", "kind": "measured"}}
    >>> [f.rule for f in unbacked_trends("The ratio grows to {glue:text}`g`.", values=values)]
    ['unchecked trend']
    >>> values["g"] = {"value": True, "text": "grows", "kind": "claim", "holds": True}
    >>> unbacked_trends("The ratio {glue:text}`g` with $d$.", values=values)
    []
    >>> unbacked_trends("The error grows like $1/\\\\eta$ (a heuristic, not measured here).")
    []
    """
    findings = []
    for kind, block in _blocks(source):
        if kind == "skip":
            continue
        if kind == "statement" and not _is_exercise(source, block):
            continue
        text, maths, glued = _clean(block)
        for sentence in _sentences(text):
            bare = re.sub(r"\$M\d+\$", " MATH ", sentence)
            bare = re.sub(r"⟦\w+⟧", " ", bare)
            if sentence.rstrip().endswith("?"):
                continue  # a question asks; it states nothing
            hits = [m for w in TREND_WORDS for m in [re.search(w, bare, re.I)] if m]
            if not hits:
                continue
            word = min(hits, key=lambda m: m.start()).group(0)  # the first in the sentence
            if not any(re.search(w, bare, re.I) for w in RESULT_WORDS + TREND_SUBJECTS):
                continue
            names = [glued[int(j)] for j in re.findall(r"⟦glue(\d+)⟧", sentence)]
            if any(_checked(n, values) for n in names):
                continue
            if re.search(TREND_REASONING, bare) or re.search(HEDGES, bare, re.I):
                continue
            shown = _show(sentence, maths, glued)
            if any(re.search(p, shown) for p in allow):
                continue
            findings.append(Finding(where, "unchecked trend", word, shown))
    return findings


def _is_exercise(source: str, block: str) -> bool:
    """Whether ``block`` (a statement box of ``source``) is an exercise's statement."""
    for m in _DIRECTIVE.finditer(source):
        if m.group("name") == "exercise" and block.strip()[:40] in source[m.end() :]:
            return True
    return False

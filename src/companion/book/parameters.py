"""A chapter's parameters: declared once in its ``parameters`` cell, checked before any work.

Each line of a chapter's ``parameters`` cell is ``name = default  # help; must be SPEC``. The
default fixes the type (an int where a float is expected is accepted; a list's elements have the
type of the default's elements). ``SPEC`` states what else the value must be, in a small grammar
(no ``=``, ``<`` or ``>``: papermill drops lines whose comment holds them):

=============================  ==============================================================
clause                          meaning
=============================  ==============================================================
``in [a, b]``                   a number in the interval; ``(`` and ``)`` exclude an end,
                                ``inf`` is allowed, and an end may be an expression of the
                                other parameters: ``in [1, d]``, ``in (0, 1/sqrt(d)]``
``in [a, b] x [c, d]``          a pair (list of 2) whose entries lie in these intervals
``one of a, b, c``              one of these values (numbers or words)
``non-empty``                   a list with at least one element
``a divisor of E``              an integer that divides the integer ``E`` (an expression of the
                                other parameters, as a bound): ``a divisor of d``
``a divisor of every E``        an integer that divides every element of the list ``E``:
                                ``each a divisor of every d_values``
``each CLAUSE``                 every element of the list satisfies the clause
=============================  ==============================================================

A bool parameter takes ``True`` or ``False`` only (``companion run`` reads only ``true`` and
``false`` as booleans, not YAML 1.1's ``yes``/``no``/``on``/``off``).

Clauses are joined by the word ``and``. A help text too long for one line (the chapters' code
lines are at most 88 characters) continues on the comment-only lines directly below its
parameter's line; they are joined with single spaces. Papermill reads only the first line
(``papermill --help-notebook`` shows that part); :func:`declared` reads them all. For example::

    d = 5  # dimension of the instance; must be in [3, 512]
    d_values = [4, 8, 16]  # dimensions of the sweep; must be non-empty and each in [2, 1024]
    rank = 2  # rank of W; must be in [1, d]
    probes = "basis"  # probe family; must be one of basis, gaussian
    cases = [[8, 1], [8, 2]]  # (d, r) pairs of the phase transition (cvxpy: keep d at most
    #   20); must be non-empty and each in [2, 20] x [1, 20]

:func:`check` refuses a bad value with one line naming the parameter, what it must be, and its
default. ``companion run`` calls it before execution; a chapter calls it through
:func:`companion.book.results.record_parameters` in the cell after its parameters (plain papermill).

Examples
--------
>>> decl = declared('d = 5  # dimension; must be in [3, 512]\\nxs = [1.0]  # values; must be non-empty')
>>> check(decl, {"d": 4, "xs": [2]})
{'d': 4, 'xs': [2.0]}
>>> try:
...     check(decl, {"d": 2})
... except ParameterError as exc:
...     print(exc)
parameter d=2 must be in [3, 512] (an int; default 5)
"""

from __future__ import annotations

import ast
import math
import operator
import re

from ..errors import ParameterError

__all__ = ["declared", "check", "parse_spec", "coerce"]

_MARK = re.compile(r";\s*must be\s+(?P<spec>.+)$")
_FUNCS = {"sqrt": math.sqrt, "min": min, "max": max, "len": len, "abs": abs, "log2": math.log2}
_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def _eval(expr: str, env: dict):
    """Evaluate a bound: numbers, ``inf``, parameter names, + - * / // **, sqrt/min/max/len/abs/log2."""

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
            return node.value
        if isinstance(node, ast.Name):
            if node.id == "inf":
                return math.inf
            if node.id in env:
                return env[node.id]
            raise ParameterError(f"the constraint names {node.id!r}, which is not a parameter")
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.operand))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS:
            return _FUNCS[node.func.id](*[ev(a) for a in node.args])
        raise ParameterError(f"cannot read the bound {expr!r} of a constraint")

    try:
        return ev(ast.parse(expr.strip(), mode="eval"))
    except SyntaxError:
        raise ParameterError(f"cannot read the bound {expr!r} of a constraint") from None


def _split_product(text: str) -> list[str]:
    return [part.strip() for part in re.split(r"\s+x\s+", text.strip())]


def _interval(piece: str):
    """``[a, b]`` -> ("[", "a", "b", "]"); the comma splitting a and b is the one outside parentheses."""
    if len(piece) < 5 or piece[0] not in "[(" or piece[-1] not in "])":
        return None
    inner, depth = piece[1:-1], 0
    for i, c in enumerate(inner):
        depth += c == "("
        depth -= c == ")"
        if c == "," and depth == 0:
            return piece[0], inner[:i].strip(), inner[i + 1 :].strip(), piece[-1]
    return None


def parse_spec(text: str) -> list:
    """Parse ``SPEC`` into clauses: ("in", [intervals]), ("one of", [values]), ("non-empty",), ("each", clause)."""
    clauses = []
    for part in re.split(r"\s+and\s+", text.strip()):
        clauses.append(_parse_clause(part.strip(), text))
    return clauses


def _parse_clause(part: str, whole: str):
    if part.startswith("each "):
        return ("each", _parse_clause(part[5:].strip(), whole))
    if part == "non-empty":
        return ("non-empty",)
    if part.startswith("in "):
        intervals = []
        for piece in _split_product(part[3:]):
            interval = _interval(piece)
            if interval is None:
                raise ParameterError(f"cannot read the interval {piece!r} in the constraint {whole!r}")
            intervals.append(interval)
        return ("in", intervals)
    if part.startswith("a divisor of "):
        rest = part[13:].strip()
        every = rest.startswith("every ")
        expr = rest[6:].strip() if every else rest
        if not expr:
            raise ParameterError(f"cannot read the constraint {whole!r}: 'a divisor of' needs what it divides")
        return ("divides", expr, every)
    if part.startswith("one of "):
        return ("one of", [coerce_word(w.strip()) for w in part[7:].split(",")])
    raise ParameterError(
        f"cannot read the constraint {whole!r}: each clause is 'in [a, b]', 'in [a, b] x [c, d]', "
        "'one of a, b', 'non-empty', 'a divisor of E', 'a divisor of every E' or 'each CLAUSE', joined by 'and'"
    )


def coerce_word(word: str):
    """A word of a ``one of`` list as a value: ``3`` -> 3, ``1e-3`` -> 0.001, ``True``, else the string."""
    try:
        return ast.literal_eval(word)
    except (ValueError, SyntaxError):
        try:
            return float(word)
        except ValueError:
            return word.strip("'\"")


def declared(source: str) -> dict:
    """The parameters of a ``parameters`` cell's source: name -> {"default", "help", "spec", "spec_text"}.

    Raises
    ------
    ParameterError
        If papermill would drop an assignment line (its comment holds ``=``), or a constraint
        cannot be read.
    """
    from papermill.translators import PythonTranslator

    found = PythonTranslator.inspect({"source": source})
    assigned = re.findall(r"^(\w+)\s*=", source, re.M)
    dropped = [name for name in assigned if name not in {p.name for p in found}]
    if dropped:
        raise ParameterError(
            f"papermill cannot read the line of {', '.join(dropped)} in the parameters cell (it drops "
            "lines whose comment holds '=', '<' or '>'); fix the comment."
        )
    continued = _continued_help(source)
    out = {}
    for p in found:
        try:
            default = ast.literal_eval(p.default)
        except (ValueError, SyntaxError):
            default = p.default
        help_text = " ".join(filter(None, [(p.help or "").strip(), *continued.get(p.name, [])]))
        m = _MARK.search(help_text)
        spec_text = m["spec"].strip() if m else None
        out[p.name] = {
            "default": default,
            "help": help_text[: m.start()].strip() if m else help_text,
            "spec": parse_spec(spec_text) if spec_text else [],
            "spec_text": spec_text,
        }
    return out


def _continued_help(source: str) -> dict[str, list[str]]:
    """Comment-only lines directly below a parameter's line (no blank line between): name -> texts.

    A parameter's line is one that starts ``name =``, or a line continuing its value (a list
    spread over lines); a blank line or the next assignment ends the continuation.

    >>> _continued_help("d = 5  # the dimension of the\\n#   instance; must be in [3, 512]\\n\\n# other")
    {'d': ['instance; must be in [3, 512]']}
    """
    out: dict[str, list[str]] = {}
    name = None
    for line in source.splitlines():
        text = line.strip()
        if not text:
            name = None
        elif text.startswith("#"):
            if name is not None:
                out.setdefault(name, []).append(text.lstrip("#").strip())
        elif m := re.match(r"(\w+)\s*=(?!=)", text):
            name = m[1]
    return out


def _type_name(default, article=True) -> str:
    """'an int', 'a list of float', 'a list of list of int' (the type the default gives)."""
    if isinstance(default, (list, tuple)):
        inner = {_type_name(x, article=False) for x in default}
        name = f"list of {inner.pop()}" if len(inner) == 1 else "list"
    elif default is None:
        return "any value"
    else:
        name = type(default).__name__
    if not article:
        return name
    return f"an {name}" if name[0] in "aeiou" else f"a {name}"


def coerce(value, default):
    """``value`` converted to the type of ``default``, or raise ValueError.

    An int becomes a float where the default is a float, and a string that reads as a float
    (YAML 1.1 reads ``1e-3`` as the string ``'1e-3'``) becomes that float; list elements follow the
    default's elements. Bools are never numbers.
    """
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        raise ValueError
    if isinstance(default, int):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ValueError
    if isinstance(default, float):
        if isinstance(value, str):
            value = float(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ValueError
    if isinstance(default, (list, tuple)):
        if not isinstance(value, (list, tuple)):
            raise ValueError
        kinds = {type(x) for x in default}
        if len(kinds) != 1:
            return list(value)
        return [coerce(x, default[0]) for x in value]
    if default is None or isinstance(value, type(default)):
        return value
    raise ValueError


def _satisfies(value, clause, env) -> bool:
    kind = clause[0]
    if kind == "non-empty":
        return isinstance(value, (list, tuple)) and len(value) > 0
    if kind == "each":
        return isinstance(value, (list, tuple)) and all(_satisfies(x, clause[1], env) for x in value)
    if kind == "one of":
        return any(value == v and isinstance(value, bool) == isinstance(v, bool) for v in clause[1])
    if kind == "divides":
        target = _eval(clause[1], env)
        targets = list(target) if clause[2] else [target]
        if isinstance(value, bool) or not isinstance(value, int) or value == 0:
            return False
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in targets):
            raise ParameterError(
                f"the constraint 'a divisor of {'every ' if clause[2] else ''}{clause[1]}' "
                f"needs integers; {clause[1]}={target!r}"
            )
        return all(t % value == 0 for t in targets)
    if kind == "in":
        intervals = clause[1]
        items = [value] if len(intervals) == 1 else value
        if len(intervals) > 1 and (not isinstance(value, (list, tuple)) or len(value) != len(intervals)):
            return False
        for x, (lo, a, b, hi) in zip(items, intervals):
            if isinstance(x, bool) or not isinstance(x, (int, float)):
                return False
            low, high = _eval(a, env), _eval(b, env)
            if not ((x >= low if lo == "[" else x > low) and (x <= high if hi == "]" else x < high)):
                return False
        return True
    raise ParameterError(f"unknown constraint {clause!r}")


def _names(spec_text: str, env: dict) -> list[str]:
    return [n for n in dict.fromkeys(re.findall(r"\b[A-Za-z_]\w*\b", spec_text or "")) if n in env]


def check(decl: dict, values: dict, *, where: str = "") -> dict:
    """Check ``values`` (name -> value) against the declarations; return them converted.

    Names not declared are refused, with the closest declared name if one is close
    (``difflib.get_close_matches``: ``seeed`` -> "did you mean seed?"). Every given value is
    converted to its default's type (:func:`coerce`), then checked against its constraint; bounds
    that name other parameters use their given values, or their defaults.

    Raises
    ------
    ParameterError
        One line: the parameter, the value, what it must be, its type and its default.
    """
    prefix = f"{where.strip()}: " if where.strip() else ""
    out = {}
    for name, value in values.items():
        if name not in decl:
            listing = ", ".join(
                f"{k} ({_type_name(v['default'], article=False)}, default {v['default']!r})" for k, v in decl.items()
            )
            import difflib

            close = difflib.get_close_matches(str(name), list(decl), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ParameterError(f"{where}has no parameter {name!r}{hint}; its parameters are: {listing}.")
        info = decl[name]
        try:
            out[name] = coerce(value, info["default"])
        except (ValueError, TypeError):
            hint = ""
            if isinstance(value, str) and isinstance(info["default"], (list, tuple)):
                hint = "; pass a list as YAML (companion run -p or -f, papermill -y)"
            elif isinstance(info["default"], bool):
                hint = "; pass true or false"
            raise ParameterError(
                f"{prefix}parameter {name}={value!r} must be {_type_name(info['default'])}"
                f"{', ' + info['spec_text'] if info['spec_text'] else ''} (default {info['default']!r}){hint}"
            ) from None
    env = {k: v["default"] for k, v in decl.items()} | out
    for name, value in out.items():
        info = decl[name]
        for clause in info["spec"]:
            if not _satisfies(value, clause, env):
                refs = [f"{n}={env[n]!r}" for n in _names(info["spec_text"], env) if n != name]
                raise ParameterError(
                    f"{prefix}parameter {name}={value!r} must be {info['spec_text']}"
                    f"{' with ' + ', '.join(refs) if refs else ''} "
                    f"({_type_name(info['default'])}; default {info['default']!r})"
                )
    return out

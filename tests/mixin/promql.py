"""The metric names a PromQL expression selects, without a PromQL parser.

promtool in Debian's Prometheus 2.42 has no AST dump, so this is a careful tokenizer: it
skips strings, label-matcher blocks (but reads a ``__name__`` matcher in them), ranges and
durations, numbers, keywords, function and aggregation names (an identifier followed by
``(``), the label lists after by/without/on/ignoring/group_left/group_right, and Grafana
variables (``$x``, ``${x}``). What is left are metric names, recording-rule names included.
"""

from __future__ import annotations

import re

KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "atan2", "inf", "nan", "start", "end"}
)
# Keywords followed by a parenthesised list of label names, never metric names.
LABEL_LIST_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})

_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_NUMBER = re.compile(r"0[xX][0-9a-fA-F]+|[0-9][0-9A-Za-z_.]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+")
_AGGREGATION_CLAUSE = re.compile(r"(?:by|without)\s*\(", re.I)
_GRAFANA_VARIABLE = re.compile(r"\$(?:\{[^}]*\}|[A-Za-z_][A-Za-z0-9_]*)")
# A regex name matcher yields its regex, which names no catalog metric: rules stay literal.
_NAME_MATCHER = re.compile(r"""__name__\s*=~?\s*(?:"([^"]*)"|'([^']*)'|`([^`]*)`)""")


class PromQLSyntaxError(ValueError):
    pass


def _skip_string(expr: str, i: int) -> int:
    """Index just past the string literal that starts at ``expr[i]``."""
    quote = expr[i]
    j = i + 1
    while j < len(expr):
        if expr[j] == "\\" and quote != "`":
            j += 2
            continue
        if expr[j] == quote:
            return j + 1
        j += 1
    raise PromQLSyntaxError(f"unterminated string at offset {i} in {expr!r}")


def _skip_block(expr: str, i: int, close: str) -> tuple[int, str]:
    """Index just past the bracketed block at ``expr[i]``, and its text (strings kept)."""
    j = i + 1
    while j < len(expr):
        ch = expr[j]
        if ch in "\"'`":
            j = _skip_string(expr, j)
            continue
        if ch == close:
            return j + 1, expr[i + 1 : j]
        j += 1
    raise PromQLSyntaxError(f"unclosed {expr[i]!r} at offset {i} in {expr!r}")


def metric_names(expr: str) -> set[str]:
    """Every metric name the PromQL expression selects (by name or by ``__name__``)."""
    names: set[str] = set()
    i = 0
    skip_label_list = False
    while i < len(expr):
        ch = expr[i]
        if ch.isspace():
            i += 1
            continue
        if ch == "#":  # a comment runs to the end of the line
            newline = expr.find("\n", i)
            i = len(expr) if newline < 0 else newline + 1
            continue
        if ch in "\"'`":
            i = _skip_string(expr, i)
            continue
        if ch == "$":
            match = _GRAFANA_VARIABLE.match(expr, i)
            i = match.end() if match else i + 1
            continue
        if ch == "{":
            i, block = _skip_block(expr, i, "}")
            for match in _NAME_MATCHER.finditer(block):
                names.add(next(g for g in match.groups() if g is not None))
            continue
        if ch == "[":
            i, _ = _skip_block(expr, i, "]")
            continue
        if ch == "(" and skip_label_list:
            i, _ = _skip_block(expr, i, ")")
            skip_label_list = False
            continue
        if ch.isdigit() or (ch == "." and expr[i + 1 : i + 2].isdigit()):
            number = _NUMBER.match(expr, i)
            assert number is not None
            i = number.end()
            continue
        ident = _IDENT.match(expr, i)
        if ident is None:  # an operator or punctuation
            i += 1
            continue
        word = ident.group()
        i = ident.end()
        following = expr[i:].lstrip()
        lowered = word.lower()
        if lowered in LABEL_LIST_KEYWORDS:
            skip_label_list = following.startswith("(")
            continue
        if lowered in KEYWORDS:
            continue
        if following.startswith("(") or _AGGREGATION_CLAUSE.match(following):
            continue  # a function or an aggregation (`topk by (x) (...)`)
        names.add(word)
    return names

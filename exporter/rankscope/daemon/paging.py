"""Paging of the JSON API's long lists: an answer's size is bounded by ``limit``, whatever
the flight directory holds."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlencode

DEFAULT_LIMIT = 500  # items per list in one answer, unless ?limit= says otherwise
MAX_LIMIT = 5000


def paginate(
    doc: dict[str, Any],
    lists: Sequence[str],
    offset: int,
    limit: int,
    next_url: Callable[[int], str],
) -> dict[str, Any]:
    """``doc`` with each of its ``lists`` cut to ``[offset, offset + limit)``, and a ``page``
    section: the totals, ``truncated`` when any list has more past this page, and ``next``
    (the URL of the next page, or null)."""
    totals = {key: len(doc[key]) for key in lists}
    for key in lists:
        doc[key] = doc[key][offset : offset + limit]
    truncated = any(total > offset + limit for total in totals.values())
    doc["page"] = {
        "offset": offset,
        "limit": limit,
        "total": totals,
        "truncated": truncated,
        "next": next_url(offset + limit) if truncated else None,
    }
    return doc


def page_url(path: str, query: str, **params: int | str) -> str:
    """``path`` with ``query``'s parameters and ``params`` set (the others kept, in order)."""
    kept = [(k, v) for k, v in parse_qsl(query, keep_blank_values=True) if k not in params]
    return f"{path}?{urlencode([*kept, *((k, str(v)) for k, v in params.items())])}"

"""Paging of the JSON API's long lists: an answer's size is bounded by ``limit``, whatever
the flight directory holds."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qsl, urlencode

DEFAULT_LIMIT = 500  # items per list in one answer, unless ?limit= says otherwise
MAX_LIMIT = 5000


def paginate(
    doc: dict[str, Any], lists: Sequence[str], offset: int, limit: int, path: str, query: str
) -> dict[str, Any]:
    """``doc`` with each of its ``lists`` cut to ``[offset, offset + limit)``, and a ``page``
    section: the totals, ``truncated`` when any list has more past this page, and ``next``
    (this URL with the next offset, its other parameters kept in order; or null)."""
    end = offset + limit
    totals = {key: len(doc[key]) for key in lists}
    for key in lists:
        doc[key] = doc[key][offset:end]
    truncated = any(total > end for total in totals.values())
    kept = [
        (k, v) for k, v in parse_qsl(query, keep_blank_values=True) if k not in ("offset", "limit")
    ]
    next_url = f"{path}?{urlencode([*kept, ('offset', end), ('limit', limit)])}"
    doc["page"] = {
        "offset": offset,
        "limit": limit,
        "total": totals,
        "truncated": truncated,
        "next": next_url if truncated else None,
    }
    return doc

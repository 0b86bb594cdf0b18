"""The census's public API (docs/census.md): ``count``, ``tick`` and the rest of ``__all__``.
It runs inside the rank; its code is :mod:`rankscope.rank.census`, loaded name by name."""

from typing import Any

from rankscope.rank import census as _census

__all__ = _census.__all__


def __getattr__(name: str) -> Any:
    return getattr(_census, name)


def __dir__() -> list[str]:
    return sorted(__all__)

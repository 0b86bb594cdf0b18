"""The census's public API (docs/census.md): ``count``, ``tick``,
``instrument_torch_distributed``, ``enable_comparison`` and the rest of ``__all__``. The
census runs inside the rank; its code is :mod:`rankscope.rank.census`, whose modules load
when a name is first used."""

from typing import Any

from rankscope.rank import census as _census

__all__ = _census.__all__


def __getattr__(name: str) -> Any:
    return getattr(_census, name)


def __dir__() -> list[str]:
    return sorted(__all__)

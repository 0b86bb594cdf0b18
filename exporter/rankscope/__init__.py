"""rankscope: where every byte of VRAM went on a multi-GPU inference job, who else holds
each card, how close each card came to its floor, and whether every rank issued the same
collectives."""

from __future__ import annotations


def __getattr__(name: str) -> str:
    # The version is looked up on first use: importlib.metadata costs tens of milliseconds,
    # and every Python process `rankscope run` arms imports this package.
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("rankscope")
        except PackageNotFoundError:  # running from a source tree without an install
            return "0.0.0+unknown"
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""rankscope: where every byte of VRAM went on a multi-GPU inference job, who else holds
each card, how close each card came to its floor, and whether every rank issued the same
collectives."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("rankscope")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+unknown"

"""rankscope: where every byte of VRAM went on a multi-GPU inference job, who else holds
each card, how close each card came to its floor, and whether every rank issued the same
collectives."""

# The package's version, read by setuptools at build time (pyproject.toml) and here without
# importlib.metadata, which would cost every armed process and the daemon about 1 MiB.
__version__ = "0.1.0"

"""Whether this interpreter can build C extensions: the mark's C line encoder
(rankscope._markline) must be built wherever it can be."""

from __future__ import annotations

import shutil
import sysconfig
from pathlib import Path


def why_no_c_build() -> str | None:
    """None where a C compiler and Python's headers are; else why the install takes the
    Python encoder."""
    headers = Path(sysconfig.get_paths()["include"], "Python.h")
    compiler = str(sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        return f"no C compiler ({compiler})"
    if not headers.exists():
        return f"no {headers}"
    return None

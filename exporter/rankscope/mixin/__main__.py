"""``python3 -m rankscope.mixin [--check] [ROOT]``: (re)write alerts/, dashboards/ and the Helm
chart's copies under ROOT (default: the source tree this package lives in). With --check
nothing is written; the exit status is 1 when any file differs."""

from __future__ import annotations

import sys
from pathlib import Path

from rankscope.mixin import helm, render


def write(root: Path, *, check: bool) -> list[Path]:
    return render.write(root, check=check) + helm.write(root, check=check)


if __name__ == "__main__":
    sys.exit(render.cli("python3 -m rankscope.mixin", __doc__, write))

"""``python3 -m rankscope.mixin [--check] [ROOT]``: (re)write the generated files.

Writes alerts/rankscope.rules.yml, alerts/alertmanager.example.yml and dashboards/*.json under
ROOT (default: the source tree this package lives in), then the Helm chart's copies
(rankscope.mixin.helm).
With --check nothing is written; the exit status is 1 when any file differs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rankscope.mixin import helm, render


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m rankscope.mixin", description=__doc__)
    parser.add_argument("root", nargs="?", type=Path, default=render.source_root())
    parser.add_argument("--check", action="store_true", help="only report stale files")
    args = parser.parse_args(argv)
    stale = render.write(args.root, check=args.check)
    for path in stale:
        print(f"{'stale' if args.check else 'wrote'} {path}")
    # The chart's copies (PrometheusRule template, dashboards, values) come from the same
    # builders; the sync reports and writes its own files.
    helm_status = helm.main([*(["--check"] if args.check else []), str(args.root)])
    if helm_status > 1:
        return helm_status
    if args.check and helm_status:
        return 1
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())

"""``python3 -m rankscope.mixin [--check] [ROOT]``: (re)write the generated files.

Writes alerts/rankscope.rules.yml and dashboards/*.json under ROOT (default: the source tree
this package lives in), then runs the Helm sync (rankscope.mixin.helm) when it is present.
With --check nothing is written; the exit status is 1 when any file differs.
"""

from __future__ import annotations

import argparse
import importlib.util
import runpy
import sys
from pathlib import Path

from rankscope.mixin import render

HELM_SYNC = "rankscope.mixin.helm"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m rankscope.mixin", description=__doc__)
    parser.add_argument("root", nargs="?", type=Path, default=render.source_root())
    parser.add_argument("--check", action="store_true", help="only report stale files")
    args = parser.parse_args(argv)
    stale = render.write(args.root, check=args.check)
    for path in stale:
        print(f"{'stale' if args.check else 'wrote'} {path}")
    if not args.check and importlib.util.find_spec(HELM_SYNC) is not None:
        # Run the chart sync exactly as `python3 -m rankscope.mixin.helm` would.
        saved_argv = sys.argv
        sys.argv = [HELM_SYNC]
        try:
            runpy.run_module(HELM_SYNC, run_name="__main__", alter_sys=True)
        except SystemExit as done:
            if done.code not in (None, 0):
                print(f"{HELM_SYNC} failed with {done.code}", file=sys.stderr)
                return 1
        finally:
            sys.argv = saved_argv
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())

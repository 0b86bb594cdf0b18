"""The run-time check of an adapter's hook points for an installed version that is not a
checked one: the same check CI runs against the manifest (rankscope.rank.adapters.manifest),
run against the installed framework's own source, read from its files with ``ast`` (nothing
of the framework is imported). ``RANKSCOPE_ADAPTERS=checked-only`` turns it off: an
unchecked version is then not attached at all.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import sys
from pathlib import Path

from rankscope.rank.adapters.manifest import check_point
from rankscope.rank.adapters.points import Adapter
from rankscope.rank.adapters.source import extract, module_path, wanted

ENV_ADAPTERS = "RANKSCOPE_ADAPTERS"
CHECKED_ONLY = "checked-only"


def checked_only() -> bool:
    return os.environ.get(ENV_ADAPTERS, "").strip().lower() == CHECKED_ONLY


def _source_of(distribution: str, module: str) -> str | None:
    """The installed source of ``module``: where the distribution's files are, else the first
    entry of sys.path that has it. None when there is none."""
    relative = module_path(module)
    candidates: list[Path] = []
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        installed = importlib.metadata.distribution(distribution).locate_file(relative)
        candidates.append(Path(str(installed)))
    candidates += [Path(entry or ".") / relative for entry in sys.path]
    for path in candidates:
        try:
            return path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
    return None


def first_problem(adapter: Adapter) -> tuple[str, str] | None:
    """(hook point, why) of the first hook point the installed source does not offer as the
    adapter uses it (module, class, method, parameters at their positions, attributes);
    None when every one does. An optional point may be missing (it is read with a
    fallback)."""
    for module, (members, functions) in sorted(wanted(adapter).items()):
        source = _source_of(adapter.distribution, module)
        try:
            entry = extract(source, members, functions) if source is not None else None
        except SyntaxError as exc:
            return module, f"its source does not parse: {exc}"
        for point in (p for p in adapter.points if p.module == module):
            problems = check_point(point, entry)
            if problems and not point.optional:
                return point.name, problems[0]
    return None

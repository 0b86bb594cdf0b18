"""The tree's promise: the daemon and the readers never load code that runs inside a rank
(rankscope/rank/), checked in a fresh interpreter; the public faces stay importable; and the
package stays in proportion (its Python in lines, its modules and functions in size)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "exporter" / "rankscope"
PACKAGE_LINES = 15_500  # counted as `find exporter/rankscope -name '*.py' | xargs cat | wc -l`
MODULE_LINES = 600
FUNCTION_LINES = 80
# A dashboard's build lists its panels: data, however long.
LONG_AS_DATA = "mixin/dashboards/"

# What a reader or the host daemon imports: nothing of these may pull in rankscope.rank.
READERS = [
    "rankscope.daemon.cli",
    "rankscope.daemon.app",
    "rankscope.record.reader",
    "rankscope.reports.census",
    "rankscope.reports.ledger",
    "rankscope.reports.oom",
    "rankscope.cli.boots",
    "rankscope.cli.census",
    "rankscope.cli.common",
    "rankscope.cli.oom",
    "rankscope.cli.phases",
    "rankscope.mixin.render",
]


def _loaded_after(module: str) -> list[str]:
    code = f"import sys, json, {module}; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return [m for m in json.loads(done.stdout) if m.startswith("rankscope")]


@pytest.mark.parametrize("module", READERS)
def test_readers_and_the_daemon_load_nothing_of_the_rank(module: str) -> None:
    loaded = _loaded_after(module)
    assert module in loaded
    assert [m for m in loaded if m == "rankscope.rank" or m.startswith("rankscope.rank.")] == []


def test_the_public_faces_are_the_rank_code() -> None:
    from rankscope import adapters, census, probe
    from rankscope.rank import adapters as rank_adapters
    from rankscope.rank import census as rank_census
    from rankscope.rank import probe as rank_probe

    assert probe.mark is rank_probe.mark
    assert probe.arenas is rank_probe.arenas
    assert census.count is rank_census.count
    assert census.tick is rank_census.tick
    assert adapters.install_import_hooks is rank_adapters.install_import_hooks
    assert sorted(census.__all__) == sorted(rank_census.__all__)


def _modules() -> dict[str, str]:
    return {str(p.relative_to(PACKAGE)): p.read_text() for p in sorted(PACKAGE.rglob("*.py"))}


def test_the_package_stays_within_its_line_budget() -> None:
    lines = sum(text.count("\n") for text in _modules().values())
    assert lines <= PACKAGE_LINES, f"{lines} lines of Python in exporter/rankscope"


def test_no_module_or_function_outgrows_its_size() -> None:
    too_long = []
    for name, text in _modules().items():
        if len(text.splitlines()) > MODULE_LINES:
            too_long.append(f"{name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > FUNCTION_LINES and not name.startswith(LONG_AS_DATA):
                too_long.append(f"{name}:{node.lineno} {node.name}: {length} lines")
    assert too_long == []

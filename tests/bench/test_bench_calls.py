"""The benches' calls into rankscope, checked without running them: many branches run only on
a GPU machine, where a renamed internal or a changed signature would fail first. Every name a
bench imports from rankscope, or reads off an imported rankscope module, must exist, and every
call of such a function must bind to its signature (argument counts and keyword names)."""

from __future__ import annotations

import ast
import importlib
import inspect
import types
from pathlib import Path
from typing import Any

import pytest

BENCHES = sorted((Path(__file__).resolve().parents[2] / "bench").glob("*.py"))
# bench_scrape_split reads an older checkout's exposition module when there is one
OPTIONAL = {"rankscope.daemon.exposition"}


def imported(tree: ast.AST, problems: list[str]) -> dict[str, Any]:
    """Local name -> the rankscope module or object a bench imports under it."""
    names: dict[str, Any] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rankscope")):
            continue
        assert node.module is not None
        if node.module in OPTIONAL:
            continue
        module = importlib.import_module(node.module)
        for alias in node.names:
            if hasattr(module, alias.name):
                names[alias.asname or alias.name] = getattr(module, alias.name)
            else:
                try:
                    names[alias.asname or alias.name] = importlib.import_module(
                        f"{node.module}.{alias.name}"
                    )
                except ImportError:
                    problems.append(f"line {node.lineno}: {node.module}.{alias.name} is gone")
    return names


def resolve(node: ast.expr, names: dict[str, Any], problems: list[str]) -> Any:
    """What ``a.b.c`` names when ``a`` is an imported rankscope module; None otherwise."""
    chain: list[str] = []
    while isinstance(node, ast.Attribute):
        chain.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in names:
        return None
    obj = names[node.id]
    for attr in reversed(chain):
        if not isinstance(obj, types.ModuleType):
            return None  # an attribute of a class or instance: its type says, not checked here
        try:
            obj = getattr(obj, attr)
        except AttributeError:
            try:
                obj = importlib.import_module(f"{obj.__name__}.{attr}")
            except ImportError:
                problems.append(f"line {node.lineno}: {obj.__name__}.{attr} is gone")
                return None
    return obj


@pytest.mark.parametrize("bench", BENCHES, ids=lambda p: p.name)
def test_a_benchs_rankscope_names_exist_and_its_calls_bind(bench: Path) -> None:
    tree = ast.parse(bench.read_text())
    problems: list[str] = []
    names = imported(tree, problems)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            resolve(node, names, problems)
        if not isinstance(node, ast.Call):
            continue
        fn = resolve(node.func, names, problems)
        if isinstance(node.func, ast.Name):
            fn = names.get(node.func.id)
        unpacked = any(isinstance(a, ast.Starred) for a in node.args) or any(
            k.arg is None for k in node.keywords
        )
        if fn is None or unpacked or isinstance(fn, types.ModuleType) or not callable(fn):
            continue
        try:
            signature = inspect.signature(fn)
        except (TypeError, ValueError):
            continue  # a builtin without one
        try:
            signature.bind(*node.args, **{k.arg: k.value for k in node.keywords if k.arg})
        except TypeError as exc:
            problems.append(f"line {node.lineno}: {ast.unparse(node.func)}(...): {exc}")
    assert not problems, f"{bench.name}: " + "; ".join(sorted(set(problems)))

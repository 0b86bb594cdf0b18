"""The adapters' hook points against the frameworks' real source, read with ``ast`` (nothing
of it imported). scripts/adapter-manifest.py runs :func:`extract` on each checked version's
released wheel to write ``manifest.json`` (beside this file), which
tests/rank/test_adapters_manifest.py checks each hook point against (:func:`check_point`); at
run time, a version that is not a checked one is checked against its installed source
(:func:`first_problem`). Manifest shape::

    {"frameworks": {"sglang": {"0.5.23": {
        "wheel": {"file": ..., "sha256": ...},
        "modules": {"sglang.srt...model_runner": {
            "functions": {"name": [[param, kind], ...]},
            "classes": {"ModelRunner": {
                "methods": {"load_model": {"params": [[param, kind], ...], "decorators": [...]}},
                "attributes": ["token_to_kv_pool", ...]}}}}}}}}

``params`` leave out ``self``; kind is ``positional_only``, ``positional``, ``var_positional``,
``keyword_only`` or ``var_keyword``.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.metadata
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from rankscope.rank.adapters.points import Adapter, HookPoint

MANIFEST_PATH = Path(__file__).with_name("manifest.json")
ENV_ADAPTERS = "RANKSCOPE_ADAPTERS"
CHECKED_ONLY = "checked-only"

Params = list[list[str]]


# --- reading the source ----------------------------------------------------------------------


def _params(args: ast.arguments, *, method: bool) -> Params:
    out: Params = [[a.arg, "positional_only"] for a in args.posonlyargs]
    out += [[a.arg, "positional"] for a in args.args]
    if method and out:
        out = out[1:]  # self (or cls)
    if args.vararg is not None:
        out.append([args.vararg.arg, "var_positional"])
    out += [[a.arg, "keyword_only"] for a in args.kwonlyargs]
    if args.kwarg is not None:
        out.append([args.kwarg.arg, "var_keyword"])
    return out


def _self_attributes(cls: ast.ClassDef) -> set[str]:
    """What the class assigns: ``x`` of any ``self.x`` in an assignment's target anywhere in
    it (``self.x[k] = v`` and ``self.x.y += v`` define x too), and names in its own body."""
    targets = [
        target
        for node in ast.walk(cls)
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign))
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
    ]
    names = {
        node.attr
        for target in targets
        for node in ast.walk(target)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    }
    for stmt in cls.body:  # class-level names and annotations
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def extract(
    source: str, members: Mapping[str, Iterable[str]], functions: Iterable[str]
) -> dict[str, Any]:
    """The manifest entry of one module's source: for each named class, the named members it
    defines (methods with their parameters and decorators, attributes), and the named
    module-level functions. A name the source does not define is simply absent."""
    out: dict[str, Any] = {"classes": {}, "functions": {}}
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name in members:
            want = set(members[node.name])
            methods = {
                item.name: {
                    "params": _params(item.args, method=True),
                    "decorators": [  # a decorator call by its callee's name
                        ast.unparse(d.func if isinstance(d, ast.Call) else d)
                        for d in item.decorator_list
                    ],
                }
                for item in node.body
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name in want
            }
            out["classes"][node.name] = {
                "methods": methods,
                "attributes": sorted(_self_attributes(node) & want),
            }
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in functions:
            out["functions"][node.name] = _params(node.args, method=False)
    return out


def wanted(adapter: Adapter) -> dict[str, tuple[dict[str, set[str]], set[str]]]:
    """module -> ({class: members}, functions) an adapter's hook points name."""
    out: dict[str, tuple[dict[str, set[str]], set[str]]] = {}
    for point in adapter.points:
        members, functions = out.setdefault(point.module, ({}, set()))
        if "." in point.qualname:
            cls, member = point.qualname.split(".", 1)
            members.setdefault(cls, set()).add(member)
        else:
            functions.add(point.qualname)
    return out


def module_path(module: str) -> str:
    """Where a module's source sits in a wheel (or a source tree): a/b/c.py."""
    return module.replace(".", "/") + ".py"


# --- checking hook points against it ---------------------------------------------------------


def _check_params(point: HookPoint, params: Params) -> list[str]:
    positional = [p for p, kind in params if kind in ("positional_only", "positional")]
    problems = []
    for name, position in point.params:
        if len(positional) > position and positional[position] == name:
            continue
        where = f"at position {position}" if position < len(positional) else "positionally"
        problems.append(
            f"{point.name} does not take {name!r} {where} "
            f"(the source has ({', '.join(p for p, _ in params)}))"
        )
    return problems


def check_point(point: HookPoint, module: dict[str, Any] | None) -> list[str]:
    """What is wrong with one hook point against one version's module entry ([]: nothing)."""
    if module is None:
        return [f"{point.name}: module {point.module} is not in the source"]
    if "." not in point.qualname:
        params = module["functions"].get(point.qualname)
        if params is None:
            return [f"{point.name}: no function {point.qualname}"]
        return _check_params(point, params)
    cls_name, member = point.qualname.split(".", 1)
    cls = module["classes"].get(cls_name)
    if cls is None:
        return [f"{point.name}: no class {cls_name}"]
    method = cls["methods"].get(member)
    if point.use == "read":
        if method is None and member not in cls["attributes"]:
            return [f"{point.name}: {cls_name} has no attribute or method {member}"]
        return []
    if method is None:
        return [f"{point.name}: {cls_name} defines no method {member}"]
    decorators = set(method["decorators"])
    if point.use in ("wrap", "count") and decorators & {"staticmethod", "classmethod", "property"}:
        return [f"{point.name}: {member} is decorated {sorted(decorators)}, not a plain method"]
    return _check_params(point, method["params"])


def unchecked_failure(adapter: Adapter, module: str) -> tuple[str, str] | None:
    """Why a version that is not a checked one cannot attach, or None: every hook point
    verified in its installed source. RANKSCOPE_ADAPTERS=checked-only: never attach."""
    if adapter.version is None:
        return module, f"no {adapter.distribution} distribution metadata: version unknown"
    if os.environ.get(ENV_ADAPTERS, "").strip().lower() == CHECKED_ONLY:
        why = f"{adapter.distribution} {adapter.version} is not a checked version"
        return module, f"{why} ({ENV_ADAPTERS}={CHECKED_ONLY})"
    return first_problem(adapter)


def _source_of(distribution: str, module: str) -> str | None:
    """The installed source of ``module``: in the distribution's files, else on sys.path."""
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
    adapter uses it; None when every one does (an optional one, read with a fallback, may not)."""
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

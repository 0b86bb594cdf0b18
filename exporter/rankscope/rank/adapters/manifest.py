"""The hook-point manifest: what the real source of each checked framework version defines
at the places the adapters use, extracted with ``ast`` (the framework is never imported),
and the check of the adapters' hook points against it.

scripts/adapter-manifest.py builds ``manifest.json`` (beside this file) from the released
wheels; tests/rank/test_adapters_manifest.py runs :func:`check` on it. Manifest shape::

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
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from rankscope.rank.adapters.points import Adapter, HookPoint

MANIFEST_PATH = Path(__file__).with_name("manifest.json")

Params = list[list[str]]


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


def _decorator(node: ast.expr) -> str:
    if isinstance(node, ast.Call):
        node = node.func
    try:
        return ast.unparse(node)
    except Exception:
        return "?"


def _self_attributes(cls: ast.ClassDef) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(cls):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        for target in targets:
            for t in ast.walk(target):
                if (
                    isinstance(t, ast.Attribute)
                    and isinstance(t.value, ast.Name)
                    and t.value.id == "self"
                ):
                    names.add(t.attr)
    for stmt in cls.body:  # class-level names and annotations
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            names.add(stmt.target.id)
        elif isinstance(stmt, ast.Assign):
            names.update(t.id for t in stmt.targets if isinstance(t, ast.Name))
    return names


def extract(
    source: str, members: Mapping[str, Iterable[str]], functions: Iterable[str]
) -> dict[str, Any]:
    """The manifest entry of one module's source: for each named class, the named members it
    defines (methods with their parameters and decorators, attributes), and the named
    module-level functions. A name the source does not define is simply absent."""
    tree = ast.parse(source)
    want_functions = set(functions)
    out: dict[str, Any] = {"classes": {}, "functions": {}}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in members:
            want = set(members[node.name])
            methods: dict[str, Any] = {}
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name in want:
                    methods[item.name] = {
                        "params": _params(item.args, method=True),
                        "decorators": [_decorator(d) for d in item.decorator_list],
                    }
            out["classes"][node.name] = {
                "methods": methods,
                "attributes": sorted(_self_attributes(node) & want),
            }
        elif (
            isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.name in want_functions
        ):
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


def _check_params(point: HookPoint, params: Params) -> list[str]:
    problems = []
    for name, position in point.params:
        positional = [p for p, kind in params if kind in ("positional_only", "positional")]
        if len(positional) > position and positional[position] == name:
            continue
        where = f"at position {position}" if position < len(positional) else "positionally"
        problems.append(
            f"{point.name} does not take {name!r} {where} "
            f"(the source has ({', '.join(p for p, _ in params)}))"
        )
    return problems


def check_point(point: HookPoint, module: dict[str, Any] | None) -> list[str]:
    """What is wrong with one hook point against one version's module entry ([] when
    nothing is)."""
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


def check(adapter: Adapter, manifest: dict[str, Any]) -> list[str]:
    """Every hook point of ``adapter`` against every version it declares checked; each
    problem names the version and the point. [] when all are present and compatible."""
    versions = manifest.get("frameworks", {}).get(adapter.framework, {})
    problems = []
    optional_seen: set[HookPoint] = set()
    for version in adapter.checked_versions:
        entry = versions.get(version)
        if entry is None:
            problems.append(f"{adapter.framework} {version}: not in the manifest")
            continue
        for point in adapter.points:
            module = entry["modules"].get(point.module)
            if point.optional:
                if not _defines(module, point):
                    continue  # read with a fallback where the version lacks it
                optional_seen.add(point)
            problems.extend(
                f"{adapter.framework} {version}: {p}" for p in check_point(point, module)
            )
    for point in adapter.points:
        if point.optional and point not in optional_seen:
            problems.append(f"{adapter.framework}: {point.name} is in no checked version")
    return problems


def _defines(module: dict[str, Any] | None, point: HookPoint) -> bool:
    if module is None:
        return False
    if "." not in point.qualname:
        return point.qualname in module["functions"]
    cls_name, member = point.qualname.split(".", 1)
    cls = module["classes"].get(cls_name)
    return cls is not None and (member in cls["methods"] or member in cls["attributes"])


def load(path: str | Path = MANIFEST_PATH) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        data: dict[str, Any] = json.load(f)
    return data


def module_path(module: str) -> str:
    """Where a module's source sits in a wheel (or a source tree): a/b/c.py."""
    return module.replace(".", "/") + ".py"

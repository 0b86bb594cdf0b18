"""Reading an adapter's hook points out of a framework's Python source with ``ast``, never
importing it: scripts/adapter-manifest.py builds the manifest from the released wheels with
it, and an adapter on a version that is not a checked one verifies the installed source
with it at run time (rankscope.rank.adapters.manifest)."""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rankscope.rank.adapters.points import Adapter

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


def _self_attributes(cls: ast.ClassDef) -> set[str]:
    """What the class assigns: ``self.x`` anywhere in it, and names in its own body."""
    names = {
        node.attr
        for node in ast.walk(cls)
        if isinstance(node, ast.Attribute)
        and isinstance(node.ctx, ast.Store)
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
                        "decorators": [  # a decorator call by its callee's name
                            ast.unparse(d.func if isinstance(d, ast.Call) else d)
                            for d in item.decorator_list
                        ],
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


def module_path(module: str) -> str:
    """Where a module's source sits in a wheel (or a source tree): a/b/c.py."""
    return module.replace(".", "/") + ".py"

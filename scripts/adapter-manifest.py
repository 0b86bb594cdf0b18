#!/usr/bin/env python3
"""Build exporter/rankscope/rank/adapters/manifest.json from the real wheels of the framework
versions each adapter declares checked.

    python scripts/adapter-manifest.py                 # download (cached), extract, write
    python scripts/adapter-manifest.py --check         # extract again, fail if it differs
    python scripts/adapter-manifest.py --cache /tmp/w  # where wheels are kept (default /tmp)

Each wheel is fetched with ``pip download --no-deps --only-binary=:all:`` (vLLM's are a few
hundred MB: downloaded once into the cache), its sha256 recorded, and only the .py files of
the hooked modules are read out of the zip and parsed with ``ast``; nothing is installed or
imported, and no framework source is written anywhere but the manifest's signatures. The
manifest's shape is in exporter/rankscope/rank/adapters/manifest.py, which checks it.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import subprocess
import sys
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "exporter"))

from rankscope.rank.adapters import ADAPTERS  # noqa: E402
from rankscope.rank.adapters.manifest import MANIFEST_PATH, Params  # noqa: E402
from rankscope.rank.adapters.points import Adapter  # noqa: E402

# One wheel per version whatever interpreter runs this script (SGLang publishes one per
# CPython version, with the same Python source): CPython 3.11 on x86-64 Linux.
WHEEL_TAGS = (
    "--python-version=3.11",
    "--implementation=cp",
    "--abi=cp311",
    "--abi=abi3",
    "--platform=manylinux_2_34_x86_64",
    "--platform=manylinux_2_28_x86_64",
)


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


def module_path(module: str) -> str:
    """Where a module's source sits in a wheel (or a source tree): a/b/c.py."""
    return module.replace(".", "/") + ".py"


def wheel_for(distribution: str, version: str, cache: Path) -> Path:
    target = cache / f"{distribution}-{version}"
    found = sorted(target.glob("*.whl"))
    if not found:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary=:all:",
                *WHEEL_TAGS,
                "--quiet",
                f"{distribution}=={version}",
                "-d",
                str(target),
            ],
            check=True,
        )
        found = sorted(target.glob("*.whl"))
    if len(found) != 1:
        raise SystemExit(f"expected one wheel in {target}, found {[p.name for p in found]}")
    return found[0]


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def build(cache: Path) -> dict[str, object]:
    frameworks: dict[str, object] = {}
    for adapter in ADAPTERS:
        versions: dict[str, object] = {}
        for version in adapter.checked_versions:
            wheel = wheel_for(adapter.distribution, version, cache)
            modules: dict[str, object] = {}
            with zipfile.ZipFile(wheel) as zf:
                names = set(zf.namelist())
                for module, (classes, functions) in sorted(wanted(adapter).items()):
                    path = module_path(module)
                    if path not in names:
                        continue  # absent: the check reports every point of it
                    source = zf.read(path).decode("utf-8")
                    modules[module] = extract(source, classes, functions)
            versions[version] = {
                "wheel": {"file": wheel.name, "sha256": sha256(wheel)},
                "modules": modules,
            }
            print(f"{adapter.framework} {version}: {wheel.name}", file=sys.stderr)
        frameworks[adapter.framework] = versions
    return {
        "about": "Hook points of the rankscope adapters as the released wheels define them; "
        "generated by scripts/adapter-manifest.py, do not edit.",
        "frameworks": frameworks,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", type=Path, default=Path("/tmp/rankscope-wheels"))
    parser.add_argument("--out", type=Path, default=MANIFEST_PATH)
    parser.add_argument("--check", action="store_true", help="fail when --out is not current")
    args = parser.parse_args()
    text = json.dumps(build(args.cache), indent=1, sort_keys=True) + "\n"
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.exists() else ""
        if current != text:
            print(f"{args.out} is not what the wheels say: run {sys.argv[0]}", file=sys.stderr)
            return 1
        print(f"{args.out} matches the wheels", file=sys.stderr)
        return 0
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""rankscope-auto.pth lands in site-packages with a regular and with an editable install,
and from an sdist, and arms a process there: wheels built by setuptools' own PEP 517 / 660
hooks from a copy of this checkout (or from the sdist built from it), installed by pip into
fresh venvs (no index, no dependencies), then run. The wheel is pure Python."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PTH = ROOT / "exporter" / "rankscope-auto.pth"

BUILD = """\
import sys
from setuptools import build_meta
hooks = {
    "editable": build_meta.build_editable,
    "wheel": build_meta.build_wheel,
    "sdist": build_meta.build_sdist,
}
print(hooks[sys.argv[1]](sys.argv[2]))
"""


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the checkout's packaging inputs: building writes build/ and egg-info
    beside the sources, and the checkout's build/ is a shared symlink."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "setup.py", "README.md", "MANIFEST.in"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(
        ROOT / "exporter",
        src / "exporter",
        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"),
    )
    return src


def build(source: Path, kind: str, out: Path) -> Path:
    out.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", BUILD, kind, str(out)],
        cwd=source,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return out / done.stdout.strip().splitlines()[-1]


def install(wheel: Path, venv: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "--no-deps",
            "--no-index",
            "--quiet",
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (site,) = venv.glob("lib/python*/site-packages")
    return site


@pytest.mark.parametrize("kind", ["wheel", "editable", "sdist"])
def test_the_pth_lands_in_site_packages_and_arms(source: Path, tmp_path: Path, kind: str):
    if kind == "sdist":  # the wheel pip would build from the sdist, as from PyPI
        sdist = build(source, "sdist", tmp_path / "sdist")
        with tarfile.open(sdist) as tf:
            tf.extractall(tmp_path / "unpacked", filter="data")
        (unpacked,) = (tmp_path / "unpacked").iterdir()
        wheel = build(unpacked, "wheel", tmp_path / "dist")
    else:
        wheel = build(source, kind, tmp_path / "dist")
    with zipfile.ZipFile(wheel) as zf:
        assert zf.read(PTH.name) == PTH.read_bytes()  # at the wheel's root: purelib
        names = zf.namelist()
    assert not [n for n in names if n.endswith((".c", ".so"))], names  # pure Python
    assert wheel.name.endswith("-py3-none-any.whl"), wheel.name
    site = install(wheel, tmp_path / "venv")
    assert (site / PTH.name).read_bytes() == PTH.read_bytes()
    python = str(tmp_path / "venv" / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANKSCOPE_", "PYTHON"))}
    flight = tmp_path / "flight"
    # Unarmed: nothing of rankscope is imported. Armed: a process_start mark, and the
    # installed copy (not this checkout) did it.
    check = "import sys, rankscope; print(json.dumps([rankscope.__file__, 'rankscope.rank.auto' in sys.modules]))"
    unarmed = subprocess.run(
        [python, "-c", "import json; " + check], env=env, capture_output=True, text=True, timeout=60
    )
    where, armed_then = json.loads(unarmed.stdout)
    assert armed_then is False
    assert Path(where).is_relative_to(source if kind == "editable" else site)
    armed = subprocess.run(
        [python, "-c", "import json; " + check],
        env={**env, "RANKSCOPE_AUTO": "1", "RANKSCOPE_DIR": str(flight)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert json.loads(armed.stdout)[1] is True, armed.stderr
    lines = [json.loads(line) for f in flight.glob("marks-*.jsonl") for line in f.open()]
    assert [r["phase"] for r in lines] == ["process_start", "process_exit"]

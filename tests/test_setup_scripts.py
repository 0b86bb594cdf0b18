"""The set-up scripts (README's two commands) install into .venv, never the system Python.

A static check on the scripts, plus a real run of scripts/venv.sh in a scratch copy of the
repository: the interpreter it hands back lives in that copy's .venv.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = [ROOT / "scripts" / name for name in ("test.sh", "demo.sh", "venv.sh")]

# Any way of reaching an interpreter's pip other than the venv's "$PY".
SYSTEM_PIP = [
    re.compile(r"\bpython3?(\.\d+)?\s+-m\s+pip\b"),
    re.compile(r"(^|[;&|(]\s*|\bsudo\s+)pip3?\s"),
    re.compile(r"\bpip3?\s+install\b.*--user\b"),
    re.compile(r"--break-system-packages"),
]


def code_lines(path: Path) -> list[str]:
    lines = []
    for line in path.read_text().splitlines():
        stripped = line.split("#", 1)[0] if not line.lstrip().startswith("#!") else ""
        if stripped.strip():
            lines.append(stripped)
    return lines


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_no_script_reaches_the_system_pip(script: Path) -> None:
    offending = [line for line in code_lines(script) if any(p.search(line) for p in SYSTEM_PIP)]
    assert offending == [], f"{script.name} installs outside .venv: {offending}"


def test_every_install_goes_through_the_venv_interpreter() -> None:
    venv = code_lines(ROOT / "scripts" / "venv.sh")
    assert any(re.search(r'PY="\$VENV/bin/python"', line) for line in venv)
    installs = [line for line in venv if "pip install" in line]
    assert installs and all('"$PY" -m pip install' in line for line in installs), installs
    for name in ("test.sh", "demo.sh"):
        lines = code_lines(ROOT / "scripts" / name)
        assert any(line.strip() == "source scripts/venv.sh" for line in lines), name
        runs = [line for line in lines if re.search(r"\b(pytest|mypy|ruff|rankscope)\b", line)]
        runs = [
            line
            for line in runs
            if "venv_install" not in line and not line.lstrip().startswith("echo ")
        ]
        assert runs and all(line.lstrip().startswith(('"$PY"', 'exec "$PY"')) for line in runs), (
            name,
            runs,
        )


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_venv_script_builds_its_venv_inside_the_checkout(tmp_path: Path) -> None:
    # RANKSCOPE_PYTHON with --system-site-packages sees this interpreter's torch (or none is
    # needed to prove where the venv goes), so nothing is downloaded.
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "venv.sh", tmp_path / "scripts" / "venv.sh")
    probe = 'source scripts/venv.sh && "$PY" -c "import sys; print(sys.prefix)"'
    if importlib.util.find_spec("torch") is None:
        pytest.skip("this interpreter has no torch; the script would download one")
    out = subprocess.run(
        ["bash", "-c", probe],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "RANKSCOPE_PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert Path(out.stdout.strip()).resolve() == (tmp_path / ".venv").resolve()


def test_test_sh_installs_npm_before_it_runs_npm() -> None:
    """A fresh Debian has no npm: test.sh installs Debian's package where npm is missing,
    before its `npm install` (it used to run `npm install` on the assumption)."""
    lines = [line.strip() for line in code_lines(ROOT / "scripts" / "test.sh")]
    runs = next(i for i, line in enumerate(lines) if line.startswith("npm install"))
    installs = [
        i
        for i, line in enumerate(lines)
        if "apt-get install" in line and re.search(r"\snpm(\s|$)", line)
    ]
    assert installs and installs[0] < runs, lines
    guard = lines[installs[0] - 1]
    assert guard == "if ! command -v npm >/dev/null; then", guard


def test_the_venv_gets_numpy_beside_torch() -> None:
    """torch's wheels do not require numpy, and without it every process that imports torch
    warns "Failed to initialize NumPy" (tests/rank/test_run.py checks a real one)."""
    venv = code_lines(ROOT / "scripts" / "venv.sh")
    assert any(re.search(r'pip_install "numpy[>=<]', line) for line in venv), venv
    assert "find_spec('numpy')" in "\n".join(venv)
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^torch = \["torch>=[\d.]+", "numpy>=[\d.]+"\]$', pyproject, re.M)

"""`rankscope run` and the .pth arming, as a shell user meets them: a script with no `#!`
line runs as the shell runs it, and each warning of the arming is said once. Real
processes in a venv that holds rankscope-auto.pth (tests/support/armed_venv.py); site.py
of a venv runs that .pth line twice, as on a user's machine."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from tests.support.armed_venv import ArmedVenv, make_armed_venv


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> ArmedVenv:
    return make_armed_venv(tmp_path_factory.mktemp("venv") / "armed")


def run(venv: ArmedVenv, *argv: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        list(argv), cwd=cwd, env=venv.env(**env), capture_output=True, text=True, timeout=120
    )


def test_a_script_with_no_interpreter_line_runs_as_the_shell_runs_it(
    venv: ArmedVenv, tmp_path: Path
) -> None:
    script = tmp_path / "job"
    script.write_text('echo "args: $*"\nexit 7\n')  # no #! line
    script.chmod(0o755)
    bare = run(venv, "bash", "-c", "./job a 'b c'", cwd=tmp_path)
    assert (bare.returncode, bare.stdout) == (7, "args: a b c\n")
    flight = str(tmp_path / "flight")
    armed = run(venv, venv.python, "-m", "rankscope", "run", "--dir", flight, "--",
                "./job", "a", "b c", cwd=tmp_path)  # fmt: skip
    assert (armed.returncode, armed.stdout, armed.stderr) == (7, "args: a b c\n", "")


def test_a_binary_the_kernel_cannot_run_is_still_refused(venv: ArmedVenv, tmp_path: Path) -> None:
    binary = tmp_path / "foreign"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00junk for another machine\n")
    binary.chmod(0o755)
    flight = str(tmp_path / "flight")
    armed = run(venv, venv.python, "-m", "rankscope", "run", "--dir", flight, "--", "./foreign",
                cwd=tmp_path)  # fmt: skip
    assert armed.returncode == 126  # what bash says too: "cannot execute binary file"
    assert armed.stderr == "rankscope run: ./foreign: Exec format error\n"


def test_each_warning_of_the_arming_is_said_once(venv: ArmedVenv, tmp_path: Path) -> None:
    done = run(venv, venv.python, "-c", "pass", cwd=tmp_path, RANKSCOPE_AUTO="1")
    assert done.returncode == 0
    assert done.stderr == (
        "rankscope: RANKSCOPE_AUTO is set without RANKSCOPE_DIR; nothing is recorded\n"
    )


def test_a_sample_interval_under_the_shortest_is_raised_to_it_and_said_once(
    venv: ArmedVenv, tmp_path: Path
) -> None:
    """RANKSCOPE_SAMPLE_EVERY=1e-9 wrote about 9,400 sample lines a second. Now the sampler
    waits 0.1 s between samples, and the process says so once."""
    flight = tmp_path / "flight"
    # start() is idempotent: it hands back the sampler the arming started at `import torch`.
    program = (
        "import torch\nfrom rankscope.rank.probe import samples\nprint(samples.start().every_s)\n"
    )
    done = run(venv, venv.python, "-m", "rankscope", "run", "--dir", str(flight), "--",
               venv.python, "-c", program, cwd=tmp_path, RANKSCOPE_SAMPLE_EVERY="1e-9")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == "0.1\n"
    said = [line for line in done.stderr.splitlines() if "RANKSCOPE_SAMPLE_EVERY" in line]
    assert said == [
        "rankscope: RANKSCOPE_SAMPLE_EVERY=1e-09 is below the shortest interval; "
        "sampling every 0.1 s"
    ]

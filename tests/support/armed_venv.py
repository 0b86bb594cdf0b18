"""A virtual environment that holds rankscope-auto.pth in its site-packages, as a pip
install puts it there (tests/rank/test_run_install.py proves that both wheels carry it).

Built without pip in a fraction of a second: a venv whose site-packages holds the .pth of
this checkout (``exporter/rankscope-auto.pth``, the file setup.py installs) and a path line
to the running interpreter's site-packages, for torch. site.py processes both at every
start of the venv's python, exactly as on a user's machine; the tests' own interpreter has
no such .pth and stays unarmed.
"""

from __future__ import annotations

import os
import site as pysite
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXPORTER = ROOT / "exporter"
PTH = EXPORTER / "rankscope-auto.pth"


@dataclass(frozen=True)
class ArmedVenv:
    root: Path

    @property
    def python(self) -> str:
        return str(self.root / "bin" / "python")

    @property
    def bin(self) -> Path:
        return self.root / "bin"

    def rankscope(self, *args: str) -> list[str]:
        """The command line of `rankscope ARGS` run by this venv's python."""
        return [self.python, "-m", "rankscope", *args]

    def run_under_rankscope(self, flight: Path, *command: str) -> list[str]:
        """The command line of `rankscope run --dir FLIGHT -- COMMAND`."""
        return self.rankscope("run", "--dir", str(flight), "--", *command)

    def env(self, **extra: str) -> dict[str, str]:
        """The environment a user's shell would give: the venv's bin first on PATH, this
        checkout's rankscope importable, nothing of rankscope's armed."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("RANKSCOPE_")}
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', os.defpath)}"
        env["PYTHONPATH"] = str(EXPORTER)
        env["OMP_NUM_THREADS"] = "1"
        env.pop("VIRTUAL_ENV", None)
        env.update(extra)
        return env


def make_armed_venv(where: Path) -> ArmedVenv:
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(where)], check=True, timeout=60
    )
    venv = ArmedVenv(where)
    site_dirs = list(where.glob("lib/python*/site-packages"))
    assert len(site_dirs) == 1, site_dirs
    site = site_dirs[0]
    # Every site directory of the running interpreter, as path lines (a missing one is
    # skipped by site.py): torch may live in site-packages or in Debian's dist-packages.
    host_dirs = [
        *pysite.getsitepackages(),
        pysite.getusersitepackages(),
        sysconfig.get_paths()["purelib"],
    ]
    (site / "host-packages.pth").write_text("".join(d + "\n" for d in host_dirs))
    (site / PTH.name).write_bytes(PTH.read_bytes())
    # torchrun, as the torch wheel installs it, run by the venv's python.
    (venv.bin / "torchrun").write_text(
        f"#!{venv.python}\nimport sys\nfrom torch.distributed.run import main\nsys.exit(main())\n"
    )
    (venv.bin / "torchrun").chmod(0o755)
    return venv

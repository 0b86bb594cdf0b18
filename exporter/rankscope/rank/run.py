"""`rankscope run [--dir DIR] [--boot-id ID] [--no-census] [--compare] -- COMMAND [ARGS...]`.

Sets RANKSCOPE_AUTO=1, RANKSCOPE_DIR and one RANKSCOPE_BOOT_ID for the whole run, then
replaces itself with COMMAND (execve): pid, exit status, output, signals and terminal are
COMMAND's own. ``rankscope-auto.pth`` arms each Python process inheriting the environment."""

from __future__ import annotations

import argparse
import errno
import os
import shutil
import signal
import site
import sys
import tempfile
from pathlib import Path

from rankscope.rank.writer import ENV_BOOT_ID, ENV_DIR, resolve_boot_id

PTH_NAME = "rankscope-auto.pth"
NOT_FOUND = 127
NOT_EXECUTABLE = 126
USAGE = 2
SHELL = "/bin/sh"
# What a wrong flag most likely meant (the reader commands' and the daemon's spellings).
SYNONYMS = {"--flight-dir": "--dir", "--flight.dir": "--dir", "--boot": "--boot-id"}


def configure_parser(parser: argparse.ArgumentParser, name: str) -> None:
    parser.description = (
        "Run COMMAND with every Python process it starts instrumented: the process itself, "
        "torchrun workers, multiprocessing children, Python subprocesses. Exits with "
        "COMMAND's status (2: bad usage or an unwritable DIR; 127: COMMAND not found)."
    )
    parser.add_argument(
        "--dir",
        metavar="DIR",
        default=os.environ.get(ENV_DIR),
        help="the flight directory, created if missing (default: $RANKSCOPE_DIR)",
    )
    parser.add_argument(
        "--boot-id",
        metavar="ID",
        help="the boot id every process records under (default: $RANKSCOPE_BOOT_ID or "
        "$TORCHELASTIC_RUN_ID, else one new id for this run)",
    )
    parser.add_argument(
        "--no-census", action="store_true", help="do not count collectives (RANKSCOPE_CENSUS=0)"
    )
    parser.add_argument(
        "--compare",
        action="store_true",
        help="compare the census across ranks in the job, over a gloo group of rankscope's "
        "own (RANKSCOPE_COMPARE=1)",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARGS...]")


def fail(message: str, status: int) -> int:
    print(f"rankscope run: {message}", file=sys.stderr)
    return status


def writable_dir(path: str) -> str | None:
    """None when ``path`` is (now) a writable directory, else why not."""
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def hook_installed() -> bool:
    """Whether this interpreter's site-packages (or user site) hold the arming .pth."""
    dirs = [*site.getsitepackages(), site.getusersitepackages()]
    return any(Path(d, PTH_NAME).is_file() for d in dirs)


def child_environment(
    environ: dict[str, str], flight_dir: str, boot_id: str | None, census: bool, compare: bool
) -> dict[str, str]:
    env = dict(environ)
    env["RANKSCOPE_AUTO"] = "1"
    env[ENV_DIR] = str(Path(flight_dir).resolve())
    env[ENV_BOOT_ID] = boot_id or resolve_boot_id(environ, os.getpid())
    if not census:
        env["RANKSCOPE_CENSUS"] = "0"
    if compare:
        env["RANKSCOPE_COMPARE"] = "1"
    return env


def main(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        return fail("no command given: rankscope run [--dir DIR] -- COMMAND [ARGS...]", USAGE)
    if not args.dir:
        return fail("no flight directory: give --dir DIR or set RANKSCOPE_DIR", USAGE)
    if (why := writable_dir(args.dir)) is not None:
        return fail(f"cannot write the flight directory {args.dir}: {why}", USAGE)
    env = child_environment(
        dict(os.environ), args.dir, args.boot_id, census=not args.no_census, compare=args.compare
    )
    program = shutil.which(command[0], path=env.get("PATH", os.defpath))
    if program is None:
        if os.sep in command[0] and os.path.exists(command[0]):
            return fail(f"{command[0]}: permission denied", NOT_EXECUTABLE)
        return fail(f"{command[0]}: command not found", NOT_FOUND)
    if not hook_installed():
        print(
            f"rankscope run: {PTH_NAME} is not in this Python's site-packages, so Python "
            "processes are not armed; install rankscope with pip (pip install -e . is fine)",
            file=sys.stderr,
        )
    sys.stdout.flush()
    sys.stderr.flush()
    # Python ignores SIGPIPE and SIGXFSZ for itself, and an ignored signal survives exec:
    # give COMMAND the default actions, as subprocess's restore_signals does.
    for ignored in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(ignored, signal.SIG_DFL)
    try:
        os.execve(program, command, env)
    except OSError as exc:
        if exc.errno != errno.ENOEXEC or not is_text(program):
            return fail(f"{command[0]}: {exc.strerror or exc}", NOT_EXECUTABLE)
    # An executable script with no #! line: run by /bin/sh, as a shell and execvp run it.
    try:
        os.execve(SHELL, [SHELL, program, *command[1:]], env)
    except OSError as exc:
        return fail(f"{command[0]}: {exc.strerror or exc}", NOT_EXECUTABLE)


def is_text(program: str) -> bool:
    """Whether ``program`` is a script by a shell's test: no NUL byte in its first line."""
    try:
        with open(program, "rb") as f:
            return b"\0" not in f.read(256).split(b"\n", 1)[0]
    except OSError:
        return False

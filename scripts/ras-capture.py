#!/usr/bin/env python3
"""Capture real NCCL RAS replies on a GPU machine (the fixtures of tests/fixtures/nccl_ras).

Starts real one-process NCCL jobs (torch.distributed, world size 1) with RAS
enabled, speaks NCCL's RAS client protocol to their endpoint from this process,
and saves every raw reply byte-for-byte under --out, named with the NCCL
version (ras-<ver>-status.txt, ras-<ver>-verbose.txt, ras-<ver>-status.json ...).

Protocol (NCCL src/ras/client.cc, src/ras/client_support.cc; docs/nccl-ras-notes.md):
one TCP connection per report; optional "CLIENT PROTOCOL 2\\n" -> "SERVER PROTOCOL 2\\n";
optional "TIMEOUT <s>\\n" -> "OK\\n"; optional "SET FORMAT json|text\\n" -> "OK\\n"
(NCCL >= 2.28.7, older: "ERROR: Unknown command ...\\n"); then "STATUS\\n" or
"VERBOSE STATUS\\n": the report follows and the server closes the connection.

Jobs: A (RAS on, default address, two communicators: the default group plus a
second group), then at once B (RAS on, default address: a second job on one
host; NCCL binds with SO_REUSEPORT, so A and B may share the port), C (RAS on,
NCCL_RAS_ADDR on another port) and D (NCCL_RAS_ENABLE=0, its own address:
expected "connection refused"). Every process gets NCCL_NVLS_ENABLE=0.
Everything finishes within --budget + 11 seconds (default 70 + 11); no step blocks.

Usage on the GPU machine:  python3 scripts/ras-capture.py --out $OUT
Stdlib + torch only.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

RAS_DEFAULT_PORT = 28028  # NCCL_RAS_CLIENT_PORT in src/ras/ras_internal.h
RAS_CLIENT_PROTOCOL = 2  # NCCL_RAS_CLIENT_PROTOCOL, unchanged 2.24 .. 2.30
# A report waits at most RAS_COLLECTIVE_LEG_TIMEOUT_SEC + RAS_COLLECTIVE_EXTRA_TIMEOUT_SEC
# (5 + 5 s) for other processes; one process should answer at once.
REPORT_READ_TIMEOUT_S = 12.0
REPLY_CAP_BYTES = 16 << 20


# ---------------------------------------------------------------- job side


def run_job(args: argparse.Namespace) -> int:
    """One-process NCCL job: init, a few collectives, then keep the comms alive."""
    import torch
    import torch.distributed as dist

    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    dist.init_process_group(
        "nccl", init_method=f"file://{args.init_file}", rank=0, world_size=1, device_id=dev
    )
    x = torch.ones(1 << 16, device=dev)
    for _ in range(3):
        dist.all_reduce(x)
    out = [torch.empty_like(x)]
    dist.all_gather(out, x)
    dist.broadcast(x, src=0)
    group2 = None
    if args.two_comms:
        # A second communicator in the same process: RAS should list both.
        group2 = dist.new_group([0])
        dist.all_reduce(x, group=group2)
    torch.cuda.synchronize()
    Path(args.ready_file).write_text(str(os.getpid()))
    print(f"job {args.job}: pid {os.getpid()} ready", flush=True)
    stop = Path(args.stop_file)
    deadline = time.monotonic() + args.hold
    n = 0
    while time.monotonic() < deadline and not stop.exists():
        dist.all_reduce(x)  # keep counts moving so RAS has live communicators
        n += 1
        time.sleep(0.2)
    torch.cuda.synchronize()
    if group2 is not None:
        dist.destroy_process_group(group2)
    dist.destroy_process_group()
    print(f"job {args.job}: {n} extra all_reduce, exiting", flush=True)
    return 0


# ---------------------------------------------------------------- client side


@dataclass
class Exchange:
    """One RAS connection: what was sent and the raw bytes that came back."""

    name: str
    port: int
    sent: list[str] = field(default_factory=list)
    replies: list[bytes] = field(default_factory=list)
    report: bytes = b""
    error: str | None = None
    seconds: float = 0.0


def _read_line(sock: socket.socket, deadline: float) -> bytes:
    buf = b""
    while not buf.endswith(b"\n"):
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        chunk = sock.recv(4096)
        if not chunk:
            break
        buf += chunk
    return buf


def _read_to_eof(sock: socket.socket, deadline: float, ex: Exchange) -> None:
    """Append to ex.report as bytes arrive, so a timeout keeps the partial report."""
    while len(ex.report) < REPLY_CAP_BYTES:
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        chunk = sock.recv(65536)
        if not chunk:
            return
        ex.report += chunk
    ex.error = f"report cut at {REPLY_CAP_BYTES} bytes"


def ras_exchange(
    name: str,
    port: int,
    setup: list[str],
    final: str | None,
    budget_end: float,
    host: str = "localhost",  # as NCCL resolves its default address
) -> Exchange:
    """Send `setup` lines (each answered by one line), then `final`, read to EOF."""
    ex = Exchange(name, port)
    t0 = time.monotonic()
    deadline = min(budget_end, t0 + 3.0 + REPORT_READ_TIMEOUT_S)
    try:
        with socket.create_connection((host, port), timeout=2.0) as sock:
            for line in setup:
                sock.sendall(line.encode() + b"\n")
                ex.sent.append(line)
                ex.replies.append(_read_line(sock, min(deadline, time.monotonic() + 3.0)))
            if final is not None:
                sock.sendall(final.encode() + b"\n")
                ex.sent.append(final)
                _read_to_eof(sock, deadline, ex)
    except OSError as e:  # refused, reset, timeout: recorded, never raised
        ex.error = f"{type(e).__name__}: {e}"
    ex.seconds = time.monotonic() - t0
    return ex


# ---------------------------------------------------------------- driver


@dataclass
class Job:
    name: str
    proc: subprocess.Popen[bytes]
    ready_file: Path
    stop_file: Path


def nccl_version_string() -> str:
    import torch

    v = torch.cuda.nccl.version()
    if isinstance(v, tuple):
        return ".".join(str(p) for p in v)
    # Older torch: one int, major*10000 + minor*100 + patch (>= 2.9) or *1000 before.
    major, rest = divmod(int(v), 10000)
    return f"{major}.{rest // 100}.{rest % 100}"


def nccl_library_paths() -> list[str]:
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return []
    return sorted({ln.split()[-1] for ln in maps.splitlines() if "libnccl" in ln})


def start_job(name: str, out: Path, env_extra: dict[str, str], two_comms: bool, hold: float) -> Job:
    work = out / "work"
    work.mkdir(parents=True, exist_ok=True)
    init_file = work / f"init-{name}"
    init_file.unlink(missing_ok=True)
    ready, stop = work / f"ready-{name}", work / f"stop-{name}"
    ready.unlink(missing_ok=True)
    stop.unlink(missing_ok=True)
    env = dict(os.environ)
    env.update(
        NCCL_NVLS_ENABLE="0",
        NCCL_DEBUG="INFO",
        NCCL_DEBUG_SUBSYS="INIT,RAS",
        NCCL_DEBUG_FILE=str(out / f"nccl-job{name}.%h.%p.log"),
    )
    env.update(env_extra)
    cmd = [sys.executable, os.path.abspath(__file__), "--job", name, "--init-file", str(init_file)]
    cmd += ["--ready-file", str(ready), "--stop-file", str(stop), "--hold", str(hold)]
    if two_comms:
        cmd.append("--two-comms")
    log = open(out / f"job{name}.log", "wb")  # noqa: SIM115 (child owns it)
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    (out / f"job{name}.env").write_text(
        "".join(f"{k}={v}\n" for k, v in sorted(env.items()) if k.startswith("NCCL_"))
    )
    return Job(name, proc, ready, stop)


def wait_ready(jobs: list[Job], until: float) -> dict[str, str]:
    """Per job: 'ready', 'exited rc=N' or 'not ready (timeout)'."""
    state: dict[str, str] = {}
    while time.monotonic() < until:
        for j in jobs:
            if j.name in state:
                continue
            if j.ready_file.exists():
                state[j.name] = "ready"
            elif j.proc.poll() is not None:
                state[j.name] = f"exited rc={j.proc.returncode}"
        if len(state) == len(jobs):
            return state
        time.sleep(0.2)
    for j in jobs:
        state.setdefault(j.name, "not ready (timeout)")
    return state


def stop_jobs(jobs: list[Job]) -> dict[str, str]:
    for j in jobs:
        j.stop_file.touch()
    end = time.monotonic() + 6.0
    result: dict[str, str] = {}
    for j in jobs:
        try:
            j.proc.wait(timeout=max(0.1, end - time.monotonic()))
            result[j.name] = f"exited rc={j.proc.returncode}"
        except subprocess.TimeoutExpired:
            j.proc.kill()
            j.proc.wait(timeout=5)
            result[j.name] = "killed (did not stop in time)"
    return result


def save(out: Path, ver: str, ex: Exchange, summary: list[dict[str, object]]) -> None:
    """Write the exchange's raw bytes: replies to setup lines and the report."""
    base = f"ras-{ver}-{ex.name}"
    files = []
    for i, (line, reply) in enumerate(zip(ex.sent[: len(ex.replies)], ex.replies, strict=True)):
        tag = line.lower().replace(" ", "-")
        p = out / f"{base}.reply{i}-{tag}.txt"
        p.write_bytes(reply)
        files.append(p.name)
    if ex.report or (ex.error is None and len(ex.sent) > len(ex.replies)):
        # "status-json" -> ras-<ver>-status.json only when JSON really came back.
        if ex.report.lstrip().startswith(b"{") and ex.name.endswith("-json"):
            p = out / f"ras-{ver}-{ex.name.removesuffix('-json')}.json"
        else:
            p = out / f"{base}.txt"
        p.write_bytes(ex.report)
        files.append(p.name)
    parsed: object = None
    if ex.report.lstrip().startswith(b"{"):
        try:
            doc = json.loads(ex.report)
            parsed = f"json ok, communicators_count={doc.get('communicators_count')}"
        except ValueError as e:
            parsed = f"json INVALID: {e}"
    first = ex.report.split(b"\n", 1)[0].decode(errors="replace")
    summary.append(
        {
            "exchange": ex.name,
            "port": ex.port,
            "sent": ex.sent,
            "replies": [r.decode(errors="replace") for r in ex.replies],
            "report_bytes": len(ex.report),
            "report_first_line": first,
            "json": parsed,
            "error": ex.error,
            "seconds": round(ex.seconds, 3),
            "files": files,
        }
    )
    status = ex.error or f"{len(ex.report)} B report, first line {first!r}"
    print(f"  {ex.name:<22} port {ex.port}: {status}" + (f"; {parsed}" if parsed else ""))
    for line, reply in zip(ex.sent[: len(ex.replies)], ex.replies, strict=True):
        print(f"      > {line!r} -> {reply!r}")


def capture(args: argparse.Namespace) -> int:
    t_start = time.monotonic()
    budget_end = t_start + args.budget
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    try:
        import torch
    except ImportError as e:
        print(f"no torch: {e}; nothing captured")
        return 0
    print(f"torch {torch.__version__}, CUDA build {torch.version.cuda}")
    if not torch.cuda.is_available():
        print("no CUDA: no GPU visible to torch, nothing captured")
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ver = nccl_version_string()
    libs = nccl_library_paths()
    print(f"NCCL version (torch.cuda.nccl.version): {ver}")
    print(f"NCCL library: {', '.join(libs) or 'not mapped in this process'}")
    vt = tuple(int(p) for p in ver.split(".")[:3])
    if vt < (2, 24, 0):
        print(f"NCCL {ver} predates RAS (2.24): expecting no endpoint; still trying")
    elif vt < (2, 28, 7):
        print(
            f"NCCL {ver} has RAS text reports but predates JSON (2.28.7): SET FORMAT expected to fail"
        )
    summary: list[dict[str, object]] = []
    facts: dict[str, object] = {
        "nccl_version": ver,
        "nccl_libraries": libs,
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0),
    }
    port, port_c, port_d = args.port, args.port + 1, args.port + 2
    hold = max(10.0, args.budget)

    # Nothing should listen before any job starts.
    print("before any job:")
    save(out, ver, ras_exchange("nojob-status", port, [], "STATUS", budget_end), summary)

    jobs: list[Job] = []
    try:
        print("job A (RAS on, default address, two communicators): starting")
        jobs.append(start_job("A", out, {"NCCL_RAS_ENABLE": "1"}, True, hold))
        facts["jobA"] = wait_ready(jobs[:1], min(budget_end - 30, time.monotonic() + 45))["A"]
        print(f"job A: {facts['jobA']}")
        # Let the RAS thread finish setting up its listening socket.
        time.sleep(1.0)
        proto = f"CLIENT PROTOCOL {RAS_CLIENT_PROTOCOL}"
        print("queries to job A:")
        for name, setup, final in [
            ("handshake", [proto], None),
            ("status", [proto], "STATUS"),
            ("verbose", [proto, "TIMEOUT 5"], "VERBOSE STATUS"),
            ("bare-status", [], "STATUS"),  # no handshake, like `echo status | nc`
            ("status-json", [proto, "SET FORMAT json"], "STATUS"),
            ("verbose-json", [proto, "SET FORMAT json"], "VERBOSE STATUS"),
            ("status-settext", [proto, "SET FORMAT text"], "STATUS"),
            ("unknown-cmd", [proto, "HELLO"], None),
        ]:
            if time.monotonic() > budget_end - 25:
                print(f"  {name}: skipped, budget nearly spent")
                continue
            save(out, ver, ras_exchange(name, port, setup, final, budget_end), summary)

        if time.monotonic() < budget_end - 25:
            print(
                f"jobs B (RAS on, default address), C (NCCL_RAS_ADDR=localhost:{port_c}),"
                f" D (NCCL_RAS_ENABLE=0, address localhost:{port_d}): starting"
            )
            extra = [
                start_job(
                    "B",
                    out,
                    {"NCCL_RAS_ENABLE": "1", "NCCL_RAS_ADDR": f"localhost:{port}"},
                    False,
                    hold,
                ),
                start_job(
                    "C",
                    out,
                    {"NCCL_RAS_ENABLE": "1", "NCCL_RAS_ADDR": f"localhost:{port_c}"},
                    False,
                    hold,
                ),
                start_job(
                    "D",
                    out,
                    {"NCCL_RAS_ENABLE": "0", "NCCL_RAS_ADDR": f"localhost:{port_d}"},
                    False,
                    hold,
                ),
            ]
            jobs += extra
            st = wait_ready(extra, min(budget_end - 15, time.monotonic() + 40))
            facts.update({f"job{k}": v for k, v in st.items()})
            print(f"jobs B, C, D: {st}")
            time.sleep(1.0)
            print("queries with jobs A, B, C, D running:")
            # NCCL sets SO_REUSEPORT on the RAS listening socket (src/ras/client_support.cc,
            # rasClientInitSocket), so B may bind the same port as A and the kernel then
            # spreads connections over both: ask several times and see who answers.
            queries = []
            for i in range(1, 4):
                queries.append((f"twojobs{i}-status", port, [proto], "STATUS"))
                queries.append(
                    (f"twojobs{i}-status-json", port, [proto, "SET FORMAT json"], "STATUS")
                )
            queries += [
                ("jobC-status", port_c, [proto], "STATUS"),
                ("jobC-status-json", port_c, [proto, "SET FORMAT json"], "STATUS"),
                ("disabled-status", port_d, [proto], "STATUS"),
            ]
            for name, p, setup, final in queries:
                if time.monotonic() > budget_end - 8:
                    print(f"  {name}: skipped, budget nearly spent")
                    continue
                save(out, ver, ras_exchange(name, p, setup, final, budget_end), summary)
        else:
            print("jobs B, C, D: skipped, budget nearly spent")
    finally:
        facts["job_exits"] = stop_jobs(jobs)

    by = {s["exchange"]: s for s in summary}

    def answered(name: str) -> bool:
        s = by.get(name)
        return bool(s and s["error"] is None and s["report_bytes"])

    json_reply = by.get("status-json", {}).get("replies", [None, None])
    verdict = {
        "ras_answers": answered("status"),
        "handshake_reply": by.get("handshake", {}).get("replies"),
        "json_supported": str(by.get("status-json", {}).get("json")).startswith("json ok"),
        "set_format_json_reply": json_reply[1] if len(json_reply) > 1 else None,
        "second_job_default_addr_reports": [
            by.get(f"twojobs{i}-status", {}).get("report_first_line") for i in range(1, 4)
        ],
        "job_c_own_addr_answers": answered("jobC-status"),
        "disabled_refused": "refused"
        in str(by.get("disabled-status", {}).get("error", "")).lower(),
        "elapsed_s": round(time.monotonic() - t_start, 1),
    }
    (out / f"ras-{ver}-summary.json").write_text(
        json.dumps({"facts": facts, "verdict": verdict, "exchanges": summary}, indent=2) + "\n"
    )
    print("\nSUMMARY")
    print(f"  NCCL {ver} from {', '.join(libs) or '?'}")
    for k, v in facts.items():
        if k.startswith("job"):
            print(f"  {k}: {v}")
        if k.startswith("job") and k != "job_exits" and v != "ready":
            tail = (out / f"{k}.log").read_bytes()[-600:].decode(errors="replace")
            print("    last lines of its log:\n      " + "\n      ".join(tail.splitlines()[-6:]))
    for k, v in verdict.items():
        print(f"  {k}: {v}")
    print(f"  files under {out}: {sorted(p.name for p in out.iterdir() if p.is_file())}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--out", default="./ras-out", help="directory for the raw replies (default ./ras-out)"
    )
    ap.add_argument(
        "--port", type=int, default=RAS_DEFAULT_PORT, help="RAS port of job A (default 28028)"
    )
    ap.add_argument(
        "--budget",
        type=float,
        default=70.0,
        help="seconds for queries; jobs stop within 11 s more (default 70)",
    )
    # Internal: the job side, started by the capture itself.
    ap.add_argument("--job", help=argparse.SUPPRESS)
    ap.add_argument("--init-file", help=argparse.SUPPRESS)
    ap.add_argument("--ready-file", help=argparse.SUPPRESS)
    ap.add_argument("--stop-file", help=argparse.SUPPRESS)
    ap.add_argument("--hold", type=float, default=60.0, help=argparse.SUPPRESS)
    ap.add_argument("--two-comms", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.job:
        return run_job(args)
    return capture(args)


if __name__ == "__main__":
    sys.exit(main())

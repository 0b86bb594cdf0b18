"""The daemon's resident memory for one card, and what it imports.

    python3 bench/bench_rss.py [--source script|nvml] [--scrapes 5] [--out DIR]
                               [--against 'nvitop-exporter --bind-address 127.0.0.1']
                               [--arena-max N]

Starts a real `rankscope serve` from this checkout, byte-compiled first as an installed
wheel is (default: the scripted source, one SIMULATED card, an empty flight directory;
--source nvml on a GPU machine), scrapes /metrics --scrapes times, and reads VmRSS and VmHWM
from /proc. A second, separate interpreter builds the same daemon without serving and lists
which optional heavy packages that pulled in (OTLP's protobuf, bcrypt, yaml, torch, numpy,
pynvml): a run without OTLP, a web config or basic auth should load none of them; pynvml loads only when the NVML source opens, after the
build. Each process's RSS is also shown by mapping, with its thread count and whether
OpenSSL's libcrypto is mapped (a default run imports neither ssl nor hashlib). With
--against CMD (a GPU machine with nvitop-exporter installed), CMD runs too, is given the
same warm-up, and the ratio of the two RSS is printed. Budget: 128 MiB RSS, half the Helm
chart's memory limit.
"""

from __future__ import annotations

import argparse
import compileall
import json
import shlex
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import harness

HEAVY = ("google", "bcrypt", "yaml", "torch", "numpy", "pynvml")
BUDGET_MIB = 128

IMPORTS = """
import sys
from rankscope.daemon import cli
import argparse
parser = argparse.ArgumentParser()
cli.configure_parser(parser, "serve")
cli.build(parser.parse_args(sys.argv[1:]))
print(" ".join(sorted({m.split(".")[0] for m in sys.modules})))
"""


def rss_kib(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "Threads"):
            out[key] = int(value.split()[0])
    return out


def rss_by_mapping(pid: int, top: int = 12) -> dict[str, int]:
    """Resident KiB per mapped file (anonymous memory as [anon], the heap as [heap]), largest
    first: where two processes' RSS differs (the NVML library, the interpreter, the heap)."""
    sizes: dict[str, int] = {}
    name = "[anon]"
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        fields = line.split()
        if "-" in fields[0] and len(fields) >= 5:  # a mapping's header line
            name = fields[5] if len(fields) > 5 else "[anon]"
        elif fields[0] == "Rss:":
            sizes[name] = sizes.get(name, 0) + int(fields[1])
    ranked = sorted(sizes.items(), key=lambda kv: -kv[1])
    return dict(ranked[:top]) | {"(the rest)": sum(v for _, v in ranked[top:])}


def openssl_mapped(pid: int) -> bool:
    """Whether OpenSSL's libcrypto is mapped: Python's ssl and hashlib modules bring it, and
    a default `rankscope serve` imports neither (docs/architecture.md)."""
    return "/libcrypto.so" in Path(f"/proc/{pid}/maps").read_text()


def print_mappings(mappings: dict[str, int]) -> None:
    for name, kib in mappings.items():
        print(f"    {kib / 1024:6.1f} MiB  {name}")


def warm(url: str, scrapes: int) -> None:
    for _ in range(scrapes):
        with urllib.request.urlopen(url, timeout=10) as r:
            r.read()
        time.sleep(0.2)


def measure(
    serve: list[str], env: dict[str, str], scrapes: int
) -> tuple[dict[str, int], Any, bool]:
    """A real `rankscope serve` with the ``serve`` arguments on a free port, warmed by
    ``scrapes`` scrapes: its RSS figures, its RSS by mapping, whether OpenSSL is mapped."""
    port = harness.free_port()
    cmd = [sys.executable, "-m", "rankscope", *serve, f"--web.listen-address=127.0.0.1:{port}"]
    daemon = subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(url + "/readyz", timeout=2).read()
                break
            except OSError:
                if daemon.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("bench_rss: rankscope serve did not start") from None
                time.sleep(0.2)
        warm(url + "/metrics", scrapes)
        return rss_kib(daemon.pid), rss_by_mapping(daemon.pid), openssl_mapped(daemon.pid)
    finally:
        daemon.terminate()
        daemon.wait(timeout=15)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--source", choices=("script", "nvml"), default="script")
    p.add_argument("--scrapes", type=int, default=5)
    p.add_argument("--against", help="another exporter's command line, serving on --against-url")
    p.add_argument("--against-url", default="http://127.0.0.1:5050/metrics")
    p.add_argument("--out", type=Path, help="directory for rss.json")
    p.add_argument(
        "--arena-max",
        type=int,
        help="also measure the daemon with MALLOC_ARENA_MAX=N: how much of its RSS is glibc's "
        "per-thread arenas (the sampler, holdings and HTTP threads each call NVML)",
    )
    args = p.parse_args()
    # The daemon imports byte-compiled modules, as from an installed wheel (pip compiles
    # nvitop-exporter's too): compiling the sources at start-up would add the compiler's
    # high-water mark, about 1.4 MiB on the dev VM, to a first run and not to the next.
    compileall.compile_dir(harness.REPO / "exporter", quiet=1)
    result: dict[str, Any] = {"source": args.source, "byte_compiled": True}
    with tempfile.TemporaryDirectory() as tmp:
        flight = Path(tmp) / "flight"
        flight.mkdir()
        flags = [f"--flight-dir={flight}"]
        if args.source == "script":
            script = Path(tmp) / "cards.json"
            script.write_text(json.dumps({"cards": [
                {"index": 0, "uuid": "GPU-sim-0", "total": "80GiB", "free": "40GiB"}]}))  # fmt: skip
            flags.append(f"--device.script={script}")
        source = f"--device.source={'nvml' if args.source == 'nvml' else 'script'}"
        serve = ["serve", source, "--log.level=warning", *flags]
        rss, mappings, openssl = measure(serve, harness.child_env(), args.scrapes)
        result["rankscope_kib"], result["rankscope_mappings_kib"] = rss, mappings
        result["rankscope_openssl_mapped"] = openssl
        if args.arena_max:
            env = harness.child_env() | {"MALLOC_ARENA_MAX": str(args.arena_max)}
            result["rankscope_arena_max"] = {"MALLOC_ARENA_MAX": args.arena_max}
            result["rankscope_arena_max"]["kib"], _, _ = measure(serve, env, args.scrapes)
        imports = subprocess.run(
            [sys.executable, "-c", IMPORTS, *serve[1:]],
            env=harness.child_env(), capture_output=True, text=True, check=True,
        ).stdout.split()  # fmt: skip
        result["heavy_imports"] = [m for m in HEAVY if m in imports]
        result["top_level_modules"] = len(imports)
    r = result["rankscope_kib"]
    print(
        f"rankscope serve (byte-compiled), {args.source} source, one card, after {args.scrapes} scrapes: "
        f"RSS {r['VmRSS'] / 1024:.1f} MiB (peak {r['VmHWM'] / 1024:.1f} MiB; budget {BUDGET_MIB} MiB)"
    )
    print(
        f"  optional heavy packages loaded: {', '.join(result['heavy_imports']) or 'none'} "
        f"({result['top_level_modules']} top-level modules), {r['Threads']} threads, "
        f"OpenSSL mapped: {'yes' if result['rankscope_openssl_mapped'] else 'no'}"
    )
    print_mappings(result["rankscope_mappings_kib"])
    if args.arena_max:
        a = result["rankscope_arena_max"]["kib"]
        print(
            f"  the same with MALLOC_ARENA_MAX={args.arena_max} (glibc arenas, a diagnostic): "
            f"RSS {a['VmRSS'] / 1024:.1f} MiB"
        )
    if args.against:
        other = subprocess.Popen(shlex.split(args.against), stderr=subprocess.DEVNULL)
        try:
            time.sleep(5)
            warm(args.against_url, args.scrapes)
            result["against"] = {
                "cmd": args.against,
                "kib": rss_kib(other.pid),
                "mappings_kib": rss_by_mapping(other.pid),
                "openssl_mapped": openssl_mapped(other.pid),
            }
        finally:
            other.terminate()
            other.wait(timeout=15)
        o = result["against"]["kib"]
        print(
            f"  {args.against}: RSS {o['VmRSS'] / 1024:.1f} MiB, {o['Threads']} threads, "
            f"OpenSSL mapped: {'yes' if result['against']['openssl_mapped'] else 'no'}; "
            f"rankscope / it = {r['VmRSS'] / o['VmRSS']:.2f}x"
        )
        print_mappings(result["against"]["mappings_kib"])
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "rss.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

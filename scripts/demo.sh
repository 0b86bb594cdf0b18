#!/usr/bin/env bash
# The main job (README): installs what the demo needs on a fresh machine, then runs
# `rankscope demo` (a small instrumented multi-rank job, the daemon, Prometheus and
# Alertmanager on loopback). Extra arguments go to `rankscope demo`, e.g.
#   bash scripts/demo.sh --scenario skip --duration 20
set -euo pipefail
cd "$(dirname "$0")/.."

# The demo's port first, before minutes of installs: --port N or --port=N (default 19400;
# 0 picks a free one, so there is nothing to check). Bound with SO_REUSEADDR as the daemon
# binds it: a port left in TIME-WAIT by the last run is free, one a process listens on not.
port=19400 prev=
for arg in "$@"; do
  if [ "$prev" = --port ]; then port=$arg; fi
  case "$arg" in --port=*) port=${arg#--port=} ;; esac
  prev=$arg
done
if [[ "$port" =~ ^[0-9]+$ ]] && [ "$port" -ne 0 ] && ! python3 -c \
    'import socket, sys; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", int(sys.argv[1])))' \
    "$port" 2>/dev/null; then
  echo "rankscope demo: 127.0.0.1:$port is taken (another rankscope daemon?); pass --port 0 for a free port" >&2
  exit 2
fi

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

# The real Prometheus and Alertmanager the demo pages through (Debian's packages).
if ! command -v prometheus >/dev/null || ! command -v prometheus-alertmanager >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  as_root apt-get update -q
  as_root apt-get install -y -q --no-install-recommends prometheus prometheus-alertmanager >/dev/null
fi

# The Python packages go into .venv (scripts/venv.sh), never the system Python.
source scripts/venv.sh
venv_install_rankscope ""

exec "$PY" -m rankscope demo "$@"

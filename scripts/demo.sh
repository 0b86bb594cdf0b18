#!/usr/bin/env bash
# The main job (README): installs what the demo needs on a fresh machine, then runs
# `rankscope demo` (a small instrumented multi-rank job, the daemon, Prometheus and
# Alertmanager on loopback). Extra arguments go to `rankscope demo`, e.g.
#   bash scripts/demo.sh --scenario skip --duration 20
set -euo pipefail
cd "$(dirname "$0")/.."

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

#!/usr/bin/env bash
# The test command (README): installs what the tests need on a fresh machine, then lints,
# type-checks and runs the suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

# Real peers for the rules, alerts and dashboard queries, and a browser for the status page.
export DEBIAN_FRONTEND=noninteractive
as_root apt-get update -q
as_root apt-get install -y -q --no-install-recommends \
  prometheus prometheus-alertmanager chromium util-linux procps >/dev/null

# The Python packages go into .venv (scripts/venv.sh), never the system Python.
source scripts/venv.sh
venv_install_rankscope "[test]"

# The Prometheus Operator's CRD schemas (ServiceMonitor, PodMonitor, PrometheusRule), compiled
# from the operator's API types, for validating the rendered chart. npm is Debian's package
# (a nodejs from elsewhere may bring its own npm: left as it is).
if ! command -v npm >/dev/null; then
  as_root apt-get install -y -q --no-install-recommends npm >/dev/null
fi
npm install --no-audit --no-fund --silent --prefix build/crd-schemas \
  @kubernetes-models/prometheus-operator@6.0.0

"$PY" -m ruff check exporter tests bench
"$PY" -m ruff format --check exporter tests bench
"$PY" -m mypy
"$PY" -m pytest "$@"

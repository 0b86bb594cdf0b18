#!/usr/bin/env bash
# The GPU tests (pytest marker gpu), for a machine with an NVIDIA GPU, torch with CUDA and
# this package installed. Each file runs in its own pytest process: a test that leaves a
# CUDA context in the pytest process would otherwise be named, rightly, as a foreign holder
# of the card by the next file's daemon. Then the GPU benchmarks and the multi-GPU run.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
# Tests that measure write their figures here too (tests/test_run_gpu.py).
[ -n "${OUT:-}" ] && export RANKSCOPE_GPU_OUT="$OUT"
status=0
for file in $(grep -l "pytest.mark.gpu" tests/test_*.py); do
  python3 -m pytest -m gpu -v -p no:cacheprovider "$file" || status=1
done
[ "${1:-}" = "--tests-only" ] && exit "$status"
python3 bench/bench_mark.py || status=1
python3 bench/bench_sampler.py || status=1
python3 bench/bench_startup.py --starts 20 ${OUT:+--out "$OUT"} || status=1
python3 bench/multigpu.py ${OUT:+--out "$OUT"} || status=1
exit "$status"

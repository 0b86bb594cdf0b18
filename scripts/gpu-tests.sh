#!/usr/bin/env bash
# The GPU tests (pytest marker gpu), for a machine with an NVIDIA GPU, torch with CUDA and
# this package installed. Each file runs in its own pytest process: a test that leaves a
# CUDA context in the pytest process would otherwise be named, rightly, as a foreign holder
# of the card by the next file's daemon. Then the GPU benchmarks and the multi-GPU run.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
# Tests that measure write their figures here too (tests/rank/test_run_gpu.py).
[ -n "${OUT:-}" ] && export RANKSCOPE_GPU_OUT="$OUT"
status=0
if [ "${1:-}" = "--perf" ]; then
  # The GPU benches, about 10 minutes in all on an H200 (`--perf --quick`: about 4.5); raw
  # figures under $OUT/perf when OUT is set. For the RSS comparison, nvitop-exporter installed
  # (pip install --no-deps .whl/nvitop*.whl).
  export PYTHONPATH="$PWD/exporter${PYTHONPATH:+:$PYTHONPATH}"
  out() { [ -n "${OUT:-}" ] && echo "--out $OUT/perf/$1"; }
  quick=""; [ "${2:-}" = "--quick" ] && quick="--quick"
  python3 bench/bench_interference.py $quick $(out interference) || status=1  # ~4.2 min (2.1 quick)
  # Why eager blocks are not comparable on a given machine: ~3.5 min, skipped with --quick.
  [ -z "$quick" ] && { python3 bench/bench_eager_schedules.py || status=1; }
  python3 bench/bench_sampler.py --daemon --daemon-seconds 30 --cadence-seconds 10 \
    --samples 500 --processes 16 --gil-seconds 3 $(out sampler) || status=1     # ~1.3 min
  python3 bench/bench_trough.py $(out trough) || status=1                       # ~0.7 min
  against=""; command -v nvitop-exporter >/dev/null && \
    against="--against=nvitop-exporter --bind-address 127.0.0.1 --port 5050"
  python3 bench/bench_rss.py --source nvml --arena-max 2 ${against:+"$against"} $(out rss) || status=1
  python3 bench/bench_mark.py --iterations 1000 $(out mark) || status=1        # ~0.5 min
  exit "$status"
fi
for file in $(grep -l "pytest.mark.gpu" tests/*/test_*.py); do
  python3 -m pytest -m gpu -v -p no:cacheprovider "$file" || status=1
done
[ "${1:-}" = "--tests-only" ] && exit "$status"
python3 bench/bench_mark.py ${OUT:+--out "$OUT"} || status=1
python3 bench/bench_sampler.py || status=1
python3 bench/bench_startup.py --starts 20 ${OUT:+--out "$OUT"} || status=1
python3 bench/multigpu.py ${OUT:+--out "$OUT"} || status=1
exit "$status"

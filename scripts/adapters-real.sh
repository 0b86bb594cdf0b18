#!/usr/bin/env bash
# Opt-in lane, outside CI (the wheels are large): the SGLang and vLLM adapters against the
# REAL wheels of every version they declare checked, on CPU.
#
#   scripts/adapters-real.sh                 # every checked version
#   scripts/adapters-real.sh vllm 0.34.0     # one
#
# For each version: the wheel (pip download --no-deps, cached in $RANKSCOPE_WHEELS, the
# cache scripts/adapter-manifest.py uses) is installed --no-deps into a venv of its own under
# $RANKSCOPE_REAL_DIR, kept for the next run (default: a new temp dir, removed when every
# version passes and kept with its logs when one fails), with only the Python packages the hooked
# modules import (listed below; found by importing them), and torch linked in from the
# project's venv (not installed: the framework's own torch pin is not what is checked here).
# Then scripts/adapters-real.py attaches to the real classes, counts a real GroupCoordinator
# over two gloo processes, reads the KV arena of the real config or pool class, and compiles
# the counted all_reduce. Needs the network (PyPI) the first time; exits non-zero if any
# version fails.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
if [ -n "${RANKSCOPE_REAL_DIR:-}" ]; then
  WORK=$RANKSCOPE_REAL_DIR keep_work=yes
else  # a temp dir of our own goes when every version passes: its venvs take gigabytes
  WORK=$(mktemp -d /tmp/rankscope-real.XXXXXX) keep_work=
fi
CACHE=${RANKSCOPE_WHEELS:-/tmp/rankscope-wheels}
mkdir -p "$WORK" "$CACHE"

# What importing the hooked modules needs, beyond torch (a venv of the wheel --no-deps,
# imported until nothing was missing).
VLLM_DEPS=(
  packaging psutil pyzmq urllib3 regex numpy pydantic pydantic-core typing-inspection
  annotated-types transformers huggingface-hub tqdm httpx2 httpcore2 idna pyyaml truststore
  h11 safetensors tokenizers aiohttp multidict attrs yarl propcache aiohappyeyeballs aiosignal
  frozenlist requests certifi pillow pybase64 cachetools cbor2 msgspec
  cloudpickle uvloop py-cpuinfo prometheus-client llguidance xgrammar apache-tvm-ffi einops
  # 0.33.0 only (its reasoning parsers import the MCP tool server at module level)
  openai-harmony openai sniffio anyio fastapi starlette annotated-doc opentelemetry-api
  partial-json-parser
)
SGLANG_DEPS=(
  numpy orjson psutil pybase64 requests urllib3 idna certifi triton packaging pillow starlette
  anyio msgspec pydantic-core pyzmq tqdm ipython traitlets pygments pydantic typing-inspection
  aiohttp multidict attrs yarl propcache aiohappyeyeballs aiosignal frozenlist transformers
  regex huggingface-hub httpx2 pyyaml httpcore2 truststore h11 safetensors tokenizers dill
  apache-tvm-ffi sentencepiece compressed-tensors loguru annotated-types gguf openai sniffio
  partial-json-parser uvicorn click fastapi annotated-doc opentelemetry-api einops setproctitle
)
# torchvision is not installed: PyPI's wheels are CUDA builds that do not load beside a CPU
# torch. SGLang imports it at module level for multimodal preprocessing the lane never runs;
# scripts/adapters-real.py gives it a stand-in that raises when used.
WHEEL_TAGS=(--python-version=3.11 --implementation=cp --abi=cp311 --abi=abi3
  --platform=manylinux_2_34_x86_64 --platform=manylinux_2_28_x86_64)

# torch and the packages it imports, linked from the project venv into one directory every
# version's venv adds to its path.
TORCH_SITE=$WORK/torch-site
mkdir -p "$TORCH_SITE"
"$PY" - "$TORCH_SITE" <<'EOF'
import importlib.metadata as md
import os
import sys

target = sys.argv[1]
for name in ("torch", "sympy", "mpmath", "networkx", "jinja2", "markupsafe", "filelock",
             "fsspec", "typing_extensions", "setuptools"):
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        continue
    tops = {f.parts[0] for f in dist.files or () if f.parts[0] not in ("..", "__pycache__")}
    for top in tops:
        source = dist.locate_file(top)
        link = os.path.join(target, top)
        if not os.path.lexists(link) and os.path.exists(source):
            os.symlink(source, link)
EOF
BASE_PY=$("$PY" -c 'import sys; print(sys._base_executable)')

run_one() {
  local dist=$1 version=$2 deps venv wheel_dir
  wheel_dir=$CACHE/$dist-$version
  if ! compgen -G "$wheel_dir/*.whl" >/dev/null; then
    echo "== $dist $version: downloading the wheel into $wheel_dir"
    "$PY" -m pip download --quiet --no-deps --only-binary=:all: "${WHEEL_TAGS[@]}" \
      "$dist==$version" -d "$wheel_dir"
  fi
  venv=$WORK/$dist-$version
  if [ ! -x "$venv/bin/python" ]; then
    "$BASE_PY" -m venv "$venv"
    "$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))' \
      | xargs -I{} sh -c "echo '$TORCH_SITE' > '{}/rankscope-torch.pth'"
    if [ "$dist" = vllm ]; then deps=("${VLLM_DEPS[@]}"); else deps=("${SGLANG_DEPS[@]}"); fi
    echo "== $dist $version: installing the wheel --no-deps and ${#deps[@]} packages"
    "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps \
      "$wheel_dir"/*.whl "${deps[@]}" 2>&1 | { grep -v '^WARNING: Location' || true; }
  fi
  echo "== $dist $version: scripts/adapters-real.py (framework warnings in $venv/run.log)"
  RANKSCOPE_DIR=$venv/flight PYTHONPATH=$ROOT/exporter "$venv/bin/python" \
    "$ROOT/scripts/adapters-real.py" "$dist" 2>"$venv/run.log"
}

if [ $# -eq 2 ]; then
  targets=("$1 $2")
else
  mapfile -t targets < <(PYTHONPATH=$ROOT/exporter "$PY" -c '
from rankscope.rank.adapters import ADAPTERS
for a in ADAPTERS:
    for v in a.checked_versions:
        print(a.distribution, v)')
fi

failed=()
for target in "${targets[@]}"; do
  # shellcheck disable=SC2086
  if ! run_one $target; then
    failed+=("$target")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "== FAILED: ${failed[*]} (venvs, logs and flight records under $WORK)"
  exit 1
fi
echo "== all passed: ${targets[*]}"
if [ -n "$keep_work" ]; then echo "== venvs kept under $WORK"; else rm -rf "$WORK"; fi

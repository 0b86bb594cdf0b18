# Sourced by test.sh and demo.sh: creates (or reuses) the virtual environment .venv in the
# repository root and sets $PY to its interpreter. Nothing is installed into the system Python.
#
# RANKSCOPE_PYTHON=/path/to/python: build .venv from that interpreter with
# --system-site-packages, so a torch it already has (a CUDA build, say) is used as it is.
# Delete .venv to rebuild it from another interpreter.

VENV=.venv
PY="$VENV/bin/python"

if [ ! -x "$PY" ]; then
  base="${RANKSCOPE_PYTHON:-python3}"
  if [ -n "${RANKSCOPE_PYTHON:-}" ]; then
    "$base" -m venv --system-site-packages "$VENV"
  else
    "$base" -m venv "$VENV"
  fi
fi

pip_install() { "$PY" -m pip install -q --disable-pip-version-check "$@"; }

# torch pinned: the CPU build where there is no NVIDIA GPU (an unpinned "torch" from PyPI is
# a multi-GB CUDA build). PyTorch's CPU index first, failing fast where it is unreachable,
# then the plain pin (which a local CPU wheel or PyPI satisfies).
# (find_spec, not import: importing torch costs seconds on a busy machine)
if ! "$PY" -c "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is None)"; then
  if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    pip_install "torch==2.13.0"
  elif ! pip_install --timeout 5 --retries 0 \
      --index-url https://download.pytorch.org/whl/cpu "torch==2.13.0" 2>/dev/null; then
    pip_install "torch==2.13.0"
  fi
fi
# numpy beside torch: without it, every process that imports torch warns "Failed to
# initialize NumPy" on stderr (torch's wheels do not require it).
if ! "$PY" -c "import importlib.util as u, sys; sys.exit(u.find_spec('numpy') is None)"; then
  pip_install "numpy>=1.26"
fi

# rankscope itself (editable) with the extras asked for; skipped when the package's metadata
# has not changed since the last install into this venv.
venv_install_rankscope() {
  local spec=".$1" stamp="$VENV/.rankscope-installed$1"
  local built="pyproject.toml setup.py"
  # shellcheck disable=SC2086  # the file list splits on purpose
  if [ ! -f "$stamp" ] || ! cat $built | cmp -s - "$stamp"; then
    pip_install -e "$spec"
    cat $built > "$stamp"
  fi
}

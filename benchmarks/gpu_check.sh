#!/usr/bin/env bash
# Real-GPU check of the GPU telemetry (issue 6), for a machine with an NVIDIA GPU and PyTorch.
#
# Two real Jupyter kernels on one GPU: one runs a CUDA matmul loop, one holds a CUDA context and
# idles. The NVML backend must attribute > 50% utilization to the busy kernel's process tree and
# 0% to the idle one. Prints what it saw as JSON on stdout (messages on stderr); exits 0 when the
# check passes, 1 otherwise (2: bad usage). Finishes in under 5 minutes.
#
#   benchmarks/gpu_check.sh [--gpu N] [--busy-seconds 90] [--sample-seconds 20]
#
# Python: $PYTHON, else .venv/bin/python when it has torch, else python3. It needs torch (with
# CUDA), nvidia-ml-py, jupyter_client, ipykernel and psutil; this repository is put on the path.
# The reaper half of the check (cull only the idle kernel) is a TODO in the output for now.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

fail() {
    echo "gpu_check: $1" >&2
    printf '{"ok": false, "error": "%s"}\n' "$1"
    exit 1
}

command -v nvidia-smi >/dev/null 2>&1 ||
    fail "nvidia-smi not found: this check needs a machine with an NVIDIA GPU and its driver"
gpus=$(timeout 30 nvidia-smi -L 2>&1) ||
    fail "nvidia-smi failed (driver not loaded, or no GPU visible): ${gpus//\"/\'}"
echo "gpu_check: GPUs: ${gpus}" >&2

if [ -n "${PYTHON:-}" ]; then
    py=$PYTHON
elif [ -x .venv/bin/python ] && .venv/bin/python -c 'import torch' >/dev/null 2>&1; then
    py=.venv/bin/python
else
    py=python3
fi
command -v "$py" >/dev/null 2>&1 || fail "no Python interpreter '$py' (set PYTHON)"
echo "gpu_check: Python: $py" >&2

"$py" -c 'import torch' >/dev/null 2>&1 ||
    fail "PyTorch is not installed for $py (pip install torch, or set PYTHON)"
"$py" - <<'PY' >&2 || fail "torch.cuda.is_available() is False for $py: a CPU-only PyTorch, or CUDA cannot reach the GPU"
import sys, torch
ok = torch.cuda.is_available()
print(f"gpu_check: torch {torch.__version__}, CUDA {torch.version.cuda}, available: {ok}")
sys.exit(0 if ok else 1)
PY
missing=$("$py" - <<'PY'
import importlib
names = {"pynvml": "nvidia-ml-py", "jupyter_client": "jupyter_client",
         "ipykernel": "ipykernel", "psutil": "psutil"}
missing = []
for module, package in names.items():
    try:
        importlib.import_module(module)
    except ImportError:
        missing.append(package)
print(" ".join(missing))
PY
)
[ -z "$missing" ] || fail "missing Python packages for $py: $missing (pip install $missing)"

export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
timeout --kill-after=5 290 "$py" benchmarks/gpu_check.py --backend nvml "$@"
rc=$?
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    fail "the check ran past its 290 s limit and was stopped"
fi
exit "$rc"

#!/usr/bin/env bash
# Real-GPU check of the GPU telemetry and the idle reaper (issue 6), for a machine with an NVIDIA
# GPU and PyTorch.
#
# Two real Jupyter kernels on one GPU: one runs a CUDA matmul loop, one holds a CUDA context and
# idles. The NVML backend must attribute > 50% utilization to the busy kernel's process tree and
# 0% to the idle one. Fed the same samples (through the notebook server's own GPU monitor), the
# reaper's decision function, each kernel its own session, 20 s timeout and 10 s warning lead,
# must warn and then cull the idle kernel only; the culled kernel is shut down and must leave the
# GPU while the busy one keeps running. `jupyter-gpusched node-agent --backend nvml`, started on a
# free port, must serve the GPU's utilization and memory as NVML reads them directly
# (DCGM_FI_DEV_GPU_UTIL, DCGM_FI_DEV_FB_USED, with DCGM exporter's labels) and stop on SIGTERM. Prints what it saw as JSON on stdout (messages on stderr);
# exits 0 when the check passes, 1 otherwise (2: bad usage). Finishes in under 5 minutes.
#
#   benchmarks/gpu_check.sh [--gpu N] [--busy-seconds 90] [--sample-seconds 20]
#                           [--reaper-timeout 20] [--warning-lead 10]
#   benchmarks/gpu_check.sh --simulated    # dry run of the plumbing without GPU or torch
#
# Python: $PYTHON, else .venv/bin/python when it has torch (any .venv with --simulated), else
# python3. It needs torch (with CUDA), nvidia-ml-py, jupyter_client, ipykernel, psutil and this
# project's dependencies (jupyter_server, prometheus_client...: pip install -e .); this repository
# is put on the path. --simulated needs neither a GPU, torch nor nvidia-ml-py.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

fail() {
    echo "gpu_check: $1" >&2
    local message=${1//\\/\\\\}
    message=${message//\"/\\\"}
    message=${message//$'\n'/\\n}
    message=${message//$'\t'/ }
    printf '{"ok": false, "error": "%s"}\n' "$message"
    exit 1
}

backend=nvml
previous=
for arg in "$@"; do
    case "$arg" in
    --simulated | --backend=simulated) backend=simulated ;;
    simulated) [ "$previous" = --backend ] && backend=simulated ;;
    esac
    previous=$arg
done

if [ "$backend" = nvml ]; then
    command -v nvidia-smi >/dev/null 2>&1 ||
        fail "nvidia-smi not found: this check needs a machine with an NVIDIA GPU and its driver"
    gpus=$(timeout 30 nvidia-smi -L 2>&1) ||
        fail "nvidia-smi failed (driver not loaded, or no GPU visible): $gpus"
    echo "gpu_check: GPUs: ${gpus}" >&2
fi

if [ -n "${PYTHON:-}" ]; then
    py=$PYTHON
elif [ -x .venv/bin/python ] && { [ "$backend" = simulated ] ||
    .venv/bin/python -c 'import torch' >/dev/null 2>&1; }; then
    py=.venv/bin/python
else
    py=python3
fi
command -v "$py" >/dev/null 2>&1 || fail "no Python interpreter '$py' (set PYTHON)"
echo "gpu_check: Python: $py, backend: $backend" >&2

if [ "$backend" = nvml ]; then
    "$py" -c 'import torch' >/dev/null 2>&1 ||
        fail "PyTorch is not installed for $py (pip install torch, or set PYTHON)"
    "$py" - <<'PY' >&2 || fail "torch.cuda.is_available() is False for $py: a CPU-only PyTorch, or CUDA cannot reach the GPU"
import sys, torch
ok = torch.cuda.is_available()
print(f"gpu_check: torch {torch.__version__}, CUDA {torch.version.cuda}, available: {ok}")
sys.exit(0 if ok else 1)
PY
fi
missing=$(GPU_CHECK_BACKEND=$backend "$py" - <<'PY'
import importlib, os
names = {"jupyter_client": "jupyter_client", "ipykernel": "ipykernel", "psutil": "psutil",
         "jupyter_server": "jupyter_server", "prometheus_client": "prometheus_client"}
if os.environ["GPU_CHECK_BACKEND"] == "nvml":
    names["pynvml"] = "nvidia-ml-py"
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
error=$("$py" -c 'import jupyter_gpusched.notebook.serverext.monitor, jupyter_gpusched.service.reaper' 2>&1) ||
    fail "the project's monitor or reaper does not import with $py (pip install -e .): ${error##*$'\n'}"
timeout --kill-after=5 290 "$py" benchmarks/gpu_check.py --backend "$backend" "$@"
rc=$?
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    fail "the check ran past its 290 s limit and was stopped"
fi
exit "$rc"

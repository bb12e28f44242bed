#!/usr/bin/env bash
# Check hami-dra against this machine's real NVIDIA GPUs: NVML discovery -> ResourceSlices that the
# API server accepts, every value against nvidia-smi, the NVML health watcher on every GPU, the CDI
# spec of prepared claims and, where a HAMi-core libvgpu.so and libcuda are present, a memory
# limit enforced. Needs only this repository and an NVIDIA driver; no network, no cluster.
#
#   hack/gpu-check.sh [--node-name N] [--dev-root /dev] [--nvidia-driver-root DIR]
#
# Python: $GPU_CHECK_PYTHON, else the repository's .venv when it runs here, else python3 (3.11+).
# A Python module that is missing (nvidia-ml-py, prometheus-client, grpcio, kubernetes-validate)
# skips the checks that need it, named in the output; put extra packages on PYTHONPATH to add them.
# Env: NVIDIA_DRIVER_ROOT (where libnvidia-ml.so.1 lives), HAMI_CORE_LIB (libvgpu.so; default
# /usr/local/vgpu/libvgpu.so), GPU_CHECK_TIMEOUT (seconds for the whole run, default 450).
# Exit status: 0 when nothing failed, 1 when a check failed, 2 when no usable Python was found.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

usable() {
    # A venv copied from another machine points at an interpreter that may not exist here.
    "$1" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null
}

python=${GPU_CHECK_PYTHON:-}
if [[ -z $python ]]; then
    for candidate in "$repo/.venv/bin/python" "$(command -v python3 || true)"; do
        if [[ -n $candidate && -x $candidate ]] && usable "$candidate"; then
            python=$candidate
            break
        fi
    done
fi
if [[ -z $python ]] || ! usable "$python"; then
    echo "FAIL no Python 3.11 or newer (tried \$GPU_CHECK_PYTHON, $repo/.venv/bin/python, python3)" >&2
    exit 2
fi

export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
budget=${GPU_CHECK_TIMEOUT:-450}
if command -v timeout >/dev/null; then
    exec timeout --kill-after=10 "$budget" "$python" "$repo/hack/gpu_check.py" "$@"
fi
exec "$python" "$repo/hack/gpu_check.py" "$@"

#!/usr/bin/env bash
# Check hami-dra against this machine's real NVIDIA GPUs: NVML discovery -> ResourceSlices that the
# API server accepts, every value against nvidia-smi, the NVML health watcher on every GPU, the CDI
# spec of prepared claims (with what CUDA in a container needs) and, where a HAMi-core libvgpu.so
# and libcuda are present, its memory limit (the limit minus the context it reports), its cores
# limit (a kernel loop at 30 % against none), two processes sharing one limit, a PID namespace and
# (as root, with podman) a container run through the claim's composed CDI spec; on a GPU in MIG
# mode and only with --allow-mig-changes, one MIG instance created, seen published, destroyed. Each a PASS, FAIL
# or SKIP line with its figure. Needs only this repository and an NVIDIA driver; no network, no
# cluster; well under 8 minutes on one GPU.
#
#   hack/gpu-check.sh [--node-name N] [--dev-root /dev] [--nvidia-driver-root DIR] [--allow-mig-changes]
#   make gpu-check GPU_CHECK_ARGS=--allow-mig-changes
#
# Needs installed, from PyPI only: nvidia-ml-py. Optional (a missing one skips the checks that need
# it, named in the output): grpcio, protobuf, PyYAML, prometheus-client, kubernetes-validate; put
# extra packages on PYTHONPATH to add them. The GPU work uses ctypes against libcuda.so.1 (nothing
# to install). From the system, optional: nvidia-ctk, unshare (util-linux), podman.
# Python: $GPU_CHECK_PYTHON, else the repository's .venv when it runs here, else python3 (3.11+).
# Env: NVIDIA_DRIVER_ROOT (where libnvidia-ml.so.1 lives), HAMI_CORE_LIB (libvgpu.so; default
# /usr/local/vgpu/libvgpu.so), NVIDIA_CTK, GPU_CHECK_SPIN_S (seconds of each kernel loop, default
# 6), GPU_CHECK_PODMAN (podman program; "none" skips the container), GPU_CHECK_TIMEOUT (seconds for
# the whole run, default 450).
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

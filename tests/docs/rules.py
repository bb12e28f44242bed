"""What happens to each shell command of the docs (``tests/docs/test_docs.py``).

Every command in a ``sh`` block of README.md, CONTRIBUTING.md and ``docs/*.md`` matches exactly one
entry below, by its longest prefix (after ``sudo`` and ``.venv/bin/`` are dropped; a prefix that
ends in a space or ``/`` matches any continuation, any other only whole words), and is:

- ``RUN``: run by the doc tests, either ``here`` (no cluster: ``hami-dra`` in-process, anything else
  in bash), ``helm`` (``helm install|upgrade`` rendered with ``helm template`` and the same values)
  or on the ``lab`` (a sandbox API server with the real kubelet plugin, webhook and controller on
  four simulated T4s, the chart's DeviceClasses applied; the lab commands of all documents run in
  one sequence, README first, so later ones see what earlier ones created);
- ``TESTED``: exercised by an existing test of the suite, named by its pytest node id;
- ``EXEMPT``: neither, with the reason.

Whatever the entry, a command's repository paths must exist, its ``hami-dra`` arguments must parse
with the real CLI, its ``make`` target must exist, and a file it ``kubectl apply``s must hold valid
objects that use the chart's DeviceClasses. A new command that matches nothing fails the tests:
add it here.
"""

from __future__ import annotations

from typing import Literal

Runner = Literal["here", "helm", "lab"]

RUN: dict[str, Runner] = {
    "hami-dra --help": "here",
    "hami-dra kubelet-plugin --help": "here",
    "hami-dra controller --help": "here",
    "hami-dra webhook --help": "here",
    "hami-dra simulate ": "here",
    "hami-dra discover --source simulated ": "here",
    "helm install hami-dra charts/hami-dra ": "helm",
    # The released chart: rendered from the checkout's (test_docs.helm_template_args); installed
    # from a registry on the real cluster by tests/cluster/test_registry_install.py.
    "helm install hami-dra oci://ghcr.io/hami-dra/charts/hami-dra ": "helm",
    "helm upgrade hami-dra oci://ghcr.io/hami-dra/charts/hami-dra ": "helm",
    "kubectl get resourceslices": "lab",
    "kubectl get deviceclasses": "lab",
    "kubectl get resourceclaims ": "lab",
    "kubectl get gpuquotas ": "lab",
    "kubectl apply -f api/examples/": "lab",
    "kubectl describe pod ": "lab",
    "kubectl describe node ": "lab",
    "kubectl label namespace team-a gpu.hami.io/hami-resources-": "lab",
    "hami-dra explain ": "lab",
    "kubectl hami-dra explain ": "lab",
    "hami-dra top": "lab",
}

#: What a lab command's output must contain (the first matching prefix), beyond exit status 0.
EXPECT: dict[str, str] = {
    "kubectl get resourceslices -o wide": "gpu.hami.io",
    "kubectl get resourceslices -o yaml | grep -A1 isolation": "isolation",
    "kubectl get resourceslices -o yaml | grep -A1 -E 'healthy|healthMonitored|computeMode'": "computeMode",
    "kubectl get deviceclasses -o custom-columns": "mutex,binpack,numa",
    "kubectl get deviceclasses": "mutex-binpack.gpu.hami.io",
    "kubectl get resourceclaims ": "gpu-",
    "hami-dra explain pod/mutex-binpack": "allocated",
    "kubectl hami-dra explain pod/mutex-binpack": "allocated",
    "hami-dra top": "gke-lab-node",
    "hami-dra simulate examples/worked-example.yaml": "gpu-2",
}

#: Placeholders of the docs, as the lab names them.
PLACEHOLDERS: dict[str, str] = {"POD": "mutex-binpack", "NAMESPACE": "default", "NODE": "gke-lab-node"}

_CLUSTER = "tests/cluster/test_e2e.py::test_resourceslice_lists_the_four_gpus"
_HAMI = (
    "tests/cluster/test_hami_workloads.py::test_the_seed_pod_unchanged_is_placed_and_limited_as_hami_would"
)

TESTED: dict[str, str] = {
    "make demo": "tests/demo/test_demo.py::test_cli_subprocess_exits_0_and_leaves_no_temp_files",
    "make chaos": "tests/cluster/test_faults.py::test_faults_lose_nothing_and_allocate_nothing_twice",
    "make image": "tests/cluster/test_helm_install.py::test_every_component_runs_as_the_chart_installs_it",
    "make release ": "tests/release/test_artifacts.py::test_every_artifact_is_there_named_with_the_version",
    "make gpu-check": "tests/devices/test_gpu_check.py::test_gpu_check_passes_against_the_mock",
    "hami-dra sandbox ": "tests/sandbox/test_command.py::test_up_status_down",
    "hami-dra simulate --from-cluster --claims ": (
        "tests/simulate/test_from_cluster.py::"
        "test_what_if_claims_are_placed_on_the_live_cluster_as_the_controller_would"
    ),
    "hami-dra simulate --from-cluster --save ": (
        "tests/simulate/test_from_cluster.py::test_the_snapshot_round_trips_every_gpu_field_and_the_ledgers_usage"
    ),
    "hami-dra simulate snapshot.yaml --claims ": (
        "tests/simulate/test_from_cluster.py::test_a_saved_snapshot_is_edited_and_simulated_with_a_claims_file"
    ),
    "hami-dra cluster up": _CLUSTER,
    "kubectl --kubeconfig /tmp/hami-dra-cluster-0/admin.kubeconfig get resourceslices": _CLUSTER,
    "hami-dra discover --source nvml": (
        "tests/devices/test_devices_command.py::test_nvml_node_name_defaults_to_the_host_name_lower_cased"
    ),
    "nvidia-ctk cdi generate ": (
        "tests/devices/test_toolkit_layouts.py::test_layout_spec_names_the_profiles_gpus_from_the_mock_root"
    ),
    "kubectl label namespace team-a gpu.hami.io/hami-resources=enabled": _HAMI,
    "kubectl apply -n team-a -f api/examples/hami/inference-latency-tier.yaml": _HAMI,
    "kubectl get pod inference-latency-tier -n team-a ": _HAMI,
}

_REAL_NODE = "changes a real node of a real cluster"
_REAL_GPU = "needs a real GPU: nvidia-smi and HAMi-core in the container (make gpu-check measures the limit)"

EXEMPT: dict[str, str] = {
    "make test": "the whole suite, CI's command; it runs these doc tests",
    "make lint": "ruff and mypy over the tree: the first step of make test",
    "make test-lowest": "the fast suite on the lowest dependency versions: a step of make test",
    "make test-cluster ": "the real-cluster suite of make test, on another Kubernetes version; root",
    "make demo-cluster": "needs root and a real cluster; no test runs `hami-dra cluster lab` yet",
    "make mutation": "mutation testing, about 30 minutes; kill rates, not a pass or fail",
    "make bench": "figures, not assertions",
    "make bench-cluster": "figures, not assertions, about 1.5 hours (tests/bench checks its statistics)",
    "make bench-scale": "figures, not assertions, about 5 minutes at 2.5 GiB (tests/bench checks its tables)",
    "python hack/bench_memory.py": (
        "figures, not assertions, about 15 minutes and 8 GiB at full size "
        "(tests/bench/test_memory_bench.py runs it at a tiny size)"
    ),
    "hami-dra cluster build": "builds Kubernetes from Go modules (minutes, root); make test runs it first",
    "hami-dra cluster status": "needs root and a running real cluster; no test reads its output yet",
    "hami-dra cluster lab": "needs root and a running real cluster; no test runs it yet",
    "hami-dra cluster down": "needs root; the tests stop their cluster with SIGTERM, as down does",
    "python -m pytest -q tests/docs": "these doc tests",
    "docker build ": "needs Docker and a registry; make image builds the same Dockerfile with podman",
    "crane copy ": "copies between two registries (a network and a mirror); the chart's rendering of "
    "global.imageRegistry is tests/chart/test_hami_core.py::test_global_image_registry_mirrors_every_image",
    "hack/e2e-kind.sh": "needs Docker and kind; tests/chart/test_e2e_script.py checks the script statically",
    "kubectl logs isolation-check": _REAL_GPU,
    "kubectl drain NODE": _REAL_NODE,
    "kubectl uncordon NODE": _REAL_NODE,
    "kubectl label node NODE ": _REAL_NODE,
}

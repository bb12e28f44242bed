"""The kubelet-plugin DaemonSet: what kubelet, the CDI runtime and the CLI contract need."""

from __future__ import annotations

import pytest

from tests.chart.combos import SIMULATED
from tests.chart.helpers import ALL_ON, NAMESPACE, HelmError, Render, container, find


def _plugin(objects: list[dict]) -> dict:
    return find(objects, "DaemonSet", "kubelet-plugin")


def test_node_name_comes_from_the_pod_spec(render: Render) -> None:
    plugin = container(_plugin(render()))
    env = {e["name"]: e for e in plugin["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert "--node-name=$(NODE_NAME)" in plugin["args"]


def test_host_paths_and_mounts(render: Render) -> None:
    ds = _plugin(render())
    volumes = {v["name"]: v["hostPath"]["path"] for v in ds["spec"]["template"]["spec"]["volumes"]}
    assert volumes == {
        "plugins": "/var/lib/kubelet/plugins/gpu.hami.io",
        "plugins-registry": "/var/lib/kubelet/plugins_registry",
        "cdi": "/var/run/cdi",
        "cdi-static": "/etc/cdi",
        "hami-core": "/usr/local/vgpu",
        "vgpulock": "/tmp/vgpulock",
        "driver-root": "/",
    }
    mounts = {m["name"]: m for m in container(ds)["volumeMounts"]}
    driver_root = mounts.pop("driver-root")
    volumes.pop("driver-root")
    assert {name: m["mountPath"] for name, m in mounts.items()} == volumes, "same paths inside and outside"
    assert driver_root == {
        "name": "driver-root",
        "mountPath": "/driver-root",
        "readOnly": True,
        "mountPropagation": "HostToContainer",
    }
    assert mounts["cdi-static"]["readOnly"] is True, "only read, to find the NVIDIA toolkit's spec"
    assert "readOnly" not in mounts["cdi"] and "readOnly" not in mounts["plugins"]


def test_hami_core_library_directory_is_mounted_at_its_host_path(render: Render) -> None:
    ds = _plugin(render(values_file=ALL_ON))
    volumes = {v["name"]: v["hostPath"] for v in ds["spec"]["template"]["spec"]["volumes"]}
    assert volumes["hami-core"] == {"path": "/usr/local/vgpu", "type": "DirectoryOrCreate"}
    mount = next(m for m in container(ds)["volumeMounts"] if m["name"] == "hami-core")
    assert mount == {"name": "hami-core", "mountPath": "/usr/local/vgpu", "readOnly": True}
    assert "cdi-static" not in volumes, "cdiDir is /etc/cdi already"


def test_args_follow_the_cli_contract(render: Render) -> None:
    args = container(_plugin(render()))["args"]
    assert args[:2] == ["-v", "kubelet-plugin"]
    assert {
        "--driver-name=gpu.hami.io",
        "--source=nvml",
        "--plugin-dir=/var/lib/kubelet/plugins/gpu.hami.io",
        "--registry-dir=/var/lib/kubelet/plugins_registry",
        "--cdi-dir=/var/run/cdi",
        "--metrics-bind-address=:8080",
        "--nvidia-cdi-kind=nvidia.com/gpu",
        "--policy-taint=true",
        "--health-checks=true",
        "--health-recovery-seconds=300",
    } <= set(args), "devices are policy-tainted and health-checked by default"
    assert not any(a.startswith("--additional-xids-to-ignore") for a in args), "only NVIDIA's defaults"


def test_simulated_source(render: Render) -> None:
    ds = _plugin(render(values=SIMULATED))
    args = container(ds)["args"]
    assert {"--source=simulated", "--profile=t4", "--gpus=4"} <= set(args)
    assert not any(a.startswith("--nvidia-cdi-kind") for a in args), "no NVIDIA toolkit spec for fake GPUs"
    security = container(ds)["securityContext"]
    assert security["privileged"] is False, "simulated GPUs need no privileges"
    assert security["capabilities"] == {"drop": ["ALL"]}
    mounts = {m["name"]: m for m in container(ds)["volumeMounts"]}
    assert not any(m["mountPath"] == "/dev" for m in mounts.values()), "the runtime's /dev stays"
    assert "cdi-static" not in mounts and "hami-core" not in mounts


def test_privileged_only_for_nvml(render: Render) -> None:
    assert container(_plugin(render()))["securityContext"]["privileged"] is True
    forced = render(values={"kubeletPlugin": {"privileged": False}})
    assert container(_plugin(forced))["securityContext"]["privileged"] is False


def test_rolling_update_one_node_at_a_time(render: Render) -> None:
    strategy = _plugin(render())["spec"]["updateStrategy"]
    assert strategy == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}


def test_custom_kubelet_root_and_options(render: Render) -> None:
    ds = _plugin(render(values_file=ALL_ON))
    args = container(ds)["args"]
    assert args[0] == "-vv"
    assert {
        "--plugin-dir=/var/lib/kubelet/plugins/gpu.hami.io",
        "--cdi-dir=/etc/cdi",
        "--hami-core-lib=/usr/local/vgpu/libvgpu.so",
        "--policy-taint=false",
        "--metrics-bind-address=:9400",
        "--health-checks=false",
        "--additional-xids-to-ignore=79,48",
        "--health-recovery-seconds=0",
    } <= set(args)
    assert args[-1].startswith("--health-file="), "extraArgs come last"
    spec = ds["spec"]["template"]["spec"]
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["serviceAccountName"] == "gpu-plugin"
    assert {"name": "regcred"} in spec["imagePullSecrets"]
    assert container(ds)["image"] == "registry.example.com/hami/hami-dra:0.1.0-test"


def test_metrics_service_is_headless_and_selects_the_plugin(render: Render) -> None:
    objects = render()
    ds = _plugin(objects)
    svc = find(objects, "Service", "kubelet-plugin-metrics")
    assert svc["metadata"]["namespace"] == NAMESPACE
    assert svc["spec"]["clusterIP"] == "None"
    labels = ds["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    assert svc["spec"]["ports"] == [
        {"name": "metrics", "port": 8080, "targetPort": "metrics", "protocol": "TCP"}
    ]
    assert {"name": "metrics", "containerPort": 8080, "protocol": "TCP"} in container(ds)["ports"]


def test_nvml_loads_the_driver_from_the_driver_root_and_runs_on_gpu_nodes_only(render: Render) -> None:
    ds = _plugin(render())
    env = {e["name"]: e.get("value") for e in container(ds)["env"]}
    assert env["NVIDIA_DRIVER_ROOT"] == "/driver-root"
    terms = ds["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    labels = [
        expression["key"] for term in terms["nodeSelectorTerms"] for expression in term["matchExpressions"]
    ]
    assert labels == ["feature.node.kubernetes.io/pci-10de.present", "nvidia.com/gpu.present"], "either label"
    operator = _plugin(render(values={"kubeletPlugin": {"nvidiaDriverRoot": "/run/nvidia/driver"}}))
    volume = next(v for v in operator["spec"]["template"]["spec"]["volumes"] if v["name"] == "driver-root")
    # Created when missing, as NVIDIA's DRA driver does: the GPU Operator's driver container mounts
    # its root there after the plugin started (a `Directory` would fail the mount and crash-loop).
    assert volume["hostPath"] == {"path": "/run/nvidia/driver", "type": "DirectoryOrCreate"}
    mount = next(m for m in container(operator)["volumeMounts"] if m["name"] == "driver-root")
    assert mount == {
        "name": "driver-root",
        "mountPath": "/driver-root",
        "readOnly": True,
        "mountPropagation": "HostToContainer",
    }, "the driver container's later mount is seen"


def test_the_plugin_sees_the_hosts_device_nodes_through_the_driver_root_mount(render: Render) -> None:
    """Issue 33: control nodes the toolkit's spec lacks are completed from where the plugin sees them."""
    host = container(_plugin(render()))["args"]
    assert "--host-root=/driver-root" in host and not any(a.startswith("--host-driver-root") for a in host)
    operator = container(
        _plugin(render(values={"kubeletPlugin": {"nvidiaDriverRoot": "/run/nvidia/driver"}}))
    )
    assert {"--host-root=", "--host-driver-root=/run/nvidia/driver"} <= set(operator["args"])


def test_simulated_nodes_and_an_admin_affinity_are_left_alone(render: Render) -> None:
    simulated = _plugin(render(values=SIMULATED))["spec"]["template"]["spec"]
    assert "affinity" not in simulated
    assert not [v for v in simulated["volumes"] if v["name"] == "driver-root"]
    everywhere = _plugin(render(values={"kubeletPlugin": {"gpuNodesOnly": False}}))["spec"]["template"][
        "spec"
    ]
    assert "affinity" not in everywhere
    own = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}
    mine = _plugin(render(values={"kubeletPlugin": {"affinity": own}}))["spec"]["template"]["spec"]
    assert mine["affinity"] == own


def test_health_knobs_reach_the_plugin_as_it_parses_them(render: Render) -> None:
    from dra_driver import cli

    values = {"kubeletPlugin": {"health": {"additionalXidsToIgnore": [79], "recoverySeconds": 1.5}}}
    args = container(_plugin(render(values=values)))["args"]
    assert {"--health-checks=true", "--additional-xids-to-ignore=79", "--health-recovery-seconds=1.5"} <= set(
        args
    )
    parsed = cli.build_parser().parse_args([a.replace("$(NODE_NAME)", "node-a") for a in args])
    assert parsed.health_checks is True
    assert parsed.additional_xids_to_ignore == frozenset({79})
    assert parsed.health_recovery_seconds == 1.5


def test_mig_on_demand_reaches_the_plugin_as_it_parses_them(render: Render) -> None:
    from dra_driver import cli

    assert not any(a.startswith("--mig-on-demand") for a in container(_plugin(render()))["args"])
    args = container(_plugin(render(values={"kubeletPlugin": {"migOnDemand": "0,GPU-1234"}})))["args"]
    assert "--mig-on-demand=0,GPU-1234" in args
    parsed = cli.build_parser().parse_args([a.replace("$(NODE_NAME)", "node-a") for a in args])
    assert parsed.mig_on_demand == frozenset({"0", "GPU-1234"})
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["kubelet-plugin", "--mig-on-demand=gpu0"])


@pytest.mark.parametrize(
    "bad",
    [
        {"additionalXidsToIgnore": ["79"]},
        {"additionalXidsToIgnore": [0]},
        {"recoverySeconds": -1},
        {"enabled": "no"},
        {"ignoreXids": [79]},
    ],
)
def test_health_values_are_checked_by_the_schema(render: Render, bad: dict) -> None:
    with pytest.raises(HelmError, match="health"):
        render(values={"kubeletPlugin": {"health": bad}})

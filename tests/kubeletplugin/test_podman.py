"""A real container engine consumes the CDI spec the plugin wrote (podman, busybox rootfs, no registry).

podman only reads specs from /etc/cdi and /var/run/cdi, so this test points the plugin's CDI dir at
/var/run/cdi (claim-UID-named files, removed by unprepare). Needs root and podman + runc +
busybox-static (hack/install.d/podman.sh); skips with the reason otherwise.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dra_driver.devices.simulated import profile_gpus
from dra_driver.kubeletplugin.plugin import KubeletPlugin
from hami_dra_dev.kubelet import KubeletProtocol, PluginClient
from tests.kubeletplugin.conftest import NODE, Dirs, create_claim, plugin_options, ref
from tests.kubeletplugin.helpers import claim, result, stand_in_library
from tests.podman import CDI_DIR, Podman, busybox_podman

IMAGE = "localhost/hami-dra-busybox:test"


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Podman:
    return busybox_podman(tmp_path_factory.mktemp("podman"), IMAGE)


@pytest.fixture
def cdi_plugin(dirs: Dirs, api_client: Any, tmp_path: Path) -> Iterator[KubeletPlugin]:
    library = stand_in_library(tmp_path / "libvgpu.so")
    options = plugin_options(dirs, cdi_dir=CDI_DIR, hami_core_lib=library)
    running = KubeletPlugin(options, profile_gpus("t4", node_name=NODE, gpus=4), api_client)
    running.start()
    try:
        yield running
    finally:
        running.stop()


def test_podman_injects_env_devices_and_mounts(
    podman: Podman, cdi_plugin: KubeletPlugin, protocol: KubeletProtocol, api_client: Any
) -> None:
    kubelet = PluginClient(protocol, cdi_plugin.servers.registration_socket)
    kubelet.register()
    c = create_claim(
        api_client,
        claim(
            "podman", [result("gpu-3", memory="3000Mi", cores=40), result("gpu-1", memory="2000Mi", cores=20)]
        ),
    )
    uid = c["metadata"]["uid"]
    response = kubelet.prepare([ref(c)])
    try:
        entry = response.claims[uid]
        assert entry.error == ""
        devices = [f"--device={cdi_id}" for d in entry.devices for cdi_id in d.cdi_device_ids]
        script = (
            "env; ls -l /dev/nvidia0 /dev/nvidia1 /dev/nvidia3 /dev/nvidiactl; cat /etc/ld.so.preload; "
            f"ls /usr/local/vgpu/libvgpu.so; touch /usr/local/vgpu/claims/{uid}/probe && echo CACHE-WRITABLE"
        )
        run = podman("run", "--rm", "--network=none", *devices, IMAGE, "sh", "-c", script)
        out = run.stdout
        env = dict(
            line.split("=", 1)
            for line in out.splitlines()
            if "=" in line and not line.startswith(("l", "c", "-"))
        )
        # gpu-1 has the lower PCI bus id -> CUDA ordinal 0
        assert env.get("CUDA_DEVICE_MEMORY_LIMIT_0") == "2000m", out + run.stderr
        assert env.get("CUDA_DEVICE_SM_LIMIT_0") == "20"
        assert env.get("CUDA_DEVICE_MEMORY_LIMIT_1") == "3000m"
        assert env.get("CUDA_DEVICE_SM_LIMIT_1") == "40"
        assert env.get("CUDA_DEVICE_ORDER") == "PCI_BUS_ID"
        assert env.get("CUDA_DEVICE_MEMORY_SHARED_CACHE") == f"/usr/local/vgpu/claims/{uid}/cudevshr.cache"
        assert "CUDA_VISIBLE_DEVICES" not in env
        lines = out.splitlines()
        for node in ("/dev/nvidia1", "/dev/nvidia3", "/dev/nvidiactl"):
            assert any(line.startswith("c") and line.endswith(node) for line in lines), (node, out)
        assert "/dev/nvidia0: No such file" in run.stderr  # only the claim's GPUs are injected
        assert "/usr/local/vgpu/libvgpu.so" in lines
        assert "CACHE-WRITABLE" in lines
        assert (cdi_plugin.options.plugin_dir / "hami-core" / "claims" / uid / "probe").exists()
    finally:
        kubelet.unprepare([ref(c)])
        kubelet.close()
    assert not list(CDI_DIR.glob(f"*{uid}*"))
    assert not (cdi_plugin.options.plugin_dir / "hami-core" / "claims" / uid).exists()

"""The local-cluster harness without a cluster: pins, errors, the images it builds, its configs."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from hami_dra_dev.cluster import binaries, configs, images
from hami_dra_dev.cluster.layout import CDI_DIRS, Layout
from hami_dra_dev.pidfile import alive
from tests.waiting import wait_for


def test_pinned_versions_include_the_default_and_the_oldest() -> None:
    pins = binaries.pinned_versions()
    assert {pins["KUBERNETES_VERSION_DEFAULT"], pins["KUBERNETES_VERSION_OLDEST"]} <= set(
        binaries.pinned_kubernetes_versions()
    )
    for version in binaries.pinned_kubernetes_versions():
        go_mod = (
            binaries.REPO_ROOT / "hack" / "cluster" / "go" / f"kubernetes-{version}" / "go.mod"
        ).read_text()
        assert f"\tk8s.io/kubernetes v{version} " in go_mod
        minor = version.split(".", 1)[1]
        assert f"k8s.io/client-go => k8s.io/client-go v0.{minor}" in go_mod


def test_a_missing_toolchain_names_the_build_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HAMI_DRA_CACHE", str(tmp_path))
    with pytest.raises(
        binaries.MissingBinaries, match=r"run: hami-dra cluster build --kubernetes-version 1\.34\.4"
    ):
        binaries.require_toolchain("v1.34.4")
    with pytest.raises(binaries.MissingBinaries, match=r"Kubernetes 1\.29\.0 is not pinned"):
        binaries.require_toolchain("1.29.0")


def test_images_are_oci_archives_named_as_our_examples_use(tmp_path: Path) -> None:
    if not images.BUSYBOX.is_file():
        pytest.skip("busybox-static not installed (hack/install.d/podman.sh)")
    archive = images.busybox_archive(tmp_path)
    with tarfile.open(archive) as tar:

        def blob(digest: str) -> bytes:
            member = tar.extractfile(f"blobs/sha256/{digest.removeprefix('sha256:')}")
            assert member is not None
            return member.read()

        member = tar.extractfile("index.json")
        assert member is not None
        (manifest_desc,) = json.loads(member.read())["manifests"]
        assert manifest_desc["annotations"]["io.containerd.image.name"] == "docker.io/library/busybox:1.36"
        (layer,) = json.loads(blob(manifest_desc["digest"]))["layers"]
        with tarfile.open(fileobj=io.BytesIO(blob(layer["digest"]))) as rootfs:
            names = set(rootfs.getnames())
    assert {"bin/busybox", "bin/sh", "bin/env", "bin/sleep"} <= names


def test_runtime_config_serves_device_taint_rules_only_where_they_are_alpha() -> None:
    assert configs.runtime_config("1.34.4") == ["--runtime-config=resource.k8s.io/v1alpha3=true"]
    assert configs.runtime_config("1.37.2") == []


def test_containerd_config_enables_cdi_in_the_runtime_dirs(tmp_path: Path) -> None:
    toolchain = binaries.Toolchain("1.37.2", {c: tmp_path / c for c in binaries.REQUIRED})
    text = configs.containerd_config(toolchain, Layout(tmp_path), Path("/usr/sbin/runc")).read_text()
    assert "enable_cdi = true" in text and json.dumps([str(d) for d in CDI_DIRS]) in text
    assert "restrict_oom_score_adj = true" in text and 'BinaryName = "/usr/sbin/runc"' in text
    assert f'config_path = "{Layout(tmp_path).registry_hosts_dir}"' in text


def test_a_zombie_counts_as_exited() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        wait_for(lambda: not alive(child.pid), 10, "an exited, unreaped child counted as gone")
    finally:
        child.wait()


def test_leftover_cleanup_kills_only_what_the_cluster_runs(tmp_path: Path) -> None:
    from hami_dra_dev.cluster.cleanup import kill_leftovers

    layout = Layout(tmp_path / "state")
    sleeper = "import sys, time; time.sleep(60)"
    bystander = subprocess.Popen([sys.executable, "-c", sleeper, str(layout.root / "logs" / "kubelet.log")])
    ours = subprocess.Popen(
        [sys.executable, "-c", sleeper, "dra_driver.cli", "--kubeconfig", str(layout.root)]
    )
    try:
        for process in (bystander, ours):  # Popen returns before the child has exec'ed its command line
            cmdline = Path(f"/proc/{process.pid}/cmdline")
            wait_for(lambda c=cmdline: str(layout.root).encode() in c.read_bytes(), 10, "child exec'ed")
        assert kill_leftovers(layout) == []
        assert ours.wait(10) == -9
        assert bystander.poll() is None, "a process that only names a log file is not ours"
    finally:
        for process in (bystander, ours):
            process.kill()
            process.wait()


def test_the_api_server_presents_its_webhook_client_certificate(tmp_path: Path) -> None:
    """What an admin configures so that a webhook can verify its caller (chart webhook.clientAuth)."""
    import yaml

    from hami_dra_dev.cluster.pki import ClusterPki

    layout = Layout(tmp_path)
    pki = ClusterPki(tmp_path / "pki")
    config = yaml.safe_load(configs.admission_config(layout, pki).read_text())
    assert config["kind"] == "AdmissionConfiguration"
    plugins = {plugin["name"]: plugin["configuration"] for plugin in config["plugins"]}
    assert set(plugins) == {"ValidatingAdmissionWebhook", "MutatingAdmissionWebhook"}
    (kubeconfig,) = {plugin["kubeConfigFile"] for plugin in plugins.values()}
    (user,) = yaml.safe_load(Path(kubeconfig).read_text())["users"]
    assert user["name"] == "*", "every webhook, whatever its Service or URL"
    subject = subprocess.run(
        ["openssl", "x509", "-noout", "-subject", "-in", user["user"]["client-certificate"]],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert configs.WEBHOOK_CLIENT_NAME in subject

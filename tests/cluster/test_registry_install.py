"""A release installed as users install it (issue 39 item 1): ``make release`` pushes the image and
the chart to a real OCI registry on this machine (Debian's docker-registry, TLS with a CA the test
makes), and ``helm install oci://<registry>/release-test/charts/hami-dra`` on the real cluster, with
no image value at all, runs a driver whose image containerd pulled from that registry.

The ``registry`` way of the ``driver`` fixture (tests/cluster/registry.py) does the release and the
install; the image archive is the one ``make image`` left in the cache (not rebuilt here).
"""

from __future__ import annotations

import subprocess

import pytest

from hami_dra_dev.demo import manifests
from tests.cluster.conftest import RealCluster
from tests.cluster.drivers import DriverUnderTest, slice_published
from tests.cluster.registry import RELEASE_PATH, RegistryDriver
from tests.cluster.test_e2e import apply
from tests.cluster.test_helm_install import place

pytestmark = [pytest.mark.cluster, pytest.mark.parametrize("driver", ["registry"], indirect=True)]

COMPONENTS = ("controller", "webhook", "kubelet-plugin")


@pytest.fixture
def installed(driver: DriverUnderTest) -> RegistryDriver:
    assert isinstance(driver, RegistryDriver)
    return driver


def test_the_release_pushed_its_image_and_chart_and_checksums_its_artifacts(
    installed: RegistryDriver,
) -> None:
    registry, released = installed.registry, installed.released
    assert {f"{RELEASE_PATH}/hami-dra", f"{RELEASE_PATH}/charts/hami-dra"} <= set(registry.repositories())
    assert registry.tags(f"{RELEASE_PATH}/hami-dra") == [released.version]
    assert registry.tags(f"{RELEASE_PATH}/charts/hami-dra") == [released.version]
    checked = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=released.out, capture_output=True,
                             text=True, check=False)  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.count(": OK") == 5, checked.stdout  # the five artifacts besides SHA256SUMS


def test_every_pod_runs_the_image_containerd_pulled_from_the_registry(
    real_cluster: RealCluster, installed: RegistryDriver
) -> None:
    released = installed.released
    repository = released.image.rsplit(":", 1)[0]
    assert released.image not in installed.images_before, "the image was in containerd before the install"
    for component in COMPONENTS:
        pods = installed.pods(component)
        assert pods, component
        for pod in pods:
            (status,) = pod["status"]["containerStatuses"]
            assert status["image"] == released.image, (component, status["image"])
            # kubelet reports the digest containerd resolved from the registry: the pushed manifest.
            assert status["imageID"] == f"{repository}@{released.image_digest}", (component, status)
    assert released.image in installed.containerd_images()


def test_the_driver_from_the_registry_publishes_its_gpus_and_places_a_pod(
    real_cluster: RealCluster, installed: RegistryDriver
) -> None:
    assert slice_published(real_cluster)
    assert installed.leader() is not None
    apply(real_cluster, manifests.claim_template("binpack"))
    claim = place(real_cluster, "from-the-registry")
    assert claim["status"]["allocation"]["devices"]["results"][0]["driver"] == manifests.DRIVER

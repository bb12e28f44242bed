"""HAMi-core on the nodes (``kubeletPlugin.hamiCore``): what each install mode renders, and the
installer's script run for real against a directory laid out like HAMi's image.

Why each rule matters:
- the library is bind-mounted from the host into every container with a share, so the plugin must
  see it at its host path, and a missing file must not keep the plugin from starting (the old
  ``type: File`` hostPath did: the type is checked before any init container could create it);
- the installer is a DaemonSet of its own, never part of the plugin's pod: an image that cannot be
  pulled (air-gapped or rate-limited registry) would otherwise keep the plugin in
  ``Init:ImagePullBackOff`` and the node without slices; the plugin publishes ``isolation: none``
  until the library arrives and picks it up while it runs;
- ``global.imageRegistry`` points every image at a mirror, keeping each repository's path;
- HAMi's image names the library ``libvgpu.so.<version>``; the version goes into
  ``libvgpu.so.version``, which the plugin reads to refuse libraries older than v2.9.0;
- the install replaces the library by rename, never in place: containers that run keep the old
  file mapped, and truncating it under them is a SIGBUS.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.chart.combos import SIMULATED
from tests.chart.helpers import REPO, HelmError, Render, container, find

IMAGE_DIR = "/k8s-vgpu/lib/nvidia"
INIT = "hami-core-install"  # the script's $0, the prefix of its log lines


def _values(hami_core: dict[str, Any] | None = None, **plugin: Any) -> dict[str, Any]:
    kubelet_plugin: dict[str, Any] = dict(plugin)
    if hami_core is not None:
        kubelet_plugin["hamiCore"] = hami_core
    return {"kubeletPlugin": kubelet_plugin}


def _pod(render: Render, values: dict[str, Any] | None = None) -> dict[str, Any]:
    daemonset = find(render(values=values), "DaemonSet", "kubelet-plugin")
    spec: dict[str, Any] = daemonset["spec"]["template"]["spec"]
    return spec


def _hami_core_args(pod: dict[str, Any]) -> list[str]:
    args: list[str] = container({"spec": {"template": {"spec": pod}}})["args"]
    return [a for a in args if a.startswith(("--hami-core-lib", "--core-utilization-policy"))]


def _volumes(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v["hostPath"] for v in pod["volumes"] if "hostPath" in v}


def _mounts(workload_container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in workload_container.get("volumeMounts") or ()}


def _installers(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == "DaemonSet" and o["metadata"]["name"].endswith("-hami-core")]


def _installer(render: Render, values: dict[str, Any] | None = None) -> dict[str, Any]:
    """The installer DaemonSet's pod spec."""
    (daemonset,) = _installers(render(values=values))
    spec: dict[str, Any] = daemonset["spec"]["template"]["spec"]
    return spec


def _init(pod: dict[str, Any]) -> dict[str, Any]:
    """The installer's one container."""
    (install,) = pod["containers"]
    found: dict[str, Any] = install
    return found


def test_real_gpus_install_hami_core_from_hamis_image_by_default(render: Render) -> None:
    pod = _pod(render)
    assert "initContainers" not in pod, "nothing the plugin's pod pulls besides its own image"
    installer = _installer(render)
    init = _init(installer)
    assert init["name"] == "install"
    assert init["image"] == "docker.io/projecthami/hami:v2.10.0"
    assert init["imagePullPolicy"] == "IfNotPresent"
    assert init["command"][:2] == ["/bin/sh", "-c"]
    assert init["command"][3:] == [INIT, IMAGE_DIR, "/usr/local/vgpu", "v2.10.0"]
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"} in init["env"], "a file copy needs no GPU"
    assert init["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert _mounts(init) == {"hami-core": {"name": "hami-core", "mountPath": "/usr/local/vgpu"}}
    assert _volumes(installer) == {"hami-core": {"path": "/usr/local/vgpu", "type": "DirectoryOrCreate"}}
    assert installer["automountServiceAccountToken"] is False, "a file copy needs no API access"
    assert _hami_core_args(pod) == [
        "--hami-core-lib=/usr/local/vgpu/libvgpu.so",
        "--core-utilization-policy=default",
    ]
    volumes = _volumes(pod)
    assert volumes["hami-core"] == {"path": "/usr/local/vgpu", "type": "DirectoryOrCreate"}
    assert volumes["vgpulock"] == {"path": "/tmp/vgpulock", "type": "DirectoryOrCreate"}
    plugin = _mounts(container({"spec": {"template": {"spec": pod}}}))
    assert plugin["hami-core"] == {"name": "hami-core", "mountPath": "/usr/local/vgpu", "readOnly": True}
    assert plugin["vgpulock"] == {"name": "vgpulock", "mountPath": "/tmp/vgpulock"}, "the plugin opens it up"


def test_no_host_path_of_type_file(render: Render) -> None:
    """A ``File`` hostPath that is missing keeps the pod from starting, before any init container."""
    for values in (None, _values({"install": "hostPath"}), _values(hamiCoreLib="/opt/vgpu/libvgpu.so")):
        types = {v["type"] for v in _volumes(_pod(render, values)).values()}
        assert "File" not in types, values


def test_simulated_gpus_get_no_hami_core_unless_asked(render: Render) -> None:
    pod = _pod(render, SIMULATED)
    assert _installers(render(values=SIMULATED)) == []
    assert _hami_core_args(pod) == []
    assert not {"hami-core", "vgpulock"} & set(_volumes(pod))
    asked = _values({"install": "image", "image": {"repository": "localhost/standin", "tag": "v2.9.1",
                                                  "pullPolicy": "Never"}},
                    source="simulated")  # fmt: skip
    pod = _pod(render, asked)
    init = _init(_installer(render, asked))
    assert init["image"] == "localhost/standin:v2.9.1" and init["imagePullPolicy"] == "Never"
    assert init["command"][3:] == [INIT, IMAGE_DIR, "/usr/local/vgpu", "v2.9.1"]
    assert "--hami-core-lib=/usr/local/vgpu/libvgpu.so" in _hami_core_args(pod)


def test_install_none_on_real_gpus(render: Render) -> None:
    pod = _pod(render, _values({"install": "none"}))
    assert _installers(render(values=_values({"install": "none"}))) == []
    assert _hami_core_args(pod) == []
    assert not {"hami-core", "vgpulock"} & set(_volumes(pod))


@pytest.mark.parametrize(
    ("values", "library", "directory"),
    [
        (_values(hamiCoreLib="/opt/vgpu/libvgpu.so"), "/opt/vgpu/libvgpu.so", "/opt/vgpu"),
        (_values({"install": "hostPath"}), "/usr/local/vgpu/libvgpu.so", "/usr/local/vgpu"),
        (_values({"install": "hostPath", "hostDir": "/srv/other"}, hamiCoreLib="/srv/hami/lib.so"),
         "/srv/hami/lib.so", "/srv/hami"),
        (_values({"install": "hostPath", "hostDir": "/srv/hami"}), "/srv/hami/libvgpu.so", "/srv/hami"),
        (_values(hamiCoreLib="/opt/vgpu/libvgpu.so", source="simulated"),
         "/opt/vgpu/libvgpu.so", "/opt/vgpu"),
    ],
    ids=["library-set", "host-dir-default", "library-wins", "host-dir", "simulated-library"],
)  # fmt: skip
def test_host_path_uses_the_admins_library(
    render: Render, values: dict[str, Any], library: str, directory: str
) -> None:
    pod = _pod(render, values)
    assert _installers(render(values=values)) == [], "nothing installs: the admin placed the library"
    assert _hami_core_args(pod)[0] == f"--hami-core-lib={library}"
    assert _volumes(pod)["hami-core"] == {"path": directory, "type": "DirectoryOrCreate"}
    mount = _mounts(container({"spec": {"template": {"spec": pod}}}))["hami-core"]
    assert mount == {"name": "hami-core", "mountPath": directory, "readOnly": True}, "same path as the host's"
    assert _volumes(pod)["vgpulock"] == {"path": "/tmp/vgpulock", "type": "DirectoryOrCreate"}


def test_custom_host_dir_and_policy_for_the_image_install(render: Render) -> None:
    values = _values({"hostDir": "/var/lib/hami-core", "coreUtilizationPolicy": "disable"})
    pod = _pod(render, values)
    assert _init(_installer(render, values))["command"][5] == "/var/lib/hami-core"
    assert _hami_core_args(pod) == [
        "--hami-core-lib=/var/lib/hami-core/libvgpu.so",
        "--core-utilization-policy=disable",
    ]
    assert _volumes(pod)["hami-core"]["path"] == "/var/lib/hami-core"


def test_the_plugin_pod_is_the_same_whatever_hamis_image(render: Render) -> None:
    """The plugin's pod never names HAMi's image: one that cannot be pulled cannot hold it back, and
    changing it (a mirror, an upgrade) rolls only the installer, never the plugin."""
    unreachable = _values({"image": {"repository": "registry.invalid/projecthami/hami", "tag": "v2.10.0",
                                     "pullPolicy": "Always"}})  # fmt: skip
    assert _pod(render, unreachable) == _pod(render)
    assert _init(_installer(render, unreachable))["image"] == "registry.invalid/projecthami/hami:v2.10.0"


@pytest.mark.parametrize(
    "plugin",
    [
        {},
        {"nodeSelector": {"pool": "gpu"}, "tolerations": [{"key": "gpu", "operator": "Exists"}],
         "priorityClassName": "gpu-critical", "affinity": {"nodeAffinity": {"x": 1}}},
        {"gpuNodesOnly": False},
    ],
    ids=["defaults", "admin-placement", "every-node"],
)  # fmt: skip
def test_the_installer_runs_on_the_plugins_nodes(render: Render, plugin: dict[str, Any]) -> None:
    values: dict[str, Any] = {"kubeletPlugin": plugin, "imagePullSecrets": [{"name": "mirror"}]}
    pod, installer = _pod(render, values), _installer(render, values)
    keys = ("nodeSelector", "tolerations", "affinity", "priorityClassName", "imagePullSecrets")
    assert {k: installer.get(k) for k in keys} == {k: pod.get(k) for k in keys}
    assert installer.get("affinity") == plugin.get("affinity", installer.get("affinity"))


@pytest.mark.parametrize(
    ("registry", "hami", "driver"),
    [
        ("", "docker.io/projecthami/hami:v2.10.0", "ghcr.io/hami-dra/hami-dra:0.1.0"),
        ("mirror.internal", "mirror.internal/projecthami/hami:v2.10.0",
         "mirror.internal/hami-dra/hami-dra:0.1.0"),
        ("mirror.internal:5000/hub/", "mirror.internal:5000/hub/projecthami/hami:v2.10.0",
         "mirror.internal:5000/hub/hami-dra/hami-dra:0.1.0"),
    ],
    ids=["own-registries", "mirror", "mirror-with-port-and-path"],
)  # fmt: skip
def test_global_image_registry_mirrors_every_image(
    render: Render, registry: str, hami: str, driver: str
) -> None:
    objects = render(values={"global": {"imageRegistry": registry}})
    (installer,) = _installers(objects)
    assert container(installer)["image"] == hami
    images = {
        c["image"]
        for o in objects
        if o["kind"] in ("DaemonSet", "Deployment") and o is not installer
        for c in o["spec"]["template"]["spec"]["containers"]
    }
    assert images == {driver}, "the plugin, the controller and the webhook"


@pytest.mark.parametrize(
    ("repository", "image"),
    [
        ("localhost/standin", "mirror.internal/standin:v2.9.1"),
        ("quay.io/someone/hami", "mirror.internal/someone/hami:v2.9.1"),
        ("projecthami/hami", "mirror.internal/projecthami/hami:v2.9.1"),
    ],
)
def test_the_mirror_replaces_only_a_registry_host(render: Render, repository: str, image: str) -> None:
    values = _values({"image": {"repository": repository, "tag": "v2.9.1", "pullPolicy": "IfNotPresent"}})
    values["global"] = {"imageRegistry": "mirror.internal"}
    assert _init(_installer(render, values))["image"] == image


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (_values({"install": "image"}, hamiCoreLib="/opt/vgpu/libvgpu.so"), "not image: unset one"),
        (_values({"install": "none"}, hamiCoreLib="/opt/vgpu/libvgpu.so"), "not none: unset one"),
        (_values(hamiCoreLib="/usr/lib/x86_64-linux-gnu/libvgpu.so"), '"/usr/lib/x86_64-linux-gnu"'),
        (_values(hamiCoreLib="/libvgpu.so"), 'directory "/"'),
        (_values({"hostDir": "/etc"}), '"/etc"'),
        (_values({"hostDir": "/usr/local"}), '"/usr/local"'),
        (_values({"install": "hostPath", "hostDir": "/opt"}), '"/opt"'),
        (_values({"hostDir": "/tmp"}), '"/tmp"'),
        (_values({"hostDir": "/run/secrets/kubernetes.io"}), '"/run/secrets/kubernetes.io"'),
        (_values({"hostDir": "/opt/hami-dra/lib"}), '"/opt/hami-dra/lib"'),
    ],
    ids=["image-and-library", "none-and-library", "system-lib-dir", "root", "etc", "usr-local", "opt", "tmp",
         "secrets", "our-venv"],
)  # fmt: skip
def test_contradictions_and_system_directories_are_refused(
    render: Render, values: dict[str, Any], message: str
) -> None:
    with pytest.raises(HelmError) as caught:
        render(values=values)
    assert message in str(caught.value)


@pytest.mark.parametrize("directory", ["/usr/local/vgpu", "/tmp/hami-dra-cluster-0/hami-core", "/opt/vgpu",
                                       "/var/lib/hami-core", "/etc-vgpu", "/usr/local/lib-vgpu"])  # fmt: skip
def test_directories_of_their_own_are_accepted(render: Render, directory: str) -> None:
    assert _volumes(_pod(render, _values({"hostDir": directory})))["hami-core"]["path"] == directory


@pytest.mark.parametrize(
    ("values", "where"),
    [
        (_values({"install": "always"}), "/kubeletPlugin/hamiCore/install"),
        (_values({"hostDir": "usr/local/vgpu"}), "/kubeletPlugin/hamiCore/hostDir"),
        (_values({"hostDir": "/"}), "/kubeletPlugin/hamiCore/hostDir"),
        (_values({"image": {"repository": "projecthami/hami", "tag": "", "pullPolicy": "Never"}}),
         "/kubeletPlugin/hamiCore/image/tag"),
        (_values({"coreUtilizationPolicy": "FORCE"}), "/kubeletPlugin/hamiCore/coreUtilizationPolicy"),
        (_values({"libPath": "/x"}), "libPath"),
        ({"global": {"imageRegistry": "https://mirror.internal"}}, "/global/imageRegistry"),
        ({"global": {"imageRegistry": "mirror internal"}}, "/global/imageRegistry"),
    ],
    ids=["install", "relative-dir", "root-dir", "empty-tag", "policy", "unknown-key", "url", "space"],
)  # fmt: skip
def test_schema_rejects_bad_hami_core_values(render: Render, values: dict[str, Any], where: str) -> None:
    with pytest.raises(HelmError) as caught:
        render(values=values)
    assert "values don't meet the specifications of the schema" in str(caught.value)
    assert where in str(caught.value)


# --- the installer's script, run for real -------------------------------------------------


class Install:
    """The rendered install script with a fake image directory and host directory."""

    def __init__(self, script: str, root: Path, tag: str = "v2.10.0") -> None:
        self.script = script
        self.src, self.dest = root / "image", root / "host"
        for directory in (self.src, self.dest):
            directory.mkdir()
        self.tag = tag

    def run(self) -> str:
        """Start the script, read its lines until it idles, stop it as kubelet would (SIGTERM)."""
        proc = subprocess.Popen(
            ["/bin/sh", "-c", self.script, INIT, str(self.src), str(self.dest), self.tag],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip
        assert proc.stdout is not None and proc.stderr is not None
        lines = []
        watchdog = threading.Timer(30, proc.kill)  # a script that never says it is done fails, not hangs
        watchdog.start()
        try:
            for line in proc.stdout:
                lines.append(line)
                if line.startswith(f"{INIT}: done; idling"):
                    break
            assert lines and lines[-1].startswith(f"{INIT}: done; idling"), (lines, proc.stderr.read())
            assert proc.poll() is None, "it keeps running: a DaemonSet restarts a container that exits"
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0, "a deleted pod's installer ends at once and cleanly"
        finally:
            watchdog.cancel()
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
            # What is left of the container goes with it (a sleep the TERM came too early to name).
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        assert proc.stderr.read() == ""
        return "".join(lines)

    @property
    def library(self) -> Path:
        return self.dest / "libvgpu.so"

    @property
    def version(self) -> str | None:
        path = self.dest / "libvgpu.so.version"
        return path.read_text() if path.exists() else None

    def leftovers(self) -> list[str]:
        return sorted(p.name for p in self.dest.iterdir() if p.name.startswith("."))


@pytest.fixture
def script(render: Render) -> str:
    command: list[str] = _init(_installer(render))["command"]
    return command[2]


def test_script_is_shellcheck_clean(script: str) -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (hack/install-test-tools.sh)")
    proc = subprocess.run([shellcheck, "-s", "sh", "-"], input=script, capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stdout


def test_script_installs_the_tagged_library_and_its_version(script: str, tmp_path: Path) -> None:
    install = Install(script, tmp_path)
    (install.src / "libvgpu.so").write_bytes(b"an old library HAMi's repository once shipped")
    (install.src / "libvgpu.so.v2.10.0").write_bytes(b"HAMi-core v2.10.0")
    out = install.run()
    assert install.library.read_bytes() == b"HAMi-core v2.10.0"
    assert install.version == "v2.10.0\n"
    assert install.library.stat().st_mode & 0o777 == 0o755
    assert install.leftovers() == []
    assert "installed HAMi-core v2.10.0" in out


def test_script_replaces_by_rename_and_leaves_an_unchanged_library_alone(script: str, tmp_path: Path) -> None:
    install = Install(script, tmp_path)
    (install.src / "libvgpu.so.v2.10.0").write_bytes(b"HAMi-core v2.10.0")
    install.run()
    before = install.library.stat().st_ino
    assert "already HAMi-core v2.10.0" in install.run()
    assert install.library.stat().st_ino == before, "same bytes: not rewritten"

    (install.src / "libvgpu.so.v2.10.0").unlink()
    (install.src / "libvgpu.so.v2.11.0").write_bytes(b"HAMi-core v2.11.0, a longer file")
    install.tag = "v2.11.0"
    with install.library.open("rb") as mapped:  # a running container's view of the old file
        install.run()
        assert os.fstat(mapped.fileno()).st_ino == before
        assert mapped.read() == b"HAMi-core v2.10.0", "the old file was not truncated or rewritten"
    assert install.library.stat().st_ino != before
    assert install.library.read_bytes() == b"HAMi-core v2.11.0, a longer file"
    assert install.version == "v2.11.0\n"
    assert install.leftovers() == []


def test_script_takes_the_only_versioned_library_when_the_tag_is_no_file_name(
    script: str, tmp_path: Path
) -> None:
    """A mirror's own tag (or a digest) names no file: the image's single ``libvgpu.so.v*`` is it."""
    install = Install(script, tmp_path, tag="mirror-2026-09")
    (install.src / "libvgpu.so.v2.9.0").write_bytes(b"HAMi-core v2.9.0")
    install.run()
    assert install.library.read_bytes() == b"HAMi-core v2.9.0"
    assert install.version == "v2.9.0\n"


@pytest.mark.parametrize(
    ("files", "said"),
    [
        ({}, "nothing installed"),
        ({"libvgpu.so": b"unversioned"}, "nothing installed"),
        ({"libvgpu.so.v2.9.0": b"a", "libvgpu.so.v2.10.0": b"b"}, "several libraries"),
    ],
    ids=["empty", "unversioned-only", "ambiguous"],
)
def test_script_installs_nothing_it_cannot_name_and_still_succeeds(
    script: str, tmp_path: Path, files: dict[str, bytes], said: str
) -> None:
    install = Install(script, tmp_path, tag="latest")
    for name, data in files.items():
        (install.src / name).write_bytes(data)
    assert said in install.run()
    assert not install.library.exists() and install.version is None


# --- the stand-in library the real-cluster test installs with this installer ---------------

STANDIN = REPO / "hack" / "hami-core-standin"


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc is not installed (hack/install.d/gcc.sh)")
    library = tmp_path_factory.mktemp("standin") / "libvgpu.so"
    proc = subprocess.run(
        [gcc, "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(library),
         str(STANDIN / "standin.c")],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return library


def _preloaded(library: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``/bin/sh -c 'echo $$'`` with the stand-in preloaded and only ``env`` besides."""
    return subprocess.run(
        ["/bin/sh", "-c", "echo $$"], env={**env, "LD_PRELOAD": str(library), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip


def test_standin_build_script_is_shellcheck_clean() -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (hack/install-test-tools.sh)")
    proc = subprocess.run([shellcheck, str(STANDIN / "build.sh")], capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stdout


def test_standin_records_what_hami_core_reads_next_to_the_cache_it_creates(
    standin: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "claim" / "cudevshr.cache"
    cache.parent.mkdir()
    env = {
        "CUDA_DEVICE_MEMORY_SHARED_CACHE": str(cache),
        "CUDA_DEVICE_MEMORY_LIMIT_0": "1024m",
        "CUDA_DEVICE_MEMORY_LIMIT": "5g",
        "CUDA_DEVICE_SM_LIMIT_1": "30",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "GPU_CORE_UTILIZATION_POLICY": "FORCE",
        "CUDA_DEVICE_SM_LIMITED": "not HAMi-core's",
        "UNRELATED": "1",
    }
    proc = _preloaded(standin, env)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    pid = proc.stdout.strip()
    assert pid.isdigit(), f"the program's own output is untouched: {proc.stdout!r}"
    assert cache.exists() and cache.stat().st_mode & 0o777 == 0o666, "created as HAMi-core creates it"
    record = dict(
        line.split("=", 1)
        for line in (cache.parent / f"hami-core-standin.{pid}.env").read_text().splitlines()
    )
    assert record.pop("standin") == "1" and record.pop("pid") == pid
    assert record.pop("library") == str(standin)
    assert record.pop("exe").endswith("sh")
    assert {"uid", "hostname", "ld.so.preload"} <= set(record)
    variables = {k: v for k, v in record.items() if k.isupper()}
    assert variables == {**{k: v for k, v in env.items() if k not in ("CUDA_DEVICE_SM_LIMITED", "UNRELATED")},
                         "LD_PRELOAD": str(standin)}  # fmt: skip
    assert sorted(p.name for p in cache.parent.iterdir()) == [
        "cudevshr.cache",
        f"hami-core-standin.{pid}.env",
    ]


def test_standin_reports_on_stderr_without_a_cache_and_never_fails_the_program(
    standin: Path, tmp_path: Path
) -> None:
    proc = _preloaded(standin, {"CUDA_DEVICE_MEMORY_LIMIT_0": "1m"})
    assert proc.returncode == 0 and proc.stdout.strip().isdigit()
    assert "standin=1" in proc.stderr and "CUDA_DEVICE_MEMORY_LIMIT_0=1m" in proc.stderr
    missing = tmp_path / "no-such-dir" / "x.cache"
    proc = _preloaded(standin, {"CUDA_DEVICE_MEMORY_SHARED_CACHE": str(missing)})
    assert proc.returncode == 0 and proc.stdout.strip().isdigit() and proc.stderr == ""
    assert not missing.parent.exists()

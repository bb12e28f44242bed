"""Configuration files and command lines of the upstream components, one function each.

Flags and fields are those documented by the upstream projects for the pinned versions
(``hack/cluster/versions.env``); values that matter on our machines are explained where set.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

from hami_dra_dev.cluster.binaries import Toolchain
from hami_dra_dev.cluster.layout import (
    BRIDGE,
    CDI_DIRS,
    NODE_IP,
    NODE_NAME,
    PAUSE_IMAGE,
    POD_CIDR,
    SERVICE_CIDR,
    SERVICE_IP,
    Layout,
)
from hami_dra_dev.cluster.pki import ClusterPki, KeyPair

#: DRA features the driver uses beyond GA DRA: consumable capacity (shared GPUs), device taints
#: (the policy-managed taint) and partitionable devices (MIG on demand: placements on shared
#: counters). Alpha in 1.34 (partitionable devices in 1.35 too), so they must be switched on; later
#: versions accept the same names (a gate is only removed releases after it locks to its GA value).
FEATURE_GATES = "DRAConsumableCapacity=true,DRADeviceTaints=true,DRAPartitionableDevices=true"


def kubeconfig(path: Path, layout: Layout, pki: ClusterPki, user: KeyPair, name: str) -> Path:
    body = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "hami-dra",
                "cluster": {"server": layout.server_url, "certificate-authority": str(pki.ca.cert)},
            }
        ],
        "users": [
            {"name": name, "user": {"client-certificate": str(user.cert), "client-key": str(user.key)}}
        ],
        "contexts": [{"name": "hami-dra", "context": {"cluster": "hami-dra", "user": name}}],
        "current-context": "hami-dra",
    }
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    path.chmod(0o600)
    return path


def etcd_args(tools: Toolchain, layout: Layout) -> list[str]:
    p = layout.ports
    client, peer = f"http://127.0.0.1:{p.etcd_client}", f"http://127.0.0.1:{p.etcd_peer}"
    return [
        str(tools.path("etcd")),
        "--name=hami-dra",
        f"--data-dir={layout.etcd_data}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=hami-dra={peer}",
        "--listen-metrics-urls=http://127.0.0.1:0",
        # A throw-away test cluster on one VM: fsync on every write only slows the tests down.
        "--unsafe-no-fsync=true",
        "--log-level=warn",
    ]


#: The common name of the client certificate kube-apiserver presents to admission webhooks: a
#: webhook that verifies it (the chart's ``webhook.clientAuth``) answers reviews only to the API
#: server, not to a pod posting one of its own (docs/multi-tenant.md).
WEBHOOK_CLIENT_NAME = "kube-apiserver-webhook-client"


def admission_config(layout: Layout, pki: ClusterPki) -> Path:
    """``--admission-control-config-file``: the API server presents ``WEBHOOK_CLIENT_NAME``'s
    certificate to every webhook (kubeconfig user ``*``), as an admin configures it in production.
    A webhook that asks for no client certificate is not sent one."""
    client = pki.issue("apiserver-webhook-client", WEBHOOK_CLIENT_NAME)
    kubeconfig = layout.root / "webhook-client.kubeconfig"
    user = {"client-certificate": str(client.cert), "client-key": str(client.key)}
    body = {"apiVersion": "v1", "kind": "Config", "users": [{"name": "*", "user": user}]}
    kubeconfig.write_text(yaml.safe_dump(body, sort_keys=False))
    webhook = {
        "apiVersion": "apiserver.config.k8s.io/v1",
        "kind": "WebhookAdmissionConfiguration",
        "kubeConfigFile": str(kubeconfig),
    }
    path = layout.root / "admission-config.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "apiserver.config.k8s.io/v1",
                "kind": "AdmissionConfiguration",
                "plugins": [
                    {"name": name, "configuration": webhook}
                    for name in ("ValidatingAdmissionWebhook", "MutatingAdmissionWebhook")
                ],
            },
            sort_keys=False,
        )
    )
    return path


def apiserver_args(tools: Toolchain, layout: Layout, pki: ClusterPki) -> list[str]:
    serving = pki.issue(
        "apiserver",
        "kube-apiserver",
        hosts=(
            NODE_IP,
            "127.0.0.1",
            "localhost",
            SERVICE_IP,
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ),
        client=False,
        server=True,
    )
    kubelet_client = pki.issue(
        "apiserver-kubelet-client", "kube-apiserver-kubelet-client", organization="system:masters"
    )
    sa = pki.service_account_keys()
    return [
        str(tools.path("kube-apiserver")),
        f"--etcd-servers=http://127.0.0.1:{layout.ports.etcd_client}",
        # The node's own address (on `lo`, see layout.NODE_IP): local to this machine, and one that
        # the endpoint reconciler accepts, so pods reach the `kubernetes` Service through kube-proxy.
        # The control plane alone (no pods) listens on the loopback instead: layout.apiserver_address.
        f"--bind-address={layout.apiserver_address}",
        f"--advertise-address={NODE_IP}",
        f"--secure-port={layout.ports.apiserver}",
        f"--tls-cert-file={serving.cert}",
        f"--tls-private-key-file={serving.key}",
        f"--client-ca-file={pki.ca.cert}",
        f"--kubelet-client-certificate={kubelet_client.cert}",
        f"--kubelet-client-key={kubelet_client.key}",
        "--kubelet-preferred-address-types=InternalIP",
        f"--service-account-key-file={sa.cert}",
        f"--service-account-signing-key-file={sa.key}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--authorization-mode=Node,RBAC",
        # The defaults already include MutatingAdmissionWebhook, ValidatingAdmissionWebhook and
        # ValidatingAdmissionPolicy; NodeRestriction makes the kubelet's identity matter as in production.
        "--enable-admission-plugins=NodeRestriction",
        f"--admission-control-config-file={admission_config(layout, pki)}",
        "--allow-privileged=true",
        # The API server runs on the host, outside kube-proxy's reach for its own connections to
        # webhook Services: it dials their endpoints (pod IPs on the bridge) instead.
        "--enable-aggregator-routing=true",
        f"--feature-gates={FEATURE_GATES}",
        *runtime_config(tools.kubernetes_version),
        *audit_args(layout),
        f"--profiling={'true' if os.environ.get(APISERVER_PROFILING_ENV) else 'false'}",
        "--v=1",
    ]


#: Set (to anything): kube-apiserver serves /debug/pprof to admins (hack/bench_cluster.py
#: --profile-apiserver records where its CPU goes during each burst). Unset: off, as in production.
APISERVER_PROFILING_ENV = "HAMI_DRA_APISERVER_PROFILING"

#: An audit policy file for kube-apiserver (set by hack/bench_cluster.py, which counts the requests of
#: each client from the audit log: the API server's own metrics do not say who sent a request).
#: Unset, the API server writes no audit log.
AUDIT_POLICY_ENV = "HAMI_DRA_AUDIT_POLICY"


def audit_log_path(layout: Layout) -> Path:
    return layout.logs / "kube-apiserver-audit.log"


def audit_args(layout: Layout) -> list[str]:
    """The audit log flags when ``$HAMI_DRA_AUDIT_POLICY`` names a policy file (JSON lines, one file,
    never rotated: `cluster up` clears the logs directory at every start)."""
    policy = os.environ.get(AUDIT_POLICY_ENV)
    if not policy:
        return []
    return [f"--audit-policy-file={policy}", f"--audit-log-path={audit_log_path(layout)}",
            "--audit-log-format=json", "--audit-log-maxsize=0"]  # fmt: skip


def runtime_config(kubernetes_version: str) -> list[str]:
    """API versions to serve beyond the defaults.

    Up to 1.35, DeviceTaintRule (which kube-scheduler watches once DRADeviceTaints is on) exists
    only as ``resource.k8s.io/v1alpha3``, off by default: without it the scheduler's informer
    never syncs and no pod with a claim is ever scheduled.
    """
    minor = int(kubernetes_version.split(".")[1])
    return ["--runtime-config=resource.k8s.io/v1alpha3=true"] if minor <= 35 else []


def _secure_component(program: Path, kubeconfig_path: Path, port: int, verbosity: int) -> list[str]:
    """What kube-controller-manager and kube-scheduler share: one identity for the API and for
    delegated authentication/authorization of their own /healthz, loopback serving, no election."""
    return [
        str(program),
        f"--kubeconfig={kubeconfig_path}",
        f"--authentication-kubeconfig={kubeconfig_path}",
        f"--authorization-kubeconfig={kubeconfig_path}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        "--leader-elect=false",
        f"--feature-gates={FEATURE_GATES}",
        f"--v={verbosity}",
    ]


def controller_manager_args(
    tools: Toolchain, layout: Layout, pki: ClusterPki, kubeconfig_path: Path
) -> list[str]:
    sa = pki.service_account_keys()
    program = tools.path("kube-controller-manager")
    return [
        *_secure_component(program, kubeconfig_path, layout.ports.controller_manager, 1),
        f"--service-account-private-key-file={sa.key}",
        f"--root-ca-file={pki.ca.cert}",
        f"--cluster-signing-cert-file={pki.ca.cert}",
        f"--cluster-signing-key-file={pki.ca.key}",
        "--use-service-account-credentials=true",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--controllers=*",
        *controller_manager_client_args(),
    ]


#: kube-controller-manager's client rate (requests/s, burst the same), set by hack/bench_cluster.py:
#: at its default 20/s (burst 30) the resourceclaim controller, which makes 2 requests per pod with
#: a claim template (the claim, the pod's status), caps any allocator at 10 pods/s. Unset: default.
CONTROLLER_MANAGER_QPS_ENV = "HAMI_DRA_CONTROLLER_MANAGER_QPS"


def controller_manager_client_args() -> list[str]:
    qps = os.environ.get(CONTROLLER_MANAGER_QPS_ENV)
    if not qps:
        return []
    rate = float(qps)
    if rate <= 0:
        raise ValueError(
            f"${CONTROLLER_MANAGER_QPS_ENV} must be a positive number of requests/s, not {qps!r}"
        )
    return [f"--kube-api-qps={rate:g}", f"--kube-api-burst={int(rate)}"]


def scheduler_args(tools: Toolchain, layout: Layout, kubeconfig_path: Path) -> list[str]:
    return _secure_component(tools.path("kube-scheduler"), kubeconfig_path, layout.ports.scheduler, 2)


def containerd_config(tools: Toolchain, layout: Layout, runc: Path) -> Path:
    """containerd 2.x (config version 3): CRI with CDI on, runc, our CNI dirs, the local pause image,
    and a registry hosts directory (a test's own registry and CA, tests/cluster/registry.py)."""
    images = 'plugins."io.containerd.cri.v1.images"'
    runtime = 'plugins."io.containerd.cri.v1.runtime"'
    text = f"""version = 3
root = "{layout.containerd_root}"
state = "{layout.containerd_state}"

[grpc]
  address = "{layout.containerd_socket}"

[ttrpc]
  address = "{layout.containerd_socket}.ttrpc"

[{images}]
  snapshotter = "overlayfs"

[{images}.pinned_images]
  sandbox = "{PAUSE_IMAGE}"

[{images}.registry]
  config_path = "{layout.registry_hosts_dir}"

[{runtime}]
  # These VMs do not let even root lower oom_score_adj, so runc would fail on the pods' -998.
  restrict_oom_score_adj = true
  enable_cdi = true
  cdi_spec_dirs = {json.dumps([str(d) for d in CDI_DIRS])}

[{runtime}.containerd]
  default_runtime_name = "runc"

[{runtime}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{runtime}.containerd.runtimes.runc.options]
  BinaryName = "{runc}"
  SystemdCgroup = false

[{runtime}.cni]
  bin_dirs = ["{tools.cni_bin_dir}"]
  conf_dir = "{layout.cni_conf_dir}"
"""
    layout.containerd_config.parent.mkdir(parents=True, exist_ok=True)
    layout.containerd_config.write_text(text)
    return layout.containerd_config


def cni_config(layout: Layout) -> Path:
    """A bridge network with host-local IPAM; no masquerading (pods only talk on this host)."""
    layout.cni_conf_dir.mkdir(parents=True, exist_ok=True)
    body: dict[str, Any] = {
        "cniVersion": "1.0.0",
        "name": "hami-dra",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(layout.cni_data_dir),
                    "ranges": [[{"subnet": POD_CIDR}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }
    path = layout.cni_conf_dir / "10-hami-dra.conflist"
    path.write_text(json.dumps(body, indent=2) + "\n")
    return path


def kubelet_config(layout: Layout, pki: ClusterPki) -> Path:
    serving = pki.issue("kubelet-serving", NODE_NAME, hosts=(NODE_IP, "127.0.0.1", "localhost", NODE_NAME),
                        client=False, server=True)  # fmt: skip
    body: dict[str, Any] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": NODE_IP,
        "port": layout.ports.kubelet,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": layout.ports.kubelet_healthz,
        "tlsCertFile": str(serving.cert),
        "tlsPrivateKeyFile": str(serving.key),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(pki.ca.cert)},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{layout.containerd_socket}",
        # Our machines run the cgroup v1 hybrid layout; kubelet 1.35+ refuses it unless told.
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "failSwapOn": False,
        "clusterDomain": "cluster.local",
        "clusterDNS": [],
        "resolvConf": "/etc/resolv.conf",
        "serializeImagePulls": False,
        # A small VM with a large shared disk: never evict the test pods for disk use.
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "featureGates": dict(
            (name, value == "true") for name, value in (g.split("=") for g in FEATURE_GATES.split(","))
        ),
        # As containerd's restrict_oom_score_adj: lowering oom_score_adj is not allowed here.
        "oomScoreAdj": 0,
        "shutdownGracePeriod": "0s",
        "nodeStatusReportFrequency": "10s",
        "syncFrequency": "10s",
    }
    layout.kubelet_config.write_text(yaml.safe_dump(body, sort_keys=False))
    return layout.kubelet_config


def kube_proxy_config(layout: Layout, kubeconfig_path: Path) -> Path:
    """kube-proxy in iptables mode for Service ClusterIPs (the pods' way to the API server).

    Nothing it would tune is touched: conntrack limits and timeouts stay as the machine has
    them (0 = leave alone), and NodePorts are not served on localhost (no route_localnet).
    """
    body: dict[str, Any] = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig_path)},
        "hostnameOverride": NODE_NAME,
        "bindAddress": NODE_IP,
        "healthzBindAddress": f"127.0.0.1:{layout.ports.kube_proxy_healthz}",
        "metricsBindAddress": f"127.0.0.1:{layout.ports.kube_proxy_metrics}",
        "mode": "iptables",
        "clusterCIDR": POD_CIDR,
        "detectLocalMode": "ClusterCIDR",
        "iptables": {"localhostNodePorts": False, "masqueradeAll": False},
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
    }
    layout.kube_proxy_config.write_text(yaml.safe_dump(body, sort_keys=False))
    return layout.kube_proxy_config


def kube_proxy_args(tools: Toolchain, layout: Layout) -> list[str]:
    return [str(tools.path("kube-proxy")), f"--config={layout.kube_proxy_config}", "--v=1"]


def kubelet_args(tools: Toolchain, layout: Layout, kubeconfig_path: Path) -> list[str]:
    return [
        str(tools.path("kubelet")),
        f"--config={layout.kubelet_config}",
        f"--kubeconfig={kubeconfig_path}",
        f"--root-dir={layout.kubelet_root}",
        f"--hostname-override={NODE_NAME}",
        f"--node-ip={NODE_IP}",
        "--v=2",
    ]

"""Values combinations the chart is rendered and validated with (besides values-all-on.yaml)."""

from __future__ import annotations

from typing import Any

SIMULATED: dict[str, Any] = {
    "kubeletPlugin": {"source": "simulated", "simulated": {"profile": "t4", "gpus": 4}}
}
CERT_MANAGER: dict[str, Any] = {"webhook": {"certificate": {"mode": "cert-manager"}}}
CERT_MANAGER_ISSUER: dict[str, Any] = {
    "webhook": {
        "certificate": {
            "mode": "cert-manager",
            "certManager": {"issuerRef": {"kind": "ClusterIssuer", "name": "ca"}},
        }
    }
}
EXISTING_CERT: dict[str, Any] = {
    "webhook": {
        "certificate": {
            "mode": "existing",
            "existing": {"secretName": "my-tls", "caBundle": "LS0tLS1CRUdJTg=="},
        }
    }
}
HA: dict[str, Any] = {"controller": {"replicas": 2}, "webhook": {"replicas": 2}}
PLUGIN_ONLY: dict[str, Any] = {
    "controller": {"enabled": False},
    "webhook": {"enabled": False},
    "recipeClasses": {"enabled": False},
    "migClass": {"enabled": False},
    "admissionPolicy": {"enabled": False},
}
CUSTOM_DRIVER: dict[str, Any] = {
    "driverName": "gpu.example.org",
    "deviceClasses": [
        {"name": "gpu.example.org", "config": {"policy": "mutex,binpack,numa", "numaBind": True}}
    ],
}

#: HAMi-core from the image on simulated GPUs (the setup of tests/cluster/test_hami_core.py).
SIMULATED_HAMI_CORE_IMAGE: dict[str, Any] = {
    "kubeletPlugin": {**SIMULATED["kubeletPlugin"], "hamiCore": {"install": "image"}}
}
#: A library the admin placed at the default host directory.
HAMI_CORE_HOST_PATH: dict[str, Any] = {"kubeletPlugin": {"hamiCore": {"install": "hostPath"}}}
HAMI_CORE_NONE: dict[str, Any] = {"kubeletPlugin": {"hamiCore": {"install": "none"}}}

#: name -> (values, use values-all-on.yaml)
COMBOS: dict[str, tuple[dict[str, Any] | None, bool]] = {
    "defaults": (None, False),
    "all-options": (None, True),
    "simulated": (SIMULATED, False),
    "cert-manager": (CERT_MANAGER, False),
    "cert-manager-issuer": (CERT_MANAGER_ISSUER, False),
    "existing-cert": (EXISTING_CERT, False),
    "ha": (HA, False),
    "plugin-only": (PLUGIN_ONLY, False),
    "custom-driver": (CUSTOM_DRIVER, False),
    "hami-core-image-simulated": (SIMULATED_HAMI_CORE_IMAGE, False),
    "hami-core-host-path": (HAMI_CORE_HOST_PATH, False),
    "hami-core-none": (HAMI_CORE_NONE, False),
}

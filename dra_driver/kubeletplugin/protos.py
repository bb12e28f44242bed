"""Our generated kubelet API modules under stable names, plus the service names kubelet uses.

The gRPC service wiring is hand-written (``grpc.method_handlers_generic_handler``) instead of
generated, so the checked-in code does not pin grpcio to the version of grpcio-tools that
generated it; only message classes come from ``gen/``.
"""

from __future__ import annotations

import importlib
from typing import Any

_GEN = "dra_driver.kubeletplugin.gen"

# Imported by name so that type checkers treat the generated modules as Any instead of analysing
# protoc output (which is excluded from linting and typing).
dra_v1: Any = importlib.import_module(f"{_GEN}.dra.v1.api_pb2")
dra_v1beta1: Any = importlib.import_module(f"{_GEN}.dra.v1beta1.api_pb2")
health_v1alpha1: Any = importlib.import_module(f"{_GEN}.dra_health.v1alpha1.api_pb2")
registration_v1: Any = importlib.import_module(f"{_GEN}.pluginregistration.v1.api_pb2")

#: gRPC full service names (method paths are /<service>/<method>).
DRA_V1_SERVICE = "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
DRA_V1BETA1_SERVICE = "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin"
HEALTH_V1ALPHA1_SERVICE = "v1alpha1.DRAResourceHealth"
REGISTRATION_SERVICE = "pluginregistration.Registration"

#: What GetInfo advertises, most preferred first (kubelet picks the first entry it knows).
SUPPORTED_SERVICES = ["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth"]
PLUGIN_TYPE = "DRAPlugin"

__all__ = [
    "DRA_V1BETA1_SERVICE",
    "DRA_V1_SERVICE",
    "HEALTH_V1ALPHA1_SERVICE",
    "PLUGIN_TYPE",
    "REGISTRATION_SERVICE",
    "SUPPORTED_SERVICES",
    "dra_v1",
    "dra_v1beta1",
    "health_v1alpha1",
    "registration_v1",
]

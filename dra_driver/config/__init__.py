"""The driver's opaque configuration (``gpu.hami.io/v1alpha1`` ``GpuConfig``) and how it is resolved.

``model`` validates one object strictly; ``resolve`` merges the sources in precedence order
(pod annotations > claim config > DeviceClass config > controller defaults) into the engine's
inputs; ``schema`` renders the JSON schema published under ``api/``.
"""

from dra_driver.config.model import (
    API_VERSION,
    KIND,
    ConfigError,
    GpuConfig,
    ScoringWeightsConfig,
    parse_gpu_config,
)
from dra_driver.config.resolve import (
    ANNOTATION_DEVICE_WEIGHTS,
    ANNOTATION_GPU_POLICY,
    ANNOTATION_NODE_POLICY,
    ConfigSource,
    ControllerDefaults,
    ResolvedConfig,
    resolve_config,
)

__all__ = [
    "ANNOTATION_DEVICE_WEIGHTS",
    "ANNOTATION_GPU_POLICY",
    "ANNOTATION_NODE_POLICY",
    "API_VERSION",
    "KIND",
    "ConfigError",
    "ConfigSource",
    "ControllerDefaults",
    "GpuConfig",
    "ResolvedConfig",
    "ScoringWeightsConfig",
    "parse_gpu_config",
    "resolve_config",
]

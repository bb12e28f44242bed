"""hami-dra: a Kubernetes DRA driver for NVIDIA GPUs with HAMi's composable placement policies."""

__version__ = "0.1.0"

#: DRA driver name used in ResourceSlices, the kubelet plugin registration and DeviceClass selectors.
DEFAULT_DRIVER_NAME = "gpu.hami.io"

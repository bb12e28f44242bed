"""Node side of the driver: kubelet registration, DRA gRPC services, ResourceSlice publishing, CDI.

Each concern lives in its own module (``slices`` builds the ResourceSlices from discovered GPUs);
this package file stays empty on purpose so importing one module never drags in the others.
"""

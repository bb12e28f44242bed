"""The admission webhook: gates pods of our DeviceClasses and validates ``GpuConfig``.

``admission`` holds the decisions (pure functions over AdmissionReview dicts), ``lookup`` reads the
claims, templates and classes a pod refers to, ``server`` serves AdmissionReview v1 over HTTPS
(``/mutate``, ``/validate``, ``/healthz``) and ``command`` is ``hami-dra webhook``.
"""

GATE_NAME = "gpu.hami.io/allocation"

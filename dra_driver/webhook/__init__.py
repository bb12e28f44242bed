"""The admission webhook: gates pods of our DeviceClasses and validates ``GpuConfig``.

``admission`` holds the decisions (pure functions over AdmissionReview dicts), ``lookup`` reads the
claims, templates and classes a pod refers to, ``server`` serves AdmissionReview v1 over HTTPS
(``/mutate``, ``/mutate-hami``, ``/validate``, ``/healthz``) within the bounds of ``limits`` and
``connections``, with the certificate ``tls`` reloads, ``clientauth`` answers only the API
server's client certificate where one is configured, ``optin`` says which namespaces HAMi
resources are translated in (the controller applies it: the webhook writes nothing), and
``command`` is ``hami-dra webhook``.
"""

from dra_driver.contract import GATE_NAME

__all__ = ["GATE_NAME"]

"""Generic Kubernetes plumbing shared by the controller, the webhook and the CLI tools.

``api`` (a thin REST layer over the real ``kubernetes`` client: dicts in and out, typed errors),
``errors`` (the error hierarchy: what an API failure means, not its status code), ``watch``
(informers: list/watch with resume and relist), ``leader`` (Lease election), ``writes`` (the one
retry-on-conflict helper), ``events`` (``events.k8s.io/v1`` events with series), ``config``
(kubeconfig / in-cluster client loading).
"""

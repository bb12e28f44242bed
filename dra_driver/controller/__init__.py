"""The allocation controller: resolves ResourceClaims of our DeviceClasses to GPUs with the engine.

Layout: ``kube`` (thin REST layer: dicts in, dicts out), ``inventory`` (ResourceSlices -> engine
cards + CEL inputs), ``ledger`` (usage of every device from all allocated claims), ``requests``
(claim requests -> engine requests), ``allocation`` (engine placements -> ``status.allocation``),
``pods`` (where a pod may run), ``reconciler`` (the state machine), ``watch`` (list/watch with
resume and relist), ``leader`` (Lease election), ``metrics``, ``command`` (``hami-dra controller``).
"""

GATE_NAME = "gpu.hami.io/allocation"
FINALIZER = "gpu.hami.io/allocation"

"""The allocation controller: resolves ResourceClaims of our DeviceClasses to GPUs with the engine.

Layout: ``kube`` (thin REST layer: dicts in, dicts out), ``watch`` (informers: list/watch with
resume and relist), ``inventory`` (ResourceSlices -> engine cards + CEL inputs), ``ledger`` (usage
of every device from all allocated claims, whoever allocated them), ``requests`` (claim requests ->
engine requests; CEL and taint eligibility), ``pods`` (where a pod may run), ``planner`` (one
pod's claims through the engine, one node), ``allocation`` (a plan -> ``status.allocation``),
``reconciler`` (plan/commit/release state machine), ``controller`` (informers -> one worker thread
+ a writer pool), ``retries`` (the bounded, namespace-fair queue of pending pods to plan again),
``leader`` (Lease election), ``metrics``, ``command`` (``hami-dra controller``).
"""

from dra_driver.contract import FINALIZER, GATE_NAME

__all__ = ["FINALIZER", "GATE_NAME"]

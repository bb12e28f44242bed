"""The allocation controller: resolves ResourceClaims of our DeviceClasses to GPUs with the engine.

Split along kube-scheduler's seams, over the typed model of dra_driver/resource:

* ``controller`` — the worker: informers -> cache -> pod queue -> ``decide`` (allocate, then
  assume or hand the failure on) -> binder on a writer pool -> results folded back; the releaser
  each pass;
* ``cache`` — typed caches, indexes, the ledger and quotas; ``apply_event`` says whom a change
  wakes (``Wake``); ``assumed`` — what we wrote before the informers show it; ``slice_changes``
  (which nodes' devices to re-read); ``bound`` (CPU/memory bound per node, kept per pod);
  ``changelog`` (which nodes changed, so derived indexes catch up with only those);
* ``allocator`` — pure: a pod and the cache -> ``Placed`` or why not (no API calls); with
  ``nodefit`` (where the pod may run), ``eligibility`` (CEL + taints per request), ``planner``
  (one pod's claims through the engine), ``allocation`` (a plan -> ``status.allocation``),
  ``hami_annotation`` and ``decision_record`` (what the gate-lifting write records),
  ``containers`` (per-container GPU limits), ``inventory`` and ``ledger`` (devices and their use);
* ``binder`` — every write after a decision (finalizer, allocation, gate, condition, event,
  fence), on the one retry helper; ``binding`` — the binds in flight on the writer threads,
  collected by the worker; ``releaser`` — deallocation and overcommit repair;
* ``pod_queue`` — every pod yet to plan (active, woken, backoff, unschedulable, in flight) and
  which changes wake a pending pod, with its parts ``retries`` (the bounded, namespace-fair batch;
  the backoff) and ``pending`` (why each pending pod waits, as last reported); ``failure`` — a
  pod's fence, event and condition when it cannot be placed, after the pass; ``reasons`` — the
  pending reasons, one enum; ``quotas``, ``metrics`` (with
  ``gpu_series``: the per-card and per-claim samples, recomputed where they changed), ``command``
  (``hami-dra controller``).

Generic plumbing (REST client, errors, informers, leader election, write retry, events) is in
dra_driver/kube.
"""

from dra_driver.contract import FINALIZER, GATE_NAME

__all__ = ["FINALIZER", "GATE_NAME"]

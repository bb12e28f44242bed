"""The driver's real allocation controller, run in-process, with its decisions recorded for display.

The demo shows each card's score *from the controller's own decision*, not a recomputation: the
controller's planner is wrapped by :class:`RecordingPlanner`, which delegates every call and keeps
the engine ``Decision`` objects of each plan (the same objects the controller logs as HAMi's
"computer score" line). Nothing else about the controller is changed.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from dra_driver.engine import Decision


@dataclass(frozen=True)
class RecordedDecision:
    pod: str  # namespace/name
    subject: str  # "claim ns/name request gpu"
    config: str  # the resolved config, as the controller describes it
    decision: Decision


class RecordingPlanner:
    """Delegates to the controller's planner and records the decisions of every plan it makes."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._lock = threading.Lock()
        self.decisions: list[RecordedDecision] = []

    def plan(self, pod: Mapping[str, Any], *args: Any, **kwargs: Any) -> Any:
        result = self._inner.plan(pod, *args, **kwargs)
        meta = pod.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        with self._lock:
            for subject, decision, config in getattr(result, "decisions", ()):
                self.decisions.append(RecordedDecision(key, subject, config, decision))
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def for_pod(self, key: str) -> list[RecordedDecision]:
        with self._lock:
            return [d for d in self.decisions if d.pod == key]


class DemoController:
    """``hami-dra controller`` in-process (defaults: card policy spread, node policy binpack)."""

    def __init__(self, api_client: Any, driver: str) -> None:
        from dra_driver.config import ControllerDefaults
        from dra_driver.controller.controller import Controller
        from dra_driver.kube.api import Kube

        self._api_client = api_client
        self.controller = Controller(
            Kube(api_client), driver, ControllerDefaults(), identity="hami-dra-demo", resync_seconds=5.0
        )
        allocator = self.controller.allocator
        self.recorder = RecordingPlanner(allocator.planner)
        allocator.planner = self.recorder  # type: ignore[assignment]
        try:
            self.controller.start(sync_timeout=15.0)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        try:
            self.controller.stop()
        finally:
            self._api_client.close()

"""DRAPlugin v1 and v1beta1: translate kubelet's messages to the version-neutral Preparer.

Both versions have the same messages except ``Device.share_id`` (v1 only), so one class serves
both, parameterised by the generated module.
"""

from __future__ import annotations

import logging
import time
from types import ModuleType
from typing import Any

import grpc

from dra_driver.kubeletplugin.claims import ClaimRef
from dra_driver.kubeletplugin.metrics import PluginMetrics
from dra_driver.kubeletplugin.prepare import Preparer
from dra_driver.kubeletplugin.protos import DRA_V1_SERVICE, DRA_V1BETA1_SERVICE, dra_v1, dra_v1beta1

log = logging.getLogger(__name__)


class DraService:
    """One API version of the DRAPlugin service."""

    def __init__(
        self, preparer: Preparer, pb: ModuleType, service_name: str, metrics: PluginMetrics | None = None
    ) -> None:
        self.preparer = preparer
        self.pb = pb
        self.service_name = service_name
        self.metrics = metrics
        self.has_share_id = "share_id" in pb.Device.DESCRIPTOR.fields_by_name

    @staticmethod
    def _refs(request: Any) -> list[ClaimRef]:
        return [ClaimRef(c.namespace, c.name, c.uid) for c in request.claims]

    def node_prepare_resources(self, request: Any, context: grpc.ServicerContext) -> Any:
        started = time.perf_counter()
        response = self.pb.NodePrepareResourcesResponse()
        for uid, result in self.preparer.prepare(self._refs(request)).items():
            entry = response.claims[uid]
            if result.error:
                entry.error = result.error
                log.warning("NodePrepareResources claim %s: %s", uid, result.error)
                continue
            cdi_ids = " ".join(cdi_id for device in result.devices for cdi_id in device.cdi_ids)
            log.info("NodePrepareResources claim %s: %s", uid, cdi_ids)
            for device in result.devices:
                message = entry.devices.add(
                    request_names=device.request_names,
                    pool_name=device.pool,
                    device_name=device.device,
                    cdi_device_ids=device.cdi_ids,
                )
                if device.share_id is not None and self.has_share_id:
                    message.share_id = device.share_id
        if self.metrics is not None:
            self.metrics.latency.labels("prepare").observe(time.perf_counter() - started)
        return response

    def node_unprepare_resources(self, request: Any, context: grpc.ServicerContext) -> Any:
        started = time.perf_counter()
        response = self.pb.NodeUnprepareResourcesResponse()
        for uid, error in self.preparer.unprepare(self._refs(request)).items():
            response.claims[uid].error = error
            if error:
                log.warning("NodeUnprepareResources claim %s: %s", uid, error)
            else:
                log.info("NodeUnprepareResources claim %s: unprepared", uid)
        if self.metrics is not None:
            self.metrics.latency.labels("unprepare").observe(time.perf_counter() - started)
        return response

    def handler(self) -> grpc.GenericRpcHandler:
        pb = self.pb
        return grpc.method_handlers_generic_handler(
            self.service_name,
            {
                "NodePrepareResources": grpc.unary_unary_rpc_method_handler(
                    self.node_prepare_resources,
                    request_deserializer=pb.NodePrepareResourcesRequest.FromString,
                    response_serializer=pb.NodePrepareResourcesResponse.SerializeToString,
                ),
                "NodeUnprepareResources": grpc.unary_unary_rpc_method_handler(
                    self.node_unprepare_resources,
                    request_deserializer=pb.NodeUnprepareResourcesRequest.FromString,
                    response_serializer=pb.NodeUnprepareResourcesResponse.SerializeToString,
                ),
            },
        )


def dra_handlers(preparer: Preparer, metrics: PluginMetrics | None = None) -> list[grpc.GenericRpcHandler]:
    """Handlers for both served DRA versions."""
    return [
        DraService(preparer, dra_v1, DRA_V1_SERVICE, metrics).handler(),
        DraService(preparer, dra_v1beta1, DRA_V1BETA1_SERVICE, metrics).handler(),
    ]

"""The registration service kubelet's plugin watcher calls on ``<registry-dir>/<driver>-reg.sock``."""

from __future__ import annotations

import logging
import threading
from typing import Any

import grpc

from dra_driver.kubeletplugin.protos import (
    PLUGIN_TYPE,
    REGISTRATION_SERVICE,
    SUPPORTED_SERVICES,
    registration_v1,
)

LOG = logging.getLogger(__name__)


class RegistrationService:
    """Answers GetInfo and records kubelet's verdict (``registered`` is set once kubelet accepts)."""

    def __init__(self, driver_name: str, endpoint: str) -> None:
        self.driver_name = driver_name
        self.endpoint = endpoint
        self.registered = threading.Event()
        self.last_error = ""

    def get_info(self, request: Any, context: grpc.ServicerContext) -> Any:
        return registration_v1.PluginInfo(
            type=PLUGIN_TYPE,
            name=self.driver_name,
            endpoint=self.endpoint,
            supported_versions=SUPPORTED_SERVICES,
        )

    def notify_registration_status(self, request: Any, context: grpc.ServicerContext) -> Any:
        if request.plugin_registered:
            LOG.info("kubelet registered plugin %s", self.driver_name)
            self.last_error = ""
            self.registered.set()
        else:
            LOG.error("kubelet rejected plugin %s: %s", self.driver_name, request.error)
            self.last_error = request.error
            self.registered.clear()
        return registration_v1.RegistrationStatusResponse()

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            REGISTRATION_SERVICE,
            {
                "GetInfo": grpc.unary_unary_rpc_method_handler(
                    self.get_info,
                    request_deserializer=registration_v1.InfoRequest.FromString,
                    response_serializer=registration_v1.PluginInfo.SerializeToString,
                ),
                "NotifyRegistrationStatus": grpc.unary_unary_rpc_method_handler(
                    self.notify_registration_status,
                    request_deserializer=registration_v1.RegistrationStatus.FromString,
                    response_serializer=registration_v1.RegistrationStatusResponse.SerializeToString,
                ),
            },
        )

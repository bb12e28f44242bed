"""``hami-dra webhook``: serve admission reviews until interrupted."""

from __future__ import annotations

import argparse
import logging
import ssl
import threading
from typing import Any

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.cli import UsageError
from dra_driver.kubeconfig import load_api_client

log = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "webhook",
        help="admission webhook: gate pods of our DeviceClasses, validate GpuConfig",
        description="Serve AdmissionReview v1 on /mutate and /validate (HTTPS), health on /healthz.",
    )
    parser.add_argument("--tls-cert-file", required=True, help="PEM certificate served to the API server")
    parser.add_argument("--tls-key-file", required=True, help="PEM private key of the certificate")
    parser.add_argument("--port", type=int, default=8443, help="HTTPS port (default 8443)")
    parser.add_argument("--driver-name", default=DEFAULT_DRIVER_NAME, help="DRA driver name")
    parser.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: in-cluster)")
    parser.add_argument(
        "--hami-device-class",
        default=None,
        help="DeviceClass that pods asking for HAMi's nvidia.com/gpu, gpumem, gpucores get on "
        "/mutate-hami (default: the class named like the driver)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from dra_driver.webhook.lookup import KubeLookup
    from dra_driver.webhook.server import WebhookServer, tls_context

    if not 0 < args.port < 65536:
        raise UsageError(f"--port must be within 1..65535, got {args.port}")
    try:
        context = tls_context(args.tls_cert_file, args.tls_key_file)
    except (OSError, ssl.SSLError) as err:
        raise UsageError(f"cannot load --tls-cert-file/--tls-key-file: {err}") from None
    api_client = load_api_client(args.kubeconfig)
    server = WebhookServer(
        KubeLookup(api_client, args.driver_name),
        args.driver_name,
        port=args.port,
        ssl_context=context,
        hami_device_class=args.hami_device_class,
    )
    server.start()
    log.warning("hami-dra webhook serving on :%d for driver %s", server.port, args.driver_name)
    from dra_driver.controller.kube import Kube
    from dra_driver.webhook.coexistence import warn_about_coexistence

    warn_about_coexistence(Kube(api_client))
    try:
        threading.Event().wait()
    finally:
        server.stop()
    return 0

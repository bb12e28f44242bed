"""``hami-dra webhook``: serve admission reviews until interrupted.

The limits (connections, deadline, body sizes) and the HAMi translation scope are flags so the
chart can set them from ``webhook.server`` and ``webhook.hamiResources``; their defaults are
``ServerLimits``'s and the chart's.
"""

from __future__ import annotations

import argparse
import logging
import ssl
import threading
from typing import Any

from dra_driver import DEFAULT_DRIVER_NAME
from dra_driver.cli import UsageError
from dra_driver.kube.config import load_api_client
from dra_driver.webhook.clientauth import ClientAuth
from dra_driver.webhook.limits import ServerLimits
from dra_driver.webhook.optin import (
    TRANSLATE_MODES,
)

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
    parser.add_argument(
        "--client-ca-file",
        default=None,
        help="answer reviews only to clients presenting a certificate this CA signed: the API server's, "
        "configured with --admission-control-config-file (docs/multi-tenant.md); health and metrics "
        "stay open",
    )
    parser.add_argument(
        "--client-name",
        action="append",
        default=[],
        help="with --client-ca-file: a common or DNS name the client certificate must carry "
        "(repeatable; default: any certificate the CA signed)",
    )
    _add_limit_flags(parser)
    _add_translation_flags(parser)
    parser.set_defaults(handler=run)


def _add_limit_flags(parser: argparse.ArgumentParser) -> None:
    defaults = ServerLimits()
    parser.add_argument(
        "--max-connections",
        type=int,
        default=defaults.max_connections,
        help="open connections at most; at the cap the longest-waiting idle one is closed to make room "
        f"(default {defaults.max_connections})",
    )
    parser.add_argument(
        "--connection-timeout",
        type=float,
        default=defaults.connection_timeout,
        help="seconds a connection has, from connecting or from a request's first byte, to deliver the "
        f"complete request: TLS handshake, headers and body (default {defaults.connection_timeout:g})",
    )
    parser.add_argument(
        "--idle-timeout",
        type=float,
        default=defaults.idle_timeout,
        help="seconds a kept-alive connection may stay silent after an answer; keep it above "
        "kube-apiserver's 90 s, so the API server closes idle connections first and never sends a "
        f"review on one being closed (default {defaults.idle_timeout:g})",
    )
    parser.add_argument(
        "--max-request-bytes",
        type=int,
        default=defaults.max_request_bytes,
        help=f"largest AdmissionReview body (default {defaults.max_request_bytes}: the API server's "
        "own request limit)",
    )
    parser.add_argument(
        "--max-inflight-bytes",
        type=int,
        default=defaults.max_inflight_bytes,
        help="review body bytes being read and decided at once, over all connections; bounds memory "
        f"(default {defaults.max_inflight_bytes})",
    )


def _add_translation_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--hami-translate",
        choices=TRANSLATE_MODES,
        default="namespaces",
        help="serve /mutate-hami (namespaces, all) or not (off); which namespaces translate is the "
        "webhook configuration's namespaceSelector, and the controller's flag of the same name "
        "(default namespaces)",
    )


def _limits(args: argparse.Namespace) -> ServerLimits:
    limits = ServerLimits(
        max_connections=args.max_connections,
        connection_timeout=args.connection_timeout,
        idle_timeout=args.idle_timeout,
        max_request_bytes=args.max_request_bytes,
        max_inflight_bytes=args.max_inflight_bytes,
    )
    problems = limits.problems()
    if problems:
        raise UsageError("; ".join(problems))
    return limits


def run(args: argparse.Namespace) -> int:
    from dra_driver.webhook.lookup import KubeLookup
    from dra_driver.webhook.server import ReloadingCertificate, WebhookServer

    if not 0 < args.port < 65536:
        raise UsageError(f"--port must be within 1..65535, got {args.port}")
    limits = _limits(args)
    client_auth = None
    if args.client_name and not args.client_ca_file:
        raise UsageError("--client-name needs --client-ca-file")
    if args.client_ca_file:
        try:
            client_auth = ClientAuth(args.client_ca_file, args.client_name)
        except (OSError, ssl.SSLError) as err:
            raise UsageError(f"cannot load --client-ca-file: {err}") from None
    try:
        certificate = ReloadingCertificate(args.tls_cert_file, args.tls_key_file, client_auth)
    except (OSError, ssl.SSLError) as err:
        raise UsageError(f"cannot load --tls-cert-file/--tls-key-file: {err}") from None
    api_client = load_api_client(args.kubeconfig)
    lookup = KubeLookup(api_client, args.driver_name)
    server = WebhookServer(
        lookup,
        args.driver_name,
        port=args.port,
        certificate=certificate,
        hami_device_class=args.hami_device_class,
        hami_translate=args.hami_translate,
        limits=limits,
        client_auth=client_auth,
    )
    server.start()
    log.warning(
        "hami-dra webhook serving on :%d for driver %s (at most %d connections, %gs per request, "
        "%gs idle, bodies up to %d bytes, HAMi translation: %s, reviews from %s)",
        server.port,
        args.driver_name,
        limits.max_connections,
        limits.connection_timeout,
        limits.idle_timeout,
        limits.max_request_bytes,
        args.hami_translate,
        "any client" if client_auth is None else f"client certificates of {args.client_ca_file}",
    )
    from dra_driver.kube.api import Kube
    from dra_driver.webhook.coexistence import warn_about_coexistence

    warn_about_coexistence(Kube(api_client))
    try:
        threading.Event().wait()
    finally:
        server.stop()
    return 0

"""Fixtures every test folder shares: the real API server tier (tests/apiserver_fixtures.py).

Imported here, once, so the session-scoped ``apiserver`` is one server for the whole run; tests that
use it (or the controller tier's ``controller_plane``) are marked ``apiserver`` (``-m "not apiserver"``
leaves both out).
"""

from __future__ import annotations

import pytest

from tests.apiserver_fixtures import (  # noqa: F401
    CONTROLLER_STARTS,
    STARTS,
    api_driver,
    api_kube,
    api_kubectl,
    api_namespace,
    apiserver,
    apiserver_client,
    controller_plane,
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if "apiserver" in fixtures or "controller_plane" in fixtures:
            item.add_marker(pytest.mark.apiserver)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for seconds in STARTS:
        terminalreporter.write_line(f"real API server tier: etcd + kube-apiserver started in {seconds:.1f}s")
    for seconds in CONTROLLER_STARTS:
        terminalreporter.write_line(
            f"controller tier: the same plus kcm and kube-scheduler, started in {seconds:.1f}s"
        )

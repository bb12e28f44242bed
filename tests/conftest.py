"""Fixtures every test folder shares: the real API server tier (tests/apiserver_fixtures.py).

Imported here, once, so the session-scoped ``apiserver`` is one server for the whole run; tests that
use it are marked ``apiserver`` (``-m "not apiserver"`` leaves the tier out).
"""

from __future__ import annotations

import pytest

from tests.apiserver_fixtures import (  # noqa: F401
    STARTS,
    api_driver,
    api_kube,
    api_kubectl,
    api_namespace,
    apiserver,
    apiserver_client,
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "apiserver" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.apiserver)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for seconds in STARTS:
        terminalreporter.write_line(f"real API server tier: etcd + kube-apiserver started in {seconds:.1f}s")

"""``hami-dra kubelet-plugin``'s flags and environment variables as they map to PluginOptions.

New spellings (``--x=true|false``, ``--metrics-bind-address``, variables named after their flags)
and the deprecated old ones (``--no-x``, ``--metrics-port``, ``CDI_ROOT``...) give the same options;
the old ones log one warning naming the new spelling. Running the plugin is test_recovery.py's.
"""

from __future__ import annotations

import logging
from pathlib import Path, PurePosixPath

import pytest

from dra_driver import cli, flags
from dra_driver.kubeletplugin.command import plugin_options
from dra_driver.kubeletplugin.plugin import PluginOptions

BASE = ["kubelet-plugin", "--node-name", "n1", "--source", "simulated", "--profile", "t4"]

#: Every variable the subcommand reads, new and deprecated, so the host's environment cannot leak in.
VARIABLES = (
    "NODE_NAME", "DRIVER_NAME", "KUBELET_PLUGIN_SOURCE", "SOURCE", "DEVICE_SOURCE", "NVIDIA_DRIVER_ROOT",
    "KUBELET_PLUGIN_PROFILE", "PROFILE", "GPU_PROFILE", "KUBELET_PLUGIN_GPUS", "GPUS", "GPU_COUNT",
    "DEVICES_FILE", "KUBECONFIG", "PLUGIN_DIR", "REGISTRY_DIR", "CDI_DIR", "CDI_ROOT", "HAMI_CORE_LIB",
    "CORE_UTILIZATION_POLICY", "NVIDIA_CDI_KIND", "HOST_ROOT", "ALLOW_DEVICE_PLUGIN", "METRICS_BIND_ADDRESS",
    "METRICS_PORT", "POLICY_TAINT", "KUBELET_PLUGIN_PUBLISH", "PUBLISH", "HEALTH_FILE",
)  # fmt: skip


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(flags, "_warned", set())


def options(*argv: str) -> PluginOptions:
    return plugin_options(cli.build_parser().parse_args([*BASE, *argv]))


def test_defaults() -> None:
    o = options()
    assert (o.policy_taint, o.publish, o.allow_device_plugin, o.metrics_port) == (True, True, False, None)
    assert o.cdi_dir == Path("/var/run/cdi")


@pytest.mark.parametrize(
    ("new", "old", "field", "value"),
    [
        (["--policy-taint=false"], ["--no-policy-taint"], "policy_taint", False),
        (["--policy-taint", "false"], ["--no-policy-taint"], "policy_taint", False),
        (["--publish=false"], ["--no-publish"], "publish", False),
        (["--publish=0"], ["--no-publish"], "publish", False),
        (["--metrics-bind-address=:9400"], ["--metrics-port=9400"], "metrics_port", 9400),
        (["--metrics-bind-address", ":8080"], ["--metrics-port", "8080"], "metrics_port", 8080),
        (["--metrics-bind-address=0"], ["--metrics-port=0"], "metrics_port", None),
    ],
)
def test_new_spellings_and_their_deprecated_aliases_agree(
    new: list[str], old: list[str], field: str, value: object
) -> None:
    assert getattr(options(*new), field) == value
    assert options(*old) == options(*new)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--allow-device-plugin"], True),
        (["--allow-device-plugin=true"], True),
        (["--allow-device-plugin=True"], True),
        (["--allow-device-plugin=1"], True),
        (["--allow-device-plugin=false"], False),
        ([], False),
    ],
)
def test_allow_device_plugin_takes_a_value(argv: list[str], expected: bool) -> None:
    assert options(*argv).allow_device_plugin is expected


def test_the_last_of_a_flag_and_its_alias_wins() -> None:
    assert options("--no-publish", "--publish").publish is True
    assert options("--publish=true", "--no-publish").publish is False


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--publish=maybe"], "argument --publish: expected true or false, got 'maybe'"),
        (["--metrics-bind-address=9400"], "argument --metrics-bind-address: expected HOST:PORT"),
        (["--metrics-port=70000"], "argument --metrics-port: a port must be within 0..65535, got 70000"),
    ],
)
def test_bad_values_are_argument_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.main([*BASE, *argv])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("address", "port", "host"),
    [
        (":9400", 9400, ""),
        ("0.0.0.0:9400", 9400, "0.0.0.0"),
        ("127.0.0.1:9400", 9400, "127.0.0.1"),
        ("[::]:9400", 9400, "::"),
        ("[::1]:9400", 9400, "::1"),
        ("0", None, ""),
    ],
)
def test_the_metrics_host_reaches_the_options(address: str, port: int | None, host: str) -> None:
    o = options(f"--metrics-bind-address={address}")
    assert (o.metrics_port, o.metrics_host) == (port, host)


@pytest.mark.parametrize(
    ("variable", "value", "field", "expected"),
    [
        ("DRIVER_NAME", "gpu.example.com", "driver_name", "gpu.example.com"),
        ("PLUGIN_DIR", "/p", "plugin_dir", Path("/p")),
        ("REGISTRY_DIR", "/r", "registry_dir", Path("/r")),
        ("CDI_DIR", "/cdi", "cdi_dir", Path("/cdi")),
        ("HAMI_CORE_LIB", "/lib/libvgpu.so", "hami_core_lib", Path("/lib/libvgpu.so")),
        ("CORE_UTILIZATION_POLICY", "force", "core_utilization_policy", "force"),
        ("NVIDIA_CDI_KIND", "management.nvidia.com/gpu", "nvidia_cdi_kind", "management.nvidia.com/gpu"),
        ("HOST_ROOT", "/host", "host_root", Path("/host")),
        ("HOST_DRIVER_ROOT", "/run/nvidia/driver", "host_driver_root", PurePosixPath("/run/nvidia/driver")),
        ("NVIDIA_DRIVER_ROOT", "/driver-root", "nvidia_driver_root", Path("/driver-root")),
        ("ALLOW_DEVICE_PLUGIN", "true", "allow_device_plugin", True),
        ("METRICS_BIND_ADDRESS", ":9400", "metrics_port", 9400),
        ("POLICY_TAINT", "false", "policy_taint", False),
        ("KUBELET_PLUGIN_PUBLISH", "false", "publish", False),
        ("HEALTH_FILE", "/h.yaml", "health_file", Path("/h.yaml")),
    ],
)
def test_environment_variables_named_after_flags(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, field: str, expected: object
) -> None:
    monkeypatch.setenv(variable, value)
    parsed = cli.build_parser().parse_args(["kubelet-plugin", "--node-name", "n1", "--source", "simulated"])
    assert getattr(plugin_options(parsed), field) == expected
    assert type(getattr(plugin_options(parsed), field)) is type(expected)
    assert not getattr(parsed, flags.ENV_NOTES, ())


@pytest.mark.parametrize(
    ("variable", "value", "attribute", "expected"),
    [
        ("NODE_NAME", "env-node", "node_name", "env-node"),
        ("KUBELET_PLUGIN_SOURCE", "simulated", "source", "simulated"),
        ("KUBELET_PLUGIN_PROFILE", "h200", "profile", "h200"),
        ("KUBELET_PLUGIN_GPUS", "3", "gpus", 3),
        ("DEVICES_FILE", "/d.yaml", "devices_file", Path("/d.yaml")),
        ("KUBECONFIG", "/k", "kubeconfig", "/k"),
        ("NVIDIA_DRIVER_ROOT", "/driver-root", "nvidia_driver_root", Path("/driver-root")),
    ],
)
def test_environment_variables_checked_before_the_options(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, attribute: str, expected: object
) -> None:
    monkeypatch.setenv(variable, value)
    parsed = getattr(cli.build_parser().parse_args(["kubelet-plugin"]), attribute)
    assert parsed == expected
    assert type(parsed) is type(expected)  # a plain str: YAML cannot write a subclass


@pytest.mark.parametrize(
    ("old", "new", "value", "attribute", "expected"),
    [
        ("SOURCE", "KUBELET_PLUGIN_SOURCE", "simulated", "source", "simulated"),
        ("DEVICE_SOURCE", "KUBELET_PLUGIN_SOURCE", "simulated", "source", "simulated"),
        ("PROFILE", "KUBELET_PLUGIN_PROFILE", "h200", "profile", "h200"),
        ("GPU_PROFILE", "KUBELET_PLUGIN_PROFILE", "h200", "profile", "h200"),
        ("GPUS", "KUBELET_PLUGIN_GPUS", "3", "gpus", 3),
        ("GPU_COUNT", "KUBELET_PLUGIN_GPUS", "3", "gpus", 3),
        ("PUBLISH", "KUBELET_PLUGIN_PUBLISH", "false", "publish", False),
        ("CDI_ROOT", "CDI_DIR", "/old-cdi", "cdi_dir", Path("/old-cdi")),
    ],
)
def test_deprecated_variables_still_work_with_a_warning_and_yield_to_the_new_ones(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    old: str,
    new: str,
    value: str,
    attribute: str,
    expected: object,
) -> None:
    monkeypatch.setenv(old, value)
    parsed = cli.build_parser().parse_args(["kubelet-plugin"])
    assert getattr(parsed, attribute) == expected
    with caplog.at_level(logging.WARNING, logger="dra_driver.cli"):
        flags.warn_deprecations(parsed)
    assert [r.getMessage() for r in caplog.records] == [
        f"environment variable {old} is deprecated: set {new} instead"
    ]
    newer = {"cdi_dir": "/new", "gpus": "5", "publish": "true"}.get(attribute, "nvml")
    monkeypatch.setenv(new, newer)
    parsed = cli.build_parser().parse_args(["kubelet-plugin"])
    assert getattr(parsed, attribute) != expected
    assert not getattr(parsed, flags.ENV_NOTES, ())


def test_metrics_port_variable_is_a_deprecated_fallback(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("METRICS_PORT", "9400")
    parsed = cli.build_parser().parse_args(BASE)
    assert plugin_options(parsed).metrics_port == 9400
    with caplog.at_level(logging.WARNING, logger="dra_driver.cli"):
        flags.warn_deprecations(parsed)
    assert [r.getMessage() for r in caplog.records] == [
        "environment variable METRICS_PORT is deprecated: set METRICS_BIND_ADDRESS=:9400 instead"
    ]
    monkeypatch.setenv("METRICS_BIND_ADDRESS", ":9500")
    assert options().metrics_port == 9500


def test_a_bad_variable_is_an_argument_error_naming_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GPU_COUNT", "four")
    with pytest.raises(SystemExit):
        cli.main(["kubelet-plugin"])
    assert "argument --gpus: expected an integer, got 'four' (environment variable GPU_COUNT)" in (
        capsys.readouterr().err
    )
    monkeypatch.setenv("ALLOW_DEVICE_PLUGIN", "yes")
    with pytest.raises(SystemExit):
        cli.main(["kubelet-plugin", "--gpus", "4"])
    assert "(environment variable ALLOW_DEVICE_PLUGIN)" in capsys.readouterr().err
    monkeypatch.delenv("ALLOW_DEVICE_PLUGIN")
    monkeypatch.setenv("PUBLISH", "maybe")
    with pytest.raises(SystemExit):
        cli.main(["kubelet-plugin", "--gpus", "4"])
    assert "argument --publish: expected true or false, got 'maybe' (environment variable PUBLISH)" in (
        capsys.readouterr().err
    )


def test_another_subcommand_never_warns_about_the_plugins_variables(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CDI_ROOT", "/old-cdi")
    with caplog.at_level(logging.WARNING, logger="dra_driver.cli"):
        assert cli.main(["discover", "--profile", "t4", "--gpus", "1", "--node-name", "n1"]) == 0
    capsys.readouterr()
    assert not caplog.records


def test_the_old_spellings_warn_once_each_when_the_command_runs(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """What the chart passes today: it still starts (here it stops at the missing --source), warning."""
    monkeypatch.setenv("CDI_ROOT", "/old-cdi")
    old = ["kubelet-plugin", "--node-name", "n1", "--no-policy-taint", "--no-publish", "--metrics-port=8080"]
    with caplog.at_level(logging.WARNING, logger="dra_driver.cli"):
        assert cli.main(old) == 2
        assert cli.main(old) == 2
    assert "--source nvml|simulated is required" in capsys.readouterr().err
    assert [r.getMessage() for r in caplog.records] == [
        "environment variable CDI_ROOT is deprecated: set CDI_DIR instead",
        "--no-policy-taint is deprecated: use --policy-taint=false",
        "--no-publish is deprecated: use --publish=false",
        "--metrics-port is deprecated: use --metrics-bind-address=:8080",
    ]

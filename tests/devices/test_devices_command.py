"""``hami-dra discover`` end to end through the real CLI entry point (in process)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from kube_validate import assert_valid

from dra_driver.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "devices"


def discover(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["discover", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_done_criterion_h100_node(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = discover(
        capsys, "--source", "simulated", "--profile", "h100-80gb", "--gpus", "8", "--node-name", "node-1"
    )
    assert code == 0
    (slice_,) = list(yaml.safe_load_all(out))
    assert_valid(slice_)
    devices = slice_["spec"]["devices"]
    assert len(devices) == 8
    for device in devices:
        assert set(device["capacity"]) == {"memory", "cores", "slots"}
        assert "resource.kubernetes.io/numaNode" in device["attributes"]


def test_json_output_and_source_inferred_from_profile(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = discover(capsys, "--profile", "t4", "--gpus", "2", "--node-name", "n1", "-o", "json")
    assert code == 0
    slice_ = json.loads(out)
    assert slice_["kind"] == "ResourceSlice"
    assert [d["name"] for d in slice_["spec"]["devices"]] == ["gpu-0", "gpu-1"]
    assert_valid(slice_)


def test_table_has_a_line_per_gpu_and_wide_adds_identity_and_topology(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ("--profile", "t4", "--gpus", "2", "--node-name", "n1", "--taint-unhealthy")
    code, table, _ = discover(capsys, *args, "-o", "table")
    assert code == 0
    lines = table.splitlines()
    assert lines[0].split() == [
        "NODE",
        "DEVICE",
        "PRODUCT",
        "MEMORY",
        "CORES",
        "SLOTS",
        "ISOLATION",
        "HEALTHY",
    ]
    assert lines[1].split() == ["n1", "gpu-0", "Tesla", "T4", "14967Mi", "100", "10", "simulated", "true"]
    assert len(lines) == 3
    _, wide, _ = discover(capsys, *args, "-o", "wide")
    _, document, _ = discover(capsys, *args, "-o", "json")
    devices = json.loads(document)["spec"]["devices"]
    header, *rows = wide.splitlines()
    assert header.split()[8:] == ["UUID", "NUMA", "PCI", "COMPUTE-MODE", "TAINTS"]
    for row, device in zip(rows, devices, strict=True):
        attributes = device["attributes"]
        assert row.split()[9:13] == [
            attributes["uuid"]["string"],
            str(attributes["resource.kubernetes.io/numaNode"]["int"]),
            attributes["resource.kubernetes.io/pciBusID"]["string"],
            "Default",
        ]


def test_yaml_stays_the_default(capsys: pytest.CaptureFixture[str]) -> None:
    args = ("--profile", "t4", "--gpus", "1", "--node-name", "n1")
    assert discover(capsys, *args)[1] == discover(capsys, *args, "-o", "yaml")[1]


def test_several_slices_print_as_a_list_or_documents(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = discover(capsys, "--profile", "t4", "--gpus", "130", "--node-name", "n1", "-o", "json")
    assert code == 0
    listing = json.loads(out)
    assert listing["kind"] == "List" and len(listing["items"]) == 2
    code, out, _ = discover(capsys, "--profile", "t4", "--gpus", "130", "--node-name", "n1")
    assert [len(doc["spec"]["devices"]) for doc in yaml.safe_load_all(out)] == [128, 2]


def test_devices_file_and_taint_preview(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = discover(
        capsys, "--devices-file", str(EXAMPLES / "mixed.yaml"), "--node-name", "node-1", "--policy-taint",
        "--taint-unhealthy", "--driver-name", "gpu.example.com",
    )  # fmt: skip
    assert code == 0
    (slice_,) = list(yaml.safe_load_all(out))
    assert_valid(slice_)
    assert slice_["spec"]["driver"] == "gpu.example.com"
    taints = [[t["key"] for t in d["taints"]] for d in slice_["spec"]["devices"]]
    assert taints[3] == ["gpu.example.com/policy-managed", "gpu.example.com/unhealthy"]
    assert taints[0] == ["gpu.example.com/policy-managed"]


def test_node_name_from_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NODE_NAME", "from-env")
    # The default is read when the parser is built, i.e. inside main().
    code, out, _ = discover(capsys, "--profile", "t4", "--gpus", "1", "-o", "json")
    assert code == 0
    assert json.loads(out)["spec"]["nodeName"] == "from-env"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--profile", "t4"], "--node-name is required (or set NODE_NAME)"),
        (["--source", "simulated", "--node-name", "n"], "--source simulated needs --profile NAME"),
        (["--source", "nvml", "--profile", "t4", "--node-name", "n"], "only apply to --source simulated"),
        (["--profile", "t4", "--gpus", "-3", "--node-name", "n"], "--gpus must be within 0..1024"),
        (["--profile", "t4", "--node-name", "Node_1"], "node name 'Node_1' is not a valid DNS subdomain"),
        (["--devices-file", "/nonexistent/d.yaml", "--node-name", "n"], "cannot read devices file"),
    ],
)
def test_user_errors_are_one_line_with_exit_status_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    code, out, err = discover(capsys, *args)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("hami-dra discover: error: ")
    assert message in err


@pytest.mark.parametrize(
    ("flags", "keys"),
    [
        ([], []),
        (["--policy-taint"], ["gpu.hami.io/policy-managed"]),
        (["--policy-taint=true"], ["gpu.hami.io/policy-managed"]),
        (["--policy-taint=false"], []),
        (["--policy-taint", "--policy-taint=0"], []),
        (["--policy-taint=false", "--taint-unhealthy=true"], []),
    ],
)
def test_taint_previews_take_true_or_false(
    capsys: pytest.CaptureFixture[str], flags: list[str], keys: list[str]
) -> None:
    code, out, _ = discover(
        capsys, "--profile", "t4", "--gpus", "1", "--node-name", "n1", "-o", "json", *flags
    )
    assert code == 0
    (device,) = json.loads(out)["spec"]["devices"]
    assert [t["key"] for t in device.get("taints", [])] == keys


def test_a_taint_preview_that_is_not_a_boolean_is_an_argument_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        discover(capsys, "--profile", "t4", "--node-name", "n1", "--taint-unhealthy=maybe")
    assert "argument --taint-unhealthy: expected true or false, got 'maybe'" in capsys.readouterr().err


@pytest.fixture
def nvml_as_t4(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """``--source nvml`` answered by a simulated T4 (no NVML here); records the node names asked for."""
    from dra_driver.devices import command
    from dra_driver.devices.source import open_source

    asked: list[str] = []

    def fake_open_source(kind: str, *, node_name: str, **_: object) -> object:
        assert kind == "nvml"
        asked.append(node_name)
        return open_source("simulated", node_name=node_name, profile="t4", gpus=1)

    monkeypatch.setattr(command, "open_source", fake_open_source)
    monkeypatch.delenv("NODE_NAME", raising=False)
    return asked


def test_nvml_node_name_defaults_to_the_host_name_lower_cased(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, nvml_as_t4: list[str]
) -> None:
    monkeypatch.setattr("socket.gethostname", lambda: "GPU-Node-7.Example.com")
    code, out, _ = discover(capsys, "--source", "nvml", "-o", "json")
    assert code == 0
    assert json.loads(out)["spec"]["nodeName"] == "gpu-node-7.example.com"
    code, out, _ = discover(capsys, "-o", "json")  # nvml is the default source
    assert code == 0 and nvml_as_t4 == ["gpu-node-7.example.com"] * 2


def test_nvml_node_name_prefers_the_flag_then_node_name(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, nvml_as_t4: list[str]
) -> None:
    monkeypatch.setattr("socket.gethostname", lambda: "host-1")
    assert discover(capsys, "--source", "nvml", "--node-name", "flag-node")[0] == 0
    monkeypatch.setenv("NODE_NAME", "env-node")
    assert discover(capsys, "--source", "nvml")[0] == 0
    assert nvml_as_t4 == ["flag-node", "env-node"]


def test_a_host_name_that_is_no_node_name_asks_for_the_flag(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, nvml_as_t4: list[str]
) -> None:
    monkeypatch.setattr("socket.gethostname", lambda: "my_host")
    code, out, err = discover(capsys, "--source", "nvml")
    assert code == 2 and out == "" and nvml_as_t4 == []
    assert err == (
        "hami-dra discover: error: the host name 'my_host' is not a valid node name: "
        "pass --node-name (or set NODE_NAME)\n"
    )


def test_mig_on_demand_preview_per_server_version(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    devices = tmp_path / "devices.yaml"
    devices.write_text(
        yaml.safe_dump({"gpus": [{"profile": "h200", "migEnabled": True}, {"profile": "h200"}]})
    )
    base = ["--devices-file", str(devices), "--node-name", "node-1", "--mig-on-demand", "all", "-o", "json"]
    code, out, _ = discover(capsys, *base)
    assert code == 0
    items = json.loads(out)["items"]  # 1.37: the card, the counter set, the placements
    assert [sorted(s["spec"].keys() & {"devices", "sharedCounters"}) for s in items] == [
        ["devices"],
        ["sharedCounters"],
        ["devices"],
    ]
    assert [d["name"] for d in items[0]["spec"]["devices"]] == ["gpu-1"]  # not in MIG mode: whole
    assert len(items[2]["spec"]["devices"]) == 18
    code, out, _ = discover(capsys, *base, "--kube-version", "1.34")
    items = json.loads(out)["items"]
    assert (
        items[1]["spec"]["sharedCounters"][0]["name"] == "gpu-0-mig"
        and len(items[1]["spec"]["devices"]) == 18
    )
    for slice_ in items:
        assert_valid(slice_, versions=("1.34",))
    code, _, err = discover(capsys, *base, "--kube-version", "2.0")
    assert code == 2 and "--kube-version: '2.0' is not 1.<minor>" in err

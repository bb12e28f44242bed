"""Our api/ protos vs kubelet's upstream protos, and the checked-in generated code vs a fresh run."""

from __future__ import annotations

import filecmp
import subprocess
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from hami_dra_dev.kubelet import OWN_PROTOS, UPSTREAM_PROTOS, compile_descriptor_set
from tests.kubeletplugin.upstream import REPO_ROOT, require_upstream

FieldKey = tuple[str, int, int, str, bool]


def _contract(descriptor_set: bytes) -> dict[str, object]:
    """Everything that is on the wire: full names, field numbers/types/labels, enums, methods."""
    files = descriptor_pb2.FileDescriptorSet.FromString(descriptor_set).file
    contract: dict[str, object] = {}

    def walk(prefix: str, messages: list[descriptor_pb2.DescriptorProto]) -> None:
        for message in messages:
            name = f"{prefix}.{message.name}"
            contract[f"message {name}"] = sorted(
                (f.name, f.number, f.type, f.type_name, f.label, f.proto3_optional) for f in message.field
            )
            contract[f"map-entry {name}"] = message.options.map_entry
            walk(name, list(message.nested_type))
            for enum in message.enum_type:
                contract[f"enum {name}.{enum.name}"] = sorted((v.name, v.number) for v in enum.value)

    for file in files:
        walk(file.package, list(file.message_type))
        for enum in file.enum_type:
            contract[f"enum {file.package}.{enum.name}"] = sorted((v.name, v.number) for v in enum.value)
        for service in file.service:
            contract[f"service {file.package}.{service.name}"] = sorted(
                (m.name, m.input_type, m.output_type, m.client_streaming, m.server_streaming)
                for m in service.method
            )
    return contract


def test_our_protos_match_upstream_wire_contract() -> None:
    upstream = _contract(compile_descriptor_set(require_upstream(), UPSTREAM_PROTOS))
    ours = _contract(compile_descriptor_set(REPO_ROOT / "api" / "kubelet", OWN_PROTOS))
    assert set(ours) == set(upstream), "message/service sets differ"
    for key, value in upstream.items():
        assert ours[key] == value, key
    # the contract really covers what matters
    assert "service k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin" in ours
    assert "service v1alpha1.DRAResourceHealth" in ours
    assert "service pluginregistration.Registration" in ours


def test_contract_detects_a_renumbered_field(tmp_path: Path) -> None:
    root = tmp_path / "api"
    for proto in OWN_PROTOS:
        target = root / proto
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text((REPO_ROOT / "api" / "kubelet" / proto).read_text())
    dra = root / "dra" / "v1" / "api.proto"
    dra.write_text(dra.read_text().replace("optional string share_id = 5;", "optional string share_id = 6;"))
    original = _contract(compile_descriptor_set(REPO_ROOT / "api" / "kubelet", OWN_PROTOS))
    changed = _contract(compile_descriptor_set(root, OWN_PROTOS))
    assert original != changed


def test_generated_code_is_not_stale(tmp_path: Path) -> None:
    out = tmp_path / "gen"
    subprocess.run(["bash", str(REPO_ROOT / "hack" / "gen-protos.sh"), str(out)], check=True, cwd=REPO_ROOT)
    committed = REPO_ROOT / "dra_driver" / "kubeletplugin" / "gen"
    fresh = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    checked_in = sorted(
        p.relative_to(committed) for p in committed.rglob("*") if p.is_file() and "__pycache__" not in p.parts
    )
    assert fresh == checked_in, "run hack/update-protos.sh"
    stale = [str(p) for p in fresh if not filecmp.cmp(out / p, committed / p, shallow=False)]
    assert not stale, f"generated code is stale, run hack/update-protos.sh: {stale}"


def test_generated_code_has_no_runtime_version_pin() -> None:
    """The lower bound in pyproject (protobuf>=4.25) cannot import a gencode/runtime assertion."""
    committed = REPO_ROOT / "dra_driver" / "kubeletplugin" / "gen"
    for path in committed.rglob("*_pb2.py"):
        assert "runtime_version" not in path.read_text(), path
    text = (REPO_ROOT / "pyproject.toml").read_text()
    assert '"protobuf>=4.25"' in text


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_share_id_only_in_v1(version: str) -> None:
    from dra_driver.kubeletplugin import protos

    module = protos.dra_v1 if version == "v1" else protos.dra_v1beta1
    assert ("share_id" in module.Device.DESCRIPTOR.fields_by_name) == (version == "v1")

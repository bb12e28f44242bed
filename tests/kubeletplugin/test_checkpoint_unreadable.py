"""An unreadable checkpoint, or one of a newer format, stops the plugin with one line naming the
file, and is not quarantined."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from dra_driver.cli import main
from dra_driver.kubeletplugin.checkpoint import Checkpoint, CheckpointUnreadable
from hami_dra_dev.cluster.controlplane import ControlPlane


def test_load_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    path.mkdir()  # unreadable as a file, even for root (permissions are not enforced for root)
    with pytest.raises(CheckpointUnreadable, match=f"cannot read the checkpoint {path}"):
        Checkpoint(path).load()
    assert path.is_dir(), "an unreadable checkpoint is left in place, not quarantined"


def _a_directory(path: Path) -> None:
    path.mkdir()


def _a_newer_format(path: Path) -> None:
    path.write_text(json.dumps({"version": 3, "writer": "hami-dra 9.9.9", "checksum": "", "claims": {}}))


@pytest.mark.parametrize(
    ("make", "first_words"),
    [(_a_directory, "cannot read the checkpoint "), (_a_newer_format, "the checkpoint ")],
)
def test_the_plugin_refuses_to_start_in_one_line(
    tmp_path: Path,
    apiserver: ControlPlane,
    capsys: pytest.CaptureFixture[str],
    make: Callable[[Path], None],
    first_words: str,
) -> None:
    plugin_dir = tmp_path / "plugin"
    plugin_dir.mkdir()
    make(plugin_dir / "checkpoint.json")
    (tmp_path / "boot_id").write_text("b\n")
    code = main([
        "kubelet-plugin", "--node-name", "n1", "--source", "simulated", "--profile", "t4", "--gpus", "1",
        "--kubeconfig", str(apiserver.kubeconfig_path), "--plugin-dir", str(plugin_dir),
        "--registry-dir", str(tmp_path / "registry"), "--cdi-dir", str(tmp_path / "cdi"),
        "--boot-id-file", str(tmp_path / "boot_id"), "--publish=false",
    ])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith(f"hami-dra kubelet-plugin: error: {first_words}")
    assert str(plugin_dir / "checkpoint.json") in err[0]
    assert [p.name for p in plugin_dir.iterdir() if p.name.startswith("checkpoint")] == ["checkpoint.json"]

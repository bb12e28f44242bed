"""``hami-dra completion bash|zsh``: the script, run by a real bash, completes what the parser takes."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from dra_driver import cli
from dra_driver.completion import bash_script, command_tree

BASH = shutil.which("bash")
pytestmark = pytest.mark.skipif(BASH is None, reason="bash is not installed")


@pytest.fixture(scope="module")
def script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("completion") / "hami-dra.bash"
    path.write_text(bash_script(cli.build_parser(cli.PROGRAM)))
    return path


def complete(script: Path, *words: str, program: str = "hami-dra") -> list[str]:
    """What bash offers after ``program words...`` (the last word is the one being completed)."""
    line = " ".join(f"'{word}'" for word in (program, *words))
    code = (
        f"source '{script}'; COMP_WORDS=({line}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); "
        f'_hami_dra; printf "%s\\n" "${{COMPREPLY[@]}}"; complete -p {program}'
    )
    done = subprocess.run([str(BASH), "-c", code], capture_output=True, text=True, timeout=30, check=True)
    *offered, registration = done.stdout.splitlines()
    assert registration.endswith(f"-F _hami_dra {program}")
    return [word for word in offered if word]


def test_subcommands_complete(script: Path) -> None:
    assert complete(script, "t") == ["top"]
    assert set(complete(script, "")) >= {"explain", "top", "simulate", "discover", "completion"}
    assert complete(script, "cluster", "") == ["build", "up", "down", "lab", "status"]


def test_flags_complete_per_subcommand(script: Path) -> None:
    assert complete(script, "simulate", "--fail") == ["--fail-on-pending"]
    assert complete(script, "-v", "top", "--all") == ["--all-namespaces"]
    assert "--fail-on-pending" not in complete(script, "top", "--")


def test_choices_complete_after_their_flag_and_as_positionals(script: Path) -> None:
    for command in ("explain", "top", "simulate", "discover"):
        assert complete(script, command, "-o", "") == ["table", "wide", "json", "yaml"]
    assert complete(script, "top", "-o", "w") == ["wide"]
    assert complete(script, "top", "") == ["gpu", "gpus", "node", "nodes"]
    assert complete(script, "completion", "") == ["bash", "zsh"]


def test_a_flags_value_is_not_taken_for_a_subcommand(script: Path) -> None:
    # `-n top`: "top" is the namespace, so the path is still `top`'s and its views complete next.
    assert complete(script, "top", "-n", "top", "no") == ["node", "nodes"]


def test_the_kubectl_plugin_file_completes_too(script: Path) -> None:
    assert complete(script, "ex", program="kubectl-hami_dra") == ["explain"]


def test_the_command_prints_the_script(capsys: pytest.CaptureFixture[str], script: Path) -> None:
    assert cli.main(["completion", "bash"]) == 0
    assert capsys.readouterr().out == script.read_text()


def test_zsh_loads_the_bash_completion(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["completion", "zsh"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("#compdef hami-dra kubectl-hami_dra\n")
    assert "bashcompinit" in out and "complete -o default -F _hami_dra hami-dra kubectl-hami_dra" in out
    subprocess.run([str(BASH), "-n"], input=out, text=True, check=True, timeout=30)


def test_the_tree_names_every_subcommand_and_flag_of_the_parser() -> None:
    parser = cli.build_parser(cli.PROGRAM)
    tree = dict(command_tree(parser))
    assert set(tree) >= {"", "top", "explain", "simulate", "discover", "cluster up", "sandbox down"}
    top = tree["top"]
    assert {"-A", "--all-namespaces", "-n", "-o", "--output", "--kubeconfig"} <= set(top.options)
    assert "-A" not in top.valued and "-n" in top.valued
    assert top.choices["-o"] == ["table", "wide", "json", "yaml"]

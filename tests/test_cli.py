"""The command line's conventions: `-v` anywhere, booleans, bind addresses, env names, deprecations,
the program's name, suggestions, output formats and the line for an unreachable API server."""

from __future__ import annotations

import argparse
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from dra_driver import cli, flags
from dra_driver.flags import BindAddress, parse_bind_address, parse_bool


@pytest.fixture
def verbosity(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The verbosity main() configures logging with (pytest owns the root logger's handlers)."""
    seen: list[int] = []
    monkeypatch.setattr(cli, "configure_logging", seen.append)
    monkeypatch.delenv("NODE_NAME", raising=False)
    return seen


DISCOVER = ["discover", "--profile", "t4", "--gpus", "1", "--node-name", "n1", "-o", "json"]


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (DISCOVER, 0),
        (["-v", *DISCOVER], 1),
        ([*DISCOVER, "-v"], 1),
        (["discover", "-vv", *DISCOVER[1:]], 2),
        (["-v", *DISCOVER, "--verbose"], 2),
    ],
)
def test_verbose_before_or_after_the_subcommand(
    verbosity: list[int], capsys: pytest.CaptureFixture[str], argv: list[str], expected: int
) -> None:
    assert cli.main(argv) == 0
    capsys.readouterr()
    assert verbosity == [expected]


def test_every_subcommand_takes_verbose_and_nested_counts_add_up() -> None:
    parser = cli.build_parser()
    subcommands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in subcommands.choices.items():
        assert "-v" in sub._option_string_actions and "--verbose" in sub._option_string_actions, name
    args = parser.parse_args(["-v", "cluster", "-v", "up", "-vv"])
    assert cli._verbosity(args) == 4 and args.verbose == 4
    assert not [name for name in vars(args) if name.startswith(cli.SUB_VERBOSE_PREFIX)]


@pytest.mark.parametrize("word", ["1", "t", "T", "true", "TRUE", "True", " true "])
def test_true_spellings(word: str) -> None:
    assert parse_bool(word) is True


@pytest.mark.parametrize("word", ["0", "f", "F", "false", "FALSE", "False"])
def test_false_spellings(word: str) -> None:
    assert parse_bool(word) is False


@pytest.mark.parametrize("word", ["", "yes", "no", "2", "on"])
def test_other_words_are_not_booleans(word: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="expected true or false"):
        parse_bool(word)


@pytest.mark.parametrize(
    ("text", "address", "shown"),
    [
        ("0", BindAddress("", 0), "0"),
        (":0", BindAddress("", 0), "0"),
        (":8080", BindAddress("", 8080), ":8080"),
        ("0.0.0.0:8080", BindAddress("0.0.0.0", 8080), "0.0.0.0:8080"),
        ("127.0.0.1:9400", BindAddress("127.0.0.1", 9400), "127.0.0.1:9400"),
        ("[::1]:8080", BindAddress("::1", 8080), "[::1]:8080"),
        ("[::]:8080", BindAddress("::", 8080), "[::]:8080"),
        (" 127.0.0.1:0 ", BindAddress("127.0.0.1", 0), "0"),
        ("localhost:65535", BindAddress("localhost", 65535), "localhost:65535"),
    ],
)
def test_bind_addresses(text: str, address: BindAddress, shown: str) -> None:
    assert parse_bind_address(text) == address
    assert str(address) == shown
    assert address.enabled == (address.port != 0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("8080", "expected HOST:PORT"),
        ("host:", "expected HOST:PORT"),
        (":http", "expected HOST:PORT"),
        (":-1", "expected HOST:PORT"),
        (":65536", "within 0..65535"),
        ("::1:8080", "IPv6 host in brackets"),
        ("garbage", "expected HOST:PORT"),
        ("[::1]", "expected HOST:PORT"),
        ("foo bar:8080", "HOST must be an IP address or a host name"),
        ("300.1.1.1:8080", "HOST must be an IP address or a host name"),
        ("-dash:8080", "HOST must be an IP address or a host name"),
        ("[127.0.0.1]:8080", "only an IPv6 address goes in brackets"),
        ("[not-an-ip]:8080", "only an IPv6 address goes in brackets"),
    ],
)
def test_bad_bind_addresses(text: str, message: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=message):
        parse_bind_address(text)


def test_environment_variables_are_named_after_their_flags() -> None:
    assert flags.env_name("--cdi-dir") == "CDI_DIR"
    assert flags.env_name("--metrics-bind-address") == "METRICS_BIND_ADDRESS"
    assert flags.env_name("--policy-taint") == "POLICY_TAINT"


def test_a_bad_value_from_the_environment_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLAG", "maybe")
    parser = argparse.ArgumentParser()
    flags.add_bool(parser, "--flag", default=False, help="a flag")
    with pytest.raises(argparse.ArgumentTypeError, match=r"got 'maybe' \(environment variable FLAG\)"):
        parse_bool(parser.get_default("flag"))


def test_a_deprecated_spelling_is_logged_once_per_process_naming_the_new_one(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(flags, "_warned", set())
    parser = argparse.ArgumentParser()
    flags.add_bool(parser, "--publish", default=True, env=False, negation_alias=True, help="publish")
    args = parser.parse_args(["--no-publish"])
    assert args.publish is False
    assert parser.parse_args(["--publish=false"]).publish is False
    assert parser.parse_args([]).publish is True
    assert not hasattr(parser.parse_args(["--publish=false"]), flags.FLAG_NOTES)
    with caplog.at_level(logging.WARNING, logger="dra_driver.cli"):
        flags.warn_deprecations(args)
        flags.warn_deprecations(parser.parse_args(["--no-publish"]))
    assert [r.getMessage() for r in caplog.records] == ["--no-publish is deprecated: use --publish=false"]
    assert caplog.records[0].levelno == logging.WARNING


@pytest.mark.parametrize(("flag", "level"), [([], "WARNING"), (["-v"], "INFO"), (["-vv"], "DEBUG")])
def test_verbose_after_the_subcommand_sets_the_log_level(flag: list[str], level: str) -> None:
    code = (
        "import logging, sys; from dra_driver.cli import main; "
        "main(sys.argv[1:]); print(logging.getLevelName(logging.getLogger().level), file=sys.stderr)"
    )
    env = {k: v for k, v in os.environ.items() if k != "NODE_NAME"}
    run = subprocess.run(
        [sys.executable, "-c", code, *DISCOVER, *flag],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    assert run.stderr.strip().splitlines()[-1] == level


# --- One CLI (issue 39): the program's name, suggestions, output formats, unreachable servers ---

#: The commands that read the cluster, with the arguments each needs besides the kubeconfig.
CLUSTER_COMMANDS = [
    ["explain", "pod/x"],
    ["top"],
    ["top", "nodes", "-A"],
    ["simulate", "--from-cluster", "--save", "-"],
]
#: The read commands and arguments that make each parse.
READ_COMMANDS = [["explain", "pod/x"], ["top"], ["simulate", "s.yaml"], ["discover"]]


@pytest.mark.parametrize(
    ("argv0", "name"),
    [
        ("/usr/local/bin/hami-dra", "hami-dra"),
        ("/home/u/.local/bin/kubectl-hami_dra", "kubectl hami-dra"),
        ("kubectl-hami_dra", "kubectl hami-dra"),
        ("/usr/lib/python3/site-packages/dra_driver/__main__.py", "hami-dra"),
    ],
)
def test_the_program_is_named_as_it_was_invoked(argv0: str, name: str) -> None:
    assert cli.program_name(argv0) == name


def test_run_as_the_kubectl_plugin_usage_and_errors_say_kubectl_hami_dra(tmp_path: Path) -> None:
    # kubectl runs `kubectl hami-dra ARGS` as the file kubectl-hami_dra on PATH (pyproject.toml's
    # entry point, or a symlink to hami-dra): argv[0] is that file.
    plugin = tmp_path / "kubectl-hami_dra"
    plugin.write_text(f"#!{sys.executable}\n{cli.CHILD_ENTRY}\n")
    plugin.chmod(0o755)
    done = subprocess.run(
        [str(plugin), "top", "-A", "--outptu=json"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2
    assert done.stderr.startswith("usage: kubectl hami-dra top ")
    assert done.stderr.endswith(
        "kubectl hami-dra top: error: unrecognized arguments: --outptu=json (did you mean --output?)\n"
    )
    help_text = subprocess.run(
        [str(plugin), "--help"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert help_text.startswith("usage: kubectl hami-dra [-h]")


def _error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        cli.main(argv)
    assert exited.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["tpo"], "invalid choice: 'tpo' (choose from "),
        (["top", "-o", "jsno"], "argument -o/--output: invalid choice: 'jsno'"),
        (["top", "-A", "--outptu=json"], "unrecognized arguments: --outptu=json (did you mean --output?)"),
        (["simulate", "s.yaml", "--fail-on-pendng"], "--fail-on-pendng (did you mean --fail-on-pending?)"),
        (["top", "--all-namepsaces"], "--all-namepsaces (did you mean --all-namespaces?)"),
    ],
)
def test_a_mistyped_flag_or_choice_gets_the_closest_name(
    capsys: pytest.CaptureFixture[str], argv: list[str], expected: str
) -> None:
    err = _error(capsys, argv)
    assert expected in err
    assert "did you mean" in err
    # The usage shown is the subcommand's the flag was given to.
    assert err.startswith(f"usage: hami-dra {argv[0]}" if argv[0] != "tpo" else "usage: hami-dra [-h]")


def test_only_a_close_name_is_suggested(capsys: pytest.CaptureFixture[str]) -> None:
    err = _error(capsys, ["top", "-A", "--zzzzzz"])
    assert err.endswith("hami-dra top: error: unrecognized arguments: --zzzzzz\n")
    assert "did you mean" not in _error(capsys, ["xylophone"])


@pytest.mark.parametrize("argv", READ_COMMANDS, ids=lambda argv: argv[0])
@pytest.mark.parametrize("output", ["table", "wide", "json", "yaml"])
def test_every_read_command_takes_the_same_output_formats(argv: list[str], output: str) -> None:
    assert cli.build_parser().parse_args([*argv, "-o", output]).output == output


@pytest.mark.parametrize("argv", READ_COMMANDS, ids=lambda argv: argv[0])
def test_earlier_format_names_stay_aliases_and_the_help_says_so(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.build_parser().parse_args([*argv, "-o", "text"]).output == "table"
    with pytest.raises(SystemExit):
        cli.main([argv[0], "--help"])
    assert "'text' is an alias of table" in " ".join(capsys.readouterr().out.split())


@pytest.fixture
def closed_port_kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A kubeconfig whose server is 127.0.0.1:1, where nothing listens."""
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1', insecure-skip-tls-verify: true}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u, namespace: team-a}}]\n"
    )
    monkeypatch.delenv("KUBECONFIG", raising=False)
    return path


@pytest.mark.parametrize("argv", CLUSTER_COMMANDS, ids=" ".join)
def test_an_unreachable_api_server_is_the_same_line_and_status_for_every_command(
    argv: list[str],
    closed_port_kubeconfig: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert cli.main([*argv, "--kubeconfig", str(closed_port_kubeconfig)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"hami-dra {argv[0]}: error: cannot reach the API server at https://127.0.0.1:1: "
        "Failed to establish a new connection: [Errno 111] Connection refused\n"
    )
    assert not caplog.records  # no retry warnings before the line


def test_a_connection_error_no_command_caught_is_the_same_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The safety net in main(): urllib3's own error, as a request with no handler of its own raises it.
    from urllib3 import HTTPSConnectionPool
    from urllib3.exceptions import MaxRetryError, NewConnectionError

    pool = HTTPSConnectionPool("10.0.0.9", 6443)
    reason = NewConnectionError(pool, "Failed to establish a new connection: [Errno 113] No route to host")

    def unreachable(args: argparse.Namespace) -> int:
        raise MaxRetryError(pool, "/api", reason)

    parser = cli.build_parser()
    original = parser.parse_args

    def parse(argv: list[str] | None = None) -> argparse.Namespace:
        args = original(argv)
        args.handler = unreachable
        return args

    monkeypatch.setattr(parser, "parse_args", parse)
    monkeypatch.setattr(cli, "build_parser", lambda prog=None: parser)
    assert cli.main(DISCOVER) == 2
    assert capsys.readouterr().err == (
        "hami-dra discover: error: cannot reach the API server at https://10.0.0.9:6443: "
        "Failed to establish a new connection: [Errno 113] No route to host\n"
    )

    def other(args: argparse.Namespace) -> int:
        raise RuntimeError("a bug stays a traceback")

    monkeypatch.setattr(
        parser,
        "parse_args",
        lambda argv=None: argparse.Namespace(**{**vars(original(argv)), "handler": other}),
    )
    with pytest.raises(RuntimeError, match="a bug stays a traceback"):
        cli.main(DISCOVER)


@pytest.fixture
def without_dev_package(monkeypatch: pytest.MonkeyPatch) -> None:
    """As in the wheel and the image: ``hami_dra_dev`` (dev/) cannot be imported."""
    for name in [cli.DEV_PACKAGE, *(n for n in sys.modules if n.startswith(f"{cli.DEV_PACKAGE}."))]:
        monkeypatch.setitem(sys.modules, name, None)


@pytest.mark.parametrize(
    "argv",
    [
        ["sandbox", "up"],
        ["demo", "--timeout", "5"],
        ["cluster", "status"],
        ["sandbox", "--help"],
        ["-v", "demo"],
    ],
)
def test_a_development_command_without_its_package_says_where_it_comes_from(
    without_dev_package: None, verbosity: list[int], capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    assert cli.main(argv) == 2
    command = next(word for word in argv if not word.startswith("-"))
    assert capsys.readouterr().err.splitlines() == [f"hami-dra {command}: error: {cli.DEV_ABSENT}"]


def test_development_commands_are_listed_without_their_package(
    without_dev_package: None, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    listed = capsys.readouterr().out
    for command in sorted(cli.DEV_COMMANDS):
        assert re.search(rf"^ +{command} +development command: run it from a clone$", listed, re.M), listed


def test_a_missing_product_module_is_not_taken_for_the_development_package(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "dra_driver.top.command", None)
    with pytest.raises(ModuleNotFoundError):
        cli.build_parser()

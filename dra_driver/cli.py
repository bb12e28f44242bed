"""The `hami-dra` command line: one entry point for every component.

Each subcommand lives in its own module that exposes ``register(subparsers)``; this module only
wires them together, so adding a component never means editing another component's code.
Modules are imported lazily by name so that, for example, ``hami-dra simulate`` does not pay for
importing gRPC or the Kubernetes client.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import os
import re
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from dra_driver import __version__
from dra_driver.flags import warn_deprecations
from dra_driver.suggest import closest

#: Modules that contribute subcommands, in the order they appear in ``--help``. Those of
#: :data:`DEV_PACKAGE` are development commands (see :func:`_register`).
COMMAND_MODULES: tuple[str, ...] = (
    "dra_driver.simulate.command",
    "dra_driver.explain.command",
    "dra_driver.devices.command",
    "dra_driver.top.command",
    "dra_driver.kubeletplugin.command",
    "dra_driver.controller.command",
    "dra_driver.webhook.command",
    "hami_dra_dev.sandbox.command",
    "hami_dra_dev.cluster.command",
    "hami_dra_dev.demo.command",
    "dra_driver.completion",
)

#: The development package (``dev/hami_dra_dev`` of a clone, installed by ``make venv``): the
#: sandbox API server, the local cluster harness and the demo. Neither the wheel nor the image
#: holds it, and no module of ``dra_driver`` imports it; this CLI only names its commands.
DEV_PACKAGE = "hami_dra_dev"
DEV_COMMANDS: frozenset[str] = frozenset({"sandbox", "cluster", "demo"})
#: Where a development command comes from, for the one line a production install prints.
DEV_ABSENT = (
    "a development command, not part of this installation; run it from a clone of the repository "
    "after `make venv`"
)
#: A development command whose package is there but a third-party module of the ``sandbox`` extra
#: is not (a clone installed without ``make venv``).
DEV_EXTRA_HINT = "pip install -e '.[sandbox]' -e ./dev (make venv does)"

#: ``python -c CHILD_ENTRY <args>`` runs this CLI in a child process. Not ``-m dra_driver.cli``:
#: that would import a second copy of this module (and of UsageError).
CHILD_ENTRY = "import sys; from dra_driver.cli import main; sys.exit(main())"


class UsageError(Exception):
    """A user-facing error: printed as one line and exits with status 2, never as a traceback."""


#: The name of the program when it is not run as a kubectl plugin.
PROGRAM = "hami-dra"
#: kubectl runs ``kubectl hami-dra ARGS`` as ``kubectl-hami_dra ARGS`` (a ``-`` of the plugin's name
#: is ``_`` in its file name, found on PATH); pyproject.toml installs that entry point.
KUBECTL_PLUGIN_PREFIX = "kubectl-"


def program_name(argv0: str | None = None) -> str:
    """How the user invoked us, for usage and error lines: ``kubectl hami-dra`` when run as the
    kubectl plugin (the file ``kubectl-hami_dra``), else ``hami-dra`` (also for ``python -m``)."""
    name = os.path.basename(sys.argv[0] if argv0 is None else argv0)
    if name.startswith(KUBECTL_PLUGIN_PREFIX):
        return "kubectl " + name.removeprefix(KUBECTL_PLUGIN_PREFIX).replace("_", "-")
    return PROGRAM


_INVALID_CHOICE = re.compile(r"invalid choice: '(?P<word>[^']*)' \(choose from (?P<choices>.*)\)")


class Parser(argparse.ArgumentParser):
    """argparse with a suggestion for a mistyped flag, subcommand or choice (Python 3.11's argparse
    has none): ``unrecognized arguments: --outptu (did you mean --output?)``."""

    def error(self, message: str) -> NoReturn:
        choice = _INVALID_CHOICE.search(message)
        if choice:
            options = re.findall(r"'([^']*)'", choice["choices"])
            suggestion = closest(choice["word"], options)
            if suggestion:
                message += f"; did you mean {suggestion!r}?"
        super().error(message)

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        words = list(sys.argv[1:] if args is None else args)
        parsed, extras = self.parse_known_args(words, namespace)
        if extras:
            # Complain from the subcommand the flags were given to: its usage, its flags suggested.
            parser = self._subcommand_of(words)
            hints = []
            for extra in extras:
                flag = extra.split("=", 1)[0]
                suggestion = closest(flag, parser._option_string_actions) if flag.startswith("-") else None
                hints.append(f"{extra} (did you mean {suggestion}?)" if suggestion else extra)
            parser.error(f"unrecognized arguments: {' '.join(hints)}")
        return parsed

    def _subcommand_of(self, words: Sequence[str]) -> argparse.ArgumentParser:
        """The innermost (sub)command parser the words select."""
        parser: argparse.ArgumentParser = self
        for word in words:
            subcommands = next(
                (a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None
            )
            if subcommands is not None and word in subcommands.choices:
                parser = subcommands.choices[word]
        return parser


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = Parser(
        prog=prog or program_name(),
        description="Kubernetes DRA driver for NVIDIA GPUs with HAMi's composable placement policies.",
    )
    parser.add_argument("--version", action="version", version=f"hami-dra {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more logging (-v info, -vv debug)"
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for module_name in COMMAND_MODULES:
        _register(subparsers, module_name)
    _add_verbose_to_subcommands(parser)
    return parser


def _register(subparsers: Any, module_name: str) -> None:
    """The module's subcommands; a development command whose package is not installed (the wheel,
    the image) is still listed, and says in one line where it comes from instead of running."""
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        missing = err.name or ""
        if not module_name.startswith(f"{DEV_PACKAGE}.") or missing.split(".")[0] != DEV_PACKAGE:
            raise
        name = module_name.split(".")[1]
        stand_in = subparsers.add_parser(name, help="development command: run it from a clone")
        # add_parser builds every subcommand with one class (argparse takes no class per
        # subcommand); the stand-in is a Parser, so it only changes how it parses.
        stand_in.__class__ = _AbsentDevCommand
        return
    module.register(subparsers)


def _absent_dev_command(args: argparse.Namespace) -> int:
    raise UsageError(DEV_ABSENT)


class _AbsentDevCommand(Parser):
    """A development command where its package is not installed: whatever follows its name (flags,
    ``--help``), it parses into :func:`_absent_dev_command`, so the user reads the one line saying
    where the command comes from rather than a usage error about arguments it does not know."""

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        return argparse.Namespace(handler=_absent_dev_command), []


#: ``-v`` given after a subcommand counts into ``<prefix><depth>`` (a subcommand parses into a fresh
#: namespace and copies it over its parent's, so one shared name would lose the counts before it).
SUB_VERBOSE_PREFIX = "verbose_after_"


def _add_verbose_to_subcommands(parser: argparse.ArgumentParser, depth: int = 1) -> None:
    """Accept ``-v``/``--verbose`` after every (nested) subcommand too, as Kubernetes tools do."""
    seen: set[int] = set()
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        for sub in action.choices.values():
            if id(sub) in seen:  # an alias names the same parser again
                continue
            seen.add(id(sub))
            with contextlib.suppress(argparse.ArgumentError):  # unless the subcommand has its own -v
                sub.add_argument(
                    "-v",
                    "--verbose",
                    dest=f"{SUB_VERBOSE_PREFIX}{depth}",
                    action="count",
                    default=argparse.SUPPRESS,
                    help="more logging (-v info, -vv debug); also before the subcommand",
                )
            _add_verbose_to_subcommands(sub, depth + 1)


def _verbosity(args: argparse.Namespace) -> int:
    """All ``-v`` counts, wherever they were given; the total is left in ``args.verbose``."""
    total: int = args.verbose
    for name in [name for name in vars(args) if name.startswith(SUB_VERBOSE_PREFIX)]:
        total += getattr(args, name)
        delattr(args, name)
    args.verbose = total
    return total


def configure_logging(verbosity: int) -> None:
    level = logging.WARNING if verbosity == 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def main(argv: Sequence[str] | None = None) -> int:
    prog = program_name()
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    configure_logging(_verbosity(args))
    warn_deprecations(args)
    try:
        result: int = args.handler(args)
    except UsageError as err:
        print(f"{prog} {args.command}: error: {err}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as err:
        if args.command not in DEV_COMMANDS:
            raise
        print(
            f"{prog} {args.command}: error: a development tool; it needs the sandbox extra "
            f"(module {err.name!r} is missing): {DEV_EXTRA_HINT}",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as err:
        # A request no command turned into its own line: the same line as theirs, not a traceback.
        server = _unreached_server(err)
        if server is None:
            raise
        from dra_driver.kube.config import unreachable

        print(f"{prog} {args.command}: error: {unreachable(server, err)}", file=sys.stderr)
        return 2
    return result


def _unreached_server(err: BaseException) -> str | None:
    """The server URL of urllib3's "could not reach it" error (``MaxRetryError``), else None."""
    pool: Any = getattr(err, "pool", None)
    if type(err).__name__ != "MaxRetryError" or pool is None:
        return None
    port = f":{pool.port}" if pool.port else ""
    return f"{pool.scheme}://{pool.host}{port}"


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

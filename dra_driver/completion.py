"""``hami-dra completion bash|zsh``: a shell completion script, generated from the parser itself.

Why a static script and not argcomplete: a completion that runs the program on every TAB pays
Python's start and the import of every subcommand (over a second on a loaded machine), needs a
marker and a registration hook in the entry point, and would add a dependency to the image that
the components (which never complete anything) do not need. The script below is written from the
same ``argparse`` tree ``--help`` is, so it cannot drift from the flags: every subcommand, flag and
choice (``-o``'s formats, ``top``'s views) completes, flags taking a value complete its choices or
else files. What it does not know is the cluster (pod names for ``explain``); kubectl does that.

Install (the same for ``kubectl-hami_dra``, the kubectl plugin's file, which it also registers)::

    source <(hami-dra completion bash)                      # this shell; or into ~/.bashrc
    hami-dra completion zsh > "${fpath[1]}/_hami-dra"       # zsh (loads bash's via bashcompinit)
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

SHELLS = ("bash", "zsh")
#: The names the script completes: the program and the kubectl plugin's file.
PROGRAMS = ("hami-dra", "kubectl-hami_dra")


@dataclass
class Command:
    """What completes after one (sub)command path (``""`` for the program, ``"cluster up"``)."""

    subcommands: list[str] = field(default_factory=list)
    options: list[str] = field(default_factory=list)
    #: Options that take a value: the next word is that value, not a subcommand.
    valued: list[str] = field(default_factory=list)
    #: Per option, the values it accepts (when fixed).
    choices: dict[str, list[str]] = field(default_factory=dict)
    #: Values of positional arguments with fixed choices (``top``'s ``gpus``/``nodes``).
    positional: list[str] = field(default_factory=list)


def _choices(action: argparse.Action) -> list[str]:
    if action.choices is not None:
        return [str(choice) for choice in action.choices]
    # ``-o``: a type function that maps aliases, with the formats in its metavar ``{a,b}``.
    metavar = action.metavar if isinstance(action.metavar, str) else ""
    if metavar.startswith("{") and metavar.endswith("}"):
        return metavar[1:-1].split(",")
    return []


def command_tree(parser: argparse.ArgumentParser, path: str = "") -> Iterator[tuple[str, Command]]:
    """Every (sub)command path of ``parser`` with what completes after it, the program first."""
    command = Command()
    children: list[tuple[str, argparse.ArgumentParser]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for name, sub in action.choices.items():
                command.subcommands.append(name)
                if id(sub) not in seen:  # an alias names the same parser again
                    seen.add(id(sub))
                    children.append((name, sub))
        elif action.option_strings:
            if action.help == argparse.SUPPRESS:
                continue
            command.options += action.option_strings
            if action.nargs not in (0, "?"):  # "?": a bool flag whose value is optional
                command.valued += action.option_strings
                values = _choices(action)
                if values:
                    for option in action.option_strings:
                        command.choices[option] = values
        else:
            command.positional += _choices(action)
    yield path, command
    for name, sub in children:
        yield from command_tree(sub, f"{path} {name}".strip())


def _words(words: list[str]) -> str:
    return " ".join(shlex.quote(word) for word in words)


def _case(function: str, entries: dict[str, list[str]]) -> list[str]:
    """A bash function printing the words of its argument's entry."""
    lines = [f"{function}() {{", '    case "$1" in']
    for key, words in entries.items():
        if words:
            lines.append(f"        {shlex.quote(key)}) echo {_words(words)} ;;")
    lines += ["    esac", "}"]
    return lines


BASH_MAIN = """\
_hami_dra() {
    local cur="${COMP_WORDS[COMP_CWORD]}" prev="" path="" word i
    # The subcommand path: words that name a subcommand, skipping the value of each valued flag.
    for ((i = 1; i < COMP_CWORD; i++)); do
        word="${COMP_WORDS[i]}"
        if [[ " $(_hami_dra_valued "$path") " == *" $word "* ]]; then
            ((i++))
        elif [[ " $(_hami_dra_subcommands "$path") " == *" $word "* ]]; then
            path="${path:+$path }$word"
        fi
    done
    ((COMP_CWORD > 0)) && prev="${COMP_WORDS[COMP_CWORD-1]}"
    if [[ " $(_hami_dra_valued "$path") " == *" $prev "* ]]; then
        local values
        values="$(_hami_dra_choices "$path $prev")"
        if [[ -n $values ]]; then
            mapfile -t COMPREPLY < <(compgen -W "$values" -- "$cur")
        else
            mapfile -t COMPREPLY < <(compgen -f -- "$cur")
        fi
        return 0
    fi
    if [[ $cur == -* ]]; then
        mapfile -t COMPREPLY < <(compgen -W "$(_hami_dra_options "$path")" -- "$cur")
    else
        local next
        next="$(_hami_dra_subcommands "$path") $(_hami_dra_positional "$path")"
        mapfile -t COMPREPLY < <(compgen -W "$next" -- "$cur")
        ((${#COMPREPLY[@]})) || mapfile -t COMPREPLY < <(compgen -f -- "$cur")
    fi
    return 0
}
"""


def bash_script(parser: argparse.ArgumentParser) -> str:
    tree = dict(command_tree(parser))
    lines = [
        "# bash completion for hami-dra, written by `hami-dra completion bash` from its own parser.",
        "# Regenerate it after upgrading hami-dra.",
    ]
    lines += _case("_hami_dra_subcommands", {p: c.subcommands for p, c in tree.items()})
    lines += _case("_hami_dra_options", {p: c.options for p, c in tree.items()})
    lines += _case("_hami_dra_valued", {p: c.valued for p, c in tree.items()})
    lines += _case("_hami_dra_positional", {p: c.positional for p, c in tree.items()})
    lines += _case(
        "_hami_dra_choices",
        {f"{p} {option}": values for p, c in tree.items() for option, values in c.choices.items()},
    )
    lines.append(BASH_MAIN.rstrip("\n"))
    lines.append(f"complete -o default -F _hami_dra {' '.join(PROGRAMS)}")
    return "\n".join(lines) + "\n"


def zsh_script(parser: argparse.ArgumentParser) -> str:
    """zsh runs the bash script through its bashcompinit layer (as kubectl's first zsh completion did)."""
    header = [
        f"#compdef {' '.join(PROGRAMS)}",
        "# zsh completion for hami-dra, written by `hami-dra completion zsh` from its own parser.",
        "autoload -U +X bashcompinit && bashcompinit",
    ]
    return "\n".join(header) + "\n" + bash_script(parser)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "completion",
        help="print a shell completion script (bash or zsh)",
        description="Print a completion script for hami-dra (and kubectl-hami_dra) for bash or zsh. "
        "bash: source <(hami-dra completion bash), or add that line to ~/.bashrc. "
        'zsh: hami-dra completion zsh > "${fpath[1]}/_hami-dra", then start a new shell.',
    )
    parser.add_argument("shell", choices=SHELLS, help="the shell to complete in")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from dra_driver.cli import PROGRAM, build_parser

    parser = build_parser(PROGRAM)
    sys.stdout.write(bash_script(parser) if args.shell == "bash" else zsh_script(parser))
    return 0

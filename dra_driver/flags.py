"""Flag conventions shared by the subcommands, in the style of Kubernetes components.

- A boolean is ``--x`` (true), ``--x=true`` or ``--x=false`` (Go's ``strconv.ParseBool`` spellings:
  ``1 t true 0 f false``, any case); ``--no-x`` survives only as a deprecated alias.
- A metrics endpoint is ``--metrics-bind-address HOST:PORT`` (``:8080`` or ``0.0.0.0:8080``: every
  IPv4 interface; ``127.0.0.1:8080``, ``[::]:8080``, ``[::1]:8080``: that address; ``0`` turns it
  off); ``--metrics-port PORT`` survives only as a deprecated alias for ``:PORT``.
- A flag's environment variable is named after it: ``--cdi-dir`` <-> ``CDI_DIR``. An older
  variable name is still read, after the new one, as a deprecated fallback.

Deprecated spellings are noted on the parsed namespace, not logged while parsing (logging is set up
only once the arguments, ``-v`` among them, are known); ``dra_driver.cli.main`` then logs each note
once per process with :func:`warn_deprecations`.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import re
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

LOG = logging.getLogger("dra_driver.cli")

#: Namespace attributes holding the deprecation notes: of environment variables (a subparser
#: default, so only the chosen subcommand's appear) and of flags (appended while parsing).
ENV_NOTES = "deprecated_environment"
FLAG_NOTES = "deprecated_flags"

_warned: set[str] = set()


class EnvValue(str):
    """A flag's default read from the environment: errors converting it name the variable."""

    variable: str

    def __new__(cls, value: str, variable: str) -> EnvValue:
        instance = super().__new__(cls, value)
        instance.variable = variable
        return instance


def _source(value: str) -> str:
    return f" (environment variable {value.variable})" if isinstance(value, EnvValue) else ""


def env_name(flag: str) -> str:
    """``--cdi-dir`` -> ``CDI_DIR``."""
    return flag.lstrip("-").replace("-", "_").upper()


def env_default(
    parser: argparse.ArgumentParser,
    flag: str,
    default: str | None = None,
    *,
    old: str | None = None,
    typed: bool = False,
) -> str | None:
    """The value of ``flag``'s environment variable, else of its deprecated ``old`` name, else ``default``.

    Read when the parser is built; using ``old`` is noted on ``parser`` and logged only if this
    parser's subcommand runs. ``typed``: the flag's ``type`` is one of this module's parsers, which
    then name the variable in their errors (an :class:`EnvValue`; never for an untyped flag, whose
    value would stay that ``str`` subclass, which YAML cannot write).
    """
    name = env_name(flag)
    variable = name if os.environ.get(name) else old if old and os.environ.get(old) else None
    if variable is None:
        return default
    if variable == old:
        _note_env(parser, f"environment variable {old} is deprecated: set {name} instead")
    value = os.environ[variable]
    return EnvValue(value, variable) if typed else value


def _note_env(parser: argparse.ArgumentParser, note: str) -> None:
    notes = parser.get_default(ENV_NOTES) or ()
    parser.set_defaults(**{ENV_NOTES: (*notes, note)})


def parse_bool(value: str) -> bool:
    """``true``/``false`` the way Go's ``strconv.ParseBool`` (and so every Kubernetes flag) reads them."""
    word = value.strip().lower()
    if word in ("1", "t", "true"):
        return True
    if word in ("0", "f", "false"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}{_source(value)}")


def parse_int(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {value!r}{_source(value)}") from None


def parse_seconds(value: str) -> float:
    """A duration in seconds, >= 0 (``0`` usually meaning never)."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {value!r}{_source(value)}")
    return seconds


def parse_xid_list(value: str) -> frozenset[int]:
    """``79,48`` (commas or blanks) -> the XIDs; anything else is an error naming the value."""
    from dra_driver.devices.nvml_events import parse_xids

    try:
        return parse_xids(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"{err}{_source(value)}") from None


def parse_mig_on_demand(value: str) -> frozenset[str]:
    """``all`` or ``0,GPU-...`` -> the cards marked for MIG on demand; anything else names the value."""
    from dra_driver.devices.mig_on_demand import MigOnDemandError, parse_selection

    try:
        return parse_selection(value)
    except MigOnDemandError as err:
        raise argparse.ArgumentTypeError(f"{err}{_source(value)}") from None


def parse_port(value: str) -> int:
    port = parse_int(value)
    if not 0 <= port < 65536:
        raise argparse.ArgumentTypeError(f"a port must be within 0..65535, got {port}{_source(value)}")
    return port


#: A host name (RFC 1123: letters, digits, hyphens, dot-separated labels), e.g. ``localhost``.
_LABEL = r"[A-Za-z0-9]([-A-Za-z0-9]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*$")


class BindAddress(NamedTuple):
    """``HOST:PORT`` to listen on; an empty host is every (IPv4) interface, port 0 is off."""

    host: str
    port: int

    @property
    def enabled(self) -> bool:
        return self.port != 0

    def __str__(self) -> str:
        if not self.enabled:
            return "0"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


OFF = BindAddress("", 0)


def parse_bind_address(value: str) -> BindAddress:
    """``HOST:PORT``, ``:PORT``, ``[IPv6]:PORT``, or ``0`` (off), as Kubernetes components take them."""
    text = value.strip()
    if text == "0":
        return OFF
    host, colon, port = text.rpartition(":")
    if not colon or not port.isdigit():
        raise argparse.ArgumentTypeError(
            f"expected HOST:PORT (e.g. :8080 or 0.0.0.0:8080) or 0 (off), got {value!r}{_source(value)}"
        )
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        if not _is_ip(host, 6):
            raise argparse.ArgumentTypeError(
                f"only an IPv6 address goes in brackets ([::1]:8080), got {value!r}{_source(value)}"
            )
    elif ":" in host:
        raise argparse.ArgumentTypeError(
            f"write an IPv6 host in brackets ([::1]:8080), got {value!r}{_source(value)}"
        )
    elif host and not (_is_ip(host, 4) or (_HOSTNAME.match(host) and not host.replace(".", "").isdigit())):
        raise argparse.ArgumentTypeError(
            f"HOST must be an IP address or a host name (127.0.0.1:8080, [::1]:8080, localhost:8080), "
            f"got {value!r}{_source(value)}"
        )
    number = int(port)
    if number >= 65536:
        raise argparse.ArgumentTypeError(f"a port must be within 0..65535, got {number}{_source(value)}")
    return BindAddress(host, number)


def _is_ip(text: str, version: int) -> bool:
    try:
        return ipaddress.ip_address(text).version == version
    except ValueError:
        return False


class DeprecatedAlias(argparse.Action):
    """An old spelling of another flag: sets that flag's destination and notes the new spelling.

    ``convert`` maps the old flag's value to the new flag's (for ``nargs=0``, ``const`` is the
    old value); ``replacement`` names the new spelling, formatted with ``value`` (the old flag's
    value) and ``new`` (the new flag's).
    """

    def __init__(
        self,
        option_strings: Sequence[str],
        dest: str,
        *,
        replacement: str,
        convert: Callable[[Any], Any] | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("default", argparse.SUPPRESS)
        kwargs.setdefault("help", argparse.SUPPRESS)
        super().__init__(option_strings, dest, **kwargs)
        self.replacement = replacement
        self.convert = convert

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        value = self.const if self.nargs == 0 else values
        new = self.convert(value) if self.convert else value
        setattr(namespace, self.dest, new)
        notes = list(getattr(namespace, FLAG_NOTES, ()))
        notes.append(f"{option_string} is deprecated: use {self.replacement.format(value=value, new=new)}")
        setattr(namespace, FLAG_NOTES, notes)


def add_bool(
    parser: argparse.ArgumentParser,
    flag: str,
    *,
    default: bool,
    help: str,
    env: bool = True,
    negation_alias: bool = False,
) -> None:
    """``--x[=true|false]`` (env ``X`` when ``env``); ``--no-x`` a deprecated alias of ``--x=false``."""
    dest = flag.lstrip("-").replace("-", "_")
    value = env_default(parser, flag, typed=True) if env else None
    source = f"; env {env_name(flag)}" if env else ""
    parser.add_argument(
        flag,
        nargs="?",
        const=True,
        type=parse_bool,
        default=default if value is None else value,
        metavar="true|false",
        help=f"{help} (default {str(default).lower()}{source})",
    )
    if negation_alias:
        parser.add_argument(
            "--no-" + flag.lstrip("-"),
            dest=dest,
            action=DeprecatedAlias,
            nargs=0,
            const=False,
            replacement=f"{flag}=false",
        )


def add_metrics_bind_address(
    parser: argparse.ArgumentParser, *, default: str, old_env: str | None = None, what: str = "/metrics"
) -> None:
    """``--metrics-bind-address`` (env ``METRICS_BIND_ADDRESS``) and the deprecated ``--metrics-port``.

    ``old_env`` is a deprecated variable holding a port (``METRICS_PORT``), read as ``:PORT``.
    """
    flag = "--metrics-bind-address"
    value = env_default(parser, flag, typed=True)
    port = os.environ.get(old_env) if old_env and value is None else None
    if old_env and port:
        address = "0" if port.strip() == "0" else f":{port.strip()}"
        _note_env(
            parser, f"environment variable {old_env} is deprecated: set {env_name(flag)}={address} instead"
        )
        value = EnvValue(address, old_env)
    parser.add_argument(
        flag,
        type=parse_bind_address,
        default=default if value is None else value,
        metavar="HOST:PORT",
        help=f"serve {what} on HOST:PORT (:PORT = every IPv4 interface, [::]:PORT = every IPv6 one, "
        f"127.0.0.1:PORT or [::1]:PORT = only there; 0 = off; default {default}; env {env_name(flag)})",
    )
    parser.add_argument(
        "--metrics-port",
        dest="metrics_bind_address",
        action=DeprecatedAlias,
        type=parse_port,
        convert=lambda port: BindAddress("", port),
        replacement="--metrics-bind-address={new}",
    )


def metrics_address(args: argparse.Namespace) -> BindAddress | None:
    """Where ``--metrics-bind-address`` says to serve metrics; None when it is off (``0``)."""
    address: BindAddress = args.metrics_bind_address
    return address if address.enabled else None


def cannot_listen(address: BindAddress, err: OSError) -> str:
    """The one-line error for a metrics address the process cannot listen on (not local, taken)."""
    return f"--metrics-bind-address {address}: cannot listen there: {err.strerror or err}"


def warn_deprecations(args: argparse.Namespace) -> None:
    """Log each deprecated spelling the command line or environment used, once per process."""
    for note in (*getattr(args, ENV_NOTES, ()), *getattr(args, FLAG_NOTES, ())):
        if note not in _warned:
            _warned.add(note)
            LOG.warning("%s", note)

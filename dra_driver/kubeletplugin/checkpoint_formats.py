"""Every format of ``checkpoint.json`` the plugin has written: a typed model each, and conversions.

The checkpoint outlives the plugin that wrote it: an upgraded plugin must read what the previous
one left on the node (the claims prepared there hold GPU shares), so each format keeps its model
here and a conversion to the next; :func:`decode` applies the chain up to :data:`CURRENT_VERSION`.
The file is written in the current format only (``Checkpoint.save``), so a converted file is
rewritten at the next write.

Formats (the fixtures under ``tests/kubeletplugin/fixtures/checkpoints`` were written by these
commits' own code, see ``hack/checkpoint_fixtures.py``):

* **1** (8b268a3 .. 28f86d3): ``{"version": 1, "checksum", "claims": {uid: entry}}``, an entry
  ``namespace, name, state, bootID, devices, cdiIDs``; until c043a7b each entry also carried the
  claim's CDI ``spec``, kept to re-create a lost spec file (since then the spec is rebuilt from
  the devices, so it is dropped on conversion);
* **2** (current): format 1 without ``spec``, plus ``writer`` ("hami-dra <version>"), so that a
  plugin meeting a file from a newer one can say which version wrote it.

Rules every future format keeps: ``version`` (an integer) and ``writer`` at the top level, and the
checksum the SHA-256 of the canonical JSON of ``claims`` (sorted keys, no spaces). A file of a
NEWER format than this code knows is refused, not quarantined (:class:`NewerFormat`): this code
cannot tell which GPU shares it records, and losing them could hand one GPU's room out twice.

Parsing is lax where the old readers were (unknown fields ignored, null lists read as empty), as
a downgrade-safe reader must be; what the plugin relies on (states, types) is checked.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from dra_driver import __version__

PREPARE_STARTED = "PrepareStarted"
PREPARE_COMPLETED = "PrepareCompleted"
STATES = (PREPARE_STARTED, PREPARE_COMPLETED)

CURRENT_VERSION = 2
#: Who writes the current format (the ``writer`` field).
WRITER = f"hami-dra {__version__}"


class FormatError(ValueError):
    """The document is not a checkpoint of any known format; the message says what is wrong."""


class NewerFormat(Exception):
    """The document is of a format newer than :data:`CURRENT_VERSION`."""

    def __init__(self, version: int, writer: str | None) -> None:
        super().__init__(f"format {version}")
        self.version = version
        self.writer = writer


def canonical(claims: Mapping[str, Any]) -> bytes:
    """The bytes the checksum covers: ``claims`` with sorted keys and no spaces."""
    return json.dumps(claims, sort_keys=True, separators=(",", ":")).encode()


def checksum(claims: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical(claims)).hexdigest()


class _Lax(BaseModel):
    """Unknown fields ignored (a newer writer's additions), values frozen once read."""

    model_config = ConfigDict(extra="ignore", frozen=True)


class DeviceV1(_Lax):
    """One allocation result of a prepared claim (unchanged in format 2)."""

    request: str
    pool: str
    device: str
    shareID: str | None = None
    consumed: dict[str, int] = Field(default_factory=dict)
    adminAccess: bool = False

    @field_validator("consumed", mode="before")
    @classmethod
    def _null_is_empty(cls, value: Any) -> Any:
        return {} if value is None else value


class _EntryFields(_Lax):
    """What format 1 and 2 entries share."""

    namespace: str
    name: str
    state: str
    bootID: str = ""
    devices: list[DeviceV1] = Field(default_factory=list)
    #: CDI IDs returned per device, in the order of ``devices``.
    cdiIDs: list[list[str]] = Field(default_factory=list)

    @field_validator("state")
    @classmethod
    def _known_state(cls, value: str) -> str:
        if value not in STATES:
            raise ValueError(f"unknown state {value!r}")
        return value

    @field_validator("devices", "cdiIDs", mode="before")
    @classmethod
    def _null_is_empty(cls, value: Any) -> Any:
        return [] if value is None else value


class EntryV1(_EntryFields):
    """A format-1 entry; ``spec`` is the CDI spec the first writers kept (null or absent later)."""

    spec: dict[str, Any] | None = None


class CheckpointV1(_Lax):
    version: Literal[1]
    claims: dict[str, EntryV1]


class EntryV2(_EntryFields):
    """A format-2 entry (also the layout of a claim record, ``ClaimRecords``)."""


class CheckpointV2(_Lax):
    version: Literal[2]
    writer: str
    claims: dict[str, EntryV2]


def v1_to_v2(old: CheckpointV1) -> CheckpointV2:
    """Drop each entry's CDI spec (rebuilt from the devices since c043a7b); format 1 named no writer."""
    claims = {uid: EntryV2(**entry.model_dump(exclude={"spec"})) for uid, entry in old.claims.items()}
    return CheckpointV2(version=2, writer="", claims=claims)


#: The model of each format, and the conversion from each to the next.
MODELS: dict[int, type[BaseModel]] = {1: CheckpointV1, 2: CheckpointV2}
CONVERSIONS: dict[int, Callable[[Any], BaseModel]] = {1: v1_to_v2}


def decode(raw: bytes) -> tuple[int, CheckpointV2]:
    """``(the file's format, its contents in the current format)``.

    Raises :class:`NewerFormat` for a format this code does not know yet, :class:`FormatError`
    for anything else that cannot be trusted (not JSON, no known version, checksum mismatch,
    fields of the wrong type, unknown states).
    """
    try:
        document = json.loads(raw)
    except ValueError as err:
        raise FormatError(str(err)) from err
    if not isinstance(document, dict):
        raise FormatError("not a JSON object")
    version = document.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise FormatError(f"unsupported version {version!r} (want 1 to {CURRENT_VERSION})")
    if version > CURRENT_VERSION:
        writer = document.get("writer")
        raise NewerFormat(version, writer if isinstance(writer, str) else None)
    claims = document.get("claims")
    if not isinstance(claims, dict):
        raise FormatError("claims is not an object")
    if document.get("checksum") != checksum(claims):
        raise FormatError("checksum mismatch")
    try:
        model: BaseModel = MODELS[version].model_validate(document)
    except ValidationError as err:
        raise FormatError(validation_message(err)) from None
    for step in range(version, CURRENT_VERSION):
        model = CONVERSIONS[step](model)
    assert isinstance(model, CheckpointV2)
    return version, model


def decode_entry(data: Any) -> EntryV2:
    """One entry in the current layout (a claim record); FormatError says what is wrong."""
    try:
        return EntryV2.model_validate(data)
    except ValidationError as err:
        raise FormatError(validation_message(err)) from None


def validation_message(err: ValidationError) -> str:
    """``claims.<uid>.state: unknown state 'Halfway'``: each problem with where it is, on one line."""
    problems = []
    for error in err.errors(include_url=False):
        where = ".".join(str(part) for part in error["loc"])
        message = error["msg"].removeprefix("Value error, ")
        problems.append(f"{where}: {message}" if where else message)
    return "; ".join(problems)

"""CDI ``containerEdits`` as the CDI spec versions in use define them: read, checked and merged.

The toolkit's specs are copied into each claim's own spec (``toolkit.py``, ``prepare.py``), so
every field a toolkit may write has to survive the copy: a field dropped on the way would start a
container without something it needs, and a field refused would withhold every GPU of the node
(issue 33: toolkit >= 1.19 writes ``additionalGids`` wherever a device node is not
world-read-writable, e.g. ``/dev/dri/cardN`` root:video 0660 where ``nvidia-drm`` is loaded).

The fields (cncf-tags/container-device-interface ``specs-go/config.go``, SPEC.md):

- lists the runtime appends in order: ``env``, ``deviceNodes``, ``mounts``, ``hooks`` and
  ``netDevices`` (1.1.0);
- ``additionalGids`` (0.7.0): groups the container's process gets; a set, 0 ignored, so merged
  without duplicates;
- ``intelRdt`` (0.7.0; ``schemata``/``enableMonitoring`` 1.1.0): one object per container. The
  runtime keeps the last one it meets, so two sources that disagree would be resolved silently;
  such a composition is refused (:class:`EditsConflict`) naming both.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

#: A ``containerEdits`` mapping as read from a spec (field name -> value), empty fields left out.
Edits = dict[str, Any]

LIST_FIELDS = ("env", "deviceNodes", "mounts", "hooks", "netDevices")
GIDS = "additionalGids"
INTEL_RDT = "intelRdt"
#: Every field a CDI spec up to 1.1.0 defines; anything else is not a CDI spec we can copy.
FIELDS = (*LIST_FIELDS, GIDS, INTEL_RDT)
_UINT32_MAX = 2**32 - 1


class EditsError(ValueError):
    """A ``containerEdits`` mapping that is not what the CDI spec defines; says which field and why."""


class EditsConflict(ValueError):
    """Two sources of one container's edits that cannot both apply (two different ``intelRdt``)."""


def read_edits(raw: Any, where: str) -> Edits:
    """``raw`` (a spec's ``containerEdits``) checked field by field; ``where`` prefixes each error."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise EditsError(f"{where}: containerEdits is not a mapping")
    edits: Edits = {}
    for key, value in raw.items():
        if value in (None, [], {}):
            continue
        if key not in FIELDS:
            raise EditsError(
                f"{where}: containerEdits field {key!r} is not one the CDI spec defines "
                f"({', '.join(FIELDS)}), so it cannot be carried into a claim's spec"
            )
        if key == INTEL_RDT:
            if not isinstance(value, dict):
                raise EditsError(f"{where}: containerEdits.intelRdt is not a mapping")
            edits[key] = dict(value)
            continue
        if not isinstance(value, list):
            raise EditsError(f"{where}: containerEdits.{key} is not a list")
        if key == GIDS:
            bad = [g for g in value if not _is_uint32(g)]
            if bad:
                raise EditsError(f"{where}: containerEdits.additionalGids holds {bad[0]!r}, not a uint32")
            gids = merge_gids(value)
            if gids:
                edits[key] = gids
            continue
        edits[key] = list(value)
    return edits


def _is_uint32(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _UINT32_MAX


def merge_gids(*lists: Iterable[int]) -> list[int]:
    """Groups of every list, first occurrence order, without duplicates and without 0 (ignored)."""
    seen: dict[int, None] = {}
    for gids in lists:
        for gid in gids:
            if gid:
                seen.setdefault(int(gid), None)
    return list(seen)


def merge_edits(*parts: Edits) -> Edits:
    """One container's edits from ``parts`` in the runtime's order.

    Lists are concatenated, ``additionalGids`` merged as a set, ``intelRdt`` carried from the one
    part that has it (the same object twice is fine); two different ones raise
    :class:`EditsConflict`.
    """
    merged: Edits = {}
    for part in parts:
        for key, value in part.items():
            if not value:
                continue
            if key == GIDS:
                merged[key] = merge_gids(merged.get(key, []), value)
            elif key == INTEL_RDT:
                if key in merged and merged[key] != value:
                    raise EditsConflict(
                        f"two different intelRdt settings for one container ({merged[key]} and {value}); "
                        "a container has one resctrl class, so they cannot both be carried"
                    )
                merged[key] = value
            else:
                merged.setdefault(key, []).extend(value)
    return merged


def intel_rdt_conflict(parts: Iterable[Edits]) -> str | None:
    """Why ``parts`` (edits the runtime applies to one container) cannot be composed, or None."""
    settings: list[Any] = []
    for part in parts:
        rdt = part.get(INTEL_RDT)
        if rdt and rdt not in settings:
            settings.append(rdt)
    if len(settings) > 1:
        return (
            f"the edits set intelRdt {len(settings)} different ways ({'; '.join(map(str, settings))}); "
            "a container has one resctrl class, so they cannot all be carried"
        )
    return None


def node_gid_needed(node: dict[str, Any]) -> int:
    """The group a container needs to open device ``node``, as the toolkit decides it (>= 1.19).

    A node whose ``gid`` is set and not 0 and whose ``fileMode`` is not both world-readable and
    world-writable needs it (``internal/edits/device.go`` in nvidia-container-toolkit); 0: none.
    """
    gid, mode = node.get("gid"), node.get("fileMode")
    if not isinstance(gid, int) or gid == 0 or not isinstance(mode, int):
        return 0
    return 0 if mode & 0o6 == 0o6 else gid

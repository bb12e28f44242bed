"""Request bodies in Kubernetes' protobuf encoding, for the few objects kubectl sends that way.

``kubectl create namespace`` (like client-go's typed clients) sends built-in types as
``application/vnd.kubernetes.protobuf``: the magic ``k8s\\x00`` then a ``runtime.Unknown`` whose
``raw`` bytes are the object. The sandbox has no generated Kubernetes messages, so it decodes the
wire format itself for objects made of ``ObjectMeta`` and string lists only (Namespace); any other
kind, or a field this decoder does not know, is refused with 415 and a message naming it, never
guessed. Field numbers are those of k8s.io/api and k8s.io/apimachinery's generated.proto.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from hami_dra_dev.sandbox.errors import ApiError

MAGIC = b"k8s\x00"
CONTENT_TYPE = "application/vnd.kubernetes.protobuf"

#: ObjectMeta fields decoded (number -> name, kind of value); others are refused.
_META_STRINGS = {1: "name", 2: "generateName", 3: "namespace"}
_META_MAPS = {11: "labels", 12: "annotations"}
_META_LISTS = {14: "finalizers"}


class _Unsupported(Exception):
    pass


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise _Unsupported("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _fields(data: bytes) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value): bytes for length-delimited, int for varints."""
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            yield number, wire, value
        elif wire == 2:
            length, pos = _varint(data, pos)
            if pos + length > len(data):
                raise _Unsupported("truncated field")
            yield number, wire, data[pos : pos + length]
            pos += length
        else:
            raise _Unsupported(f"wire type {wire} of field {number}")


def _text(value: Any) -> str:
    if not isinstance(value, bytes):
        raise _Unsupported("expected a string")
    return value.decode()


def _object_meta(data: bytes) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    for number, _, value in _fields(data):
        if number in _META_STRINGS:
            meta[_META_STRINGS[number]] = _text(value)
        elif number in _META_MAPS:
            entry = {n: _text(v) for n, _, v in _fields(value)}
            meta.setdefault(_META_MAPS[number], {})[entry.get(1, "")] = entry.get(2, "")
        elif number in _META_LISTS:
            meta.setdefault(_META_LISTS[number], []).append(_text(value))
        elif value not in (b"", 0):
            # Generated marshalling writes every optional field; only a set one matters here.
            raise _Unsupported(f"metadata field {number}")
    return meta


def _namespace(raw: bytes) -> dict[str, Any]:
    body: dict[str, Any] = {"apiVersion": "v1", "kind": "Namespace"}
    for number, _, value in _fields(raw):
        if number == 1:
            body["metadata"] = _object_meta(value)
        elif number == 2:
            finalizers = [_text(v) for n, _, v in _fields(value) if n == 1]
            body["spec"] = {"finalizers": finalizers} if finalizers else {}
        elif number == 3 or value in (b"", 0):
            continue  # status is ignored on create, as the API server's strategy does
        else:
            raise _Unsupported(f"Namespace field {number}")
    return body


_DECODERS = {("v1", "Namespace"): _namespace}


def decode(data: bytes) -> dict[str, Any]:
    """The JSON form of a protobuf request body, or ApiError 415 naming what is not supported."""
    try:
        if not data.startswith(MAGIC):
            raise _Unsupported("no k8s protobuf envelope")
        type_meta: dict[int, str] = {}
        raw = b""
        for number, _, value in _fields(data[len(MAGIC) :]):
            if number == 1:
                type_meta = {n: _text(v) for n, _, v in _fields(value)}
            elif number == 2:
                raw = bytes(value)
        api_version, kind = type_meta.get(1, ""), type_meta.get(2, "")
        decoder = _DECODERS.get((api_version, kind))
        if decoder is None:
            raise ApiError(
                415,
                "UnsupportedMediaType",
                f"the sandbox API server decodes protobuf request bodies only for "
                f"{', '.join(f'{v} {k}' for v, k in _DECODERS)}, not {api_version or '?'} {kind or '?'}: "
                "send JSON (e.g. kubectl apply -f), or use a real API server (hami-dra cluster up)",
            )
        return decoder(raw)
    except _Unsupported as err:
        raise ApiError(
            415,
            "UnsupportedMediaType",
            f"the sandbox API server cannot decode this protobuf request body ({err}): send JSON, "
            "or use a real API server (hami-dra cluster up)",
        ) from None

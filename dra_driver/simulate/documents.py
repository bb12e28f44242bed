"""Reading and writing scenario documents fast enough for a snapshot of a whole cluster.

A 5,000-node snapshot is about 10 MB and a million YAML scalars. PyYAML's pure-Python loader
took two minutes on that, and even libyaml's ``CSafeLoader`` spends most of its time in Python
(the resolver's regular expressions and the generator-based constructor, once per scalar), so:

* a document that is JSON (``{`` first) is read with ``json``, tens of times faster; JSON is
  YAML, so such a file means the same to both (``simulate --from-cluster --save x.json``; the
  one difference, ``\\u`` surrogate pairs, is never written: see :func:`json_text`);
* anything else is parsed by libyaml and built by :func:`_plain_yaml`, a loop over the parser's
  events that resolves each distinct plain scalar once (a snapshot repeats the same few:
  ``80Gi``, ``true``, ``hami-core``, model names). It handles what scenario files use (mappings,
  sequences, plain and quoted scalars) and hands any other document (anchors, aliases, merge
  keys, explicit tags, more than one document, a collection as a key) to ``CSafeLoader``
  (``SafeLoader`` without libyaml), so every document means exactly what ``yaml.safe_load`` says;
* documents are written with ``CSafeDumper`` when libyaml is there.
"""

from __future__ import annotations

import json
from typing import IO, Any

import yaml

#: libyaml's loader and dumper, or PyYAML's pure-Python ones where libyaml is not installed.
SAFE_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
SAFE_DUMPER: type[yaml.SafeDumper] = getattr(yaml, "CSafeDumper", yaml.SafeDumper)

#: The tags of plain scalars :func:`_plain_yaml` builds itself; others (merge ``<<``, value ``=``)
#: need the full loader.
_SCALAR_TAGS = frozenset(
    f"tag:yaml.org,2002:{name}" for name in ("str", "int", "float", "bool", "null", "timestamp")
)


class _Unusual(Exception):
    """The document uses YAML beyond the fast path: load it with the full loader instead."""


def load_document(text: str) -> Any:
    """``yaml.safe_load(text)``, fast for big plain documents; errors are ``yaml.YAMLError``."""
    if text.lstrip()[:1] == "{":
        try:
            return json.loads(text)
        except ValueError:
            pass  # YAML flow style (`{nodes: [...]}`) or a broken file: YAML says which
    try:
        return _plain_yaml(text)
    except _Unusual:
        return yaml.load(text, Loader=SAFE_LOADER)


def _plain_yaml(text: str) -> Any:
    """The document built from libyaml's events; ``_Unusual`` for anything but plain YAML."""
    loader = SAFE_LOADER(text)
    try:
        return _build(loader)
    finally:
        loader.dispose()


_MISSING: Any = object()


def _build(loader: yaml.SafeLoader) -> Any:
    scalars: dict[str, Any] = {}  # plain scalar text -> its (immutable) value
    root: Any = _MISSING
    # Open collections, innermost last; for a mapping, the key read and not yet given a value.
    stack: list[tuple[Any, Any]] = []
    documents = 0
    get_event = loader.get_event
    while True:
        event = get_event()  # type: ignore[no-untyped-call]
        kind = type(event)
        if kind is yaml.ScalarEvent:
            if event.anchor is not None or event.tag is not None:
                raise _Unusual
            if event.implicit[0]:
                value = scalars.get(event.value, _MISSING)
                if value is _MISSING:
                    value = scalars[event.value] = _plain_scalar(loader, event.value)
            else:
                value = event.value
        elif kind is yaml.MappingStartEvent or kind is yaml.SequenceStartEvent:
            if event.anchor is not None or not event.implicit:
                raise _Unusual
            value = {} if kind is yaml.MappingStartEvent else []
        elif kind is yaml.MappingEndEvent or kind is yaml.SequenceEndEvent:
            stack.pop()
            continue
        elif kind is yaml.DocumentStartEvent:
            documents += 1
            if documents > 1:
                raise _Unusual
            continue
        elif kind is yaml.StreamEndEvent:
            return None if root is _MISSING else root
        elif kind is yaml.StreamStartEvent or kind is yaml.DocumentEndEvent:
            continue
        else:  # an alias
            raise _Unusual
        if not stack:
            root = value
        else:
            container, key = stack[-1]
            if type(container) is list:
                container.append(value)
            elif key is _MISSING:
                if type(value) is dict or type(value) is list:
                    raise _Unusual  # a collection as a key
                stack[-1] = (container, value)
            else:
                container[key] = value
                stack[-1] = (container, _MISSING)
        if type(value) is dict or type(value) is list:
            stack.append((value, _MISSING))


def _plain_scalar(loader: yaml.SafeLoader, text: str) -> Any:
    """A plain scalar's value exactly as SafeLoader resolves and constructs it."""
    tag = loader.resolve(yaml.ScalarNode, text, (True, False))  # type: ignore[no-untyped-call]
    if tag not in _SCALAR_TAGS:
        raise _Unusual
    return loader.yaml_constructors[tag](loader, yaml.ScalarNode(tag, text))


def dump_document(
    data: Any, out: IO[str], *, json_format: bool = False, depth: int = 4, comment: str = ""
) -> None:
    """Write ``data`` as YAML or JSON with every collection ``depth`` levels down on one line.

    At the default depth that is one line per GPU of a scenario (``nodes[i].gpus[j]``), as the
    README writes them: a snapshot of thousands of GPUs stays greppable and diffable. Above it,
    YAML is block style except for collections of scalars (flow style, as PyYAML does). YAML
    starts with ``comment`` (one ``#`` line per line of it); JSON has no comments.
    """
    if comment and not json_format:
        out.write("".join(f"# {line}".rstrip() + "\n" for line in comment.splitlines()))
    if json_format:
        out.write(json_text(data, depth, ascii_only=False))
        out.write("\n")
        return
    yaml.dump(
        _flow_below(data, depth), out, Dumper=_Dumper, sort_keys=False, default_flow_style=None, width=4096
    )


class _FlowDict(dict[Any, Any]):
    """A mapping :func:`dump_document` writes in flow style (on one line)."""


class _Dumper(SAFE_DUMPER):  # type: ignore[valid-type,misc]
    """The safe dumper, plus flow style for :class:`_FlowDict`."""


def _represent_flow(dumper: yaml.SafeDumper, data: _FlowDict) -> yaml.Node:
    return dumper.represent_mapping("tag:yaml.org,2002:map", data, flow_style=True)


_Dumper.add_representer(_FlowDict, _represent_flow)


def _flow_below(value: Any, depth: int) -> Any:
    if isinstance(value, dict):
        if depth <= 0:
            return _FlowDict(value)
        return {key: _flow_below(item, depth - 1) for key, item in value.items()}
    if isinstance(value, list):
        return [_flow_below(item, depth - 1) for item in value]
    return value


def json_text(data: Any, depth: int, indent: int = 2, *, ascii_only: bool = True) -> str:
    """JSON laid out like ``json.dumps(indent=...)`` down to ``depth`` levels, one line per deeper value.

    ``json.dumps`` with an indent runs Python's encoder, not the C one, which made it the
    slowest step of ``simulate -o json`` (16,000 candidate cards for 2,000 claims); here every
    value ``depth`` levels down (a candidate card, a GPU) is encoded by the C encoder as one line,
    which also reads better than one line per field. Files are written with ``ascii_only``
    off: ``\\u`` surrogate pairs (characters outside the BMP) are read as one character by JSON
    but as two by YAML, and a file must mean the same to both.
    """
    parts: list[str] = []
    _json_parts(data, depth, indent, 0, parts, ascii_only)
    return "".join(parts)


def _json_parts(value: Any, depth: int, indent: int, level: int, parts: list[str], ascii_only: bool) -> None:
    if level >= depth or not isinstance(value, dict | list) or not value:
        parts.append(json.dumps(value, ensure_ascii=ascii_only))
        return
    inner = "\n" + " " * (indent * (level + 1))
    opening, closing = ("{", "}") if isinstance(value, dict) else ("[", "]")
    parts.append(opening)
    items = value.items() if isinstance(value, dict) else ((None, item) for item in value)
    for position, (key, item) in enumerate(items):
        parts.append(inner if position == 0 else "," + inner)
        if key is not None:
            parts.append(json.dumps(key, ensure_ascii=ascii_only) + ": ")
        _json_parts(item, depth, indent, level + 1, parts, ascii_only)
    parts.append("\n" + " " * (indent * level) + closing)

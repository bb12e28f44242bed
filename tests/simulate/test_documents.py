"""The fast document reader means exactly what ``yaml.safe_load`` says, and the writers round-trip.

``load_document`` builds plain YAML from libyaml's events itself and hands everything else to
the full loader; these tests hold it to ``yaml.safe_load`` on the repository's scenario and
manifest files, on YAML 1.1's surprising scalars, on what it must hand over, and on random
documents in every style PyYAML writes.
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dra_driver.simulate import documents
from dra_driver.simulate.documents import dump_document, json_text, load_document

REPO = Path(__file__).resolve().parents[2]


def same_as_safe_load(text: str) -> Any:
    expected = yaml.safe_load(text)
    got = load_document(text)
    assert got == expected and type(got) is type(expected)
    return got


@pytest.mark.parametrize(
    "path",
    sorted((REPO / "examples").rglob("*.yaml")) + sorted((REPO / "api" / "examples").glob("*.yaml")),
    ids=lambda path: str(path.relative_to(REPO)),
)
def test_repository_files(path: Path) -> None:
    text = path.read_text()
    try:
        yaml.safe_load(text)
    except yaml.YAMLError:  # a multi-document manifest: both refuse it alike
        with pytest.raises(yaml.YAMLError):
            load_document(text)
        return
    same_as_safe_load(text)


YAML_11_SCALARS = """\
bools: [yes, No, ON, off, true, False, y, n]
nulls: [~, null, Null, '', ]
ints: [0x1F, 0o17, 017, 1_000, -42, +7, 0b101, '123', 1:30]
floats: [1.5, 1.5e3, .inf, -.Inf, 6.8523015e+5, 190:20:30.15, 1e3]
times: [2001-12-14, 2001-12-14t21:59:43.10-05:00, 2001-12-14 21:59:43.10 -5]
strings: ["true", 'null', plain text, "tab\\there", 80Gi, 15360Mi, hami-core, "1"]
block: |
  kept
   indented
folded: >
  one
  line
empty:
nested: {a: [1, {b: c}], d: {}}
"""


def test_yaml_11_scalars_resolve_as_safe_load_resolves_them() -> None:
    data = same_as_safe_load(YAML_11_SCALARS)
    assert data["bools"] == [True, False, True, False, True, False, "y", "n"]
    assert data["ints"][:4] == [31, "0o17", 15, 1000]  # YAML 1.1: octal is 017


@pytest.mark.parametrize(
    "text",
    [
        "base: &b {memory: 1Gi}\ncopy: *b\n",  # anchors and aliases
        "base: &b {memory: 1Gi}\nmerged: {<<: *b, cores: 10}\n",  # merge keys
        "a: !!str 1\nb: !!float 2\n",  # explicit tags
        "s: !!set {a, b}\n",
        "? [a, b]\n: 1\n",  # a collection as a key: refused alike
        "a: 1\n---\nb: 2\n",  # two documents: refused alike
        "",
        "# only a comment\n",
        "{nodes: [{name: n}]}\n",  # flow YAML starting with '{': not JSON
        '{"nodes": [{"name": "n", "gpus": []}], "x": [1.5, null, true]}',  # JSON
    ],
)
def test_what_the_fast_path_hands_over_means_the_same(text: str) -> None:
    try:
        expected = yaml.safe_load(text)
    except yaml.YAMLError as err:
        with pytest.raises(type(err)):
            load_document(text)
        return
    assert load_document(text) == expected


def test_plain_documents_never_reach_the_full_loader(monkeypatch: pytest.MonkeyPatch) -> None:
    """The speed comes from the event loop; a scenario file must not fall back silently."""

    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("fell back to the full loader")

    monkeypatch.setattr(documents.yaml, "load", refuse)
    load_document((REPO / "examples" / "quota.yaml").read_text())
    load_document(YAML_11_SCALARS)


def test_errors_carry_the_parsers_position() -> None:
    with pytest.raises(yaml.YAMLError) as raised:
        load_document("nodes: [\n")
    mark = getattr(raised.value, "problem_mark", None)
    assert mark is not None and mark.line == 1


scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=12)
    | st.sampled_from(["yes", "~", "0x1F", "1:30", "2001-12-14", "80Gi", "-", "<<", "=", "1e3", ".5"])
)
trees = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=80, deadline=None)
@given(data=trees, flow=st.sampled_from([None, True, False]), style=st.sampled_from([None, "'", '"', "|"]))
def test_random_documents_load_as_safe_load_loads_them(
    data: Any, flow: bool | None, style: str | None
) -> None:
    text = yaml.safe_dump({"root": data}, default_flow_style=flow, default_style=style, allow_unicode=True)
    same_as_safe_load(text)


#: Text YAML can hold at all (its reader refuses control characters; JSON would write them raw).
printable = st.text(st.characters(blacklist_categories=("Cc", "Cs")), max_size=12)
printable_trees = st.recursive(
    scalars.filter(lambda value: not isinstance(value, str)) | printable,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(printable, children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=60, deadline=None)
@given(data=printable_trees, depth=st.integers(0, 5), as_json=st.booleans())
@example(data=5e-324, depth=0, as_json=True)  # found by make test-lowest: an exponent without a dot
def test_written_documents_read_back(data: Any, depth: int, as_json: bool) -> None:
    if as_json and _has_inf(data):
        return  # JSON has no infinity
    out = io.StringIO()
    dump_document({"root": data}, out, json_format=as_json, depth=depth)
    # JSON is read as JSON (PyYAML's YAML 1.1 would read an exponent without a dot, 5e-324, as a
    # string); YAML as PyYAML reads it.
    other_reader = json.loads if as_json else yaml.safe_load
    assert load_document(out.getvalue()) == other_reader(out.getvalue()) == {"root": data}


def _has_inf(value: Any) -> bool:
    if isinstance(value, float):
        return math.isinf(value)
    if isinstance(value, dict):
        return any(_has_inf(item) for item in value.values())
    if isinstance(value, list):
        return any(_has_inf(item) for item in value)
    return False


def test_json_text_is_json_laid_out_by_depth() -> None:
    data = {"results": [{"claim": "a", "candidates": [{"node": "n", "index": 0}, {"node": "n", "index": 1}]}]}
    text = json_text(data, depth=4)
    assert json.loads(text) == data
    assert '\n        {"node": "n", "index": 0},\n' in text  # one line per candidate
    assert json_text(data, depth=0) == json.dumps(data)

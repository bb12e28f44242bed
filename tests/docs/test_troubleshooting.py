"""docs/troubleshooting.md keeps up with what the kubelet plugin can report.

Every message the plugin can answer NodePrepareResources with (the message of each ``raise`` of a
claim error in ``dra_driver/kubeletplugin``, and each error it builds for ``PrepareResult``) must
match an example in the first column of "A placed pod that does not start"; every reason it
withholds GPUs for, or reports on the Node, must have its row among the events. A new message
without a row fails here, naming it.

The messages are read from the source (``ast``), not from a list kept by hand: an f-string's literal
parts must appear as written, each ``{...}`` may be anything, and a wrapper's words may come first.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from dra_driver.kubeletplugin import plugin, withheld
from tests.docs.markdown import REPO

PLUGIN = REPO / "dra_driver" / "kubeletplugin"
TROUBLESHOOTING = REPO / "docs" / "troubleshooting.md"
#: The exceptions whose message becomes a claim's NodePrepareResources error.
CLAIM_ERRORS = {"ClaimError", "ClaimNotFound", "CapacityError", "EditsConflict"}
#: Fewer literal letters than this: a message that wraps another one (``f"{err} ({HINT})"``,
#: ``f"claim {uid}: {err}"``), whose rows are the wrapped messages'.
WRAPPER_LETTERS = 12


@dataclass(frozen=True)
class Message:
    where: str  # file:line
    text: str  # the source expression
    pattern: re.Pattern[str]
    letters: int  # literal letters


def _message(node: ast.expr) -> tuple[re.Pattern[str], int] | None:
    """The message ``node`` builds as a regex, or None when it is not built here (``str(err)``)."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "strip":
        node = node.func.value
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        parts: list[ast.expr] = [node]
    elif isinstance(node, ast.JoinedStr):
        parts = list(node.values)
    else:
        return None
    regex, letters = "", 0
    for part in parts:
        if isinstance(part, ast.Constant):
            regex += re.escape(str(part.value))
            letters += sum(c.isalpha() for c in str(part.value))
        else:
            regex += ".*"
    # A wrapper may put its own words before it (``claim <uid>: <message>``).
    return re.compile(f"(?:.+: )?{regex}", re.S), letters


def _messages(path: Path) -> list[Message]:
    found = []
    tree = ast.parse(path.read_text())
    error_returns = {
        ret
        for func in ast.walk(tree)
        if isinstance(func, ast.FunctionDef) and func.name.endswith("_error")
        for ret in ast.walk(func)
        if isinstance(ret, ast.Return)
    }
    for node in ast.walk(tree):
        argument: ast.expr | None = None
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            call = node.exc
            if isinstance(call.func, ast.Name) and call.func.id in CLAIM_ERRORS and call.args:
                argument = call.args[0]
        elif (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "PrepareResult"
        ):
            argument = next((k.value for k in node.keywords if k.arg == "error"), None)
        elif isinstance(node, ast.Return) and node.value is not None and node in error_returns:
            # A helper that builds a PrepareResult's error (``def _write_error(...) -> str``).
            argument = node.value
        built = _message(argument) if argument is not None else None
        if built is not None:
            where = f"{path.name}:{node.lineno}"
            found.append(Message(where, ast.unparse(argument or node), *built))
    return found


def plugin_messages() -> list[Message]:
    return [
        m for path in sorted(PLUGIN.glob("*.py")) for m in _messages(path) if m.letters >= WRAPPER_LETTERS
    ]


def _section(title: str) -> str:
    text = TROUBLESHOOTING.read_text()
    assert f"\n## {title}\n" in text, f"docs/troubleshooting.md has no section {title!r}"
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def documented_examples() -> list[str]:
    """The code spans of the first column of the section's message table."""
    table = _section("A placed pod that does not start").split("| message | cause | fix |", 1)[1]
    rows = [line for line in table.split("\n\n", 1)[0].splitlines() if line.startswith("| ")]
    return [span for row in rows for span in re.findall(r"`([^`]+)`", row.split(" | ", 1)[0])]


def test_the_scan_finds_the_plugins_messages() -> None:
    """The scan itself works: known messages of each kind are among those found."""
    found = {m.where.split(":")[0] for m in plugin_messages()}
    assert {"claims.py", "prepare.py", "defence.py", "hamicore.py", "container_edits.py"} <= found
    texts = " ".join(m.text for m in plugin_messages())
    assert "is not allocated" in texts and "memory overcommitted" in texts and "writing state" in texts
    assert len(plugin_messages()) >= 20


def test_every_prepare_message_has_a_row() -> None:
    examples = documented_examples()
    assert examples
    missing = [
        f"{m.where}: {m.text}"
        for m in plugin_messages()
        if not any(m.pattern.fullmatch(example) for example in examples)
    ]
    assert not missing, "messages without a row in docs/troubleshooting.md (A placed pod...):\n" + "\n".join(
        missing
    )


def test_an_undocumented_message_is_caught(tmp_path: Path) -> None:
    """What the check does with a message nobody documented."""
    source = tmp_path / "new.py"
    source.write_text('raise ClaimError(f"GPU {name} melted during prepare")\n')
    messages = [m for m in _messages(source) if m.letters >= WRAPPER_LETTERS]
    assert len(messages) == 1
    assert not any(messages[0].pattern.fullmatch(example) for example in documented_examples())
    assert messages[0].pattern.fullmatch("GPU gpu-0 melted during prepare")


def test_every_node_reason_has_a_row() -> None:
    """The reasons GPUs are withheld for (Node events, hami_dra_kubelet_plugin_withheld_gpus) and
    the plugin's own Node warnings."""
    reasons = {
        withheld.NO_CDI_SPEC,
        withheld.NO_CONTROL_NODES,
        withheld.DEVICE_PLUGIN,
        plugin.SHARES_NOT_ENFORCED,
    }
    declared = {
        value
        for name, value in vars(withheld).items()
        if name.isupper() and isinstance(value, str) and re.fullmatch(r"[A-Z][A-Za-z]+", value)
    }
    assert declared <= reasons, f"a new withheld reason: {declared - reasons}"
    events = _section("Other events")
    rows = {m for line in events.splitlines() for m in re.findall(r"^\| node \| Warning `(\w+)`", line)}
    assert reasons <= rows, reasons - rows

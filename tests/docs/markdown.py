"""Reading the project's Markdown: code blocks, the shell commands in them, links and anchors."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: The documents whose commands and links are checked: what users and contributors read.
DOCS: tuple[Path, ...] = (
    REPO / "README.md",
    REPO / "CONTRIBUTING.md",
    *sorted((REPO / "docs").glob("*.md")),
)

#: Fence languages whose lines are shell commands.
SHELL = frozenset({"sh", "bash", "shell"})

_FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int  # 1-based line of the first line inside the fence
    lang: str
    text: str


@dataclass(frozen=True)
class Command:
    doc: Path
    line: int
    text: str  # one logical command: continuation lines joined, the trailing comment removed

    @property
    def where(self) -> str:
        return f"{self.doc.relative_to(REPO)}:{self.line}"


def blocks(doc: Path) -> list[Block]:
    """Fenced code blocks, with their language (``""`` when none is given)."""
    found: list[Block] = []
    lines = doc.read_text().splitlines()
    opened: tuple[int, str, str] | None = None  # (index, indent, lang)
    body: list[str] = []
    for index, line in enumerate(lines):
        match = _FENCE.match(line)
        if opened is None:
            if match:
                opened, body = (index, match.group(1), match.group(2)), []
            continue
        if match and match.group(2) == "":
            start, indent, lang = opened
            text = "\n".join(item[len(indent) :] if item.startswith(indent) else item for item in body)
            found.append(Block(doc, start + 2, lang, text))
            opened = None
        else:
            body.append(line)
    assert opened is None, f"{doc.relative_to(REPO)}:{opened[0] + 1}: unclosed code block"
    return found


def strip_comment(line: str) -> str:
    """``line`` without a trailing ``# comment`` (a ``#`` outside quotes that starts a word)."""
    quote = ""
    for position, char in enumerate(line):
        if quote:
            if char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char == "#" and (position == 0 or line[position - 1].isspace()):
            return line[:position].rstrip()
    return line.rstrip()


def commands(doc: Path) -> list[Command]:
    """Every command of the shell blocks of ``doc``, one per logical line."""
    found: list[Command] = []
    for block in blocks(doc):
        if block.lang not in SHELL:
            continue
        pending: list[str] = []
        start = 0
        for offset, raw in enumerate(block.text.splitlines()):
            line = strip_comment(raw)
            if not pending:
                start = block.line + offset
                if not line.strip():
                    continue
            if line.endswith("\\"):
                pending.append(line[:-1].strip())
                continue
            pending.append(line.strip())
            found.append(Command(doc, start, " ".join(part for part in pending if part)))
            pending = []
        assert not pending, f"{doc.relative_to(REPO)}:{start}: a command ends with a line continuation"
    return found


def links(doc: Path) -> list[tuple[int, str]]:
    """Link targets outside code blocks: (line, target)."""
    found: list[tuple[int, str]] = []
    in_code = False
    for number, line in enumerate(doc.read_text().splitlines(), start=1):
        if _FENCE.match(line):
            in_code = not in_code
            continue
        if in_code:
            continue
        found += [(number, target) for target in _LINK.findall(re.sub(r"`[^`]*`", "", line))]
    return found


def anchors(doc: Path) -> set[str]:
    """GitHub's anchors for the headings of ``doc``."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    in_code = False
    for line in doc.read_text().splitlines():
        if _FENCE.match(line):
            in_code = not in_code
            continue
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if in_code or not match:
            continue
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", match.group(1))
        slug = re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found

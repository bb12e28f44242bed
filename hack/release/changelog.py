"""CHANGELOG.md in Keep a Changelog form: ``## [X.Y.Z] - YYYY-MM-DD`` sections, newest first, an
optional ``## [Unreleased]`` on top. A release needs its own section (its notes and upgrade notes)."""

from __future__ import annotations

import re
from pathlib import Path

from hack.release.errors import ReleaseError

HEADING = re.compile(r"^## \[(?P<version>[^\]]+)\](?: - (?P<date>\d{4}-\d{2}-\d{2}))?\s*$", re.MULTILINE)
UNRELEASED = "Unreleased"


def released_versions(text: str) -> list[str]:
    """Versions with a section, newest first (as written), ``Unreleased`` left out."""
    return [m["version"] for m in HEADING.finditer(text) if m["version"] != UNRELEASED]


def section(text: str, version: str) -> str:
    """The section of ``version``, its heading included, up to the next section or the link list."""
    headings = list(HEADING.finditer(text))
    for index, match in enumerate(headings):
        if match["version"] != version:
            continue
        if not match["date"]:
            raise ReleaseError(
                f"CHANGELOG.md: the heading of {version} has no date: write '## [{version}] - YYYY-MM-DD'"
            )
        end = headings[index + 1].start() if index + 1 < len(headings) else len(text)
        body = text[match.start() : end]
        # Keep a Changelog's link references ("[0.1.0]: https://...") close the file, not a section.
        body = re.split(r"^\[[^\]]+\]: ", body, maxsplit=1, flags=re.MULTILINE)[0]
        if "### Upgrade notes" not in body:
            raise ReleaseError(
                f"CHANGELOG.md: the section of {version} has no '### Upgrade notes' "
                "(what a user does to move to it, or 'Nothing to do.')"
            )
        return body.rstrip() + "\n"
    known = ", ".join(released_versions(text)) or "none"
    raise ReleaseError(
        f"CHANGELOG.md has no section for {version} (sections: {known}): "
        f"add '## [{version}] - YYYY-MM-DD' with its changes and upgrade notes"
    )


def read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError as err:
        raise ReleaseError(f"{path} is missing: the release notes come from it") from err

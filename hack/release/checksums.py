"""SHA256SUMS in the format ``sha256sum -c`` reads: ``<hex>  <file name>``, one line per artifact."""

from __future__ import annotations

import hashlib
from pathlib import Path

NAME = "SHA256SUMS"


def digest(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()


def write(directory: Path) -> Path:
    """Checksums of every file in ``directory`` (but SHA256SUMS itself), sorted by name."""
    files = sorted(p for p in directory.iterdir() if p.is_file() and p.name != NAME)
    target = directory / NAME
    target.write_text("".join(f"{digest(p)}  {p.name}\n" for p in files))
    return target

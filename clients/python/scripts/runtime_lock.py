"""Prints the part of a hash-pinned lock a built wheel needs at run time.

    python scripts/runtime_lock.py DIST.whl requirements/test.txt > runtime.txt

The wheel's own requirements (no extras) and, transitively, theirs as the
running environment has them installed: that environment must have been made
from the same lock (scripts/test-python.sh runs this with target/python-venv).
scripts/test-python.sh installs the result with --require-hashes into the
fresh virtualenvs it installs the wheel and the sdist into, as a user's
would be: the package's runtime dependencies and nothing else."""

from __future__ import annotations

import re
import sys
import zipfile
from collections.abc import Iterable
from email.parser import Parser
from importlib.metadata import distribution
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import NormalizedName, canonicalize_name

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==")


def runtime_names(requires: Iterable[str]) -> Iterable[NormalizedName]:
    for line in requires:
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            yield canonicalize_name(requirement.name)


def wheel_requires(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(archive.read(name).decode())
    return metadata.get_all("Requires-Dist") or []


def closure(requires: list[str]) -> set[NormalizedName]:
    seen: set[NormalizedName] = set()
    todo = list(runtime_names(requires))
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(runtime_names(distribution(name).requires or []))
    return seen


def lock_entries(lock: Path) -> dict[NormalizedName, list[str]]:
    """Each pinned requirement with its --hash lines, by name."""
    entries: dict[NormalizedName, list[str]] = {}
    current: list[str] | None = None
    for line in lock.read_text().splitlines():
        pin = PIN.match(line)
        if pin:
            current = entries.setdefault(canonicalize_name(pin.group(1)), [])
            current.append(line)
        elif current is not None and line.strip().startswith("--hash="):
            current.append(line)
        elif not line.startswith(" "):
            current = None
    return entries


def main() -> int:
    wheel, lock = (Path(arg) for arg in sys.argv[1:3])
    entries = lock_entries(lock)
    names = sorted(closure(wheel_requires(wheel)))
    missing = [name for name in names if name not in entries]
    if missing:
        print(f"runtime_lock: {lock} pins no {', '.join(missing)}", file=sys.stderr)
        return 1
    for name in names:
        print("\n".join(entries[name]).rstrip(" \\"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

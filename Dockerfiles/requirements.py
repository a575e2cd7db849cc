"""Print the requirements of rlrun's base dependencies plus the named extras, read from
pyproject.toml (self-references such as `rlrun[model,serve]` expanded), one per line.

The images install these before they copy the source, so that a source change reuses the
dependency layers:

    python requirements.py pyproject.toml model serve > requirements.txt
    pip install -r requirements.txt -c constraints.txt

Standard library only: it runs in the build stage before anything is installed."""

from __future__ import annotations

import re
import sys
import tomllib


def requirements(pyproject: dict, extras: list[str]) -> list[str]:
    project = pyproject["project"]
    name = project["name"]
    optional = project.get("optional-dependencies", {})
    out: list[str] = []
    seen: set[str] = set()

    def add(items: list[str]) -> None:
        for item in items:
            match = re.match(rf"^{re.escape(name)}\s*\[([^\]]*)\]\s*$", item)
            if match:
                expand([e.strip() for e in match.group(1).split(",") if e.strip()])
            elif item not in out:
                out.append(item)

    def expand(names: list[str]) -> None:
        for extra in names:
            if extra not in optional:
                raise SystemExit(f"{name} has no extra {extra!r} (known: {', '.join(sorted(optional))})")
            if extra not in seen:
                seen.add(extra)
                add(optional[extra])

    add(project.get("dependencies", []))
    expand(extras)
    return out


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit("usage: requirements.py PYPROJECT [EXTRA ...]")
    with open(argv[0], "rb") as file:
        pyproject = tomllib.load(file)
    print("\n".join(requirements(pyproject, argv[1:])))


if __name__ == "__main__":
    main(sys.argv[1:])

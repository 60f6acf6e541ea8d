"""The locked environment: ``requirements.lock``, every package with its version and sha256
hashes (``make lock``: uv pip compile --generate-hashes of requirements.txt and
requirements-test.txt), installed by .ci/setup.sh with ``pip install --require-hashes``.

    python -m pipeline.environment                # what a run records: the lock's sha256, versions
    python -m pipeline.environment --check        # exit 1 if the installed versions are not the lock's
    python -m pipeline.environment --subset numpy cython   # those packages' entries (setup.sh's first step)

Standard library only: .ci/setup.sh runs it before anything is installed.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import re
import sys
from pathlib import Path

from pipeline import REPO

LOCK = REPO / "requirements.lock"
# a pinned entry starts a line: name==version, then its `--hash=sha256:...` continuation lines
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


def normalize(name: str) -> str:
    """A distribution's name as PEP 503 compares them (Cython = cython, ruamel.yaml = ruamel-yaml)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_entries(text: str) -> dict[str, str]:
    """name -> the lock's whole entry for it (pin, hashes, uv's `# via` comments)."""
    entries: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        pin = PIN.match(line)
        if pin:
            current = normalize(pin[1])
            entries[current] = []
        elif not line.startswith(" "):
            current = None  # a comment or a blank line between entries
        if current is not None:
            entries[current].append(line)
    return {name: "\n".join(lines) for name, lines in entries.items()}


def locked_versions(text: str) -> dict[str, str]:
    """name -> the version the lock pins (lock_entries starts an entry only at a pin: each has one)."""
    pins = {name: PIN.match(entry) for name, entry in lock_entries(text).items()}
    return {name: pin[2] for name, pin in pins.items() if pin is not None}


def installed_versions() -> dict[str, str]:
    """name -> version of every distribution this interpreter sees (one pass over sys.path)."""
    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        found.setdefault(normalize(dist.metadata["Name"] or ""), dist.version)  # first on sys.path wins
    return found


def environment(lock: Path = LOCK) -> dict:
    """What a run states of its environment: the lock file's sha256 and, for each package the
    lock pins, the version installed here (None: not installed); ``not_as_locked`` lists the
    packages whose installed version is not the lock's (empty in an environment built from it)."""
    data = Path(lock).read_bytes()
    locked = locked_versions(data.decode())
    installed = installed_versions()
    packages = {name: installed.get(name) for name in sorted(locked)}
    return {
        "lock": Path(lock).name,
        "lock_sha256": hashlib.sha256(data).hexdigest(),
        "packages": packages,
        "not_as_locked": {
            name: {"locked": locked[name], "installed": version}
            for name, version in packages.items()
            if version != locked[name]
        },
    }


def subset(text: str, names: list[str]) -> str:
    """The lock's entries for ``names``: a lock file of its own (pip --require-hashes --no-deps)."""
    entries = lock_entries(text)
    missing = [n for n in names if normalize(n) not in entries]
    if missing:
        raise SystemExit(f"not in the lock: {', '.join(missing)} (make lock adds what requirements*.txt ask for)")
    return "\n".join(entries[normalize(n)] for n in names) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lock", type=Path, default=LOCK)
    ap.add_argument("--check", action="store_true", help="exit 1 if an installed version is not the lock's")
    ap.add_argument("--subset", nargs="+", metavar="NAME", help="print these packages' entries of the lock")
    args = ap.parse_args(argv)
    if args.subset:
        sys.stdout.write(subset(args.lock.read_text(), args.subset))
        return 0
    env = environment(args.lock)
    if args.check:
        for name, versions in env["not_as_locked"].items():
            print(f"{name}: locked {versions['locked']}, installed {versions['installed']}", file=sys.stderr)
        print(
            f"{args.lock.name} sha256 {env['lock_sha256']}: {len(env['packages'])} packages, "
            f"{len(env['not_as_locked'])} not as locked"
        )
        return 1 if env["not_as_locked"] else 0
    print(json.dumps(env, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The coverage gate of CI: every line of pipeline/ (bench/ aside) that the test suite never
executed must be in .ci/coverage-allowlist.txt, with the reason it cannot run here (it needs a
CUDA device). An allowlisted line that is executed, or that no longer exists, is an error too,
so the list stays short and true.

    python -m pytest --cov ...       # writes .coverage.* (pyproject: [tool.coverage.run])
    python .ci/coverage_gate.py      # combines them, prints the figure, checks the allowlist
"""

from __future__ import annotations

import sys
from pathlib import Path

import coverage

REPO = Path(__file__).resolve().parent.parent
ALLOWLIST = REPO / ".ci" / "coverage-allowlist.txt"


def read_allowlist(path: Path) -> dict[tuple[str, str], str]:
    """(file, stripped source line) -> reason, from lines ``file | source line | reason``."""
    entries = {}
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        parts = [p.strip() for p in raw.split(" | ")]
        if len(parts) != 3 or not all(parts):
            raise SystemExit(f"{path}:{n}: expected 'file | source line | reason', got {raw!r}")
        entries[(parts[0], parts[1])] = parts[2]
    return entries


def missed_lines(cov: coverage.Coverage) -> tuple[list[tuple[str, int, str]], int, int]:
    """(file, line number, stripped source) of every statement never executed, and the
    statement counts (executed, all)."""
    missed, run, total = [], 0, 0
    for filename in sorted(cov.get_data().measured_files()):
        rel = Path(filename).resolve().relative_to(REPO).as_posix()
        _, statements, _, missing, _ = cov.analysis2(filename)
        source = Path(filename).read_text().splitlines()
        missed += [(rel, n, source[n - 1].strip()) for n in missing]
        run, total = run + len(statements) - len(missing), total + len(statements)
    return missed, run, total


def main() -> int:
    cov = coverage.Coverage(config_file=str(REPO / "pyproject.toml"))
    cov.load()  # what pytest-cov combined at the end of the run
    cov.combine(data_paths=[str(REPO)], keep=False)  # and any process's file written after it
    cov.save()
    # every module of the package, also those no test imported (they count as never run)
    for path in sorted((REPO / "pipeline").rglob("*.py")):
        if "bench" not in path.relative_to(REPO).parts:
            cov.get_data().touch_file(str(path))
    missed, run, total = missed_lines(cov)
    allowed = read_allowlist(ALLOWLIST)
    unexplained = [m for m in missed if (m[0], m[2]) not in allowed]
    used = {(m[0], m[2]) for m in missed}
    stale = [key for key in allowed if key not in used]
    print(f"[coverage] pipeline/ (bench/ excluded): {run} of {total} statements run, {100.0 * run / total:.2f}%")
    print(f"[coverage] {len(missed)} never run, {len(missed) - len(unexplained)} of them allowlisted (need CUDA)")
    for rel, n, text in unexplained:
        print(f"[coverage] never run and not allowlisted: {rel}:{n}: {text}")
    for rel, text in stale:
        print(f"[coverage] allowlisted but run or gone (remove it): {rel}: {text}")
    return 1 if unexplained or stale else 0


if __name__ == "__main__":
    sys.exit(main())

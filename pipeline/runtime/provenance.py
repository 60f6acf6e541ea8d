"""Where a run ran: CPU model and its vector extensions, library versions, git commit, and the
lock its environment was built from (requirements.lock's sha256 and the packages installed at
another version than the lock's: with none, the sha256 names every installed version).

Recorded in every ``summary.json`` (pretraining) and ``probe.json``; each table's footnote names
it (``environment_note``), and says so when the runs behind a table disagree. Numbers are
bit-identical on the same CPU and library versions only, so a table without this line cannot
be compared with another. Recording never fails: what cannot be read is None.
"""

from __future__ import annotations

import platform
import subprocess
from collections import Counter
from importlib import metadata
from pathlib import Path

from pipeline import REPO, environment

LIBRARIES = ("torch", "torchvision", "numpy", "ffcv")
# the extensions that change which kernels run (and so the last bits of a result)
KEY_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile")


def cpu(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict:
    """{"model": ..., "flags": the KEY_FLAGS present} of the first processor listed."""
    model: str | None = None
    flags: list[str] = []
    try:
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, val = line.partition(":")
            key = key.strip()
            if key == "model name" and model is None:
                model = val.strip()
            elif key == "flags" and not flags:
                present = set(val.split())
                flags = [f for f in KEY_FLAGS if f in present]
    except OSError:
        pass
    return {"model": model or platform.processor() or None, "flags": flags}


def versions() -> dict:
    out: dict[str, str | None] = {}
    for lib in LIBRARIES:
        try:
            out[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            out[lib] = None
    return out


def git_commit(repo: Path = REPO) -> str | None:
    """HEAD of the checkout the code runs from; None outside a git checkout or without git."""
    try:
        proc = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    return proc.stdout.strip() or None


def locked_environment(lock: Path | None = None) -> dict:
    """{"lock_sha256", "not_as_locked"} of pipeline.environment; None values without the lock."""
    try:
        env = environment.environment(lock or environment.LOCK)
    except (OSError, UnicodeDecodeError):
        return {"lock_sha256": None, "not_as_locked": None}
    return {"lock_sha256": env["lock_sha256"], "not_as_locked": env["not_as_locked"]}


def record(fast_path: str | None = None) -> dict:
    """This process's provenance, as stored under "provenance" in summary.json and probe.json;
    a pretraining's also names the path its steps took (``fast_path``: fp32 or bf16 autocast)."""
    rec = {"cpu": cpu(), "versions": versions(), "commit": git_commit(), "environment": locked_environment()}
    return {**rec, "fast_path": fast_path} if fast_path else rec


def describe(rec: dict) -> dict[str, str]:
    """A record as short texts per field (the footnote's parts)."""
    c, v = rec.get("cpu") or {}, rec.get("versions") or {}
    flags = set(c.get("flags") or [])
    shown = [f for f in KEY_FLAGS[:2] if f in flags] + [f"no {f}" for f in KEY_FLAGS[:2] if f not in flags]
    shown += [f for f in KEY_FLAGS[2:] if f in flags]
    commit = rec.get("commit")
    out = {
        "CPU": f"{c.get('model') or '?'} ({', '.join(shown)})",
        "versions": ", ".join(f"{lib} {v.get(lib) or 'absent'}" for lib in LIBRARIES),
        "commit": commit[:12] if commit else "not a git checkout",
    }
    return {**out, "pretraining steps": rec["fast_path"]} if rec.get("fast_path") else out


def environment_note(records: list[dict | None]) -> str | None:
    """One footnote line naming the CPU, flags, versions and commit of the runs behind a table,
    and the path the pretrainings' steps took (fp32 or bf16 autocast: probes record none); a
    field on which they disagree lists each value with its number of runs."""
    if not records:
        return None
    recorded = [describe(r) for r in records if r]
    if not recorded:
        return "Ran on: not recorded (runs from before summary.json stored their provenance)."
    parts = []
    for field in dict.fromkeys(f for d in recorded for f in d):
        counts = Counter(d[field] for d in recorded if field in d)
        if len(counts) == 1:
            parts.append(f"{field}: {next(iter(counts))}")
        else:
            listed = "; ".join(f"{value} ({n} run{'s' * (n > 1)})" for value, n in counts.most_common())
            parts.append(f"{field} DIFFER across runs: {listed}")
    if len(recorded) < len(records):
        parts.append(f"{len(records) - len(recorded)} of {len(records)} runs did not record it")
    return "Ran on: " + "; ".join(parts) + "."

"""What a rule's jobs need in GPUs against what the profile gives them, checked while the DAG is
built (before anything is submitted). Standard library only: the Snakefile imports it."""

from __future__ import annotations

from pipeline.dag.config import ConfigError


def gres_gpus(gres) -> int | None:
    """GPUs per node a gres asks for: "gpu:4" and "gpu:a100:4" -> 4, "gpu" -> 1; None where it
    asks for none (no gres, "": e.g. a CPU test cluster, where ranks run on CPUs)."""
    for part in str(gres or "").split(","):
        fields = part.strip().split(":")
        if fields[0] == "gpu":
            return int(fields[-1]) if len(fields) > 1 and fields[-1].isdigit() else 1
    return None


def check_ranks_fit(rule: str, ranks: int, key: str, profile_resources) -> None:
    """Fail unless a gres the profile pins (``set-resources.<rule>.gres``; the rule's own is
    "gpu:<ranks>") gives each of ``rule``'s jobs a GPU per rank (``key``: the config key that
    sets the ranks). ``profile_resources``: Snakemake's overwrite resources, rule -> {resource: value}."""
    gres = (profile_resources or {}).get(rule, {}).get("gres")
    gpus = gres_gpus(gres)
    if gpus is not None and gpus < ranks:
        raise ConfigError(
            f"{key}: {ranks} ranks need {ranks} GPUs in each {rule} job, but the profile's "
            f"set-resources.{rule}.gres gives {gres!r}: remove it there (the rule then asks for "
            f'"gpu:{ranks}" itself), set "gpu:{ranks}", or lower {key}'
        )

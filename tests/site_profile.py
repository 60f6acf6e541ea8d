"""profiles/slurm, the site profile users submit with, made to run on the local two-node test
cluster (tests/slurm_cluster.py), and a wrapper that records every real ``sbatch`` call.

Only what this cluster cannot match is changed, and only through the profile's own switches:
the values of its ``x-site`` anchors (SITE_OVERRIDES), the settings its comments name for a
cluster without accounting (LOCAL_SETTINGS) and for one without GPU gres (NO_GPU_GRES).
Everything else (requeue, partitions, time limits, the pretraining's srun geometry and warning
signal, retries, kept logs) is the site profile's text as shipped. Apart from the profile,
Snakemake's SLURM executor checks its jobs' status every few seconds instead of backing off to
minutes (snakemake_command(): the test cluster's jobs take seconds).
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
SITE_PROFILE = REPO / "profiles" / "slurm" / "config.yaml"

# x-site anchor -> the value the test cluster can hold (2 "nodes" of 2 CPUs, no GPUs, no accounts)
SITE_OVERRIDES = {
    "account": '""',  # no accounting: a named account fails the plugin's sacctmgr/sshare check
    "node_gpus": '""',
    "gpus_per_node": 2,  # ranks per node: a node has 2 CPUs (and the plugin wants > 1 for srun jobs)
    "cpus_per_gpu": 1,
    "cpu_job_cpus": 1,
    "convert_cpus": 1,
    "mem_per_node_mb": 1000,  # RealMemory is the machine's (~24 GB), shared by both nodes
    "cpu_job_mem_mb": 500,
    "gpu_job_mem_mb": 500,
}
# rules whose gres comes from the workflow config ("gpu:1", "gpu:<detect.ranks>"): pinned to
# "" under set-resources, as the profile says for a cluster without GPU gres
NO_GPU_GRES = ("probe", "detect")
# settings the profile itself names for a cluster without accounting (sacct fails there), and a
# first status check after 2 s instead of 20 (the test's jobs take seconds)
LOCAL_SETTINGS = {
    "slurm-status-command": "squeue",
    "slurm-init-seconds-before-status-checks": 2,
}

SBATCH_WRAPPER = """#!/bin/sh
# logs the call (one JSON object per line: time, argv), then runs the real sbatch. One write(2) on an
# O_APPEND file per call: calls made at once (Snakemake submits from several threads) do not interleave.
{python} -c '
import json, os, sys, time
line = json.dumps({{"t": time.time(), "argv": sys.argv[2:]}}) + "\\n"
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
os.write(fd, line.encode())
' {log} "$@"
exec {sbatch} "$@"
"""


def set_anchor(text: str, name: str, value) -> str:
    new, n = re.subn(rf"(&{name}\s+)(\"[^\"]*\"|\S+)", lambda m: f"{m[1]}{value}", text)
    if n != 1:
        raise ValueError(f"profiles/slurm has {n} anchors &{name}, expected 1")
    return new


def set_setting(text: str, key: str, value) -> str:
    """A top-level key's value; a commented-out key (`# key: ...`) is switched on."""
    new, n = re.subn(rf"^(?:# )?{key}:[^\n]*$", f"{key}: {value}", text, flags=re.M)
    if n != 1:
        raise ValueError(f"profiles/slurm has {n} lines for {key}, expected 1")
    return new


def pin_resource(text: str, rule: str, key: str, value) -> str:
    """``key: value`` as the first resource under set-resources.<rule>."""
    new, n = re.subn(rf"^(  {rule}:[^\n]*\n)", lambda m: f"{m[1]}    {key}: {value}\n", text, flags=re.M)
    if n != 1:
        raise ValueError(f"profiles/slurm has {n} set-resources entries {rule}, expected 1")
    return new


def one_process_pretraining(text: str) -> str:
    """The pretrain rule without srun: one process in a one-core job, as the profile runs a rule
    it gives no ``mpi`` (``tasks_per_node`` goes with it: the plugin reads it for srun jobs only)."""
    head, rule, rest = text.partition("\n  pretrain:")
    rest, n = re.subn(r"^    (?:mpi|tasks_per_node): [^\n]*\n", "", rest, flags=re.M)
    if n != 2:
        raise ValueError(f"profiles/slurm's pretrain rule has {n} of its mpi and tasks_per_node lines, expected 2")
    return head + rule + rest


def derive(dest: Path, one_process: bool = False) -> Path:
    """dest/config.yaml: profiles/slurm with the overrides above; returns dest (a profile folder).
    ``one_process``: every pretraining one process (one_process_pretraining)."""
    text = SITE_PROFILE.read_text()
    if one_process:
        text = one_process_pretraining(text)
    for name, value in SITE_OVERRIDES.items():
        text = set_anchor(text, name, value)
    for key, value in LOCAL_SETTINGS.items():
        text = set_setting(text, key, value)
    for rule in NO_GPU_GRES:
        text = pin_resource(text, rule, "gres", '""')
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "config.yaml").write_text(text)
    return dest


def site() -> dict:
    """profiles/slurm as YAML (anchors resolved): what the sbatch lines are checked against."""
    return yaml.safe_load(SITE_PROFILE.read_text())


def snakemake_command() -> list[str]:
    """Snakemake as the SLURM tests submit with it: status checks at most a few seconds apart
    (tests/snakemake_quick_polls.py says why), and without the lock (conftest.snakemake_cli says why)."""
    return [sys.executable, str(REPO / "tests" / "snakemake_quick_polls.py"), "--nolock"]


def sbatch_wrapper(folder: Path, python: str) -> tuple[Path, Path]:
    """folder/bin/sbatch (put it first on PATH) and the log of its calls, folder/sbatch.jsonl."""
    real = shutil.which("sbatch")
    if real is None:
        raise FileNotFoundError("sbatch is not on PATH")
    bin_dir, log = folder / "bin", folder / "sbatch.jsonl"
    bin_dir.mkdir(parents=True, exist_ok=True)
    wrapper = bin_dir / "sbatch"
    wrapper.write_text(SBATCH_WRAPPER.format(python=python, log=log, sbatch=real))
    wrapper.chmod(0o755)
    return bin_dir, log


def sbatch_calls(log: Path) -> list[dict]:
    """Every sbatch call, in order: {"t": its time (s since the epoch), "argv": its arguments}."""
    if not log.is_file():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


if __name__ == "__main__":  # python tests/site_profile.py <folder>: the profile, for runs by hand
    import sys

    if len(sys.argv) != 2:
        sys.exit("usage: python tests/site_profile.py <folder for the derived profile>")
    print(derive(Path(sys.argv[1])))

"""Run one pretraining as a SLURM job through submitit, and wait for it.

The pretrain rule uses this with ``launch.launcher: submitit`` (it is then a local rule: it
runs where Snakemake runs, e.g. on a login node). The job has ``--nodes`` x
``--tasks-per-node`` ranks, one per GPU; each task runs ``pipeline.pretrain`` in-process with
its rank and world size from SLURM's environment. This process waits for the job, prints
every rank's log and exits non-zero if the job failed, so the Snakemake job fails too.

Time limit: SLURM sends SIGUSR2 ``--signal-delay-s`` before it. The trainer saves its resume
state (in ``--state``, outside the outputs) at the next step all ranks agree on, then
submitit's handler calls ``checkpoint()``, which resubmits the same call, and requeues the
job; the requeued job resumes from the state. After ``--max-requeues`` time-limit requeues
the launcher gives up.

    python -m pipeline.launch --nodes 2 --tasks-per-node 4 --gpus-per-node 4 \\
        --cpus-per-task 8 --timeout-min 1440 --partition gpu --folder results/logs/submitit/base \\
        -- --config cfg.json --data results/data/ffcv --out results/cells/base/pretrain \\
           --state results/state/base

Everything after ``--`` is passed to ``python -m pipeline.pretrain`` (see its --help).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import signal
import subprocess
import time
from pathlib import Path

from pipeline.dag.sections import Launch
from pipeline.runtime.stage_log import stage_log

FINAL_STATES = {"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "TIMEOUT"}
RANK_WAIT_S = 120  # a rank other than 0 that stopped for a requeue waits this long to be killed


log = stage_log("launch")


# --- helpers of workflow/rules/pretrain.smk ---------------------------------------------------
def srun_prefix(resources, launcher: str = "direct") -> str:
    """``srun <geometry> `` when a SLURM profile made the pretrain job multi-node (resources
    ``mpi``, ``nodes``, ``tasks_per_node`` or ``tasks``, ``cpus_per_task``, ``gres``), else "".

    Snakemake's job step strips SLURM_* from the rule's environment, so srun gets its geometry
    explicitly. ``tasks`` (all ranks) is the alternative to ``tasks_per_node`` for one rank per
    node, which the SLURM plugin refuses for mpi jobs. ``--wait=60``: when one rank dies, the
    others are stopped a minute later instead of hanging in a collective."""
    if launcher != "direct" or not resources.get("mpi"):
        return ""
    srun = [str(resources.get("mpi")), f"--nodes={resources.get('nodes') or 1}"]
    if resources.get("tasks_per_node"):
        srun.append(f"--ntasks-per-node={resources.get('tasks_per_node')}")
    elif resources.get("tasks"):
        srun.append(f"--ntasks={resources.get('tasks')}")
    if (resources.get("cpus_per_task") or 0) > 0:
        srun.append(f"--cpus-per-task={resources.get('cpus_per_task')}")
    if resources.get("gres"):
        srun.append(f"--gres={resources.get('gres')}")
    srun.append("--wait=60")
    return shlex.join(srun) + " "


def module_args(launch: Launch, folder: str) -> str:
    """What the rule runs with ``python -m``: the trainer, or this launcher with the options
    of the config's ``launch.slurm`` section, followed by ``--`` (the trainer's arguments)."""
    if launch.launcher != "submitit":
        return "pipeline.pretrain"
    args = ["pipeline.launch"]
    for key, value in dataclasses.asdict(launch.slurm).items():
        if value is not None:  # None: SLURM's own default (memory, partition, account)
            args += [f"--{key.replace('_', '-')}", str(value)]
    return shlex.join([*args, "--folder", folder, "--"])


# --- the job ----------------------------------------------------------------------------------
class Pretraining:
    """One rank of the run (a submitit task): ``python -m pipeline.pretrain ARGV`` in-process.

    Checkpointable: on SLURM's time-limit signal, ``checkpoint()`` resubmits the same call; the
    resumed run reads its state from ``--state``, which the trainer wrote before stopping.
    """

    def __init__(self, argv: list[str]):
        self.argv = list(argv)

    def __call__(self) -> str:
        import submitit
        from submitit.helpers import TorchDistributedEnvironment

        from pipeline import pretrain
        from pipeline.runtime import preempt

        env = submitit.JobEnvironment()
        if env.num_tasks > 1:  # RANK, WORLD_SIZE, MASTER_ADDR/PORT for torch.distributed
            TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
        # The trainer takes over SIGUSR1/2 and SIGTERM: on one it saves its state at a step all
        # ranks agree on and exits 75; on SIGUSR1/2, submitit's handler (kept here) then
        # checkpoints and requeues.
        os.environ["MOCO_REQUEUE"] = "0"
        usr_sig = env._usr_sig()
        submitit_handler = signal.getsignal(usr_sig)
        try:
            pretrain.main([*self.argv, "--no-progress"])
        except SystemExit as stop:
            if stop.code in (None, 0):
                return repr(env)
            if stop.code != preempt.EXIT_REQUEUE:
                raise RuntimeError(str(stop.code)) from None  # recorded by submitit, shown by the launcher
            # state saved; requeue on SLURM's warning signals only: SIGTERM is also `scancel`
            warned = set(preempt.received()) & {signal.SIGUSR1, signal.SIGUSR2}
            if warned and env.global_rank == 0 and callable(submitit_handler):
                submitit_handler(usr_sig, None)  # checkpoint(), requeue, exit
            if warned:
                time.sleep(RANK_WAIT_S)  # the requeue ends this task
            raise
        return repr(env)

    def checkpoint(self, *args, **kwargs):
        """Resubmit the same call: the trainer resumes from its own state (``--state``)."""
        from submitit.helpers import DelayedSubmission

        log("checkpoint: resubmitting; the run resumes from its state folder")
        return DelayedSubmission(self, *args, **kwargs)


def slurm_state(job_id: str) -> str | None:
    """The job's state from squeue (None once SLURM forgot it, after MinJobAge)."""
    try:
        out = subprocess.run(
            ["squeue", "-h", "-j", job_id, "--states=all", "-o", "%T"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return "UNKNOWN"
    if out.returncode != 0:
        return None if "Invalid job id" in out.stderr else "UNKNOWN"
    return out.stdout.strip().split("\n")[0] or None


def wait(job, on_slurm: bool, poll_s: float = 5, grace_s: float = 60) -> None:
    """Until the job's tasks have written their results, or the job ended without them.

    submitit's own wait relies on sacct: on a cluster without accounting it never learns
    that a job was killed or cancelled and waits for ever, hence squeue here."""
    ended_at = None
    while not job.done():
        if on_slurm:
            state = slurm_state(job.job_id)
            if state is None or state in FINAL_STATES:
                ended_at = ended_at or time.time()
                if time.time() - ended_at > grace_s:  # results are written before the job ends
                    log(f"job {job.job_id} ended ({state or 'purged'}) without results from every task")
                    return
            else:
                ended_at = None
        time.sleep(poll_s)


def print_logs(folder: Path, job_id: str) -> None:
    for path in sorted(folder.glob(f"{job_id}_*_log.out")) + sorted(folder.glob(f"{job_id}_*_log.err")):
        print(f"===== {path} =====", flush=True)
        print(path.read_text(errors="replace"), flush=True)


def check_pretrain_args(argv: list[str]) -> None:
    """Fail here, before anything is queued, on a bad config or a missing dataset."""
    from pipeline.dag.config import ConfigError, load_stage_config, section
    from pipeline.data.loaders import is_converted
    from pipeline.pretrain import SECTIONS, build_parser

    args = build_parser().parse_args(argv)  # the stage's own parser: a wrong flag fails here, not in the job
    try:
        cfg = load_stage_config(args.config, SECTIONS)
    except (ConfigError, ValueError) as err:
        raise SystemExit(f"[launch] error: {err}") from None
    loader = section("data", cfg["data"]).loader
    if not is_converted(Path(args.data) / "train.beton", loader):  # torchvision reads only the report
        raise SystemExit(f"[launch] error: {args.data} holds no converted train split for data.loader: {loader}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m pipeline.launch", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--tasks-per-node", type=int, default=1, help="ranks per node: one per GPU")
    ap.add_argument("--gpus-per-node", type=int, default=0)
    ap.add_argument("--cpus-per-task", type=int, default=2)
    ap.add_argument("--mem-gb", type=float, help="memory per node (default: the partition's)")
    ap.add_argument("--timeout-min", type=int, default=60, help="time limit of one run (requeued after it)")
    ap.add_argument("--partition", help="default: the cluster's default partition")
    ap.add_argument("--account")
    ap.add_argument(
        "--signal-delay-s",
        type=int,
        default=120,
        help="SIGUSR2 this long before the time limit: save, checkpoint, requeue",
    )
    ap.add_argument("--max-requeues", type=int, default=3, help="time-limit requeues before giving up")
    ap.add_argument("--folder", required=True, help="submitit's folder: job scripts, pickles, per-rank logs")
    ap.add_argument("--cluster", choices=["slurm", "local"], help="default: slurm when sbatch exists, else local")
    ap.add_argument("pretrain_args", nargs=argparse.REMAINDER, help="-- then the arguments of pipeline.pretrain")
    args = ap.parse_args(argv)
    pretrain_args = args.pretrain_args[1:] if args.pretrain_args[:1] == ["--"] else args.pretrain_args
    check_pretrain_args(pretrain_args)

    import submitit

    folder = Path(args.folder)
    executor = submitit.AutoExecutor(folder=folder, cluster=args.cluster, slurm_max_num_timeout=args.max_requeues)
    params = dict(
        name="moco-pretrain",
        nodes=args.nodes,
        tasks_per_node=args.tasks_per_node,
        cpus_per_task=args.cpus_per_task,
        timeout_min=args.timeout_min,
        slurm_signal_delay_s=args.signal_delay_s,
        slurm_stderr_to_stdout=True,
    )
    optional = dict(
        gpus_per_node=args.gpus_per_node or None,
        mem_gb=args.mem_gb,
        slurm_partition=args.partition,
        slurm_account=args.account,
    )
    executor.update_parameters(**params, **{k: v for k, v in optional.items() if v is not None})
    job = executor.submit(Pretraining(pretrain_args))
    on_slurm = executor.cluster == "slurm"
    log(
        f"submitted {executor.cluster} job {job.job_id}: {args.nodes} node(s) x {args.tasks_per_node} task(s); "
        f"logs {folder}/{job.job_id}_<task>_log.out"
    )

    def cancel(signum, frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, cancel)  # Snakemake stops its jobs with SIGTERM
    try:
        wait(job, on_slurm)
        results = job.results()
    except KeyboardInterrupt as why:
        log(f"interrupted ({why}): cancelling job {job.job_id}")
        job.cancel(check=False)
        raise SystemExit(130) from None
    except Exception as err:  # the job failed: its ranks' logs say why
        print_logs(folder, job.job_id)
        raise SystemExit(f"[launch] error: job {job.job_id} failed: {err}") from None
    print_logs(folder, job.job_id)
    log(f"job {job.job_id} done: {results}")


if __name__ == "__main__":
    # Run as pipeline.launch, not __main__, so that the job pickles Pretraining by reference.
    from pipeline import launch

    launch.main()

# Stage 2: pretraining, one job per ablation cell. The resume state lives in results/state,
# outside the declared outputs, so a killed or requeued job continues where it stopped; it
# carries its run's fingerprint, so a job with another config never resumes it (pipeline.pretrain).
#
# How the ranks start (config launch.launcher):
#   direct    locally one process; under a SLURM profile that sets the `mpi` resource
#             (profiles/slurm), the job's shell runs
#             `srun --nodes=N --ntasks-per-node=G ... python -m pipeline.pretrain` inside the
#             allocation: one rank per GPU, ranks from SLURM's environment.
#   submitit  a local rule: `python -m pipeline.launch` submits one SLURM job through submitit
#             (geometry from launch.slurm), waits for it, and requeues it at its time limit.

from pipeline import launch as pretrain_launch

if CFG.launch.launcher == "submitit":

    localrules:
        pretrain,


rule pretrain:
    input:
        train=converted("train"),
        val=converted("val"),  # kNN monitor
    output:
        checkpoint=cell_file(R, "{cell}", "checkpoint"),
        log_csv=cell_file(R, "{cell}", "log"),
        summary=cell_file(R, "{cell}", "summary"),
        config=cell_file(R, "{cell}", "config"),  # declared: a failed rerun leaves no stale one
    log:
        f"{R}/logs/pretrain/{{cell}}.log",
    benchmark:
        f"{R}/benchmarks/pretrain/{{cell}}.tsv"
    # cells with detection transfer first: their fine-tuning then overlaps the other cells'
    # pretraining instead of running alone at the end
    priority: lambda w: 1 if detects(w.cell) else 0
    conda:
        CONDA_ENV
    threads: lambda w: params_of(w.cell).pretrain.threads
    resources:
        # minutes, scaled with the cell (config grid.resources) and with each retry (a job
        # killed at its time limit resumes with more time)
        runtime=lambda w, attempt: cell_runtime(w) * attempt,
        nodes=cell_nodes,
    params:
        **job_config(lambda w: {"data": config["data"], "pretrain": cell_pretrain(w.cell)}),
        py=PY,
        # the world size is: a run on other ranks is another run (Snakemake compares it; the job
        # does not read it, it finds its ranks in its environment)
        world=cell_world,
        # functions of `resources`: how a cell is launched is not a params change (no rerun)
        srun=lambda w, resources: pretrain_launch.srun_prefix(resources, cell_launch(w.cell).launcher),
        module=lambda w, resources: pretrain_launch.module_args(
            cell_launch(w.cell), f"{R}/logs/pretrain/submitit/{w.cell}"
        ),
        state=lambda w: f"{R}/state/{w.cell}",
        out=lambda w, output: os.path.dirname(output.checkpoint),
        data=lambda w, input: os.path.dirname(input.train[-1]),  # the report's folder
    shell:
        "{params.srun}{params.py} -m {params.module} --config {params.cfg:q} --data {params.data:q}"
        " --out {params.out:q} --state {params.state:q} > {log:q} 2>&1"


# The random-init baseline trains nothing (it saves a freshly initialised encoder): a rule of
# its own, so that profiles size it as the small job it is (see cell_launch for how it starts).
use rule pretrain as pretrain_random_init with:
    wildcard_constraints:
        cell=r"(?:[^/,]+,)*method=random(?:,[^/,]+)*",
    threads: 1
    resources:
        runtime=15,
        nodes=1,


ruleorder: pretrain_random_init > pretrain

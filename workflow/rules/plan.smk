# What the grid will cost, before it is submitted: per cell images x epochs and GPU-hours from
# published throughput figures for pretraining, probe and detection, the wall time at the
# profile's `jobs` limit, and every job whose estimate exceeds its time limit, in its first
# attempt or all of them (pipeline.plan; python -m pipeline.plan runs it by hand). It needs no
# data: the Snakefile checks dataset.root and detect.root only for the jobs that read them.
#
#   snakemake plan --configfile workflow/config/presets/imagenet-mocov2.yaml
#   PLAN_PROFILE=path/to/profile snakemake plan      # another profile than profiles/slurm
#
# A local rule with no output: it runs wherever Snakemake runs, every time it is asked for.


from pipeline.plan import DEFAULT_PROFILE  # (no torch: the DAG is built without it)


localrules:
    plan,


rule plan:
    log:
        f"{R}/logs/plan.log",
    conda:
        CONDA_ENV
    params:
        py=PY,
        cfg=lambda w: json.dumps(config),
        # an environment variable, not a config key; its default is pipeline.plan's
        profile=os.environ.get("PLAN_PROFILE", DEFAULT_PROFILE),
    shell:
        "{params.py} -m pipeline.plan --config-json {params.cfg:q} --profile {params.profile:q} | tee {log:q}"

# What the grid will cost, before it is submitted: per cell images x epochs and GPU-hours from
# published throughput figures, the wall time at the profile's `jobs` limit, and every cell whose
# estimate exceeds its time limit (pipeline.plan; python -m pipeline.plan runs it by hand).
#
#   snakemake plan --configfile workflow/config/presets/imagenet-mocov2.yaml
#   PLAN_PROFILE=path/to/profile snakemake plan      # another profile than profiles/slurm
#
# A local rule with no output: it runs wherever Snakemake runs, every time it is asked for.


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
        # PLAN_PROFILE: another profile than pipeline.plan's default (DEFAULT_PROFILE)
        profile=(f" --profile {shlex.quote(os.environ['PLAN_PROFILE'])}" if "PLAN_PROFILE" in os.environ else ""),
    shell:
        "{params.py} -m pipeline.plan --config-json {params.cfg:q}{params.profile} | tee {log:q}"

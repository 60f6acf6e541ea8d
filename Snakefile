# MoCo pretraining pipeline: dataset -> FFCV -> pretrain (one job per ablation cell)
# -> linear probe / kNN -> detection transfer -> tables.
#
#   snakemake                                   # the whole DAG (profiles/default applies)
#   snakemake cell --config cell=K=1024         # one ablation cell's jobs
#   snakemake tables --forcerun tables          # regenerate tables from existing metrics
#   snakemake --profile profiles/slurm          # on a SLURM cluster
from pipeline.config import validate
from pipeline.grid import expand

configfile: "workflow/config/config.yaml"

validate(config)  # schema + cross-field rules, with the key and the allowed range on error
CELLS = expand(config)

include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/pretrain.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/tables.smk"


rule all:
    default_target: True
    input:
        rules.tables.output,

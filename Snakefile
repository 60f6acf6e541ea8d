# MoCo pretraining pipeline: dataset -> FFCV -> pretrain (one job per ablation cell)
# -> linear probe / kNN -> detection transfer -> tables.
#
#   snakemake                                   # the whole DAG (profiles/default applies)
#   snakemake cell --config cell=K=1024         # one ablation cell's jobs
#   snakemake tables --forcerun tables          # regenerate tables from existing metrics
#   snakemake exports                           # every cell's weights for torchvision/Detectron2/timm
#   snakemake claims                            # the seeds' claims as experiments (tables/claims.*)
#   snakemake plan                              # the grid's GPU-hours and wall time before submitting
#   snakemake --profile slurm                   # on a SLURM cluster
import sys

from pipeline.dag.config import ConfigError, load_config, read_command_line_values
from pipeline.dag.grid import claims_cells, grid_cells  # (not `expand`: that is Snakemake's)
from pipeline.dag.target_jobs import rejoin_cells_in_cluster_jobs


configfile: "workflow/config/config.yaml"


# a cluster job runs the cell it names, "K=128,seed=1" too (Snakemake splits it at the comma)
rejoin_cells_in_cluster_jobs()
read_command_line_values(config)  # --config pretrain='{epochs: 50}': 50, not '50'
# schema + cross-field rules, with the key and the allowed range on error; then typed once:
# the rules read CFG (every default is pipeline.dag.sections'), and `config`, the dicts as given,
# only where they write a job's JSON (its keys as the config states them)
ASKED_EPOCHS = config.get("pretrain", {}).get("epochs")
CFG = load_config(config)  # the folders: when a job needs them (common.smk)
if ASKED_EPOCHS is not None and CFG.pretrain.epochs != ASKED_EPOCHS:  # said at DAG build
    print(
        f"pretrain: {ASKED_EPOCHS} epochs of this training set are fewer than pretrain.min_steps="
        f"{CFG.pretrain.min_steps} steps: the base cell trains {CFG.pretrain.epochs} epochs",
        file=sys.stderr,
    )
CELLS = grid_cells(CFG)
try:  # `snakemake claims` only; a config whose claims cannot run fails that target alone
    CLAIMS_CELLS, CLAIMS_ERROR = claims_cells(CFG), None
except ConfigError as err:
    CLAIMS_CELLS, CLAIMS_ERROR = {}, err


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/pretrain.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/tables.smk"
include: "workflow/rules/export.smk"
include: "workflow/rules/plan.smk"


rule all:
    default_target: True
    input:
        rules.tables.output,

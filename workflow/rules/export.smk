# Weights people can take elsewhere (pipeline.export): each cell's backbone for torchvision /
# Detectron2 (ResNets) or timm (ViTs), with a sidecar JSON. Not part of the default target:
#   snakemake exports          # every cell of the grid
#   snakemake results/cells/base/export/export.json


rule export:
    input:
        checkpoint=cell_file(R, "{cell}", "checkpoint"),
        probe=cell_file(R, "{cell}", "probe"),  # its top-1 goes into the sidecar
    output:
        cell_file(R, "{cell}", "export"),
    log:
        f"{R}/logs/export/{{cell}}.log",
    conda:
        CONDA_ENV
    params:
        py=PY,
    shell:
        "{params.py} -m pipeline.export --checkpoint {input.checkpoint:q} --probe {input.probe:q}"
        " --cell {wildcards.cell:q} --out {output:q} > {log:q} 2>&1"


localrules:
    exports,


rule exports:
    input:
        [cell_file(R, cell, "export") for cell in CELLS],

# Weights people can take elsewhere (pipeline.export): each cell's backbone for torchvision /
# Detectron2 (ResNets) or timm (ViTs), with a sidecar JSON. Not part of the default target:
#   snakemake exports          # every cell of the grid
#   snakemake results/cells/base/export/export.json


rule export:
    input:
        checkpoint=f"{R}/cells/{{cell}}/pretrain/checkpoint.pt",
        probe=f"{R}/cells/{{cell}}/probe.json",  # its top-1 goes into the sidecar
    output:
        f"{R}/cells/{{cell}}/export/export.json",
    params:
        py=PY,
    log:
        f"{R}/logs/export/{{cell}}.log",
    conda:
        CONDA_ENV
    shell:
        "{params.py} -m pipeline.export --checkpoint {input.checkpoint:q} --probe {input.probe:q}"
        " --cell {wildcards.cell:q} --out {output:q} > {log:q} 2>&1"


localrules:
    exports,


rule exports:
    input:
        [f"{R}/cells/{cell}/export/export.json" for cell in CELLS],

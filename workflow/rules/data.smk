# Stage 1: the dataset and its FFCV conversion (once per dataset, shared by every cell).


rule synthetic:
    output:
        directory(f"{R}/data/synthetic"),
    params:
        py=PY,
        cfg=lambda w: json.dumps(config["dataset"]["synthetic"]),
    log:
        f"{R}/logs/synthetic.log",
    benchmark:
        f"{R}/benchmarks/synthetic.tsv"
    conda:
        CONDA_ENV
    shell:
        "{params.py} -m pipeline.synthetic --out {output} --config {params.cfg:q} > {log} 2>&1"


rule convert:
    input:
        lambda w: [f"{R}/data/synthetic"] if config["dataset"]["source"] == "synthetic" else [],
    output:
        beton=f"{R}/data/ffcv/{{split}}.beton",
        report=f"{R}/data/ffcv/{{split}}.json",
    params:
        py=PY,
        root=split_root,
        cfg=lambda w: json.dumps(config["convert"]),
    log:
        f"{R}/logs/convert/{{split}}.log",
    benchmark:
        f"{R}/benchmarks/convert/{{split}}.tsv"
    conda:
        CONDA_ENV
    shell:
        "{params.py} -m pipeline.convert --root {params.root:q} --out {output.beton} --config {params.cfg:q} > {log} 2>&1"

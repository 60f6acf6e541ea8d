# Stage 1: the dataset and its FFCV conversion (once per dataset, shared by every cell).
DS = CFG.dataset


rule synthetic:
    """One part of the embedded dataset (cls: the classification images, det: the detection
    scenes), each from its own keys (SYNTHETIC_PARTS): a changed scene key reruns no pretraining."""
    output:
        directory(f"{R}/data/synthetic/{{part}}"),
    log:
        f"{R}/logs/synthetic/{{part}}.log",
    benchmark:
        f"{R}/benchmarks/synthetic/{{part}}.tsv"
    wildcard_constraints:
        part="|".join(SYNTHETIC_PARTS),
    conda:
        CONDA_ENV
    params:
        py=PY,
        root=lambda w, output: os.path.dirname(output[0]),  # the part writes <root>/<part>
        # typed values: a key set to its default and a key left out are one job
        cfg=lambda w: json.dumps(CFG.dataset.synthetic.part(w.part), sort_keys=True),
    shell:
        "{params.py} -m pipeline.synthetic --out {params.root:q} --part {wildcards.part}"
        " --config {params.cfg:q} > {log} 2>&1"


rule convert:
    """One split -> .beton + JSON report (source, counts, skipped files, resolutions, bytes)."""
    input:
        dataset_folder,
    output:
        # data.loader: torchvision writes only the report (--report-only): no FFCV needed
        **({"beton": f"{CONVERTED}/{{split}}.beton"} if LOADER == "ffcv" else {}),
        report=f"{CONVERTED}/{{split}}.json",
    log:
        f"{R}/logs/convert/{{split}}.log",
    benchmark:
        f"{R}/benchmarks/convert/{{split}}.tsv"
    conda:
        CONDA_ENV
    threads: CFG.convert.workers
    params:
        py=PY,
        # the embedded dataset is an ImageFolder tree
        source=lambda w: "imagefolder" if DS.source == "synthetic" else DS.source,
        root=split_root,
        # STL-10's train split may include its 100k unlabeled images (label -1)
        split=lambda w: (
            "train+unlabeled" if DS.source == "stl10" and w.split == "train" and DS.stl10_unlabeled else w.split
        ),
        # Snakemake compares `key` and `source_state` (the dataset folder's content may change
        # under the same path: the conversion then reruns); the job reads `cfg`, the whole
        # section (a function of threads: not compared, see job_config)
        key=lambda w: json.dumps(result_part("convert", config["convert"]), sort_keys=True),
        source_state=lambda w: None if DS.source == "synthetic" else folder_state(split_root(w)),
        cfg=lambda w, threads: json.dumps(config["convert"], sort_keys=True),
        beton=lambda w, output: os.path.splitext(output.report)[0] + ".beton",
        report_only="" if LOADER == "ffcv" else " --report-only",
    shell:
        "{params.py} -m pipeline.convert --source {params.source} --root {params.root:q} --split {params.split:q}"
        " --out {params.beton:q} --config {params.cfg:q}{params.report_only} > {log:q} 2>&1"

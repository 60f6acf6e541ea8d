# Stage 2: pretraining, one job per ablation cell. The resume state lives in results/state,
# outside the declared outputs, so a killed or requeued job continues where it stopped.


rule pretrain:
    input:
        beton=f"{R}/data/ffcv/train.beton",
        report=f"{R}/data/ffcv/train.json",
    output:
        checkpoint=f"{R}/cells/{{cell}}/pretrain/checkpoint.pt",
        log_csv=f"{R}/cells/{{cell}}/pretrain/log.csv",
        summary=f"{R}/cells/{{cell}}/pretrain/summary.json",
    params:
        py=PY,
        cfg=lambda w: stage_config(data=config["data"], pretrain=params_of(w.cell)),
        state=lambda w: f"{R}/state/{w.cell}",
        out=lambda w, output: os.path.dirname(output.checkpoint),
        data=lambda w, input: os.path.dirname(input.beton),
    threads: lambda w: params_of(w.cell).get("threads", 2)
    log:
        f"{R}/logs/pretrain/{{cell}}.log",
    benchmark:
        f"{R}/benchmarks/pretrain/{{cell}}.tsv"
    conda:
        CONDA_ENV
    shell:
        "{params.py} -m pipeline.pretrain --config {params.cfg:q} --data {params.data:q}"
        " --out {params.out:q} --state {params.state:q} > {log:q} 2>&1"

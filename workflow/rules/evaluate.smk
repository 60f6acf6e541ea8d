# Stages 3 and 4: linear probe (+ kNN) on the frozen encoder, detection transfer.
from pipeline.dag.job_gpus import check_ranks_fit

# GPUs per job from the config: probe.ranks and detect.ranks (torchrun starts them inside the
# job's one task). A profile may pin another gres under set-resources (a CPU cluster: ""); one
# that cannot give a job its ranks' GPUs stops the DAG build here.
PROBE_GRES = f"gpu:{CFG.probe.ranks}"
DETECT_GRES = f"gpu:{CFG.detect.ranks}"
check_ranks_fit("probe", CFG.probe.ranks, "probe.ranks", profile_resources())
if CFG.detect.enabled:
    check_ranks_fit("detect", CFG.detect.ranks, "detect.ranks", profile_resources())


rule probe:
    input:
        checkpoint=cell_file(R, "{cell}", "checkpoint"),
        train=converted("train"),
        val=converted("val"),
    output:
        cell_file(R, "{cell}", "probe"),
    log:
        f"{R}/logs/probe/{{cell}}.log",
    benchmark:
        f"{R}/benchmarks/probe/{{cell}}.tsv"
    # the shortest jobs last (seconds each): they fill the cores while the last fine-tunings run,
    # instead of a fine-tuning running alone at the end
    priority: -1
    conda:
        CONDA_ENV
    threads: CFG.probe.threads
    resources:
        gres=PROBE_GRES,
    params:
        **job_config(lambda w: {"data": config["data"], "probe": cell_probe(w.cell)}),
        py=PY,
        data=lambda w, input: os.path.dirname(input.train[-1]),  # the report's folder
        # the resume state, outside the outputs: a killed or requeued probe continues from it
        # (a function of resources, as the launch params: Snakemake does not compare it)
        state=lambda w, resources: f"{R}/state/{w.cell}/probe",
        launch=lambda w, resources: python_module(CFG.probe.ranks),  # not compared: probe.ranks is in key
    shell:
        "{params.py} {params.launch} pipeline.probe --config {params.cfg:q} --checkpoint {input.checkpoint:q}"
        " --data {params.data:q} --out {output:q} --state {params.state:q} > {log:q} 2>&1"


rule detect:
    """One fine-tuning trial (seed = detect.seed + trial)."""
    input:
        checkpoint=cell_file(R, "{cell}", "checkpoint"),
        data=detection_folder,
    output:
        cell_file(R, "{cell}", "detect_trial"),
    log:
        trial_log(R),
    benchmark:
        f"{R}/benchmarks/detect/{{cell}}/trial{{trial}}.tsv"
    conda:
        CONDA_ENV
    threads: CFG.detect.threads
    resources:
        gres=DETECT_GRES,
    params:
        **detect_params(lambda w: None),
    shell:
        "{params.py} {params.launch} pipeline.detect --config {params.cfg:q} --checkpoint {input.checkpoint:q}"
        " --data {params.root:q} --seed {params.seed} --out {output:q} --state {params.state:q} > {log:q} 2>&1"


use rule detect as detect_protocol with:
    # another protocol of detect.protocols, on the same checkpoint, seeds and scenes
    output:
        cell_file(R, "{cell}", "protocol_trial"),
    log:
        trial_log(R, "{protocol}"),
    benchmark:
        f"{R}/benchmarks/detect-{{protocol}}/{{cell}}/trial{{trial}}.tsv"
    params:
        **detect_params(lambda w: w.protocol),


localrules:
    detect_trials,
    protocol_trials,


rule detect_trials:
    """A cell's detection metrics: the mean and std of its trials (each trial listed too)."""
    input:
        lambda w: [cell_file(R, w.cell, "detect_trial").format(trial=t) for t in range(CFG.detect.trials)],
    output:
        cell_file(R, "{cell}", "detect"),
    log:
        f"{R}/logs/detect/{{cell}}/trials.log",
    conda:
        CONDA_ENV
    params:
        py=PY,
    shell:
        "{params.py} -m pipeline.transfer.summary --out {output:q} {input:q} > {log:q} 2>&1"


use rule detect_trials as protocol_trials with:
    input:
        lambda w: [
            cell_file(R, w.cell, "protocol_trial").format(protocol=w.protocol, trial=t)
            for t in range(CFG.detect.trials)
        ],
    output:
        cell_file(R, "{cell}", "protocol"),
    log:
        f"{R}/logs/detect-{{protocol}}/{{cell}}/trials.log",


rule cell:
    """Only the jobs of one cell: snakemake cell --config cell=K=1024,m=0.9"""
    input:
        lambda w: cell_outputs(CFG.cell or BASE_ID),

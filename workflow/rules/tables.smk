# Stage 5: every metric of every cell -> paper-style tables (Markdown, CSV).


rule tables:
    input:
        [out for cell in CELLS for out in cell_outputs(cell)],
    output:
        main=f"{R}/tables/main.md",
        cells=f"{R}/tables/cells.csv",
    params:
        py=PY,
        results=lambda w, output: os.path.dirname(os.path.dirname(output.main)),
    log:
        f"{R}/logs/tables.log",
    benchmark:
        f"{R}/benchmarks/tables.tsv"
    conda:
        CONDA_ENV
    shell:
        "{params.py} -m pipeline.tables {params.results:q} > {log} 2>&1"

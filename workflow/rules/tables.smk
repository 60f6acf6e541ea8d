# Stage 5: every metric of every cell -> paper-style tables (Markdown, CSV, LaTeX) and figures,
# all marked for the HTML report:  snakemake --report results/report.html


report: "../report/workflow.rst"


rule tables:
    input:
        [out for cell in CELLS for out in cell_outputs(cell)],
    output:
        main=report(
            f"{R}/tables/main.md",
            caption="../report/main.rst",
            category="Tables",
            subcategory="main",
            labels={"study": "main", "format": "Markdown"},
        ),
        cells=f"{R}/tables/cells.csv",
        all=f"{R}/tables/all.md",
        tables=reported_tables(),
        figures=reported_figures(),
        pdfs=[f for f in figure_files(R, CELLS, DRAWN) if f.endswith(".pdf")],
    log:
        f"{R}/logs/tables.log",
    benchmark:
        f"{R}/benchmarks/tables.tsv"
    conda:
        CONDA_ENV
    params:
        **job_config(tables_sections),
        py=PY,
        results=lambda w, output: os.path.dirname(os.path.dirname(output.main)),
    shell:
        "{params.py} -m pipeline.tables {params.results:q} --config {params.cfg:q} > {log:q} 2>&1"


# `snakemake claims`: the cells the seeds' claims need (pipeline.dag.grid.claims_cells, their
# pretraining and probe; no detection) -> tables/claims.* first in the report. Not in the default target.
rule claims:
    input:
        claims_inputs,
    output:
        reported_tables(CLAIMS_TABLES, category="Claims"),
    log:
        f"{R}/logs/claims.log",
    benchmark:
        f"{R}/benchmarks/claims.tsv"
    conda:
        CONDA_ENV
    params:
        **job_config(claims_sections),
        py=PY,
        results=lambda w, output: os.path.dirname(os.path.dirname(output[0])),
    shell:
        "{params.py} -m pipeline.claims {params.results:q} --config {params.cfg:q} > {log:q} 2>&1"

"""What Snakemake builds the DAG from: the config's typed sections and the schema derived from
them, the grid's cells, the results layout, the claims' plan, each job's GPUs. Imports no torch."""

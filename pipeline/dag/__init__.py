"""What Snakemake builds the DAG from: the config's schema and typed sections, the grid's cells,
the results layout, the claims' plan, the method registry, each job's GPUs. Imports no torch."""

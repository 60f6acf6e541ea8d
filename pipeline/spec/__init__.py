"""What to run and where its files go: the config's schema and typed sections, the grid's cells,
the results layout, the claims' plan, the method registry. Imports no torch: the DAG is built
from it."""

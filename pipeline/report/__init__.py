"""Results out: the studies' tables, their statistics, the Markdown/CSV/LaTeX writers and the
figures."""

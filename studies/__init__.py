"""The studies that chose the embedded data's defaults, kept to be rerun: their candidates and
choice rules (``python -m studies.<name>``), outside the product's package. Each study's runs
and reading are a dated page under docs/studies/."""

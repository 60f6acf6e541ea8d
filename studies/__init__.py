"""The studies that chose the embedded data's defaults, kept to be rerun: their candidates and
choice rules (``python -m studies.<name>``), and the held-out real images they were checked on
(``studies.digits``), outside the product's package. Each study's runs and reading are a dated
page under docs/studies/."""

"""python -m pipeline.bench <name> [args]: run one benchmark (``--help`` after the name for
its options); without a name, list them."""

from __future__ import annotations

import sys

from pipeline.bench import available, load


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "list"):
        print(__doc__.strip())
        print("benchmarks: " + ", ".join(available()))
        return
    try:
        module = load(argv[0])
    except ValueError as err:
        raise SystemExit(f"[bench] {err}") from None
    module.main(argv[1:])


if __name__ == "__main__":
    main()

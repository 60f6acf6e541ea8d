"""The README and the pages under docs/: the README stays a short manual and each page a short
one that says first what it answers (what a study measured lives in its dated page under
docs/studies/), every repository path and module they name exists, every results/ path is one the
workflow writes, every relative link between them and the study pages resolves (file and
heading), and no page, config or module sends its reader to an issue number instead of the
reason."""

import glob
import re
from pathlib import Path

import pytest
from conftest import REPO

from pipeline.base.layout import CELL_FILES, CLAIMS_TABLES, STUDY_NAMES

README = REPO / "README.md"
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
IDS = [str(p.relative_to(REPO)) for p in PAGES]
STUDIES = sorted((REPO / "docs" / "studies").glob("*.md"))  # dated: what a run measured or chose
MAX_README_LINES = 200  # what it is, two commands, one demo table, concepts, layout, extending
MAX_PAGE_LINES = 300  # a manual page says what is true now; the runs behind it are study pages
ISSUE = re.compile(r"issue \d", re.I)  # "issue 34": a reader needs the reason, not a tracker's number

# A name is read as a repository path when its first part is one of these (the tracked top level).
ROOTS = {
    ".ci",
    ".gitignore",
    "Makefile",
    "README.md",
    "Snakefile",
    "bench",
    "docs",
    "pipeline",
    "profiles",
    "pyproject.toml",
    "requirements-test.txt",
    "requirements.lock",
    "requirements.txt",
    "studies",
    "tests",
    "workflow",
}
# bench/out/ holds the benchmarks' JSON, one file per benchmark run: written at run time, ignored
# by git, and named by a template (`bench/out/<name>.json`), so there is nothing to look for.
SKIPPED = ("bench/out/",)


def run_outputs() -> set[str]:
    """What a run writes directly under results/ (a clean checkout has none of it, so a results/
    path is checked against this instead): the folders the rules and pipeline.base.layout name,
    the recipe study's default --out folder and the HTML report's file."""
    rules = "\n".join(p.read_text() for p in [REPO / "Snakefile", *(REPO / "workflow" / "rules").glob("*.smk")])
    layout = (REPO / "pipeline" / "base" / "layout.py").read_text()
    recipe = (REPO / "studies" / "recipe.py").read_text()
    found = set(re.findall(r"\{R\}/(\w+)", rules)) | set(re.findall(r"\{results\}/(\w+)", layout))
    found |= set(re.findall(r'"--out", default="results/(\w+)', recipe))
    return found | {"report.html"}  # snakemake --report results/report.html


OUTPUTS = run_outputs()
TABLES = {*STUDY_NAMES, *CLAIMS_TABLES, "main", "all", "cells"}  # the tables stage's files

CODE_SPAN = re.compile(r"`((?:[^`\n]|\n(?!\n))+)`")  # a span may wrap, not cross a paragraph
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
TEMPLATE = re.compile(r"<[^<>]*>|\{[^{},]*\}|\*|…|\.\.\.")  # a placeholder: any name fits
CHOICE = re.compile(r"\{([^{}]*,[^{}]*)\}")  # {train,val}: each of them must exist


def named_paths(text: str) -> list[str]:
    """The repository and results/ paths a page names in code spans and code blocks."""
    spans = CODE_SPAN.findall(FENCE.sub("", text)) + FENCE.findall(text)
    found = []
    for span in spans:
        for token in span.split():
            token = token.strip("()[],;:'\"").split("::")[0].rstrip(".,;:")
            first = token.split("/")[0]
            if (first in ROOTS or first == "results" and "/" in token) and not token.startswith(SKIPPED):
                found.append(token)
    return found


def choices(path: str) -> list[str]:
    """`a/{b,c}.md` as `a/b.md` and `a/c.md`."""
    choice = CHOICE.search(path)
    if not choice:
        return [path]
    return [p for c in choice[1].split(",") for p in choices(path[: choice.start()] + c + path[choice.end() :])]


def exists(path: str) -> bool:
    """A path, or a template (`<cell>`, `…`) that some path fits; `{a,b}`: each of them.
    Under results/: a name the workflow writes there."""
    for one in choices(path):
        if one.startswith("results/"):
            parts = one.split("/")[1:]
            if parts[0] and not TEMPLATE.fullmatch(parts[0]) and parts[0] not in OUTPUTS:
                return False
            if parts[0] == "tables" and len(parts) > 1 and parts[1] and not TEMPLATE.match(parts[1]):
                if parts[1].split(".")[0] not in TABLES:
                    return False
            if parts[0] == "cells" and len(parts) > 2 and parts[2]:
                if not any(f.startswith(parts[2]) for f in [*CELL_FILES.values(), "tensorboard/"]):
                    return False
        elif not TEMPLATE.search(one):
            if not (REPO / one).exists():
                return False
        elif not glob.glob(str(REPO / TEMPLATE.sub("*", one))):
            return False
    return True


def named_modules(text: str) -> list[str]:
    """`python -m pipeline.<stage>` (and `pipeline.bench <name>`) as the file each one runs."""
    files = []
    for module, bench in re.findall(r"python -m (pipeline(?:\.\w+)+)(?: (\w+))?", text):
        path = module.replace(".", "/")
        files.append(f"{path}/__main__.py" if (REPO / path).is_dir() else f"{path}.py")
        if module == "pipeline.bench" and bench:
            files.append(f"pipeline/bench/{bench}.py")
    return files


def anchors(page: Path) -> set[str]:
    """The heading anchors GitHub gives a page: lower case, punctuation dropped, spaces to '-'."""
    headings = re.findall(r"^#{1,6}\s+(.+?)\s*$", FENCE.sub("", page.read_text()), re.M)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists() or anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(target)
    return broken


def test_the_readme_is_a_short_manual():
    text = README.read_text()
    lines = text.splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines, at most {MAX_README_LINES}"
    quick = text[text.index("## Quick start") :]
    quick = quick[: quick.index("\n## ", 1)]
    assert "make demo" in quick and "make test" in quick
    for page in PAGES[1:]:  # the README is the index of the pages
        assert f"(docs/{page.name})" in text, f"README.md does not link docs/{page.name}"


def too_long(page: Path, limit: int) -> str | None:
    lines = len(page.read_text().splitlines())
    return f"{page.relative_to(REPO)} has {lines} lines, at most {limit}" if lines > limit else None


@pytest.mark.parametrize("page", PAGES[1:], ids=IDS[1:])
def test_every_manual_page_is_short(page):
    """A manual page holds what is true now and how to use it; a study's command, CPU, table and
    reading go in its dated page under docs/studies/, which the manual links."""
    assert not too_long(page, MAX_PAGE_LINES)


def issue_numbers(paths) -> list[str]:
    """`file:line` of every "issue <digits>" in these files."""
    found = []
    for path in paths:
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if ISSUE.search(line):
                found.append(f"{path.relative_to(REPO)}:{number}")
    return found


def test_no_page_config_or_module_names_an_issue_instead_of_its_reason():
    """pipeline/, workflow/, the README and the manual say what was measured or why, or link the
    study page that holds it; a dated study page may name the issue it answered."""
    paths = [README, *(REPO / "docs").glob("*.md")]
    for top in ("pipeline", "workflow"):
        paths += [p for p in (REPO / top).rglob("*") if p.is_file() and p.suffix in (".py", ".smk", ".yaml")]
    found = issue_numbers(paths)
    assert not found, f"an issue number instead of the reason or the study: {found}"


@pytest.mark.parametrize("page", PAGES[1:], ids=IDS[1:])
def test_every_page_starts_with_what_it_answers(page):
    assert re.search(r"answers:", page.read_text()[:600], re.I), f"{page.name}: no 'answers:' at its top"


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_every_path_a_page_names_exists(page):
    missing = sorted({p for p in named_paths(page.read_text()) if not exists(p)})
    assert not missing, f"{page.relative_to(REPO)} names paths that do not exist: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=IDS)
def test_every_named_test_and_module_exists(page):
    """`tests/test_x.py::test_y`: the file has that test; `python -m pipeline.x`: the module exists."""
    text = page.read_text()
    missing = sorted({f for f in named_modules(text) if not (REPO / f).exists()})
    for file, name in re.findall(r"(tests/\w+\.py)::(\w+)", text):
        if not re.search(rf"^def {name}\(", (REPO / file).read_text(), re.M):
            missing.append(f"{file}::{name}")
    assert not missing, f"{page.relative_to(REPO)} names what does not exist: {missing}"


@pytest.mark.parametrize("page", PAGES + STUDIES, ids=IDS + [str(p.relative_to(REPO)) for p in STUDIES])
def test_every_relative_link_resolves(page):
    broken = broken_links(page)
    assert not broken, f"{page.relative_to(REPO)} links to what does not exist: {broken}"


def test_every_docs_page_the_code_names_exists():
    """Comments, help texts and config files that send a reader to a page under docs/."""
    missing = []
    for root in ROOTS - {"README.md", "docs"}:
        top = REPO / root
        for path in [top] if top.is_file() else top.rglob("*"):
            if path.is_file() and path.suffix in ("", ".py", ".smk", ".yaml", ".sh", ".toml", ".txt"):
                for name in re.findall(r"docs/[\w./-]*\w", path.read_text(errors="replace")):
                    if not (REPO / name).exists():
                        missing.append(f"{path.relative_to(REPO)}: {name}")
    assert not missing, missing


def test_the_checks_can_fail(tmp_path):
    """Each reader finds what is missing: a path, a template, a choice, a results/ name, a
    module, a link and a heading."""
    text = (
        "`pipeline/nowhere.py` and `python -m x --config workflow/config/presets/<nope>-x.yaml` "
        "`results/README.md` `results/tables/nowhere.md` `bench/out/<name>.json`\n"
        "```\nbench/gpu_check.sh [--dry]\n```\n"
    )
    paths = named_paths(text)
    assert paths == [
        "pipeline/nowhere.py",
        "workflow/config/presets/<nope>-x.yaml",
        "results/README.md",
        "results/tables/nowhere.md",
        "bench/gpu_check.sh",
    ]
    assert [exists(p) for p in paths] == [False, False, False, False, True]
    assert exists("workflow/config/presets/<paper-scale>.yaml") and exists("pipeline/data/{sources,loaders}.py")
    assert not exists("pipeline/data/{sources,nowhere}.py")
    assert exists("results/tables/<study>.{md,csv,tex}") and exists("results/cells/<cell>/probe.json")
    assert not exists("results/cells/<cell>/nowhere.json") and not exists("results/data2/")
    assert named_modules("`python -m pipeline.bench nowhere`, `python -m pipeline.nowhere --help`") == [
        "pipeline/bench/__main__.py",
        "pipeline/bench/nowhere.py",
        "pipeline/nowhere.py",
    ]
    page = tmp_path / "page.md"
    page.write_text("# A heading\n\n[a](#a-heading) [b](#nowhere) [c](nowhere.md) [d](https://example.org)\n")
    assert broken_links(page) == ["#nowhere", "nowhere.md"]


def test_the_length_and_issue_checks_can_fail(tmp_path, monkeypatch):
    """A 301-line page is too long and a 300-line one is not; an issue number is found in any case,
    a word that merely contains "issue" is not."""
    monkeypatch.setattr(f"{__name__}.REPO", tmp_path)
    page = tmp_path / "page.md"
    page.write_text("line\n" * (MAX_PAGE_LINES + 1))
    assert too_long(page, MAX_PAGE_LINES) == f"page.md has {MAX_PAGE_LINES + 1} lines, at most {MAX_PAGE_LINES}"
    page.write_text("line\n" * MAX_PAGE_LINES)
    assert too_long(page, MAX_PAGE_LINES) is None
    page.write_text("chosen then (Issue 34's bar)\nthe issues/10486 thread, no issue-49 anchor\nissue 7\n")
    assert issue_numbers([page]) == ["page.md:1", "page.md:3"]


# --- the README's demo table ----------------------------------------------------------------------
def table_rows(text: str) -> list[dict[str, str]]:
    """The first Markdown table in ``text``: its rows, each by its header's names."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    split = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
    header, rows = split[0], split[2:]  # split[1]: the |---| line
    return [dict(zip(header, row, strict=True)) for row in rows]


def demo_config_digest() -> str:
    """What the demo computes from the config: the result keys of its sections (runtime keys,
    such as threads, left out), hashed."""
    import hashlib
    import json

    from pipeline.dag.config import load_config, load_yaml, result_part, to_dict

    cfg = to_dict(load_config(load_yaml(REPO / "workflow" / "config" / "config.yaml")))
    sections = ("dataset", "convert", "data", "pretrain", "grid", "probe", "detect")
    parts = {name: result_part(name, cfg[name]) for name in sections}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def demo_record() -> Path:
    """The demo run the README's table comes from: the study page its "What you get" links."""
    section = README.read_text().split("## What you get")[1].split("\n## ")[0]
    (link,) = re.findall(r"\((docs/studies/[\w-]+-demo\.md)\)", section)
    return REPO / link


def test_the_readme_demo_table_is_the_recorded_demo_table_column_for_column():
    """Each column the README shows is the main table's column of that name, as `make demo`
    printed it in the recorded run, row for row; and the verdicts under it are that run's."""
    readme = README.read_text().split("## What you get")[1].split("\n## ")[0]
    printed = demo_record().read_text().split("## What it printed")[1]
    shown, main = table_rows(readme), table_rows(printed)
    assert [r["method"] for r in shown] == [r["method"] for r in main]
    for ours, theirs in zip(shown, main, strict=True):
        assert ours == {column: theirs[column] for column in ours}, ours["method"]
    verdicts = readme.split("| reference |")[-1]  # the lines under the table
    for number in re.findall(r"[+−-]\d+\.\d ± \d+\.\d|\[[+−-]\d+\.\d, [+−-]\d+\.\d\]", verdicts):
        assert number.replace("−", "-") in printed, number


def test_the_recorded_demo_ran_on_the_current_config():
    """A change of what the demo computes (a default of config.yaml) fails here until the demo is
    run again and recorded; a change of code alone is the determinism tests' (test_workflow.py)."""
    recorded = re.search(r"\*\*Config digest\*\*.*?`([0-9a-f]{16})`", demo_record().read_text(), re.S)
    assert recorded, f"{demo_record().name} records no config digest"
    assert recorded[1] == demo_config_digest(), (
        f"config.yaml's result keys changed since {demo_record().name}: run `make demo`, record its table "
        f"and the digest {demo_config_digest()} in a new dated page, and update the README's table"
    )

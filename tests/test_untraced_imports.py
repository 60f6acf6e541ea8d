"""tests/untraced_imports.py: coverage's tracer set aside while a library imports, not while
pipeline/ does, in pytest's process and in every process a test starts."""

import builtins
import subprocess
import sys

import pytest
import untraced_imports


@pytest.fixture
def packages(tmp_path, monkeypatch):
    """A measured package `measuredpkg`, two libraries (one importing a measured module), and the
    hook for `measuredpkg` as this process's __import__."""
    (tmp_path / "measuredpkg").mkdir()
    (tmp_path / "measuredpkg" / "__init__.py").write_text("")
    (tmp_path / "measuredpkg" / "core.py").write_text("CORE = 1\n")
    (tmp_path / "somelib.py").write_text("import otherlib\nSOME = 2\n")
    (tmp_path / "otherlib.py").write_text("import measuredpkg.core\nOTHER = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    original = getattr(builtins.__import__, "original", builtins.__import__)
    monkeypatch.setattr(builtins, "__import__", untraced_imports.untraced_import("measuredpkg", original))
    yield tmp_path
    for name in ("measuredpkg", "measuredpkg.core", "somelib", "otherlib"):
        sys.modules.pop(name, None)


def traced_files(statement: str) -> list[str]:
    """The files whose code a trace function saw run while `statement` ran."""
    seen = []

    def tracer(frame, event, arg):
        if event == "call":
            seen.append(frame.f_code.co_filename)
        return None

    outer = sys.gettrace()  # coverage's, under make test
    sys.settrace(tracer)
    try:
        exec(compile(statement, "<test>", "exec"), {})
        after = sys.gettrace()
    finally:
        sys.settrace(outer)
    assert after is tracer, "the tracer is back once the import returns"
    return seen


def test_a_librarys_first_import_runs_untraced_and_the_measured_module_it_reaches_traced(packages):
    seen = traced_files("import somelib\ndef after(): pass\nafter()")
    assert not [f for f in seen if f.endswith(("somelib.py", "otherlib.py"))]
    assert str(packages / "measuredpkg" / "core.py") in seen
    assert "<test>" in seen  # what runs after the import is traced again


def test_a_measured_import_is_traced(packages):
    seen = traced_files("import measuredpkg.core")
    assert str(packages / "measuredpkg" / "core.py") in seen


def test_a_process_a_test_starts_has_the_hook():
    out = subprocess.run(
        [sys.executable, "-c", "import builtins; print(hasattr(builtins.__import__, 'original'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == "True"


def test_the_measured_package_is_coverages_source(repo):
    import tomllib

    source = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["coverage"]["run"]["source"]
    assert source == [untraced_imports.MEASURED]

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


def fresh_python(code: str) -> str:
    """What ``code`` prints in a new interpreter started as the tests start one."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_a_process_a_test_starts_has_the_hook():
    assert fresh_python("import builtins; print(hasattr(builtins.__import__, 'original'))") == "True"


def test_the_measured_package_is_coverages_source(repo):
    import tomllib

    source = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["coverage"]["run"]["source"]
    assert source == [untraced_imports.MEASURED]


def test_coverage_measures_through_the_tracer_the_hook_sets_aside():
    """The hook's premise, checked loudly: coverage traces through sys.settrace (its C tracer,
    Python 3.11's only core). Under a core without it (sys.monitoring) setting the tracer aside
    pauses nothing: the hook would cost a call per import and save nothing, and should go."""
    started = fresh_python("import coverage, sys; coverage.Coverage().start(); print(sys.gettrace() is not None)")
    assert started == "True", "coverage no longer traces through sys.settrace: tests/untraced_imports.py is moot"

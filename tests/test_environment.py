"""The locked environment: requirements.lock covers both requirements files with hashes, and
pipeline.environment reads it (what a run records)."""

import json
import re
import sys

import pytest
from packaging.requirements import Requirement

from pipeline.environment import LOCK, environment, lock_entries, locked_versions, normalize, subset
from pipeline.environment import main as environment_main
from tests.conftest import REPO, run

# sha256 of TINY_LOCK's bytes, by hand: the same text in a file (a shell heredoc), then sha256sum
TINY_LOCK = """\
# a lock of two packages
pyyaml==0.0.1 \\
    --hash=sha256:aaaa
    # via -r requirements.txt
not-a-real-package==1.0 \\
    --hash=sha256:bbbb \\
    --hash=sha256:cccc
"""
TINY_LOCK_SHA256 = "baecdee6c18240b01e834ae64877cdf8d732f07f2d0134b3b7c136ea6c03dbdc"


def requirements(path):
    """The requirements of a requirements file (comments and blank lines dropped)."""
    lines = (line.split("#", 1)[0].strip() for line in (REPO / path).read_text().splitlines())
    return [Requirement(line) for line in lines if line]


def test_lock_pins_every_requirement_within_its_range():
    locked = locked_versions(LOCK.read_text())
    for req in requirements("requirements.txt") + requirements("requirements-test.txt"):
        name = normalize(req.name)
        assert name in locked, f"{req.name} is not in requirements.lock: run make lock"
        assert req.specifier.contains(locked[name], prereleases=True), (
            f"requirements.lock pins {name}=={locked[name]}, outside {req}: run make lock"
        )


def test_every_locked_package_has_a_hash():
    entries = lock_entries(LOCK.read_text())
    assert len(entries) > 100  # transitive dependencies included (torch alone brings ~20)
    unhashed = [name for name, entry in entries.items() if not re.search(r"--hash=sha256:[0-9a-f]{64}", entry)]
    assert unhashed == []


def test_environment_records_the_lock_and_the_installed_versions(tmp_path):
    import yaml

    lock = tmp_path / "requirements.lock"
    lock.write_bytes(TINY_LOCK.encode())
    env = environment(lock)
    assert env["lock_sha256"] == TINY_LOCK_SHA256
    assert env["packages"] == {"not-a-real-package": None, "pyyaml": yaml.__version__}
    assert env["not_as_locked"] == {
        "not-a-real-package": {"locked": "1.0", "installed": None},
        "pyyaml": {"locked": "0.0.1", "installed": yaml.__version__},
    }


def test_subset_is_a_lock_of_its_own(tmp_path):
    text = subset(TINY_LOCK, ["not_a_real_package"])
    assert text == "not-a-real-package==1.0 \\\n    --hash=sha256:bbbb \\\n    --hash=sha256:cccc\n"


def test_this_environment_is_the_lock():
    """The venv the tests run in was installed from the lock (.ci/setup.sh checks the same)."""
    proc = run([sys.executable, "-m", "pipeline.environment", "--check"], check=False)
    assert proc.returncode == 0, proc.stderr


# --- the command line: the lock's subset, the record it prints, --check ----------------------------
def test_environment_cli(tmp_path, capsys):
    lock = tmp_path / "tiny.lock"
    lock.write_text(TINY_LOCK)
    assert environment_main(["--lock", str(lock), "--subset", "PyYAML"]) == 0
    assert capsys.readouterr().out == "pyyaml==0.0.1 \\\n    --hash=sha256:aaaa\n    # via -r requirements.txt\n"
    assert environment_main(["--lock", str(lock)]) == 0
    env = json.loads(capsys.readouterr().out)
    assert env["lock_sha256"] == TINY_LOCK_SHA256 and env["packages"]["not-a-real-package"] is None
    assert environment_main(["--lock", str(lock), "--check"]) == 1  # 0.0.1 is not what is installed
    err = capsys.readouterr().err
    assert "pyyaml: locked 0.0.1, installed " in err and "not-a-real-package: locked 1.0, installed None" in err
    with pytest.raises(SystemExit, match="not in the lock: nope"):
        subset(TINY_LOCK, ["nope"])


def test_a_line_without_an_exact_pin_is_no_entry_of_the_lock():
    # an entry starts only at name==version: the unpinned line (and its hash) belongs to none
    lock = "pyyaml>=6 \\\n    --hash=sha256:aaaa\nfoo==1.0 \\\n    --hash=sha256:bbbb\n"
    assert locked_versions(lock) == {"foo": "1.0"}

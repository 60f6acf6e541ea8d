"""pipeline.environment as a command (the lock's subset, the record it prints, --check) and its
reading of a lock. Beside tests/test_environment.py, which binds the name `environment` to the
function these tests reach as pipeline.environment.environment."""

import json

import pytest

from pipeline import environment
from tests.test_environment import TINY_LOCK, TINY_LOCK_SHA256


def test_environment_cli(tmp_path, capsys):
    lock = tmp_path / "tiny.lock"
    lock.write_text(TINY_LOCK)
    assert environment.main(["--lock", str(lock), "--subset", "PyYAML"]) == 0
    assert capsys.readouterr().out == "pyyaml==0.0.1 \\\n    --hash=sha256:aaaa\n    # via -r requirements.txt\n"
    assert environment.main(["--lock", str(lock)]) == 0
    env = json.loads(capsys.readouterr().out)
    assert env["lock_sha256"] == TINY_LOCK_SHA256 and env["packages"]["not-a-real-package"] is None
    assert environment.main(["--lock", str(lock), "--check"]) == 1  # 0.0.1 is not what is installed
    err = capsys.readouterr().err
    assert "pyyaml: locked 0.0.1, installed " in err and "not-a-real-package: locked 1.0, installed None" in err
    with pytest.raises(SystemExit, match="not in the lock: nope"):
        environment.subset(TINY_LOCK, ["nope"])


def test_a_line_without_an_exact_pin_is_no_entry_of_the_lock():
    # an entry starts only at name==version: the unpinned line (and its hash) belongs to none
    lock = "pyyaml>=6 \\\n    --hash=sha256:aaaa\nfoo==1.0 \\\n    --hash=sha256:bbbb\n"
    assert environment.locked_versions(lock) == {"foo": "1.0"}

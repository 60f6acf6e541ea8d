import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import slurm_cluster
import untraced_imports

REPO = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
# coverage set aside while libraries import, here and in every process the tests start
untraced_imports.install_startup_hook()
untraced_imports.install()
# a MoCo v2 pretrain section for the config checks (tests/test_config.py) and the plan (tests/test_plan.py)
BASE_MOCO = {"method": "moco", "backbone": "resnet18", "epochs": 10, "batch_size": 256, "K": 4096}


def require(condition: bool, why: str) -> None:
    """Skip outside CI when a prerequisite is missing; in CI a missing prerequisite fails."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"prerequisite missing in CI: {why}")
    pytest.skip(why)


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def synthetic_small(tmp_path_factory) -> Path:
    """A small embedded dataset (ImageFolder + COCO detection scenes), generated once."""
    from pipeline.dag.sections import Synthetic
    from pipeline.synthetic import run as generate

    out = tmp_path_factory.mktemp("synthetic")
    small = Synthetic(train_per_class=8, val_per_class=4, det_train_images=6, det_val_images=4, det_image_size=64)
    generate(out, small, progress=False)
    return out


@pytest.fixture(scope="session")
def ffcv_small(synthetic_small, tmp_path_factory) -> Path:
    """train/val .beton of the small dataset."""
    from pipeline.convert import run as convert
    from pipeline.dag.sections import Convert

    out = tmp_path_factory.mktemp("ffcv")
    for split in ("train", "val"):
        convert(
            synthetic_small / "cls" / split,
            out / f"{split}.beton",
            Convert(max_resolution=32, write_mode="raw", workers=1),
        )
    return out


def run(cmd, timeout=600, cwd=REPO, env=None, check=True):
    """Run a command with a hard timeout; on failure show its output."""
    proc = subprocess.run(
        cmd, cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{cmd} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def snakemake_cli() -> list[str]:
    """Snakemake as the tests run it: outside coverage in its own process (tests/snakemake_untraced.py
    says why), and with --nolock, since the test workers run it side by side in the repository and
    snakemake 9 (9.27.1, also upstream's newest) removes the whole .snakemake/locks folder when any
    run ends, so another run starting then fails to write its lock (FileNotFoundError). Each test
    writes to its own results folder: the lock guards nothing here."""
    return [sys.executable, str(REPO / "tests" / "snakemake_untraced.py"), "--nolock"]


def hard_run(cmd, timeout: float, env=None) -> subprocess.CompletedProcess:
    """Run with `timeout -s KILL`: a hang ends as a failure, not as a stuck test run."""
    return subprocess.run(
        ["timeout", "-s", "KILL", str(int(timeout)), *map(str, cmd)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
    )


# --- the local SLURM cluster (tests/slurm_cluster.py), for the tests marked slurm -----------------
@pytest.fixture(scope="session")
def cluster():
    missing = slurm_cluster.missing_prerequisites()
    require(not missing, "the SLURM test cluster needs " + ", ".join(missing))
    c = slurm_cluster.Cluster()
    try:
        c.start()
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as err:
        pytest.fail(f"the SLURM test cluster did not start: {err}")
    yield c
    c.stop()


@pytest.fixture(autouse=True)
def no_leftover_jobs(request):
    """A test that failed or timed out leaves no job behind for the next one."""
    yield
    if "cluster" in request.fixturenames:
        slurm_cluster.cancel_all()


@pytest.fixture(scope="session")
def site_profile_dir(tmp_path_factory) -> Path:
    """profiles/slurm with only what the test cluster cannot match changed (tests/site_profile.py)."""
    import site_profile

    return site_profile.derive(tmp_path_factory.mktemp("site-profile"))


# fixtures that run the workflow or a SLURM cluster: a test using one is an integration test,
# which `make test-quick` leaves out (the full suite, `make test`, runs it)
WORKFLOW_FIXTURES = {"tiny_results", "finished", "done", "fresh_new", "cluster", "site_profile_dir"}


# make test runs the suite on every core (pytest-xdist, -n auto), a file to a worker at a time, so
# that a module's fixtures (a workflow run, the SLURM cluster) are built once. The SLURM files share
# one worker: one cluster, on fixed ports. The files whose tests take longest go first, so that
# their chain starts at once and the other workers fill in beside it (docs/testing.md).
SLURM_FILES = ("test_slurm.py", "test_slurm_grid.py")
LONGEST_FIRST = (*SLURM_FILES, "test_workflow.py", "test_stale_state.py", "test_rerun.py")


@functools.cache  # once: a test's stand-in for cpus.available must not change it
def worker_threads() -> int | None:
    """Under xdist, a worker's share of the CPUs (None outside xdist). torch's default, every CPU,
    in each of -n auto's workers puts two threads on a core: a small op's OpenMP region then waits
    for a thread the other worker holds off the core (a 2 s test took 43 s beside another on 2 cores)."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not workers:
        return None
    from pipeline.runtime.cpus import available

    return max(1, available() // int(workers))


@pytest.fixture(autouse=True)
def torch_threads_of_the_worker():
    """Before each test: a test that sets torch's thread count (a benchmark, a stage run in this
    process) does not leave it to the tests after it."""
    if (threads := worker_threads()) is not None:
        import torch

        torch.set_num_threads(threads)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if WORKFLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


def scope_of(nodeid: str) -> str:
    """The unit of work a worker takes whole: its file, or "slurm" for the SLURM files."""
    path = nodeid.split("::", 1)[0]
    return "slurm" if Path(path).name in SLURM_FILES else path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ByFile(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    config.option.loadscopereorder = False  # the collection's order (longest first), not the test count
    return ByFile(config, log)

"""pipeline.launch: the submitit task and the launcher's waiting, without SLURM: the trainer's exit
codes, a requeued or stopped rank, squeue's answers, a failed or cancelled job."""

import os
import shlex
import signal
import subprocess
from types import SimpleNamespace

import pytest
import submitit

from pipeline import launch
from pipeline.runtime import preempt


class FakeJobEnvironment:
    """What Pretraining reads of submitit.JobEnvironment in a one-task job."""

    num_tasks = 1

    def __init__(self, rank: int = 0):
        self.global_rank = rank

    def _usr_sig(self):
        return signal.SIGUSR2

    def __repr__(self):
        return f"FakeJobEnvironment(rank={self.global_rank})"


def run_pretraining(monkeypatch, exit_code, received=(), rank=0):
    """Pretraining()() with pipeline.pretrain.main exiting with ``exit_code``; returns its
    result (or raised exception) and the sleeps it took."""
    from pipeline import pretrain

    def fake_main(argv):
        assert argv == ["--config", "c.json", "--no-progress"]
        raise SystemExit(exit_code)

    sleeps = []
    monkeypatch.setattr(submitit, "JobEnvironment", lambda: FakeJobEnvironment(rank))
    monkeypatch.setattr(pretrain, "main", fake_main)
    monkeypatch.setattr(preempt, "received", lambda: list(received))
    monkeypatch.setattr(launch, "time", SimpleNamespace(sleep=sleeps.append))
    # the task sets MOCO_REQUEUE=0 for its trainer; undone after the test, so that the SLURM jobs of
    # later tests (which inherit this process's environment) still requeue themselves
    monkeypatch.setenv("MOCO_REQUEUE", "1")
    try:
        result = launch.Pretraining(["--config", "c.json"])(), sleeps
        assert os.environ["MOCO_REQUEUE"] == "0"  # the trainer leaves the requeue to submitit
        return result
    except BaseException as err:  # SystemExit included: what the task ends with
        return err, sleeps


def test_pretraining_task_returns_its_environment_when_the_trainer_exits_0(monkeypatch):
    result, sleeps = run_pretraining(monkeypatch, 0)
    assert result == "FakeJobEnvironment(rank=0)" and sleeps == []


def test_pretraining_task_failure_is_a_runtime_error_with_the_exit_message(monkeypatch):
    result, _ = run_pretraining(monkeypatch, "[pretrain] error: bad config")
    assert isinstance(result, RuntimeError) and str(result) == "[pretrain] error: bad config"


def test_a_rank_stopped_for_a_requeue_waits_to_be_killed(monkeypatch):
    """Rank 1 after SLURM's warning signal: it does not requeue (rank 0 does), it waits
    RANK_WAIT_S for the requeue to end it, then exits with the requeue code."""
    result, sleeps = run_pretraining(monkeypatch, preempt.EXIT_REQUEUE, received=[signal.SIGUSR2], rank=1)
    assert isinstance(result, SystemExit) and result.code == preempt.EXIT_REQUEUE
    assert sleeps == [launch.RANK_WAIT_S]


def test_a_rank_stopped_by_sigterm_exits_at_once(monkeypatch):
    """SIGTERM is also `scancel`: no requeue, no wait."""
    result, sleeps = run_pretraining(monkeypatch, preempt.EXIT_REQUEUE, received=[signal.SIGTERM], rank=1)
    assert isinstance(result, SystemExit) and result.code == preempt.EXIT_REQUEUE
    assert sleeps == []


@pytest.mark.parametrize(
    "outcome, expected",
    [
        (OSError("squeue: not found"), "UNKNOWN"),
        (subprocess.TimeoutExpired("squeue", 60), "UNKNOWN"),
        (subprocess.CompletedProcess([], 1, "", "slurm_load_jobs error: Invalid job id specified"), None),
        (subprocess.CompletedProcess([], 1, "", "slurm_load_jobs error: Unable to contact controller"), "UNKNOWN"),
        (subprocess.CompletedProcess([], 0, "RUNNING\n", ""), "RUNNING"),
    ],
)
def test_slurm_state_from_squeue(monkeypatch, outcome, expected):
    def fake_run(cmd, **kwargs):
        assert cmd[:4] == ["squeue", "-h", "-j", "123"]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    monkeypatch.setattr(launch.subprocess, "run", fake_run)
    assert launch.slurm_state("123") == expected


class NeverDoneJob:
    job_id = "123"

    def done(self):
        return False


@pytest.mark.parametrize("state, shown", [("COMPLETED", "COMPLETED"), (None, "purged")])
def test_wait_gives_up_on_a_job_that_ended_without_results(monkeypatch, capsys, state, shown):
    """grace_s=-1: the first poll that finds the job ended is past the grace period."""
    monkeypatch.setattr(launch, "slurm_state", lambda job_id: state)
    launch.wait(NeverDoneJob(), on_slurm=True, poll_s=0, grace_s=-1)
    assert f"job 123 ended ({shown}) without results from every task" in capsys.readouterr().out


def test_launcher_refuses_an_invalid_config_before_queueing(tmp_path):
    cfg = tmp_path / "cfg.json"
    cfg.write_text('{"pretrain": {}}')
    with pytest.raises(SystemExit, match=r"^\[launch\] error: config section 'data' is missing"):
        launch.check_pretrain_args(["--config", str(cfg), "--data", str(tmp_path), "--out", str(tmp_path / "o")])


class FakeExecutor:
    """submitit.AutoExecutor's surface that main uses; its job is ``FakeExecutor.job``."""

    cluster = "local"
    job = None

    def __init__(self, folder, cluster, slurm_max_num_timeout):
        self.folder = folder

    def update_parameters(self, **params):
        self.params = params

    def submit(self, task):
        assert isinstance(task, launch.Pretraining)
        return FakeExecutor.job


class FailedJob(NeverDoneJob):
    def done(self):
        return True

    def results(self):
        raise RuntimeError("rank 0: [pretrain] error: loss is nan")


class SigtermedJob(NeverDoneJob):
    """Snakemake stops the launcher (SIGTERM) while it waits."""

    cancelled = False

    def done(self):
        os.kill(os.getpid(), signal.SIGTERM)  # the launcher's handler runs before this returns
        return False

    def cancel(self, check=True):
        self.cancelled = True


def run_launcher(monkeypatch, tmp_path, job):
    monkeypatch.setattr(launch, "check_pretrain_args", lambda argv: None)
    monkeypatch.setattr(submitit, "AutoExecutor", FakeExecutor)
    monkeypatch.setattr(FakeExecutor, "job", job)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        launch.main(["--folder", str(tmp_path), "--cluster", "local", "--", "--config", "c.json"])
    finally:
        signal.signal(signal.SIGTERM, previous)


class FinishedJob(NeverDoneJob):
    def done(self):
        return True

    def results(self):
        return ["rank 0 done"]


def test_the_rules_launcher_command_submits_the_config_launch_slurm_section(monkeypatch, tmp_path):
    """The pretrain rule runs ``python -m <module_args>``: parsed by the launcher, its options are
    the config's launch.slurm section; keys left null (account) are left to SLURM."""
    from pipeline.dag.config import section

    slurm = {"nodes": 2, "tasks_per_node": 4, "gpus_per_node": 4, "mem_gb": 64.5, "partition": "gpu"}
    cfg = section("launch", {"launcher": "submitit", "slurm": slurm})
    module, *argv = shlex.split(launch.module_args(cfg, str(tmp_path / "sub mit")))
    assert module == "pipeline.launch" and argv[-3:] == ["--folder", str(tmp_path / "sub mit"), "--"]
    monkeypatch.setattr(launch, "check_pretrain_args", lambda argv: None)
    monkeypatch.setattr(submitit, "AutoExecutor", FakeExecutor)
    monkeypatch.setattr(FakeExecutor, "job", FinishedJob())
    executors = []
    monkeypatch.setattr(FakeExecutor, "update_parameters", lambda self, **params: executors.append(params))
    launch.main([*argv, "--config", "c.json"])
    (params,) = executors
    assert {k: params[k] for k in ("nodes", "tasks_per_node", "gpus_per_node", "mem_gb", "slurm_partition")} == {
        "nodes": 2,
        "tasks_per_node": 4,
        "gpus_per_node": 4,
        "mem_gb": 64.5,
        "slurm_partition": "gpu",
    }
    assert (params["cpus_per_task"], params["timeout_min"], params["slurm_signal_delay_s"]) == (2, 60, 120)
    assert "slurm_account" not in params
    direct = section("launch", {"launcher": "direct"})
    assert launch.module_args(direct, str(tmp_path)) == "pipeline.pretrain"


def test_launcher_shows_the_logs_of_a_failed_job(monkeypatch, tmp_path, capsys):
    (tmp_path / "123_0_log.out").write_text("rank 0 says why\n")
    with pytest.raises(SystemExit, match=r"job 123 failed: rank 0: \[pretrain\] error: loss is nan"):
        run_launcher(monkeypatch, tmp_path, FailedJob())
    assert "rank 0 says why" in capsys.readouterr().out


def test_launcher_cancels_its_job_on_sigterm(monkeypatch, tmp_path, capsys):
    job = SigtermedJob()
    with pytest.raises(SystemExit) as stop:
        run_launcher(monkeypatch, tmp_path, job)
    assert stop.value.code == 130 and job.cancelled
    assert "interrupted (SIGTERM): cancelling job 123" in capsys.readouterr().out

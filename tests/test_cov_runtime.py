"""The error paths and rare branches of the runtime (launcher, trainer, checkpoints, optimisers,
models, MoCo mechanisms), each run on CPU with what it must do asserted."""

import os
import signal
import subprocess
from types import SimpleNamespace

import pytest
import submitit
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from test_distributed import P, _init, free_port
from test_fast_path import BASE

from pipeline import launch
from pipeline.dag.config import section
from pipeline.runtime import checkpoint, preempt

CPU = torch.device("cpu")


# --- pipeline.launch: the submitit job and the launcher's waiting, without SLURM ------------------
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


# --- pipeline.runtime.checkpoint ------------------------------------------------------------------------
def test_load_names_a_file_that_is_no_checkpoint(tmp_path):
    garbage, foreign = tmp_path / "garbage.pt", tmp_path / "foreign.pt"
    garbage.write_bytes(b"not a pickle")
    torch.save({"model": {}}, foreign)  # a torch file without our format tag
    with pytest.raises(checkpoint.CheckpointError, match=rf"cannot read checkpoint {garbage}: "):
        checkpoint.load(garbage)
    with pytest.raises(checkpoint.CheckpointError, match=rf"{foreign} is not a {checkpoint.FORMAT} checkpoint"):
        checkpoint.load(foreign)


def test_a_mid_epoch_state_resumes_only_with_the_same_ranks(tmp_path):
    path = tmp_path / "last.pt"
    checkpoint.save(path, fingerprint={"seed": 1}, world_size=2, step_in_epoch=3)
    env = SimpleNamespace(world_size=1, rank=0, is_main=True)
    with pytest.raises(checkpoint.CheckpointError, match=r"written mid-epoch by 2 ranks.*\(now 1\)"):
        checkpoint.load_resume_state(path, None, None, env, CPU, {"seed": 1})


def test_cuda_rng_streams_resume_on_the_devices_this_process_sees(monkeypatch, capsys):
    """Saved on 1 GPU, resumed where 2 are seen (CUDA's answers monkeypatched): device 0 gets
    its stream back and the log says the resume is not exact; with no GPU, nothing is set."""
    restored = []
    stream = torch.arange(16, dtype=torch.uint8)
    checkpoint.set_cuda_rng_states([stream])  # this machine: no CUDA device seen
    assert "holds the RNG streams of 1 CUDA device(s), this process sees 0" in capsys.readouterr().out
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device: restored.append((state, device)))
    checkpoint.set_cuda_rng_states([stream])
    assert "holds the RNG streams of 1 CUDA device(s), this process sees 2" in capsys.readouterr().out
    assert len(restored) == 1 and restored[0][0] is stream and restored[0][1] == 0


# --- pipeline.runtime.distributed.init: the GPU branches, with CUDA's answers monkeypatched ----------------
def fake_gpus(monkeypatch, count: int, local_rank: int):
    from pipeline.runtime import distributed

    for name in ("RANK", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", str(local_rank))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    return distributed


def test_a_rank_without_its_gpu_is_refused(monkeypatch):
    distributed = fake_gpus(monkeypatch, count=1, local_rank=1)
    with pytest.raises(RuntimeError, match=r"local rank 1 has no GPU: this node's job sees 1 GPU"):
        distributed.init()


def test_each_rank_takes_the_gpu_of_its_local_rank(monkeypatch):
    """The process group as NCCL set it up (already initialised: rank 3 of 4)."""
    distributed = fake_gpus(monkeypatch, count=2, local_rank=1)
    chosen = []
    monkeypatch.setattr(torch.cuda, "set_device", chosen.append)
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(distributed.dist, "get_rank", lambda: 3)
    monkeypatch.setattr(distributed.dist, "get_world_size", lambda: 4)
    env = distributed.init()
    assert chosen == [1] and (env.rank, env.world_size, env.local_rank) == (3, 4, 1)


# --- pipeline.export -----------------------------------------------------------------------------
def test_export_names_a_missing_checkpoint(tmp_path):
    from pipeline import export

    missing = tmp_path / "checkpoint.pt"
    with pytest.raises(SystemExit, match=rf"^\[export\] error: checkpoint not found: {missing}$"):
        export.main(["--checkpoint", str(missing), "--out", str(tmp_path / "export.json")])


# --- pipeline.nets.optim -------------------------------------------------------------------------------
def test_lars_leaves_a_parameter_without_gradient_untouched():
    from pipeline.nets.optim import LARS

    used, unused = torch.nn.Parameter(torch.ones(2, 2)), torch.nn.Parameter(torch.ones(3))
    opt = LARS([used, unused], lr=0.1)
    used.grad = torch.ones(2, 2)
    opt.step()
    assert torch.equal(unused, torch.ones(3)) and unused not in opt.state
    assert not torch.equal(used, torch.ones(2, 2))


def test_unknown_optimizer_is_named():
    from pipeline.nets.optim import build_optimizer

    with pytest.raises(ValueError, match=r"unknown optimizer 'rmsprop' \(sgd, lars, adamw\)"):
        build_optimizer(section("pretrain", {"optimizer": "rmsprop"}), [torch.nn.Parameter(torch.ones(1))])


@pytest.mark.parametrize(
    "schedule, step, expected",
    [  # 100 epochs of 10 steps
        ({"warmup_epochs": 10}, 49, 0.5),  # step 49 of a 100-step linear warmup: (49 + 1) / 100
        ({"schedule": "step"}, 500, 1.0),  # before MoCo's drops at 60% and 80%
        ({"schedule": "step"}, 700, 0.1),
        ({"schedule": "step"}, 900, 0.01),
        ({"schedule": "step", "lr_step_epochs": [30, 60]}, 500, 0.1),  # epoch 50 of 100: one drop
    ],
)
def test_learning_rate_warmup_and_steps(schedule, step, expected):
    from pipeline.nets.optim import pretrain_schedule

    p = section("pretrain", {"lr": 1.0, "epochs": 100, **schedule})
    assert pretrain_schedule(p, steps_per_epoch=10).factor(step) == pytest.approx(expected)


# --- pipeline.nets.models -----------------------------------------------------------------------------
def test_unknown_backbone_and_odd_embedding_are_refused():
    from pipeline.nets.models import ResNetBackbone, sincos_2d

    with pytest.raises(ValueError, match=r"unknown backbone 'resnet7' \(known: resnet18, .*vit_"):
        ResNetBackbone("resnet7")
    with pytest.raises(ValueError, match=r"embedding dim 6 must be a multiple of 4"):
        sincos_2d(2, 6)


# --- the MoCo methods ----------------------------------------------------------------------------
def tiny_model(**changes):
    from pipeline.methods.build import build_model

    torch.manual_seed(0)
    return build_model(section("pretrain", {**P, **changes}), 16, 10, 64)  # test_distributed's MoCo v2, 16 px images


def views(n: int = 4, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 16, 16, generator=g), torch.randn(n, 3, 16, 16, generator=g)


def test_keys_without_sample_index_enter_the_queue_as_unknown():
    model = tiny_model()
    model.queue.source.fill_(7)  # stands for the indices of earlier batches
    model(*views(4), None)
    assert model.queue.source[:4].tolist() == [-1] * 4 and set(model.queue.source[4:].tolist()) == {7}


def test_memory_bank_needs_enough_samples_and_each_index():
    from pipeline.methods.build import bn_guard_text
    from pipeline.methods.moco.mechanisms import MemoryBank

    model = tiny_model(mechanism="memory_bank")
    assert bn_guard_text(model, 1) == "not applicable (no key batch normalised apart from its queries)"
    assert model.diagnostics_state() is None  # nothing beyond the state dict to resume
    with pytest.raises(ValueError, match="the memory bank needs each sample's index"):
        model(*views(4), None)
    with pytest.raises(ValueError, match=r"K=64 negatives need more than K samples \(the training set has 64\)"):
        MemoryBank(model.encoder_q, num_samples=64, K=64)


def test_momentum_update_refuses_encoders_of_different_structure():
    from pipeline.methods.momentum_target import momentum_update

    key, query = torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="key and query encoders differ in structure"):
        momentum_update(key, query, 0.99)


def test_key_encoder_check_needs_two_recorded_steps():
    import math

    from pipeline.methods.ema_check import EmaRecord

    record = EmaRecord(tiny_model())
    steps, error = record.replay_error()
    assert steps == 0 and math.isnan(error)
    record.before_step()
    steps, error = record.replay_error()
    assert steps == 0 and math.isnan(error)


def test_split_batch_norm_refuses_a_batch_it_cannot_split():
    from pipeline.methods.split_bn import SplitBatchNorm2d

    with pytest.raises(ValueError, match="a batch of 3 cannot be split into 2 equal sub-batches"):
        SplitBatchNorm2d(4, splits=2)(torch.randn(3, 4, 2, 2))


def test_split_batch_norm_without_running_statistics_normalises_each_sub_batch():
    from pipeline.methods.split_bn import SplitBatchNorm2d

    x = torch.randn(4, 3, 2, 2, generator=torch.Generator().manual_seed(0)) * 5 + 2
    y = SplitBatchNorm2d(3, splits=2, track_running_stats=False, affine=False)(x)
    reference = torch.nn.BatchNorm2d(3, track_running_stats=False, affine=False)
    for j in (0, 1):  # sub-batch j: images j, j + 2
        torch.testing.assert_close(y[j::2], reference(x[j::2]))


def test_split_batch_norm_cumulative_average_is_batch_norms_per_sub_batch():
    """momentum=None: the running statistics are the plain average over the batches seen, as
    BatchNorm's; the split one holds the mean of its sub-batches' statistics."""
    from pipeline.methods.split_bn import SplitBatchNorm2d

    g = torch.Generator().manual_seed(0)
    batches = [torch.randn(4, 3, 2, 2, generator=g) * (1 + i) + i for i in range(2)]
    split = SplitBatchNorm2d(3, splits=2, momentum=None)
    references = [torch.nn.BatchNorm2d(3, momentum=None) for _ in (0, 1)]
    for x in batches:
        split(x)
        for j, ref in enumerate(references):
            ref(x[j::2])
    torch.testing.assert_close(split.running_mean, (references[0].running_mean + references[1].running_mean) / 2)
    torch.testing.assert_close(split.running_var, (references[0].running_var + references[1].running_var) / 2)
    assert int(split.num_batches_tracked) == 2


def test_parameter_sketch_follows_its_module_to_another_device():
    """The model moves to its training device after the sketch was made: the bins follow.
    "meta" (every torch has it) stands for the GPU; a move to meta makes new Parameter objects
    where a move to a GPU keeps them, so the sketch is pointed at the moved ones."""
    from pipeline.methods.moco.staleness import ParameterSketch

    module = torch.nn.Linear(3, 2)
    sketch = ParameterSketch(module, buckets=8)
    sketch.params = list(module.to("meta").parameters())
    out = sketch()
    assert out.device.type == "meta" and out.shape == (8,)
    assert {b.device.type for b in sketch.bins + sketch.signs} == {"meta"}


# --- across two gloo ranks: gradients through the gather, the bank's shared negatives -------------
def _two_rank_gather_worker(rank, world, port, out):
    from pipeline.methods.gather import gather_with_grad

    _init(rank, world, port)
    x = torch.full((2, 1), rank + 1.0, requires_grad=True)
    gathered = gather_with_grad(x)
    (gathered * torch.arange(4.0)[:, None]).sum().backward()
    bank = tiny_model(mechanism="memory_bank", K=16)  # the same bank on every rank (seed 0)
    torch.manual_seed(10 + rank)  # the draw of negatives, different on each rank unless shared
    x1, _ = views(4)
    _, _, logits = bank(x1, x1, torch.arange(4))
    torch.save({"gathered": gathered.detach(), "grad": x.grad, "logits": logits.detach()}, f"{out}/rank{rank}.pt")
    dist.destroy_process_group()


def test_two_ranks_share_gathered_keys_gradients_and_bank_negatives(tmp_path):
    mp.spawn(_two_rank_gather_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    for r in (r0, r1):
        assert r["gathered"].flatten().tolist() == [1.0, 1.0, 2.0, 2.0]  # rank 0's rows, then rank 1's
    # d(sum_i w_i * gathered_i)/dx on each rank, w = 0, 1, 2, 3: both ranks' sums flow back to
    # the rows they gathered, each rank's own rows: 2 x (0, 1) and 2 x (2, 3)
    assert r0["grad"].flatten().tolist() == [0.0, 2.0] and r1["grad"].flatten().tolist() == [4.0, 6.0]
    # the same queries and bank on both ranks: equal logits only if the negatives are the same
    assert torch.equal(r0["logits"], r1["logits"])


# --- pipeline.pretrain: the Trainer on the small dataset ------------------------------------------
def pretrain_cfg(**changes) -> dict:
    return {"data": {"crop_size": 32, "workers": 1}, "pretrain": {**BASE, **changes}}


def trainer(ffcv_small, tmp_path, **changes):
    from pipeline.pretrain import Job, Trainer
    from pipeline.runtime import distributed

    return Trainer(Job.of(pretrain_cfg(**changes)), ffcv_small, tmp_path / "state", distributed.init(), progress=False)


def test_pretrain_compile_wraps_the_network(ffcv_small, tmp_path):
    """pretrain.compile: the step runs the compiled network. Only the wrapping is checked:
    compiling the first step takes minutes on a CPU (Inductor builds C++), a GPU run's business."""
    t = trainer(ffcv_small, tmp_path, compile=True)
    assert isinstance(t.net, torch._dynamo.eval_frame.OptimizedModule) and t.net._orig_mod is t.model


def test_a_batch_larger_than_the_training_set_is_refused(ffcv_small, tmp_path):
    from pipeline.dag.config import ConfigError

    with pytest.raises(ConfigError, match=r"pretrain.batch_size=128 exceeds the training set \(80 images\)"):
        trainer(ffcv_small, tmp_path, batch_size=128)  # ffcv_small: 10 classes x 8 training images


def test_training_stops_at_the_first_diverged_epoch(ffcv_small, tmp_path, monkeypatch, capsys):
    t = trainer(ffcv_small, tmp_path, epochs=3)
    row = {"epoch": 1, "loss": float("nan"), "inst_acc": 0.0, "lr": 0.03, "seconds": 0.0}
    monkeypatch.setattr(t, "run_epoch", lambda skip: None)  # the epoch's steps are not the point
    monkeypatch.setattr(t, "epoch_row", lambda: dict(row))
    assert t.train() is False
    assert t.epoch == 1 and len(t.log_rows) == 1 and t.state_path.is_file()  # the diverged epoch is kept
    assert "loss diverged at epoch 1: stopping; the cell is reported as failed" in capsys.readouterr().out


def test_knn_monitor_without_labelled_training_images_is_nan(ffcv_small, tmp_path, monkeypatch):
    import math

    from pipeline import pretrain

    t = trainer(ffcv_small, tmp_path)
    unlabelled = (torch.randn(6, 4), torch.full((6,), -1))  # an unlabeled pretraining set: label -1
    monkeypatch.setattr(t, "eval_batches", lambda split: split)
    monkeypatch.setattr(pretrain, "features_of", lambda backbone, batches, device: unlabelled)
    assert math.isnan(t.knn_monitor())


def test_a_collapsed_run_is_reported_as_failed(ffcv_small, tmp_path, monkeypatch, capsys):
    """A run whose loss never diverged but whose last epoch sits at chance (failure() says so):
    the stage warns and its summary carries the failure, which the tables count."""
    from pipeline import pretrain

    monkeypatch.setattr(pretrain, "failure", lambda rows, method: "collapsed: loss 5.545 at chance")
    summary = pretrain.run(pretrain_cfg(), ffcv_small, tmp_path / "out", tmp_path / "state", progress=False)
    assert summary["failure"] == "collapsed: loss 5.545 at chance" and summary["diverged"] is False
    assert "warning: training failed (collapsed: loss 5.545 at chance); the cell is reported as failed" in (
        capsys.readouterr().out
    )


def test_a_key_encoder_that_misses_its_update_is_reported(ffcv_small, tmp_path, monkeypatch, capsys):
    """The key encoder never takes its momentum update: the stage's EMA replay sees it and
    warns, and the summary records the failed check."""
    from pipeline import pretrain
    from pipeline.methods import momentum_target

    monkeypatch.setattr(momentum_target, "momentum_update", lambda key, query, m: None)
    summary = pretrain.run(pretrain_cfg(), ffcv_small, tmp_path / "out", tmp_path / "state", progress=False)
    replay = summary["key_encoder"]["ema_replay"]
    assert summary["key_encoder"]["holds"] is False and replay["max_relative_error"] > replay["tolerance"]
    assert "warning: the key encoder check failed" in capsys.readouterr().out

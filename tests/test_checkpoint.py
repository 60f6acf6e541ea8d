"""pipeline.runtime.checkpoint: a file that is no checkpoint, a mid-epoch state on other ranks and the
CUDA RNG streams are named or restored as the resume needs."""

from types import SimpleNamespace

import pytest
import torch

from pipeline.runtime import checkpoint

CPU = torch.device("cpu")


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


def test_a_field_of_the_resume_state_is_read_only_from_this_runs_state(tmp_path):
    """checkpoint.recorded: the field of a state whose fingerprint is this run's; None for no
    state, another run's, or a file that is no state (load_resume_state then says why)."""
    path = tmp_path / "last.pt"
    assert checkpoint.recorded(path, {"seed": 1}, "fast_path") is None
    torch.save({"fingerprint": {"seed": 1}, "fast_path": True}, path)
    assert checkpoint.recorded(path, {"seed": 1}, "fast_path") is True
    assert checkpoint.recorded(path, {"seed": 2}, "fast_path") is None
    path.write_bytes(b"not a state")
    assert checkpoint.recorded(path, {"seed": 1}, "fast_path") is None

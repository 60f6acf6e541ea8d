"""One checkpoint format for resume, probe and detection transfer, and the pretraining's
resume state (with the epoch's running statistics, EpochStats).

A resume state also carries the fingerprint of its run (everything that determines it,
pipeline.pretrain.run_fingerprint): a run resumes only from a state with its own fingerprint,
and sets any other aside (``last.stale-<hash>.pt``, kept) to start fresh.

A checkpoint is a dict of tensors and plain values only, so it loads with
``torch.load(weights_only=True)``: {"format", "arch", "method", "backbone" (query backbone
state), "model", "optimizer", "epoch", "step", "rng", "log", "config"}. The resume state adds,
per rank, the RNG streams, the epoch's partial sums and the BN statistics, and the method's
diagnostics state.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from pathlib import Path
from typing import NamedTuple, cast

import numpy as np
import torch

from pipeline.runtime import distributed
from pipeline.runtime.io import atomic_torch_save

FORMAT = "moco-pipeline/1"


class CheckpointError(RuntimeError):
    pass


def rng_state() -> dict:
    """This process's RNG streams: torch's CPU generator and every visible CUDA device's (the key
    shuffle and the memory bank's draws run on the GPU; an empty list without CUDA), numpy's,
    Python's."""
    kind, keys, pos, has_gauss, cached = cast(tuple, np.random.get_state())  # the legacy tuple form
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": torch.from_numpy(keys.astype(np.int64)),
        "numpy_pos": int(pos),
        "numpy_gauss": [int(has_gauss), float(cached)],
        "python": random.getstate(),
    }


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    set_cuda_rng_states(state.get("cuda", []))  # none in states written before the CUDA streams were saved
    has_gauss, cached = state["numpy_gauss"]
    np.random.set_state(
        ("MT19937", state["numpy"].numpy().astype(np.uint32), state["numpy_pos"], int(has_gauss), cached)
    )
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))


def set_cuda_rng_states(states: list[torch.Tensor]) -> None:
    """Restore the CUDA generators saved by ``rng_state``, device by device. Resumed where this
    process sees other devices (none, or another count), the streams of the devices it sees are
    restored and the log says that the resume is not exact."""
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if len(states) != visible:
        print(
            f"[checkpoint] warning: the resume state holds the RNG streams of {len(states)} CUDA device(s), "
            f"this process sees {visible}: the resumed run's GPU draws (key shuffle, memory-bank negatives) "
            "differ from the uninterrupted run's",
            flush=True,
        )
    for device, state in enumerate(states[:visible]):
        torch.cuda.set_rng_state(state, device)


class EpochStats:
    """The epoch's loss and the method's metrics (pipeline.nets.method.Step), summed over rows on
    the device (no host sync per step); saved with the state."""

    def __init__(self, device, state: dict | None = None):
        # a new epoch, or a saved one (a state written before methods reported their own metrics
        # holds none: the resumed epoch's metrics then cover its steps after the resume)
        state = {
            "loss": torch.zeros((), dtype=torch.float64),
            "metrics": {},
            "seen": 0,
            "seconds": 0.0,
            "lr": 0.0,
            **(state or {}),
        }
        self.device = device
        self.loss = state["loss"].to(device)
        self.metrics: dict[str, torch.Tensor] = {k: v.to(device) for k, v in state["metrics"].items()}
        self.seen, self.seconds = state["seen"], state["seconds"]
        self.lr = state["lr"]  # of the last step: the epoch's row reports it

    def add(self, loss: torch.Tensor, metrics: dict, rows: int) -> None:
        """One step of ``rows`` samples: its loss and its metrics (means over those rows)."""
        self.loss += loss.detach().double() * rows
        for name, value in metrics.items():
            value = value.detach().double() if torch.is_tensor(value) else torch.tensor(value, dtype=torch.float64)
            if name not in self.metrics:
                self.metrics[name] = torch.zeros((), dtype=torch.float64, device=self.device)
            self.metrics[name] += value.to(self.device) * rows
        self.seen += rows

    def state(self) -> dict:
        return {"loss": self.loss, "metrics": self.metrics, "seen": self.seen, "seconds": self.seconds, "lr": self.lr}


def on_cpu(values: dict) -> dict:
    """A (nested) dict of tensors and plain values with every tensor on the CPU."""
    return {k: on_cpu(v) if isinstance(v, dict) else v.cpu() if torch.is_tensor(v) else v for k, v in values.items()}


class Resumed(NamedTuple):
    epoch: int
    step_in_epoch: int
    log: list
    stats: EpochStats
    rng: dict  # this rank's RNG streams, to set when the interrupted epoch continues


def save_resume_state(path: Path, model, optimizer, stats: EpochStats, env, **fields) -> None:
    """Every rank's RNG streams, partial epoch sums and BN statistics (they differ per rank
    between the epoch-end averages) with the model, optimizer and the method's diagnostics
    state; rank 0 writes."""
    rngs = distributed.gather_objects(rng_state())
    sums = distributed.gather_objects(on_cpu(stats.state()))
    bn = distributed.gather_objects({k: v.cpu() for k, v in distributed.bn_statistics(model).items()})
    if env.is_main:
        save(
            path,
            model=model.state_dict(),
            optimizer=optimizer.state_dict(),
            stats=sums,
            rng=rngs,
            bn=bn,
            world_size=env.world_size,
            diagnostics=model.diagnostics_state(),
            **fields,
        )
    distributed.barrier()


def fingerprint_hash(fingerprint: dict | None) -> str:
    """A short hash of a fingerprint (canonical JSON): it names a state set aside."""
    text = json.dumps(fingerprint, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def flat(fingerprint: dict, prefix: str = "") -> dict:
    """Nested keys as dotted ones: {"pretrain": {"lr": 0.06}} -> {"pretrain.lr": 0.06}."""
    out = {}
    for key, value in fingerprint.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def differences(old: dict | None, new: dict) -> str:
    """What differs between two fingerprints, as 'key old -> new' items (absent: "-")."""
    if old is None:
        return "the state has no fingerprint (written before runs were fingerprinted)"
    old, new = flat(old), flat(new)
    keys = sorted(k for k in old.keys() | new.keys() if old.get(k, "-") != new.get(k, "-"))
    return ", ".join(f"{k} {json.dumps(old.get(k, '-'))} -> {json.dumps(new.get(k, '-'))}" for k in keys)


def set_aside(path: Path, old: dict | None, env) -> Path:
    """Rename another run's state to ``last.stale-<hash of its fingerprint>[.n].pt`` (rank 0,
    the other ranks wait): never resumed from, never deleted."""
    stem = f"{path.stem}.stale-{fingerprint_hash(old)}"
    target = next(
        t for n in range(1, 10**6) if not (t := path.with_name(f"{stem}{'' if n == 1 else f'.{n}'}.pt")).exists()
    )
    distributed.barrier()  # every rank has read the state before it moves
    if env.is_main:
        os.replace(path, target)
    distributed.barrier()
    return target


def matching_state(path: Path, fingerprint: dict, env, log=print) -> dict | None:
    """The resume state at ``path`` if it is this run's (same fingerprint); None when there is
    none, or when it is another run's: then it is set aside and one line says what differed."""
    if not Path(path).is_file():
        return None
    state = load(path)
    if state.get("fingerprint") != fingerprint:
        changed = differences(state.get("fingerprint"), fingerprint)
        target = set_aside(Path(path), state.get("fingerprint"), env)
        log(f"{path} is another run's state ({changed}): set aside as {target.name}; starting fresh")
        return None
    return state


def recorded(path: Path, fingerprint: dict, field: str):
    """What this run's resume state at ``path`` recorded under ``field`` (memory-mapped: the
    weights are not read); None when there is no state, it is another run's or it lacks the field."""
    if not Path(path).is_file():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # unreadable: load_resume_state says why
        return None
    if not isinstance(state, dict) or state.get("fingerprint") != fingerprint:
        return None
    return state.get(field)


def retire(path: Path, env, log=print) -> None:
    """A finished run's state becomes ``finished.pt`` (replacing an earlier one), once its outputs
    exist: a later run, even with the same fingerprint (e.g. after a code fix, --forcerun), never
    resumes from it and trains afresh. Kept, not deleted: it holds the optimizer and RNG state."""
    if env.is_main and path.is_file():
        os.replace(path, path.with_name("finished.pt"))
        log(f"finished: state kept as {path.with_name('finished.pt')}, which no run resumes")
    distributed.barrier()


def file_digest(path: Path) -> str:
    """The content of a file, as a short sha256 (read in 1 MiB blocks: checkpoints are large)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


class StageState:
    """The resume state of a run after pretraining (a probe, a detection trial), in the same
    format: ``<folder>/last.pt`` holds the weights, optimizer and schedule (``fields``), the
    position in the epoch and, per rank, the RNG streams and what else differs between ranks
    (``ranks``). Written at epoch ends, every ``every`` steps and on a preemption signal;
    resumed only by a run with the same fingerprint (world size included); ``finished.pt`` once
    the run's outputs exist. ``folder`` None: nothing saved or resumed."""

    def __init__(self, folder: Path | None, fingerprint: dict, env, log=print, every: int = 0):
        self.path = None if folder is None else Path(folder) / "last.pt"
        self.fingerprint = {**fingerprint, "world_size": env.world_size}
        self.env, self.log, self.every = env, log, every

    def load(self) -> dict | None:
        """This run's state, with this rank's RNG streams restored; ``state["rank"]`` holds this
        rank's own values. None: start fresh."""
        if self.path is None:
            return None
        state = matching_state(self.path, self.fingerprint, self.env, self.log)
        if state is None:
            return None
        state["rank"] = state["ranks"][self.env.rank]
        set_rng_state(state["rank"]["rng"])
        self.log(f"resumed from {self.path} at epoch {state['epoch'] + 1}, step {state['step_in_epoch']}")
        return state

    def due(self, step_in_epoch: int) -> bool:
        return bool(self.every) and step_in_epoch % self.every == 0

    def save(self, epoch: int, step_in_epoch: int, ranks: dict | None = None, **fields) -> None:
        """Rank 0 writes every rank's ``ranks`` and RNG streams with ``fields`` (all ranks call)."""
        if self.path is None:
            return
        mine = {k: v.cpu() if torch.is_tensor(v) else v for k, v in (ranks or {}).items()}
        every_rank = distributed.gather_objects({**mine, "rng": rng_state()})
        if self.env.is_main:
            save(
                self.path,
                fingerprint=self.fingerprint,
                world_size=self.env.world_size,
                epoch=epoch,
                step_in_epoch=step_in_epoch,
                ranks=every_rank,
                **fields,
            )
        distributed.barrier()

    def retire(self) -> None:
        if self.path is not None:
            retire(self.path, self.env, self.log)


def load_resume_state(path: Path, model, optimizer, env, device, fingerprint: dict, log=print) -> Resumed | None:
    """Restore model, optimizer, this rank's BN statistics and the method's diagnostics from
    ``path``; None when there is nothing to resume, or when ``path`` holds another run's state
    (its fingerprint differs): then it is set aside and one line says what differed."""
    state = matching_state(path, fingerprint, env, log)
    if state is None:
        return None
    if state["world_size"] != env.world_size and state["step_in_epoch"]:
        raise CheckpointError(
            f"{path} was written mid-epoch by {state['world_size']} ranks; resume it with the "
            f"same number of ranks (now {env.world_size})"
        )
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    mine = min(env.rank, len(state["rng"]) - 1)
    with torch.no_grad():
        for name, buf in distributed.bn_statistics(model).items():
            buf.copy_(state["bn"][mine][name])
    if state.get("diagnostics"):
        model.load_diagnostics_state(state["diagnostics"])
    return Resumed(
        state["epoch"],
        state["step_in_epoch"],
        list(state["log"]),
        EpochStats(device, state["stats"][mine]),
        state["rng"][mine],
    )


def save(path: str | Path, **fields) -> None:
    atomic_torch_save({"format": FORMAT, **fields}, path)


def load(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise CheckpointError(f"cannot read checkpoint {path}: {err}") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a {FORMAT} checkpoint")
    return ckpt


def load_backbone_state(module: torch.nn.Module, state: dict, source: str) -> None:
    """Load every backbone tensor; a missing, unexpected or misshapen key is an error."""
    own = module.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    shapes = [k for k in set(own) & set(state) if own[k].shape != state[k].shape]
    if missing or unexpected or shapes:
        raise CheckpointError(
            f"{source}: backbone weights do not match the model: missing {missing[:5]}"
            f"{'...' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}"
            f"{'...' if len(unexpected) > 5 else ''}, wrong shape {shapes[:5]}"
        )
    module.load_state_dict(state, strict=True)

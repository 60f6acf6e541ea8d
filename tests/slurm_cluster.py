"""A real two-node SLURM cluster on this one machine, for the SLURM tests.

Debian's slurm-wlm can run several slurmd on one host: ``slurmd -N n1`` and ``slurmd -N n2``
share the host's cores, listen on their own ports and look like two nodes to the scheduler,
so ``srun -N2`` really starts one task "on" each. Everything runs as root without systemd:
munged, slurmctld and the two slurmd are children of the test process, started in the
foreground (``-D``) so that exactly these processes are stopped afterwards.

What it touches outside its work folder (``$TMPDIR/moco-slurm-test``):

- ``/etc/slurm/slurm.conf``: the default path is the only one every SLURM command finds,
  because Snakemake's job step strips ``SLURM_CONF`` from a rule's environment. A file that
  was there before is kept as ``slurm.conf.moco-test-backup`` and put back on ``stop()``.
- ``/etc/hosts``: ``127.0.0.1 n1 n2`` is appended once (and left: harmless), since ranks find
  the rendezvous host (``MASTER_ADDR``) by the first node's name.
- ``/run/munge``: munged's socket, when no munged answers already.

By hand (for experiments; the pytest fixture in tests/test_slurm.py does the same)::

    python tests/slurm_cluster.py start    # prints sinfo
    python tests/slurm_cluster.py stop
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

NODES = ("n1", "n2")
PARTITIONS = ("cpu", "gpu")  # both over n1,n2: the test profile names them like a real site's
CONF = Path("/etc/slurm/slurm.conf")
BACKUP = CONF.with_name("slurm.conf.moco-test-backup")
MARK = "# written by tests/slurm_cluster.py (moco-pipeline test cluster)"
WORKDIR = Path(tempfile.gettempdir()) / "moco-slurm-test"
CTLD_PORT, NODE_PORTS = 16817, (17001, 17002)
MIN_JOB_AGE = 300  # finished jobs stay visible to squeue that long (Snakemake's status command)
DAEMONS = ("slurmctld", "slurmd", "munged")
BINARIES = (
    "munged",
    "munge",
    "unmunge",
    "slurmctld",
    "slurmd",
    "sinfo",
    "squeue",
    "sbatch",
    "srun",
    "scontrol",
    "scancel",
)


def missing_prerequisites() -> list[str]:
    """What is missing to run the cluster here (empty list: it can run)."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root (the daemons run as root)")
    missing += [f"{b} (Debian packages slurm-wlm munge)" for b in BINARIES if shutil.which(b) is None]
    if not Path("/etc/munge/munge.key").is_file():
        missing.append("/etc/munge/munge.key (Debian package munge)")
    return missing


def sh(cmd: list[str], timeout: float = 30, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stdout}{proc.stderr}")
    return proc


def real_memory_mb() -> int:
    """What ``slurmd -C`` reports: a node may not declare more (it would be drained)."""
    out = sh(["slurmd", "-C"]).stdout
    for word in out.split():
        if word.startswith("RealMemory="):
            return int(word.split("=", 1)[1])
    raise RuntimeError(f"no RealMemory in 'slurmd -C': {out}")


def slurm_conf(workdir: Path, host: str, cpus: int, memory_mb: int) -> str:
    nodes = "\n".join(
        f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} CPUs={cpus} "
        f"RealMemory={memory_mb} State=UNKNOWN"
        for name, port in zip(NODES, NODE_PORTS)
    )
    partitions = "\n".join(
        f"PartitionName={p} Nodes={','.join(NODES)} Default={'YES' if i == 0 else 'NO'} MaxTime=INFINITE "
        f"State=UP OverSubscribe=NO"
        for i, p in enumerate(PARTITIONS)
    )
    return f"""{MARK}
# Two slurmd on one host (multiple-slurmd build), no accounting, no cgroups.
ClusterName=mocotest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={CTLD_PORT}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=cred_expire=5  # a requeued job may start again after this (default 120 s)
StateSaveLocation={workdir}/state
SlurmdSpoolDir={workdir}/spool/%n
SlurmctldPidFile={workdir}/slurmctld.pid
SlurmdPidFile={workdir}/slurmd-%n.pid
SlurmctldLogFile={workdir}/slurmctld.log
SlurmdLogFile={workdir}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
MpiDefault=none
ReturnToService=2
JobRequeue=1
MinJobAge={MIN_JOB_AGE}
KillWait=5
InactiveLimit=0
Waittime=0
SlurmdTimeout=300
SlurmctldTimeout=120
MessageTimeout=20
{nodes}
{partitions}
"""


def ensure_hosts() -> None:
    """Node names resolve (the first one is the ranks' MASTER_ADDR)."""
    missing = []
    for name in NODES:
        try:
            socket.gethostbyname(name)
        except OSError:
            missing.append(name)
    if missing:
        with open("/etc/hosts", "a") as hosts:
            hosts.write(f"127.0.0.1 {' '.join(missing)}  # moco-pipeline SLURM test cluster\n")


def munge_works() -> bool:
    try:
        cred = subprocess.run(["munge", "-n"], capture_output=True, timeout=10)
        return (
            cred.returncode == 0
            and subprocess.run(["unmunge"], input=cred.stdout, capture_output=True, timeout=10).returncode == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


def cancel_all(wait: float = 30) -> None:
    """Cancel every job of the test cluster (if it still answers) and wait up to ``wait`` s until
    none is left running: daemons stopped under a running job leave its processes behind."""
    try:
        subprocess.run(["scancel", "--full", "--state=RUNNING"], capture_output=True, timeout=20)
        subprocess.run(["scancel", "--state=PENDING"], capture_output=True, timeout=20)
        deadline = time.time() + wait
        while time.time() < deadline:
            left = subprocess.run(
                ["squeue", "-h", "-t", "RUNNING,COMPLETING", "-o", "%i"], capture_output=True, text=True, timeout=20
            )
            if left.returncode != 0 or not left.stdout.strip():
                return
            time.sleep(0.5)
    except (OSError, subprocess.TimeoutExpired):
        pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def kill_leftovers(workdir: Path = WORKDIR) -> None:
    """Daemons a previous, interrupted test run started: their pids are in our work folder."""
    for pidfile in workdir.glob("*.pid"):
        try:
            pid = int(pidfile.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        if _alive(pid) and any(d in _cmdline(pid) for d in DAEMONS):
            os.kill(pid, signal.SIGTERM)
            deadline = time.time() + 10
            while _alive(pid) and time.time() < deadline:
                time.sleep(0.2)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        pidfile.unlink(missing_ok=True)


class Cluster:
    """munged + slurmctld + slurmd n1, n2; ``start()`` returns once both nodes are idle."""

    def __init__(self, workdir: Path = WORKDIR):
        self.workdir = Path(workdir)
        self.procs: dict[str, subprocess.Popen] = {}

    # --- lifecycle ----------------------------------------------------------------------
    def start(self, timeout: float = 120) -> Cluster:
        kill_leftovers(self.workdir)
        if self.workdir.exists():
            shutil.rmtree(self.workdir)
        for sub in ("state", *(f"spool/{n}" for n in NODES)):
            (self.workdir / sub).mkdir(parents=True)
        ensure_hosts()
        self._start_munge()
        self._write_conf()
        try:
            self._spawn("slurmctld", ["slurmctld", "-D", "-i"])
            for name in NODES:
                self._spawn(f"slurmd-{name}", ["slurmd", "-D", "-N", name])
            self.wait_idle(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop what start() started (by pid), put back a slurm.conf that was there before."""
        cancel_all()
        for name in sorted(self.procs, key=lambda n: n == "munged"):  # munged last
            proc = self.procs[name]
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self.procs.clear()
        if CONF.is_file() and CONF.read_text().startswith(MARK):
            CONF.unlink()
        if BACKUP.is_file():
            BACKUP.rename(CONF)

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- pieces -------------------------------------------------------------------------
    def _spawn(self, name: str, cmd: list[str]) -> None:
        log = open(self.workdir / f"{name}.out", "w")
        self.procs[name] = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
        (self.workdir / f"{name}.pid").write_text(str(self.procs[name].pid))
        log.close()

    def _start_munge(self) -> None:
        if munge_works():
            return
        Path("/run/munge").mkdir(parents=True, exist_ok=True)
        self._spawn(
            "munged",
            [
                "munged",
                "--force",
                "--foreground",
                f"--pid-file={self.workdir}/munged.daemon-pid",
                f"--log-file={self.workdir}/munged.log",
                f"--seed-file={self.workdir}/munged.seed",
            ],
        )
        deadline = time.time() + 20
        while not munge_works():
            if time.time() > deadline or self.procs["munged"].poll() is not None:
                raise RuntimeError(f"munged did not start: {self.tail('munged.out')}{self.tail('munged.log')}")
            time.sleep(0.2)

    def _write_conf(self) -> None:
        CONF.parent.mkdir(parents=True, exist_ok=True)
        if CONF.is_file() and not CONF.read_text().startswith(MARK) and not BACKUP.exists():
            CONF.rename(BACKUP)
        cpus = os.cpu_count() or 1
        CONF.write_text(slurm_conf(self.workdir, socket.gethostname(), cpus, real_memory_mb()))

    def wait_idle(self, timeout: float = 120) -> None:
        deadline = time.time() + timeout
        states = ""
        while time.time() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"{name} exited ({proc.returncode}):\n{self.tail(f'{name}.out')}{self.tail(name + '.log')}"
                    )
            out = subprocess.run(
                ["sinfo", "-h", "-N", "-p", PARTITIONS[0], "-o", "%N %t"], capture_output=True, text=True, timeout=20
            )
            states = out.stdout.strip()
            nodes = dict(line.split() for line in states.splitlines() if len(line.split()) == 2)
            if all(nodes.get(n) == "idle" for n in NODES):
                return
            time.sleep(0.5)
        raise RuntimeError(f"nodes not idle after {timeout:.0f} s: {states!r}\n{self.tail('slurmctld.log')}")

    def tail(self, name: str, lines: int = 30) -> str:
        path = self.workdir / name
        if not path.is_file():
            return ""
        return f"--- {path} ---\n" + "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) + "\n"

    def logs(self) -> str:
        """The daemons' recent log lines (for failure messages)."""
        return "".join(self.tail(n) for n in ("slurmctld.log", *(f"slurmd-{n}.log" for n in NODES)))


def main(argv: list[str]) -> int:
    what = argv[1] if len(argv) > 1 else ""
    if what == "start":
        missing = missing_prerequisites()
        if missing:
            print("missing: " + ", ".join(missing), file=sys.stderr)
            return 1
        cluster = Cluster().start()
        # detach: the daemons outlive this process; `stop` finds them by their pid files
        cluster.procs.clear()
        print(sh(["sinfo"]).stdout)
        return 0
    if what == "stop":
        cancel_all()
        kill_leftovers()
        if CONF.is_file() and CONF.read_text().startswith(MARK):
            CONF.unlink()
        if BACKUP.is_file():
            BACKUP.rename(CONF)
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""A real one-node Slurm cluster for tests: munged, slurmctld and slurmd (Debian's slurm-wlm, installed by
`make slurm`) started as root with every file in a temp directory and ports of its own, so it never touches a
system Slurm. The node is this machine (2 CPUs, no GPUs, no GRES) in a `debug` partition. There is no
accounting (no slurmdbd): finished jobs are read with `scontrol show job`, kept for MinJobAge seconds."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

from worker.trainer.net import free_port

DAEMONS = ("munged", "slurmctld", "slurmd")


def missing() -> str | None:
    """Why a cluster cannot start here, or None."""
    absent = [d for d in (*DAEMONS, "sbatch", "scontrol") if shutil.which(d) is None
              and not Path("/usr/sbin", d).exists()]
    if absent:
        return f"{', '.join(absent)} not installed (`make slurm` installs slurm-wlm and munge)"
    if os.geteuid() != 0:
        return "slurmd must start as root"
    return None


def _daemon(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def write_conf(root: Path, host: str, ctld_port: int, slurmd_port: int, cpus: int = 2) -> Path:
    for d in ("state", "spool", "log", "run"):
        (root / d).mkdir(parents=True, exist_ok=True)
    conf = root / "slurm.conf"
    conf.write_text(f"""\
ClusterName=ulabtest
SlurmctldHost={host}
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
AuthInfo=socket={root / 'run' / 'munge.socket'}
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root / 'state'}
SlurmdSpoolDir={root / 'spool'}
SlurmctldPidFile={root / 'run' / 'slurmctld.pid'}
SlurmdPidFile={root / 'run' / 'slurmd.pid'}
SlurmctldLogFile={root / 'log' / 'slurmctld.log'}
SlurmdLogFile={root / 'log' / 'slurmd.log'}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MinJobAge=600
KillWait=30
SchedulerParameters=sched_interval=1
MessageTimeout=10
SlurmctldTimeout=30
SlurmdTimeout=30
MpiDefault=none
NodeName={host} CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
""")
    return conf


class Cluster:
    def __init__(self, root: Path):
        self.root = root
        self.host = socket.gethostname().split(".")[0]
        self.conf = write_conf(root, self.host, free_port(), free_port())
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.procs: list[subprocess.Popen] = []

    def _start(self, cmd: list[str], name: str) -> None:
        log = (self.root / "log" / f"{name}.out").open("ab")
        self.procs.append(subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True))
        log.close()

    def start(self) -> Cluster:
        run = self.root / "run"
        key = run / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self._start([_daemon("munged"), "-F", "--force", f"--socket={run / 'munge.socket'}", f"--key-file={key}",
                     f"--pid-file={run / 'munged.pid'}", f"--log-file={self.root / 'log' / 'munged.log'}",
                     f"--seed-file={run / 'munged.seed'}"], "munged")
        self._wait(lambda: (run / "munge.socket").exists(), "munged socket")
        self._start([_daemon("slurmctld"), "-D", "-c", "-f", str(self.conf)], "slurmctld")
        self._wait(lambda: self.scontrol("ping").returncode == 0 and "UP" in self.scontrol("ping").stdout,
                   "slurmctld")
        self._start([_daemon("slurmd"), "-D", "-f", str(self.conf)], "slurmd")
        self._wait(lambda: "State=IDLE" in self.scontrol("show", "node", self.host).stdout, "node idle")
        return self

    def scontrol(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["scontrol", *args], env=self.env, capture_output=True, text=True, timeout=30)

    def _wait(self, ok, what: str, timeout_s: float = 60) -> None:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"a Slurm daemon exited ({p.args[0]}): {self.logs()}")
            try:
                if ok():
                    return
            except (OSError, subprocess.SubprocessError):
                pass
            time.sleep(0.3)
        raise TimeoutError(f"{what} not ready in {timeout_s}s: {self.logs()}")

    def logs(self) -> str:
        return "\n".join(f"--- {f.name}\n{f.read_text(errors='replace')[-2000:]}"
                         for f in sorted((self.root / "log").glob("*")) if f.is_file())

    def stop(self) -> None:
        """Cancel what is left, then stop the daemons this cluster started (by their process ids)."""
        subprocess.run(["scancel", "--full", "--user", "root"], env=self.env, capture_output=True, timeout=30)
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


@contextmanager
def slurm_cluster(root: Path):
    cluster = Cluster(root)
    try:
        yield cluster.start()
    finally:
        cluster.stop()

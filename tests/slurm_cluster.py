"""A one-machine Slurm cluster from Debian's packages, for tests: munged, slurmctld and slurmd in
the foreground with a generated configuration, everything (keys, state, spool, logs) in a
temporary directory, stopped at the end.

The configuration suits a container without systemd or a writable cgroup tree: processes tracked by
process group (proctrack/pgid), no task containment (task/none), no accounting; the daemons and the
jobs run as the user who starts them (root in CI). MpiDefault=pmix: OpenMPI under srun takes its
rank from Slurm's PMIx plugin, as on clusters that run OpenMPI.
"""
import getpass
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

DAEMONS = ["munged", "slurmctld", "slurmd"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def missing_programs():
    return [p for p in DAEMONS + ["sbatch", "srun", "sinfo"]
            if not shutil.which(p) and not os.path.exists(os.path.join("/usr/sbin", p))]


def program(name):
    return shutil.which(name) or os.path.join("/usr/sbin", name)


class SlurmCluster:
    """`with SlurmCluster() as cluster:` starts the daemons and waits until the node is idle;
    cluster.env is the environment for sbatch, srun and squeue (SLURM_CONF)."""

    def __init__(self, cpus=2):
        self.cpus = cpus
        self.processes = []

    def __enter__(self):
        self.dir = tempfile.mkdtemp(prefix="tessera_slurm_")
        os.chmod(self.dir, 0o755)  # munged insists that others may reach its socket
        for sub in ("munge", "state", "spool", "log"):
            os.makedirs(os.path.join(self.dir, sub), mode=0o755)
        key = os.path.join(self.dir, "munge", "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        self.socket = os.path.join(self.dir, "munge", "munge.socket")
        self.conf = os.path.join(self.dir, "slurm.conf")
        self.node = "tessera-node"
        self.write_configuration()
        self.env = dict(os.environ, SLURM_CONF=self.conf)
        try:
            self.start("munged", [program("munged"), "--foreground", f"--key-file={key}", f"--socket={self.socket}",
                                  f"--pid-file={self.dir}/munge/munged.pid", f"--log-file={self.dir}/log/munged.log",
                                  f"--seed-file={self.dir}/munge/munged.seed"])
            self.wait_for(lambda: os.path.exists(self.socket), "munged's socket")
            self.start("slurmctld", [program("slurmctld"), "-D", "-c", "-f", self.conf])
            self.start("slurmd", [program("slurmd"), "-D", "-f", self.conf, "-N", self.node])
            self.wait_for(self.node_idle, "the node to be idle")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def write_configuration(self):
        user, host = getpass.getuser(), socket.gethostname().split(".")[0]
        d = self.dir
        with open(self.conf, "w") as f:
            f.write(f"""ClusterName=tessera-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.socket}
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
MpiDefault=pmix
ReturnToService=2
SlurmdParameters=config_overrides
NodeName={self.node} NodeHostname={host} NodeAddr=127.0.0.1 CPUs={self.cpus} State=UNKNOWN
PartitionName=test Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
""")

    def start(self, name, command):
        log = open(os.path.join(self.dir, "log", name + ".out"), "w")
        self.processes.append((name, subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                                      start_new_session=True)))
        log.close()

    def wait_for(self, ready, what, timeout=120):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, process in self.processes:
                if process.poll() is not None:
                    raise RuntimeError(f"{name} exited with {process.returncode} while waiting for {what}:\n"
                                       + self.logs())
            if ready():
                return
            time.sleep(0.5)
        raise TimeoutError(f"no {what} after {timeout} s:\n" + self.logs())

    def node_idle(self):
        result = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], capture_output=True, text=True, env=self.env)
        return result.returncode == 0 and result.stdout.strip() == "idle"

    def logs(self):
        text = ""
        for name in sorted(os.listdir(os.path.join(self.dir, "log"))):
            with open(os.path.join(self.dir, "log", name), errors="replace") as f:
                text += f"== {name}\n" + "".join(f.readlines()[-30:])
        return text

    def __exit__(self, *_):
        subprocess.run(["scancel", "--full", "--quiet", f"--partition=test"], env=self.env, capture_output=True)
        for name, process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
        self.processes = []
        shutil.rmtree(self.dir, ignore_errors=True)

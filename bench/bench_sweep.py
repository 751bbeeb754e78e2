#!/usr/bin/python3
"""Per-trial overhead of `tessera sweep` and of Optuna running each trial in a process.

tessera: every trial is a child `tessera train --dry-run` (process start, Vulkan instance and
device creation, the memory plan, teardown) plus the sweep's own work (checking the flags once,
sampling, SQLite records, reaping); dry-run trials report no final value, so the study records
them as failed, which does not matter here. The sweep's own work is its wall time less the
children's lifetimes, which it records per attempt. The parts are also timed alone: `tessera --version` (process start),
`tessera info` (instance and device enumeration) and `tessera train --dry-run`.
Optuna: a trivial objective in a multiprocessing.Process per trial, the parent waiting for
its value, with the fork and spawn start methods (spawn is what a GPU objective needs), with
in-memory and SQLite storage.
Shared studies: the same tessera sweep with --study postgresql://... beside SQLite, and Optuna's
RDB storage (SQLAlchemy and psycopg2) on the same server, which the benchmark starts itself
(initdb and pg_ctl in a temporary directory, as nobody when run as root); skipped, saying why,
where the server programs or the Python modules are absent.

Prints one JSON object. Usage: bench/bench_sweep.py [TESSERA] [--trials N]
"""
import argparse
import contextlib
import glob
import json
import multiprocessing
import os
import pwd
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def median_seconds(command, runs):
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@contextlib.contextmanager
def postgres_server():
    """A throwaway PostgreSQL server on a Unix socket; yields its socket directory, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        yield None
        return
    bin_dir = os.path.dirname(found[-1])
    directory = tempfile.mkdtemp(prefix="tpg_")
    as_user = []
    if os.geteuid() == 0:  # initdb refuses root
        nobody = pwd.getpwnam("nobody")
        os.chown(directory, nobody.pw_uid, nobody.pw_gid)
        as_user = ["runuser", "-u", "nobody", "--"]
    data = os.path.join(directory, "data")
    try:
        subprocess.run(as_user + [os.path.join(bin_dir, "initdb"), "-D", data, "-U", "tessera", "--auth=trust",
                                  "--no-sync"], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        subprocess.run(as_user + [os.path.join(bin_dir, "pg_ctl"), "-D", data, "-l", os.path.join(directory, "log"),
                                  "-w", "-o", f"-k {directory} -c listen_addresses= -p 5432", "start"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        yield directory
    finally:
        subprocess.run(as_user + [os.path.join(bin_dir, "pg_ctl"), "-D", data, "-m", "fast", "stop"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(directory, ignore_errors=True)


def create_database(socket_dir, name):
    subprocess.run(["psql", "-h", socket_dir, "-U", "tessera", "-d", "postgres", "-c", f"CREATE DATABASE {name}"],
                   check=True, stdout=subprocess.DEVNULL)
    return name


def tessera_figures(tessera, trials, work, socket_dir):
    data = os.path.join(work, "tiny.h5")
    subprocess.run(["/usr/bin/python3", os.path.join(HERE, "..", "tools", "make_patch_task.py"), "--out", data,
                    "--count", "64", "--size", "16"], check=True, stdout=subprocess.DEVNULL)
    dry_run = [tessera, "train", "--data", data, "--dry-run"]
    figures = {
        "process_start_s": median_seconds([tessera, "--version"], trials),
        "instance_and_enumeration_s": median_seconds([tessera, "info"], trials),
        "train_dry_run_s": median_seconds(dry_run, trials),
    }
    info = json.loads(subprocess.run([tessera, "info", "--json"], check=True, capture_output=True, text=True).stdout)
    figures["device"] = info["devices"][0]["name"] if info["devices"] else None
    stores = [("", lambda parallel: os.path.join(work, f"study{parallel}.sqlite"))]
    if socket_dir:
        stores.append(("postgresql_", lambda parallel: "postgresql:///" + create_database(
            socket_dir, f"tessera{parallel}") + f"?host={socket_dir}&user=tessera"))
    for (store, parallel) in [(s, p) for s in stores for p in (1, 2)]:
        prefix, location = store
        study = location(parallel)
        start = time.perf_counter()
        subprocess.run([tessera, "sweep", "--study", study, "--trials", str(trials), "--parallel", str(parallel),
                        "--param", "lr=loguniform:1e-4:1e-1", "--", "--data", data, "--dry-run"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wall = time.perf_counter() - start
        figures[f"{prefix}sweep_per_trial_s_parallel_{parallel}"] = wall / trials
        if parallel == 1:
            # The sweep times each child from fork to reap; the rest of the wall time is its own.
            exported = json.loads(subprocess.run([tessera, "sweep", "--study", study, "--export", "json"],
                                                 check=True, capture_output=True, text=True).stdout)
            children = sum(a["finished"] - a["started"] for t in exported["trials"] for a in t["attempts"])
            figures[f"{prefix}sweep_child_per_trial_s"] = children / trials
            figures[f"{prefix}sweep_own_work_per_trial_s"] = (wall - children) / trials
    return figures


def trivial_objective(x, results):
    results.put((x - 2.0) ** 2)


def optuna_per_trial(optuna, start_method, storage, trials):
    context = multiprocessing.get_context(start_method)
    study = optuna.create_study(storage=storage, sampler=optuna.samplers.TPESampler(seed=0))

    def objective(trial):
        results = context.Queue()
        child = context.Process(target=trivial_objective, args=(trial.suggest_float("x", -10, 10), results))
        child.start()
        value = results.get()
        child.join()
        return value

    start = time.perf_counter()
    study.optimize(objective, n_trials=trials)
    return (time.perf_counter() - start) / trials


def optuna_figures(trials, work, socket_dir):
    try:
        import optuna
    except ImportError:
        return None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    figures = {"version": optuna.__version__}
    for start_method in ("fork", "spawn"):
        figures[f"per_trial_s_{start_method}_memory"] = optuna_per_trial(optuna, start_method, None, trials)
        storage = "sqlite:///" + os.path.join(work, f"optuna_{start_method}.sqlite")
        figures[f"per_trial_s_{start_method}_sqlite"] = optuna_per_trial(optuna, start_method, storage, trials)
    if not socket_dir:
        figures["postgresql"] = "skipped: no PostgreSQL server programs"
        return figures
    try:
        import psycopg2  # noqa: F401  (SQLAlchemy's PostgreSQL driver)
        import sqlalchemy  # noqa: F401
    except ImportError as missing:
        figures["postgresql"] = f"skipped: {missing}"
        return figures
    for start_method in ("fork", "spawn"):
        name = create_database(socket_dir, f"optuna_{start_method}")
        storage = f"postgresql+psycopg2://tessera@/{name}?host={socket_dir}"
        figures[f"per_trial_s_{start_method}_postgresql"] = optuna_per_trial(optuna, start_method, storage, trials)
    return figures


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tessera", nargs="?", default=os.path.join(HERE, "..", "build", "tools", "tessera"))
    parser.add_argument("--trials", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work, postgres_server() as socket_dir:
        out = {"benchmark": "sweep per-trial overhead", "trials": args.trials,
               "tessera": tessera_figures(os.path.abspath(args.tessera), args.trials, work, socket_dir),
               "optuna_multiprocessing": optuna_figures(args.trials, work, socket_dir)}
    per_trial = out["tessera"]["sweep_per_trial_s_parallel_1"]
    out["target_per_trial_s"] = 0.2
    out["under_target"] = per_trial < 0.2
    # A tessera trial includes creating a Vulkan device, which Optuna's trivial objective does
    # not; the sweep's own work is the like-for-like figure.
    own_work = out["tessera"]["sweep_own_work_per_trial_s"]
    if out["optuna_multiprocessing"]:
        optuna_times = {k: v for k, v in out["optuna_multiprocessing"].items() if k.startswith("per_trial_s")}
        out["tessera_trial_below_optuna"] = {k: per_trial < v for k, v in optuna_times.items()}
        out["tessera_own_work_below_optuna"] = {k: own_work < v for k, v in optuna_times.items()}
        postgres_own_work = out["tessera"].get("postgresql_sweep_own_work_per_trial_s")
        optuna_postgres = out["optuna_multiprocessing"].get("per_trial_s_fork_postgresql")
        if postgres_own_work is not None and optuna_postgres is not None:
            out["tessera_postgresql_own_work_below_optuna_postgresql"] = postgres_own_work < optuna_postgres
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

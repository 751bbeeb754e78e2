"""Runs tessera's test suite from an unpacked GPU bundle (bench/gpu/make-bundle.sh), where ctest's
files, with the build machine's paths, do not apply: every GoogleTest executable of build/tests
and every tests/test_*.py under pytest, all under the Khronos validation layer
(TESSERA_VALIDATION=1), longest first (the build's ctest costs), several at a time, until a deadline.

A test that needs what this machine lacks is skipped with the reason, not failed: a Python module
its file (or a local module it imports) imports at the top, a program it runs by name (mpirun,
PostgreSQL's, Slurm's), or Debian's /usr/bin/python3 with numpy and h5py, which some GoogleTests
run by path (the Python tests run their helper scripts with their own interpreter). A test that
imports a module only where it needs it (tests/data_tools.py's python3-lmdb) runs, and pytest
skips the cases that need it: they are listed with the test (skipped_cases).
The environment names the helpers the Python tests run (TESSERA_DUMP_LOADER,
TESSERA_HEAD_GRADIENTS) and the programs this machine lacks (TESSERA_ABSENT_PROGRAMS), so that a
test that runs one only in some cases (chromium, through test_sweep_report) skips those cases.
Writes one JSON object (every test: status, seconds, reason, the end of its output) and each
test's whole output under --logs.

Run: python3 bench/gpu/run_suite.py --root TREE --out suite.json --logs DIR [--tests REGEX] [--jobs N]
     [--deadline EPOCH]
"""
import argparse
import ast
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time

# Programs a test may run by name; a missing one skips the test.
PROGRAMS = ("mpirun", "srun", "sbatch", "slurmctld", "munged", "sqlite3", "pg_ctl", "initdb", "chromium")
DEBIAN_PYTHON = "/usr/bin/python3"


def local_module(root, name):
    for folder in ("tests", "tools", "bench"):
        path = os.path.join(root, folder, name + ".py")
        if os.path.exists(path):
            return path
    return None


def top_level_imports(path):
    """Modules a file imports outside functions (what importing it needs)."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    names = set()
    for node in tree.body:
        blocks = [node]
        if isinstance(node, (ast.If, ast.Try)):  # `try: import x` at the top counts too
            blocks = [n for n in ast.walk(node) if isinstance(n, (ast.Import, ast.ImportFrom))]
        for block in blocks:
            if isinstance(block, ast.Import):
                names.update(alias.name.split(".")[0] for alias in block.names)
            elif isinstance(block, ast.ImportFrom) and block.module and block.level == 0:
                names.add(block.module.split(".")[0])
    return names


def missing_modules(root, path, seen=None):
    seen = set() if seen is None else seen
    missing = set()
    for name in top_level_imports(path):
        if name in seen:
            continue
        seen.add(name)
        local = local_module(root, name)
        if local:
            missing |= missing_modules(root, local, seen)
        elif importlib.util.find_spec(name) is None:
            missing.add(name)
    return missing


def debian_python_ready():
    if not os.path.exists(DEBIAN_PYTHON):
        return False
    return subprocess.run([DEBIAN_PYTHON, "-c", "import numpy, h5py"], capture_output=True).returncode == 0


def skip_reason(root, test, debian_python):
    """Why `test` cannot run here, or None."""
    text = open(test["source"], encoding="utf-8").read()
    if test["kind"] == "pytest":
        missing = missing_modules(root, test["source"])
        if missing:
            return "Python modules missing here: " + ", ".join(sorted(missing))
    absent = [p for p in PROGRAMS if re.search(r"[\"']" + p + r"[\"']", text) and not shutil.which(p)]
    if absent:
        return "programs missing here: " + ", ".join(absent)
    # The Python tests run their helper scripts with sys.executable (this interpreter); a
    # GoogleTest names Debian's Python by path.
    if test["kind"] == "gtest" and DEBIAN_PYTHON in text and not debian_python:
        return f"runs {DEBIAN_PYTHON} by path, which lacks numpy and h5py here"
    return None


def ctest_costs(root, tests):
    """Seconds per test from the build's last ctest run, where ctest names a GoogleTest case
    Suite.Case: each executable's cases (--gtest_list_tests) summed."""
    per_name = {}
    path = os.path.join(root, "build", "Testing", "Temporary", "CTestCostData.txt")
    if os.path.exists(path):
        for line in open(path):
            parts = line.split()
            if len(parts) == 3:
                per_name[parts[0]] = float(parts[2])
    costs = {}
    for test in tests:
        if test["kind"] == "pytest":
            if test["name"] in per_name:
                costs[test["name"]] = per_name[test["name"]]
            continue
        listing = subprocess.run(test["command"] + ["--gtest_list_tests"], capture_output=True, text=True).stdout
        suites = {line.strip() for line in listing.splitlines() if line.strip().endswith(".") and line[:1] != " "}
        seconds = [cost for name, cost in per_name.items() if name[: name.find(".") + 1] in suites]
        if seconds:
            costs[test["name"]] = sum(seconds)
    return costs


def discover(root, pattern):
    tests = []
    for name in sorted(os.listdir(os.path.join(root, "tests"))):
        stem, extension = os.path.splitext(name)
        if not stem.startswith("test_") or not re.search(pattern, stem):
            continue
        source = os.path.join(root, "tests", name)
        if extension == ".cpp":
            binary = os.path.join(root, "build", "tests", stem)
            if os.path.exists(binary):
                tests.append({"name": stem, "kind": "gtest", "source": source, "command": [binary]})
        elif extension == ".py":
            tests.append({"name": stem, "kind": "pytest", "source": source,
                          "command": [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", source]})
    return tests


def skipped_cases(output):
    """The reasons pytest's -rA summary gives for the cases it skipped ("SKIPPED [2] f.py:10: why"),
    each once: a test that passed may have skipped some cases (a module imported where needed)."""
    reasons = []
    for line in output.splitlines():
        match = re.match(r"SKIPPED \[(\d+)\] [^:]+:\d+: (.*)", line)
        if match and match.group(2) not in reasons:
            reasons.append(match.group(2))
    return reasons


def tail(text, lines=40):
    return "\n".join(text.splitlines()[-lines:])


def run(args):
    root = os.path.abspath(args.root)
    os.makedirs(args.logs, exist_ok=True)
    tests = discover(root, args.tests)
    costs = ctest_costs(root, tests)
    tests.sort(key=lambda t: -costs.get(t["name"], 60.0))
    debian_python = debian_python_ready()
    # The programs this machine lacks, for a test that runs one through a module it imports
    # (test_mil_cross_validation renders through test_sweep_report's chromium): it skips that case.
    env = dict(os.environ, TESSERA_VALIDATION="1", PYTHONDONTWRITEBYTECODE="1",
               TESSERA_BINARY=os.path.join(root, "build", "tools", "tessera"),
               TESSERA_DUMP_LOADER=os.path.join(root, "build", "tests", "dump_loader"),
               TESSERA_HEAD_GRADIENTS=os.path.join(root, "build", "tests", "head_gradients"),
               TESSERA_ABSENT_PROGRAMS=",".join(p for p in PROGRAMS if not shutil.which(p)))
    waiting, running, results = [], {}, []
    for test in tests:
        reason = skip_reason(root, test, debian_python)
        if reason:
            results.append({"name": test["name"], "status": "skipped", "reason": reason, "seconds": 0})
        else:
            waiting.append(test)
    started_at = time.time()
    while waiting or running:
        now = time.time()
        while waiting and len(running) < args.jobs and now + 30 < args.deadline:
            test = waiting.pop(0)
            log = open(os.path.join(args.logs, test["name"] + ".log"), "w+")
            process = subprocess.Popen(test["command"], cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True)
            running[process] = (test, log, now)
            print(f"[{now - started_at:6.0f}s] start {test['name']}", flush=True)
        if not running and waiting:  # the deadline leaves no time to start another
            for test in waiting:
                results.append({"name": test["name"], "status": "not_run", "reason": "out of time", "seconds": 0})
            break
        time.sleep(0.5)
        for process in list(running):
            test, log, start = running[process]
            over = time.time() > min(start + args.timeout, args.deadline)
            if process.poll() is None and not over:
                continue
            if process.poll() is None:
                os.killpg(process.pid, 9)
                process.wait()
            del running[process]
            log.seek(0)
            output = log.read()
            log.close()
            status = "timed_out" if over else "passed" if process.returncode == 0 else "failed"
            seconds = round(time.time() - start, 1)
            result = {"name": test["name"], "status": status, "seconds": seconds, "exit_code": process.returncode,
                      "output_tail": "" if status == "passed" else tail(output)}
            skipped = skipped_cases(output) if test["kind"] == "pytest" else []
            if skipped:
                result["skipped_cases"] = skipped
            results.append(result)
            print(f"[{time.time() - started_at:6.0f}s] {status} {test['name']} ({seconds} s)", flush=True)
    counts = {}
    for result in results:
        counts[result["status"]] = counts.get(result["status"], 0) + 1
    return {"python": sys.executable, "jobs": args.jobs, "seconds": round(time.time() - started_at, 1),
            "counts": counts, "tests": sorted(results, key=lambda r: r["name"])}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", required=True, help="the bundle's source tree (tests/, tools/, build/)")
    parser.add_argument("--out", required=True, help="the JSON report")
    parser.add_argument("--logs", required=True, help="a folder for each test's output")
    parser.add_argument("--tests", default="", help="a regular expression: only the tests whose names it finds")
    parser.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    parser.add_argument("--timeout", type=float, default=900, help="seconds per test")
    parser.add_argument("--deadline", type=float, default=float("inf"), help="epoch seconds: start nothing after")
    args = parser.parse_args()
    report = run(args)
    with open(args.out, "w") as out:
        json.dump(report, out, indent=1)
    print(json.dumps(report["counts"]))
    return 0 if not any(r["status"] in ("failed", "timed_out") for r in report["tests"]) else 1


if __name__ == "__main__":
    sys.exit(main())

"""What people and programs read, with the real binary under a pseudo-terminal (Python's pty) and
without one:
- `train` on a terminal prints one readable line per epoch (loss, accuracy, validation loss,
  accuracy and AUC, images/s, time left) with the numbers of the JSON records a run without a
  terminal prints, and names its checkpoint at the end; no JSON. Without a terminal, and with
  --json on one, JSON lines as before, ending with the checkpoint's record.
- `--dry-run` prints its plan as a table on a terminal and as JSON otherwise, of the same categories.
- A --resume conflict prints the flag as typed and the checkpoint's value as its shortest text.
- A mistyped flag or command names the nearest one (exit 2).
"""
import json
import os
import pty
import re
import shutil
import subprocess

import pytest

from data_tools import workdir

TESSERA = os.environ.get("TESSERA_BINARY", "build/tools/tessera")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, TESSERA_VALIDATION="1")


def on_terminal(args):
    """(exit code, what the terminal showed as lines) of tessera ARGS with stdout and stderr on a pty."""
    master, slave = pty.openpty()
    process = subprocess.Popen([TESSERA, *map(str, args)], stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
                               env=ENV)
    os.close(slave)
    output = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        output += chunk
    os.close(master)
    code = process.wait(timeout=600)
    text = output.decode(errors="replace")
    assert "vulkan validation" not in text.lower(), text
    # What stays on screen: each line's text after its last carriage return or erase.
    lines = [re.split(r"\r|\x1b\[K", line)[-1] for line in text.replace("\r\n", "\n").split("\n")]
    return code, [line for line in lines if line.strip()]


def off_terminal(args, check=True):
    result = subprocess.run([TESSERA, *map(str, args)], capture_output=True, text=True, env=ENV, timeout=600)
    assert "vulkan validation" not in result.stderr.lower(), result.stderr
    if check:
        assert result.returncode == 0, result.stderr
    return result


@pytest.fixture(scope="module")
def task():
    work = workdir("test_terminal_output")
    subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "tools", "make_patch_task.py"), "--out",
                    os.path.join(work, "task.h5"), "--count", "200", "--size", "16", "--seed", "2"],
                   check=True, capture_output=True)
    yield work
    shutil.rmtree(work, ignore_errors=True)


def train_args(work, name, *flags):
    return ["train", "--data", os.path.join(work, "task.h5"), "--model", "small-cnn", "--width", 4, "--epochs", 2,
            "--batch", 16, "--optimizer", "adam", "--lr", 0.01, "--seed", 4, "--val-fraction", 0.3,
            "--checkpoint", os.path.join(work, name), *flags]


def test_train_lines_on_a_terminal_and_json_lines_off_it(task):
    code, screen = on_terminal(train_args(task, "terminal.h5"))
    assert code == 0, screen
    records = [json.loads(line) for line in off_terminal(train_args(task, "pipe.h5")).stderr.splitlines()]
    epochs = [r for r in records if r.get("event") == "epoch"]
    assert [(r["epoch"], r["epochs"]) for r in epochs] == [(1, 2), (2, 2)]
    assert records[-1] == {"task": "train", "event": "checkpoint", "path": os.path.join(task, "pipe.h5"), "epoch": 2}

    assert not any(line.lstrip().startswith("{") for line in screen), screen
    split = next(r for r in records if r.get("event") == "split")
    train, validation = split["train"], split["validation"]
    assert (f"split: training {train['groups']} groups, {train['patches']} patches (per class "
            f"{', '.join(map(str, train['per_class']))}); validation {validation['groups']} groups") in screen[0], screen
    lines = [line for line in screen if line.startswith("epoch ")]
    assert len(lines) == 2, screen
    for line, record in zip(lines, epochs):
        # The same seed gives the same run: the line shows the record's numbers.
        expected = (f"epoch {record['epoch']}/2  loss {record['train_loss']:.4f}  accuracy {record['train_accuracy']:.4f}"
                    f"  |  val loss {record['val_loss']:.4f}  accuracy {record['val_accuracy']:.4f}"
                    f"  AUC {record['val_auc']:.4f}  |  ")
        assert line.startswith(expected), (line, expected)
        assert re.search(r"  \|  \d+ images/s", line), line
    assert re.search(r"images/s  (\d+s|\d+m\d\ds|\d+h\d\dm) left$", lines[0]), lines[0]
    assert screen[-1] == f"checkpoint: {os.path.join(task, 'terminal.h5')} (epoch 2)", screen

    # --json on a terminal: the JSON lines of a pipe.
    code, screen = on_terminal(train_args(task, "json.h5", "--json"))
    assert code == 0 and screen and all(line.startswith("{") for line in screen), screen
    assert [json.loads(line)["epoch"] for line in screen if '"event":"epoch"' in line] == [1, 2]


def test_dry_run_table_on_a_terminal(task):
    args = train_args(task, "plan.h5", "--dry-run")
    plan = json.loads(off_terminal(args).stdout)
    code, screen = on_terminal(args)
    assert code == 0, screen
    assert screen[0].startswith("Device memory plan on " + plan["device"]), screen
    rows = [line.split("  ")[1].strip() for line in screen[1:] if line.startswith("  ")]
    assert rows[:len(plan["bytes"])] == sorted(plan["bytes"]) and "total" in rows, screen
    assert screen[-1].endswith(": fits") and "of the budget's 2.0 GiB" in screen[-1], screen


def test_resume_conflict_prints_flags_as_typed(task):
    off_terminal(train_args(task, "resume.h5"))
    for typed in ("0.02", "2e-2"):
        args = train_args(task, "resume.h5", "--resume")
        args[args.index("--lr") + 1] = typed
        result = off_terminal(args, check=False)
        assert result.returncode == 2, result.stderr
        assert f"--lr {typed} (the checkpoint's run: 0.01)" in result.stderr, result.stderr
        assert "0.0099999" not in result.stderr, result.stderr


@pytest.mark.parametrize("args, words", [
    (["train", "--data", "x.h5", "--lrate", "0.1"], "--lrate is not a flag of tessera train: did you mean --lr?"),
    (["train", "--data", "x.h5", "--epoch=3"], "--epoch is not a flag of tessera train: did you mean --epochs?"),
    (["tile", "x.tiff", "--out", "x.lmdb", "--sise", "64"], "--sise is not a flag of tessera tile: did you mean --size?"),
    (["trian", "--data", "x.h5"], "trian is not a command: did you mean train?"),
    (["--versoin"], "--versoin is not a flag: did you mean --version?"),
])
def test_mistyped_flag_names_the_nearest(args, words):
    result = off_terminal(args, check=False)
    assert result.returncode == 2 and words in result.stderr, result.stderr

"""What people and programs read, with the real binary under a pseudo-terminal (Python's pty) and
without one:
- `train` on a terminal prints one readable line per epoch (loss, accuracy, validation loss,
  accuracy and AUC, images/s, time left) with the numbers of the JSON records a run without a
  terminal prints, and names its checkpoint at the end; no JSON. Without a terminal, and with
  --json on one, JSON lines as before, ending with the checkpoint's record.
- `--dry-run` (train's and extract's) prints its plan as a table on a terminal and as JSON
  otherwise, of the same categories and bytes.
- A --resume conflict prints the flag as typed and the checkpoint's value as its shortest text.
- A mistyped flag or command names the nearest one (exit 2).
- `tile`, `extract`, `sweep`, `heatmap` and `forward` on a terminal: a progress bar, a readable
  line per slide (per trial for sweep) and a short table or line at the end, no JSON; through a
  pipe every line of stdout and stderr is JSON, with the slide (trial) events and the result,
  whose numbers match the outputs read with python3-lmdb and h5py.
- Library warnings: `synth` prints no libtiff text; a libtiff warning on slides with an unknown
  tag is tessera's own line naming the file, told once (JSON through a pipe), never libtiff's.
"""
import json
import os
import pty
import re
import shutil
import subprocess
import sys

import pytest

from data_tools import workdir

TESSERA = os.environ.get("TESSERA_BINARY", "build/tools/tessera")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = dict(os.environ, TESSERA_VALIDATION="1")


def on_terminal(args):
    """(exit code, what the terminal showed as lines) of tessera ARGS with stdout and stderr on a pty."""
    code, text = terminal_session(args)
    # What stays on screen: each line's text after its last carriage return or erase.
    lines = [re.split(r"\r|\x1b\[K", line)[-1] for line in text.replace("\r\n", "\n").split("\n")]
    return code, [line for line in lines if line.strip()]


def terminal_session(args):
    """(exit code, everything written to the terminal) of tessera ARGS on a pty."""
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
    return code, text


def off_terminal(args, check=True):
    result = subprocess.run([TESSERA, *map(str, args)], capture_output=True, text=True, env=ENV, timeout=600)
    assert "vulkan validation" not in result.stderr.lower(), result.stderr
    if check:
        assert result.returncode == 0, result.stderr
    return result


@pytest.fixture(scope="module")
def task():
    work = workdir("test_terminal_output")
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "make_patch_task.py"), "--out",
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
    listed = screen.index("  largest buffers:")
    assert screen[listed + 1].strip().startswith(plan["largest_buffers"][0]["name"] + " "), screen
    assert re.search(r"of the budget's \d+\.\d [KMG]iB: fits$", screen[-1]), screen


def test_extract_dry_run_table_on_a_terminal(task):
    args = ["extract", "--encoder", "vit-b16", "--random-weights", "--dry-run", "--out", os.path.join(task, "never")]
    plan = json.loads(off_terminal(args).stdout)
    code, screen = on_terminal(args)
    assert code == 0, screen
    device = plan["devices"][0]
    assert screen[0].startswith("Device memory plan on " + device["name"]), screen
    assert not any(line.lstrip().startswith("{") for line in screen), screen
    model = device["models"][0]
    assert screen[1].startswith(f"  vit-b16 at batch {model['batch']}: the largest batch"), screen
    rows = [line.split()[0] for line in screen[2:] if line.startswith("    ")]
    assert rows == [category.split()[0] for category in model["plan"]["bytes"]] + ["total"], screen
    assert screen[-1].endswith(": fits"), screen
    assert not os.path.exists(os.path.join(task, "never"))


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


# The other commands, on tiny synthetic slides (lavapipe is slow): each run on a terminal, then
# the same through a pipe.
BAR = r"\[[# ]{30}\] \d+/\d+"
TABLE_HEAD = re.compile(r"^slide\s+status\s+tiles\s+time\s+tiles/s$")


def json_lines(text):
    """Every line of TEXT as JSON (a line that is not fails the test)."""
    return [json.loads(line) for line in text.splitlines()]


def piped(args):
    """(stdout's records, stderr's records) of tessera ARGS through pipes: every line JSON."""
    result = off_terminal(args)
    return json_lines(result.stdout), json_lines(result.stderr)


def readable(screen):
    assert not any(line.lstrip().startswith("{") for line in screen), screen
    assert not any("TIFF" in line and "warning" not in line for line in screen), screen


@pytest.fixture(scope="module")
def slides(task):
    """Two synthetic slides (the demo's generator), tiled into a store through a pipe."""
    paths = [os.path.realpath(os.path.join(task, f"s{seed}.tiff")) for seed in (1, 2)]
    for path, (width, height, seed) in zip(paths, [(512, 512, 1), (448, 384, 2)]):
        off_terminal(["synth", path, "--width", width, "--height", height, "--seed", seed])
    return paths


def test_synth_prints_no_library_text(task):
    path = os.path.join(task, "synth.tiff")
    code, text = terminal_session(["synth", path, "--width", 640, "--height", 512, "--seed", 7])
    assert code == 0, text
    assert "TIFF" not in text and "Scanline" not in text, text
    result = off_terminal(["synth", os.path.join(task, "synth2.tiff"), "--width", 640, "--height", 512, "--seed", 7])
    assert "TIFF" not in result.stderr + result.stdout, result.stderr
    json_lines(result.stdout), json_lines(result.stderr)


def test_tile_lines_table_and_json(task, slides):
    from data_tools import read_store
    args = ["tile", *slides, "--size", 32, "--min-tissue", 0.3]
    out, err = piped([*args, "--out", os.path.join(task, "pipe.lmdb")])
    tiles, _ = read_store(os.path.join(task, "pipe.lmdb"))
    per_slide = [sum(1 for key in tiles if key[0] == n) for n in range(len(slides))]
    assert len(out) == 1 and [s["tiles"] for s in out[0]["slides"]] == per_slide and all(per_slide), out
    events = [r for r in err if r.get("event") == "slide"]
    assert [(r["task"], r["slide"], r["status"], r["tiles"]) for r in events] == \
        [("tile", path, "tiled", n) for path, n in zip(slides, per_slide)], err
    assert all(r["tiles_per_second"] > 0 and r["seconds"] > 0 for r in events), events

    code, text = terminal_session([*args, "--out", os.path.join(task, "terminal.lmdb")])
    assert code == 0, text
    assert re.search(r"tile " + re.escape(slides[0]) + " " + BAR, text), text
    _, screen = on_terminal([*args, "--out", os.path.join(task, "terminal.lmdb")])  # complete: nothing to do
    for path, n in zip(slides, per_slide):
        assert f"{path}  already complete  {n} tiles" in screen, screen
    screen = [re.split(r"\r|\x1b\[K", line)[-1] for line in text.replace("\r\n", "\n").split("\n")]
    screen = [line for line in screen if line.strip()]
    readable(screen)
    for path, n in zip(slides, per_slide):
        assert any(re.fullmatch(re.escape(f"{path}  tiled  {n} tiles  ") + r"\S+s  \d+ tiles/s", line)
                   for line in screen), screen
    head = next(i for i, line in enumerate(screen) if TABLE_HEAD.match(line))
    rows = [line.split() for line in screen[head + 1:head + 3]]
    assert [(row[0], row[1], int(row[2])) for row in rows] == [(p, "tiled", n) for p, n in zip(slides, per_slide)]
    assert screen[head + 3].startswith("-----"), screen
    assert screen[head + 4].split()[:4] == ["total", "2", "slides", str(sum(per_slide))], screen
    assert screen[-2] == f"store: {os.path.join(task, 'terminal.lmdb')}", screen
    assert re.fullmatch(re.escape(f"tile: run report {task}/terminal.lmdb/runs/") + r"\S+\.json", screen[-1]), screen

    # --json on a terminal: the records of a pipe.
    code, screen = on_terminal([*args, "--json", "--out", os.path.join(task, "json.lmdb")])
    records = [json.loads(line) for line in screen]
    assert code == 0 and [r["tiles"] for r in records if r.get("event") == "slide"] == per_slide, screen
    result = next(r for r in reversed(records) if "slides" in r)  # the run report's record follows it
    assert [s["tiles"] for s in result["slides"]] == per_slide, screen
    assert "run report" in records[-1], screen


@pytest.fixture(scope="module")
def features(task, slides):
    """Features of the slides' store (small-cnn, random weights), extracted through a pipe."""
    store = os.path.join(task, "pipe.lmdb")
    if not os.path.exists(store):
        off_terminal(["tile", *slides, "--size", 32, "--min-tissue", 0.3, "--out", store])
    args = ["extract", "--model", "small-cnn", "--random-weights", "--layer", "pool2", "--tiles", store]
    out, err = piped([*args, "--out", os.path.join(task, "features")])
    return args, out, err


def test_extract_lines_table_and_json(task, features):
    import h5py
    args, out, err = features
    assert len(out) == 1, out
    summary = out[0]
    rows = {}
    for slide in summary["slides"]:
        with h5py.File(os.path.join(task, "features", slide["slide"] + ".h5"), "r") as f:
            rows[slide["slide"]] = f["features"].shape[0]
    assert [s["tiles"] for s in summary["slides"]] == list(rows.values()) and summary["tiles"] == sum(rows.values())
    events = [r for r in err if r.get("event") == "slide"]
    assert sorted((r["task"], r["slide"], r["status"], r["tiles"]) for r in events) == \
        sorted(("extract", name, "extracted", n) for name, n in rows.items()), err

    code, text = terminal_session([*args, "--out", os.path.join(task, "features-terminal")])
    assert code == 0, text
    assert re.search(r"extract " + BAR, text), text
    screen = [re.split(r"\r|\x1b\[K", line)[-1] for line in text.replace("\r\n", "\n").split("\n")]
    screen = [line for line in screen if line.strip()]
    readable(screen)
    for name, n in rows.items():
        assert any(re.fullmatch(re.escape(f"{name}  extracted  {n} tiles  ") + r"\S+s  \d+ tiles/s", line)
                   for line in screen), screen
    head = next(i for i, line in enumerate(screen) if TABLE_HEAD.match(line))
    assert screen[head + len(rows) + 2].split()[:4] == ["total", "2", "slides", str(sum(rows.values()))], screen
    assert screen[-2].startswith(f"features: {os.path.join(task, 'features-terminal')}  (") and "busy" in screen[-2]
    assert re.fullmatch(re.escape(f"extract: run report {task}/features-terminal/runs/") + r"\S+\.json",
                        screen[-1]), screen


def test_heatmap_line_and_json(task, slides, features):
    labels = os.path.join(task, "slides.csv")
    names = [os.path.splitext(os.path.basename(path))[0] for path in slides]
    with open(labels, "w") as f:
        f.write(f"slide,label\n{names[0]},tumor\n{names[1]},normal\n")
    head = os.path.join(task, "head.h5")
    off_terminal(["train", "--features", os.path.join(task, "features"), "--labels", labels, "--head", "mean",
                  "--epochs", 1, "--val-fraction", 0, "--checkpoint", head])
    args = ["heatmap", "--features", os.path.join(task, "features", names[0] + ".h5"), "--model", head,
            "--slide", slides[0], "--max-size", 128]
    out, err = piped([*args, "--out", os.path.join(task, "pipe.png")])
    assert len(out) == 1 and out[0]["event"] == "heatmap", out
    tiles = out[0]["tiles"]
    assert [(r["event"], r["slide"], r["tiles"]) for r in err if r.get("event")] == [("slide", slides[0], tiles)]

    code, text = terminal_session([*args, "--out", os.path.join(task, "terminal.png")])
    assert code == 0, text
    assert re.search(r"heatmap " + re.escape(slides[0]) + " " + BAR, text), text
    _, screen = on_terminal([*args, "--out", os.path.join(task, "again.png")])
    readable(screen)
    assert re.fullmatch(re.escape(f"{slides[0]}  {tiles} tiles, P(tumor) ") + r"\S+ to \S+", screen[-2]), screen
    assert screen[-1] == (f"heatmap: {os.path.join(task, 'again.png')} ({out[0]['width']}x{out[0]['height']}, "
                          f"thumbnail of level {out[0]['level']}, colours 0 to 1)"), screen


def test_forward_line_and_json(task):
    import h5py
    import numpy as np
    images = os.path.join(task, "images.h5")
    with h5py.File(images, "w") as f:
        f["x"] = np.random.default_rng(3).normal(size=(12, 3, 16, 16)).astype(np.float32)
    args = ["forward", "--model", "small-cnn", "--random-weights", "--input", images, "--batch", 4]
    out, err = piped([*args, "--output", os.path.join(task, "pipe-logits.h5")])
    with h5py.File(os.path.join(task, "pipe-logits.h5"), "r") as f:
        classes = f["logits"].shape[1]
        assert f["logits"].shape[0] == 12
    assert len(out) == 1 and out[0]["images"] == 12 and out[0]["batch"] == 4, out
    assert all(r["task"] == "forward" for r in err), err

    code, text = terminal_session([*args, "--output", os.path.join(task, "terminal-logits.h5")])
    assert code == 0, text
    assert re.search(r"forward " + re.escape(images) + " " + BAR, text), text
    screen = [re.split(r"\r|\x1b\[K", line)[-1] for line in text.replace("\r\n", "\n").split("\n")]
    screen = [line for line in screen if line.strip()]
    readable(screen)
    assert re.fullmatch(re.escape(f"logits: {os.path.join(task, 'terminal-logits.h5')} (12 images x {classes} "
                                  f"classes; ") + r"\d+ images/s on .+\)", screen[-1]), screen


def test_sweep_trial_lines_table_and_json(task):
    def args(study):
        return ["sweep", "--study", os.path.join(task, study), "--trials", 2, "--sampler", "grid", "--param",
                "lr=choice:0.001,0.1", "--", "--data", os.path.join(task, "task.h5"), "--epochs", 1, "--batch", 16,
                "--width", 4, "--val-fraction", 0.3]
    out, err = piped(args("pipe.sqlite"))
    assert len(out) == 1 and out[0]["event"] == "sweep" and out[0]["trials"] == 2, out
    assert out[0]["states"] == {"complete": 2}, out
    exported = json.loads(off_terminal(["sweep", "--study", os.path.join(task, "pipe.sqlite"), "--export",
                                        "json"]).stdout)
    trials = [r for r in err if r.get("event") == "trial"]
    assert sorted((r["trial"], r["state"], r["value"]) for r in trials) == \
        sorted((t["number"], t["state"], t["value"]) for t in exported["trials"]), (trials, exported)
    assert out[0]["best"]["number"] == exported["best"]["number"], (out, exported)

    code, text = terminal_session(args("terminal.sqlite"))
    assert code == 0, text
    assert re.search(r"sweep " + BAR, text), text
    screen = [re.split(r"\r|\x1b\[K", line)[-1] for line in text.replace("\r\n", "\n").split("\n")]
    screen = [line for line in screen if line.strip()]
    readable(screen)
    assert sorted(int(line.split()[1]) for line in screen if re.fullmatch(r"trial \d  complete  value \S+  \d+s", line)) \
        == [0, 1], screen
    assert any(re.match(r"^trial\s+state\s+value\s+attempts\s+seconds\s+lr", line) for line in screen), screen
    assert "2 trials: 2 complete" in screen and any(line.startswith("best: trial ") for line in screen), screen


def test_library_warning_told_once_naming_the_file(task):
    import numpy as np
    import tifffile
    paths = [os.path.join(task, f"tagged{n}.tif") for n in (1, 2)]
    for n, path in enumerate(paths):  # a private tag libtiff does not know: it warns on reading the directory
        pixels = np.random.default_rng(n).integers(0, 255, size=(256, 256, 3), dtype=np.uint8)
        tifffile.imwrite(path, pixels, tile=(64, 64), photometric="rgb", extratags=[(65000, "s", 0, "mine", True)])
    args = ["tile", *paths, "--size", 64, "--tissue", "none"]
    out, err = piped([*args, "--out", os.path.join(task, "tagged.lmdb")])
    assert out[0]["written"] == 32, out
    warnings = [r for r in err if "65000" in r.get("warning", "")]
    assert warnings and warnings[0]["file"] in paths and warnings[0]["library"] == "libtiff", err
    assert warnings[0]["warning"].startswith(warnings[0]["file"] + ": libtiff: "), warnings
    # Told once, and once more at the end with the count when it came from more than one file.
    assert len(warnings) <= 2 and all(r["task"] == "tile" for r in warnings), warnings
    if len(warnings) == 2:
        assert warnings[1]["files"] == 2, warnings

    _, screen = on_terminal([*args, "--out", os.path.join(task, "tagged-terminal.lmdb")])
    told = [line for line in screen if "65000" in line]
    assert told and told[0].startswith(f"tile warning: {warnings[0]['file']}: libtiff: "), screen
    assert not any(line.startswith("TIFF") or "Warning, " in line for line in screen), screen


def test_libvips_warning_from_its_own_threads_names_the_file(task):
    import numpy as np
    from PIL import Image
    whole, truncated = os.path.join(task, "whole.jpg"), os.path.join(task, "truncated.jpg")
    Image.fromarray(np.random.default_rng(1).integers(0, 255, (256, 256, 3), dtype=np.uint8)).save(whole, quality=90)
    with open(whole, "rb") as f:
        data = f.read()
    with open(truncated, "wb") as f:
        f.write(data[:len(data) * 2 // 3])
    result = off_terminal(["tile", truncated, "--size", 64, "--tissue", "none", "--out",
                           os.path.join(task, "truncated.lmdb")], check=False)
    assert result.returncode == 5, result.stderr
    records = json_lines(result.stderr.split("\ntessera: ")[0])
    told = [r for r in records if r.get("library") == "libvips"]
    assert told and all(r["file"] == truncated and r["warning"].startswith(truncated + ": libvips: ") for r in told)
    assert len({r["warning"] for r in told}) == len(told), told  # each told once

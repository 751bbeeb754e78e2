"""Defaults that fit the device (jobs/batch_choice.h): without --batch, `train` and `extract`
choose the largest batch whose plan takes at most 75% of the device's budget, up to what still
makes the device faster (on lavapipe four 224 x 224 tiles' worth: 4 of 224 pixels, 16 of 96, 32
of 64), and say which; an explicit --batch that does not fit stays exit 3 naming --batch. Flags
and inputs are checked before any weights are read. A small cohort's default validation split
holds out a slide of each class. README.md's plan commands run as printed on lavapipe."""
import json
import os
import re
import shutil
import subprocess

import h5py
import numpy as np
import tifffile

from data_tools import patch_task, run_with_report, workdir
from test_extract_live import CMU

TESSERA = os.environ.get("TESSERA_BINARY", "build/tools/tessera")
REPOSITORY = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 1 << 20
BUDGET_SHARE = 0.75


def tessera(*args, check=False):
    return run_with_report(TESSERA, [*map(str, args)], check=check, env=dict(os.environ, TESSERA_VALIDATION="1"))


def events(stderr, kind):
    lines = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("event") == kind]


def plan_line(stdout):
    """train --dry-run's plan, as its JSON line when piped."""
    plans = [json.loads(line) for line in stdout.splitlines() if line.startswith('{"budget_bytes"')]
    assert len(plans) == 1, stdout
    return plans[0]


def lavapipe():
    info = subprocess.run([TESSERA, "info", "--json"], capture_output=True, text=True, check=True)
    return "llvmpipe" in info.stdout


def test_train_chooses_a_batch_that_fits():
    work = workdir("test_device_defaults_train")
    patches = patch_task(os.path.join(work, "p96.h5"), 36, 96)
    code, out, err, _ = tessera("train", "--data", patches, "--model", "resnet18", "--epochs", 1, "--dry-run")
    assert code == 0, err
    chosen, = events(err, "batch")
    assert chosen["chosen"] and chosen["planned_device_bytes"] <= chosen["within_bytes"], chosen
    plan = plan_line(out)
    if lavapipe():
        # 4 * 224^2 / 96^2 = 21.8: the power of two at or below it.
        assert chosen["batch"] == 16 and chosen["speed_cap"] == 21, chosen
        assert chosen["within_bytes"] == int(2048 * MiB * BUDGET_SHARE), chosen
    assert plan["device_bytes"] == chosen["planned_device_bytes"] and plan["fits"], (plan, chosen)

    # Under a budget that holds less, a smaller batch; it trains (the plan fits).
    code, _, err, report = tessera("train", "--data", patches, "--model", "resnet18", "--epochs", 1,
                                   "--device-memory-limit", "300MiB", "--workers", 1)
    assert code == 0, err
    small, = events(err, "batch")
    assert small["batch"] < chosen["batch"] and small["planned_device_bytes"] <= int(300 * MiB * BUDGET_SHARE), small
    # The next batch up would not have fit the share: the choice is the largest.
    code, out, err, _ = tessera("train", "--data", patches, "--model", "resnet18", "--epochs", 1, "--dry-run",
                                "--device-memory-limit", "300MiB", "--batch", 2 * small["batch"])
    doubled = plan_line(out)
    assert doubled["device_bytes"] > int(300 * MiB * BUDGET_SHARE), doubled

    # An explicit --batch that does not fit: exit 3 naming --batch, nothing trained.
    code, _, err, report = tessera("train", "--data", patches, "--model", "resnet18", "--epochs", 1,
                                   "--device-memory-limit", "300MiB", "--batch", 32)
    assert code == 3 and "--batch" in err, (code, err)
    assert not events(err, "batch"), err
    # --batch 0 is not "choose": exit 2 naming --batch.
    code, _, err, _ = tessera("train", "--data", patches, "--batch", 0)
    assert code == 2 and "--batch must be at least 1" in err, (code, err)
    code, _, err, _ = tessera("extract", "--model", "small-cnn", "--random-weights", "--layer", "conv1", "--slides",
                              CMU, "--out", os.path.join(work, "zero"), "--batch", 0)
    assert code == 2 and "--batch must be at least 1" in err and not os.path.exists(os.path.join(work, "zero"))
    shutil.rmtree(work)


def features(path):
    with h5py.File(path, "r") as f:
        return f["features"][:], f["coords"][:]


def test_extract_chooses_a_batch_with_the_same_features():
    work = workdir("test_device_defaults_extract")
    common = ["extract", "--model", "small-cnn", "--random-weights", "--layer", "conv1", "--slides", CMU,
              "--size", 64, "--min-tissue", 0.5]
    code, out, err, _ = tessera(*common, "--out", os.path.join(work, "chosen"))
    assert code == 0, err
    device = json.loads(out.strip().splitlines()[-1])["devices"][0]
    chosen = device["batch_chosen"]
    assert device["batch"] == chosen["batch"] and chosen["planned_device_bytes"] <= chosen["within_bytes"], device
    if lavapipe():
        assert chosen["batch"] == 32, chosen  # 4 * 224^2 / 64^2 = 49
    code, out, err, _ = tessera(*common, "--out", os.path.join(work, "one"), "--batch", 1)
    assert code == 0, err
    assert json.loads(out.strip().splitlines()[-1])["devices"][0]["batch_chosen"] is None
    chosen_features, chosen_coords = features(os.path.join(work, "chosen", "CMU-1-Small-Region.h5"))
    one_features, one_coords = features(os.path.join(work, "one", "CMU-1-Small-Region.h5"))
    assert len(chosen_coords) > 32 and np.array_equal(chosen_coords, one_coords)
    np.testing.assert_allclose(chosen_features, one_features, rtol=1e-5, atol=1e-5)
    shutil.rmtree(work)


def test_a_missing_mpp_is_refused_before_any_weights_are_read():
    """The weights file is not a checkpoint at all: read, it would fail naming itself. The refusal
    names the slide and --mpp instead, so the weights were never opened; nothing is written."""
    work = workdir("test_device_defaults_mpp")
    slide = os.path.join(work, "no-mpp.tif")
    tifffile.imwrite(slide, np.full((300, 300, 3), 180, np.uint8), tile=(256, 256), photometric="rgb")
    weights = os.path.join(work, "uni.h5")
    with open(weights, "wb") as f:
        f.write(b"not HDF5")
    out = os.path.join(work, "features")
    code, _, err, _ = tessera("extract", "--encoder", "uni", "--model", weights, "--slides", slide, "--out", out)
    assert code == 2 and "--mpp" in err and slide in err and weights not in err, (code, err)
    assert not os.path.exists(out)
    # A weights file that is not there is named before any slide is opened.
    code, _, err, _ = tessera("extract", "--encoder", "uni", "--model", os.path.join(work, "none.h5"), "--slides",
                              os.path.join(work, "no-such-slide.tif"), "--out", out)
    assert code == 5 and "--model" in err and "none.h5" in err and "no-such-slide" not in err, (code, err)
    # With --mpp, the same run reaches the weights, and names them.
    code, _, err, _ = tessera("extract", "--encoder", "uni", "--model", weights, "--slides", slide, "--out", out,
                              "--mpp", 0.5)
    assert code != 0 and weights in err, (code, err)
    shutil.rmtree(work)


def cohort(work, slides, classes=2):
    features_dir = os.path.join(work, "features")
    os.makedirs(features_dir)
    rng = np.random.default_rng(3)
    rows = ["slide,label"]
    for s in range(slides):
        with h5py.File(os.path.join(features_dir, f"s{s}.h5"), "w") as f:
            f["features"] = (rng.normal(size=(6, 8)) + (s % classes)).astype(np.float32)
        rows.append(f"s{s},{s % classes}")
    labels = os.path.join(work, "labels.csv")
    with open(labels, "w") as f:
        f.write("\n".join(rows) + "\n")
    return features_dir, labels


def test_a_small_cohorts_default_split_holds_out_every_class():
    work = workdir("test_device_defaults_cohort")
    features_dir, labels = cohort(work, 6)
    code, _, err, report = tessera("train", "--features", features_dir, "--labels", labels, "--epochs", 2)
    assert code == 0, err
    split, = events(err, "split")
    # 0.1 of 6 slides is one: one class left out. The default holds out one slide of each instead.
    assert split["validation"]["per_class"] == [1, 1] and split["train"]["per_class"] == [2, 2], split
    assert any("the default" in w and "one slide of each class" in w for w in split["warnings"]), split
    assert not any("AUC is undefined" in w for w in split["warnings"]), split
    held = sorted(int(name[1:]) % 2 for name in split["held_out_slides"])
    assert held == [0, 1], split
    final, = [line for line in report if line["type"] == "final"]
    assert final["metrics"]["val_slides"] == 2 and "val_auc" in final["metrics"], final
    # One slide of a class: it stays in training, and validation says what it lacks.
    shutil.rmtree(work)
    work = workdir("test_device_defaults_cohort_one")
    features_dir, labels = cohort(work, 3, classes=3)
    with open(labels, "w") as f:
        f.write("slide,label\ns0,0\ns1,0\ns2,1\n")
    code, _, err, _ = tessera("train", "--features", features_dir, "--labels", labels, "--epochs", 1)
    assert code == 0, err
    split, = events(err, "split")
    assert split["validation"]["per_class"] == [1, 0] and any("AUC is undefined" in w for w in split["warnings"]), split
    shutil.rmtree(work)


def readme_commands():
    """The indented `tessera ...` commands of README.md, continuation lines joined, comments cut."""
    lines, commands = open(os.path.join(REPOSITORY, "README.md")).read().splitlines(), []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("    tessera "):
            text = line.strip()
            while text.split("#")[0].rstrip().endswith("\\"):
                i += 1
                text = text.split("#")[0].rstrip()[:-1] + " " + lines[i].strip()
            commands.append(text.split("   #")[0].split("  #")[0].strip())
        i += 1
    return commands


def test_readme_plans_fit_lavapipe():
    """README's commands that give no --batch or a batch it plans (--dry-run) fit the device as
    printed: the extract plan, and the first train example on a store of 256-pixel tiles (its
    --checkpoint swapped for --dry-run, as the store is made here)."""
    commands = readme_commands()
    assert not [c for c in commands if c.startswith("tessera train --data tiles.lmdb") and "--batch" in c], commands
    work = workdir("test_device_defaults_readme")
    plans = [c for c in commands if c.startswith("tessera extract") and "--dry-run" in c]
    assert plans, commands
    for command in plans:
        code, out, err, _ = tessera(*command.split()[1:])
        assert code == 0, (command, err)
        assert json.loads(out.strip().splitlines()[-1])["devices"][0]["models"][0]["fits"], out
    # README's first tile command as printed, on a small synthetic slide and its annotations.
    files = {name: os.path.join(work, name) for name in ("slide.tiff", "slide.geojson", "tiles.lmdb")}
    subprocess.run([TESSERA, "synth", files["slide.tiff"], "--width", "3072", "--height", "3072", "--seed", "1"],
                   check=True, capture_output=True)
    tile = next(c for c in commands if c.startswith("tessera tile slide.tiff --out tiles.lmdb --size 256"))
    code, _, err, _ = tessera(*[files.get(a, a) for a in tile.split()[1:]])
    assert code == 0, (tile, err)
    train = next(c for c in commands if c.startswith("tessera train --data tiles.lmdb --model small-cnn"))
    args = [files.get(a, a) for a in re.sub(r"--checkpoint \S+", "--dry-run", train).split()[1:]]
    code, _, err, _ = tessera(*args, "--val-fraction", 0)  # one slide: nothing to hold out
    assert code == 0, (args, err)
    chosen, = events(err, "batch")
    assert chosen["planned_device_bytes"] <= chosen["within_bytes"], chosen
    shutil.rmtree(work)


def test_a_small_stores_default_split_holds_out_a_slide():
    """Three slides of a tile store, each a third of the tiles: --val-fraction 0.1 holds out none.
    Given, that is refused (test_train_data_checks); as the default, the slide with both classes
    and the fewest tiles, whose others keep both, is held out, and a warning says so."""
    from test_train_data_checks import SMALL, write_store
    work = workdir("test_device_defaults_store")
    store = os.path.join(work, "three.lmdb")
    write_store(store, [[0] * 20, [0, 1] * 10, [0, 1] * 9 + [1, 1]])
    code, _, err, report = tessera("train", "--data", store, *SMALL)
    assert code == 0, err
    split, = events(err, "split")
    assert split["held_out_slides"] == ["/slides/s1.svs"], split
    assert split["validation"]["per_class"] == [10, 10] and split["train"]["per_class"] == [29, 11], split
    assert any("(the default) holds out none" in w and "/slides/s1.svs" in w for w in split["warnings"]), split
    final, = [line for line in report if line["type"] == "final"]
    assert "val_auc" in final["metrics"], final
    code, _, err, _ = tessera("train", "--data", store, *SMALL, "--val-fraction", 0.1)
    assert code == 2 and "holds out nothing" in err, (code, err)
    shutil.rmtree(work)

"""`tessera train --features ... --resume` continues the run that wrote the checkpoint, as patch
training does: --features, --labels, --head and --attention-hidden given with other values exit 2
naming each flag, the checkpoint untouched; left out, they take the checkpoint's values; a head's
checkpoint resumed as a CNN on --data (or the other way round) exits 2. Feature files are written
with h5py, the checkpoint read back with it."""
import hashlib
import json
import os
import shutil
import subprocess

import h5py
import numpy as np
import pytest

TESSERA = os.environ.get("TESSERA_BINARY", "build/tools/tessera")
SLIDES, WIDTH = 8, 8


def tessera(*args):
    result = subprocess.run([TESSERA, *map(str, args)], capture_output=True, text=True,
                            env=dict(os.environ, TESSERA_VALIDATION="1"))
    assert "vulkan validation" not in result.stderr.lower(), result.stderr
    return result


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def write_task(directory):
    """Feature files of SLIDES slides and their labels file; returns (features dir, labels path)."""
    features = directory / "features"
    features.mkdir()
    generator = np.random.default_rng(5)
    rows = ["slide,label"]
    for s in range(SLIDES):
        with h5py.File(features / f"slide{s}.h5", "w") as f:
            f["features"] = generator.normal(size=(10 + s, WIDTH)).astype(np.float32)
        rows.append(f"slide{s},{'tumor' if s % 2 else 'normal'}")
    labels = directory / "slides.csv"
    labels.write_text("\n".join(rows) + "\n")
    return features, labels


@pytest.fixture()
def trained(tmp_path):
    """A head trained one epoch with --head attention --attention-hidden 8."""
    features, labels = write_task(tmp_path)
    checkpoint = tmp_path / "head.h5"
    result = tessera("train", "--features", features, "--labels", labels, "--head", "attention",
                     "--attention-hidden", 8, "--epochs", 1, "--checkpoint", checkpoint)
    assert result.returncode == 0, result.stderr
    return tmp_path, features, labels, checkpoint


def test_every_differing_flag_is_named(trained):
    work, features, labels, checkpoint = trained
    other_features = work / "other_features"
    shutil.copytree(features, other_features)
    other_labels = work / "other.csv"
    shutil.copy(labels, other_labels)
    before = digest(checkpoint)
    result = tessera("train", "--features", other_features, "--labels", other_labels, "--head", "mean",
                     "--attention-hidden", 16, "--epochs", 2, "--checkpoint", checkpoint, "--resume")
    assert result.returncode == 2, (result.returncode, result.stderr)
    for flag in (f"--features {other_features}", f"--labels {other_labels}", "--head mean", "--attention-hidden 16"):
        assert flag in result.stderr, (flag, result.stderr)
    assert digest(checkpoint) == before


@pytest.mark.parametrize("flag, value", [("--head", "mean"), ("--attention-hidden", "16"), ("--labels", None),
                                         ("--features", None)])
def test_each_flag_alone(trained, flag, value):
    work, features, labels, checkpoint = trained
    given = {"--features": features, "--labels": labels}
    if value is None:  # the same files at another path
        value = work / ("copy_" + os.path.basename(given[flag]))
        (shutil.copytree if flag == "--features" else shutil.copy)(given[flag], value)
    given[flag] = value
    before = digest(checkpoint)
    flags = [item for pair in given.items() for item in pair]
    result = tessera("train", *flags, "--epochs", 2, "--checkpoint", checkpoint, "--resume")
    assert result.returncode == 2, (flag, result.returncode, result.stderr)
    assert f"{flag} {value}" in result.stderr, result.stderr
    assert digest(checkpoint) == before


def test_flags_left_out_take_the_checkpoints(trained):
    work, features, labels, checkpoint = trained
    # --head and --attention-hidden left out: the checkpoint's attention head of width 8 goes on.
    result = tessera("train", "--features", features, "--labels", labels, "--epochs", 2, "--checkpoint", checkpoint,
                     "--resume")
    assert result.returncode == 0, result.stderr
    with h5py.File(checkpoint, "r") as f:
        progress = json.loads(f["train"].attrs["progress"])
        assert f["params/attention_V.weight"].shape == (8, WIDTH)
    assert progress["epoch"] == 2 and progress["head"] == "attention" and progress["attention_hidden"] == 8, progress
    assert progress["features"] == str(features.resolve()) and progress["labels"] == str(labels.resolve()), progress


def test_head_checkpoint_resumed_as_cnn(trained):
    work, _, _, checkpoint = trained
    patches = work / "patches.h5"
    with h5py.File(patches, "w") as f:
        f["x"] = np.zeros((4, 32, 32, 3), np.uint8)
        f["y"] = np.array([0, 1, 0, 1], np.uint8)
    before = digest(checkpoint)
    result = tessera("train", "--data", patches, "--epochs", 2, "--checkpoint", checkpoint, "--resume")
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "--features" in result.stderr and str(checkpoint) in result.stderr, result.stderr
    assert digest(checkpoint) == before

"""`tessera train --precision fp16` end to end on a small patch task, read back with h5py.

A forced overflow (TESSERA_FAULT=loss_scale:VALUE starts the dynamic loss scale so high that
the first steps' fp16 gradients overflow) skips those steps, halves the scale each time, and
training goes on; a run killed with SIGKILL and resumed ends with exactly the weights of an
uninterrupted one (the scale and the skipped steps are in the checkpoint); NaN weights are
still divergence (exit 4); an fp16 checkpoint runs in fp32 and back; the plan counts fp16
activations and the measured peak matches it."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np
import pytest
from data_tools import run_with_report

TESSERA = os.environ.get("TESSERA_BINARY", "build/tools/tessera")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VULKAN = dict(os.environ, TESSERA_VALIDATION="1")


def run(args, check=True, env=None):
    """Runs tessera; (exit code, stdout, stderr, report lines); no validation message on success."""
    code, out, err, lines = run_with_report(TESSERA, args, check, env or VULKAN)
    assert "vulkan validation" not in err.lower() or code != 0, err
    return code, out, err, lines


def epochs(stderr):
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{") and '"event":"epoch"' in line]


def group(path, name):
    with h5py.File(path, "r") as f:
        out = {}
        f[name].visititems(lambda key, obj: out.__setitem__(key, obj[()]) if isinstance(obj, h5py.Dataset) else None)
        return out


@pytest.fixture(scope="module")
def work():
    with tempfile.TemporaryDirectory(prefix="tessera-train-fp16-") as directory:
        data = os.path.join(directory, "task.h5")
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "make_patch_task.py"), "--out", data,
                        "--count", "320", "--size", "16", "--seed", "3"], check=True, capture_output=True)
        yield directory, data


def train(data, *extra, precision="fp16"):
    return ["train", "--data", data, "--model", "small-cnn", "--width", "4", "--batch", "16", "--optimizer", "adam",
            "--lr", "0.003", "--seed", "7", "--workers", "2", "--val-fraction", "0.2", "--precision", precision, *extra]


def test_forced_overflow_skips_steps_halves_the_scale_and_training_goes_on(work):
    directory, data = work
    start = 2.0 ** 30
    _, _, err, report = run(train(data, "--epochs", "2"), env=dict(VULKAN, TESSERA_FAULT=f"loss_scale:{start:.0f}"))
    first, second = epochs(err)
    steps_per_epoch = 256 // 16
    skipped = int(first["skipped_steps"])
    # Gradients of the logits about 2^30 / 16 overflow fp16 (65504) until the scale is near 2^20.
    assert 5 <= skipped < steps_per_epoch, first
    # Each skipped step halved the scale, no clean step doubled it (2000 are needed).
    assert first["loss_scale"] == start / 2 ** skipped, first
    # Once the scale fits, steps are taken: no more skips, and the model learns.
    assert second["skipped_steps"] == skipped and second["loss_scale"] == first["loss_scale"], second
    assert second["train_loss"] < first["train_loss"] < 0.75, (first, second)
    final = [line for line in report if line["type"] == "final"][0]
    assert final["metrics"]["skipped_steps"] == skipped


def test_normal_scale_skips_nothing(work):
    _, data = work
    _, _, err, _ = run(train(data, "--epochs", "1"))
    (first,) = epochs(err)
    assert first["loss_scale"] == 65536.0 and first["skipped_steps"] == 0, first


def test_killed_and_resumed_equals_uninterrupted(work):
    directory, data = work
    whole = os.path.join(directory, "whole.h5")
    killed = os.path.join(directory, "killed.h5")
    fault = dict(VULKAN, TESSERA_FAULT="loss_scale:1e9")  # skipped steps too, so their count must resume
    run(train(data, "--epochs", "3", "--checkpoint", whole), env=fault)
    process = subprocess.Popen([TESSERA, *train(data, "--epochs", "3", "--checkpoint", killed)], env=fault,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # Killed once the first epoch's checkpoint is there: during a later epoch (or after it, when
    # the resumed run has less or nothing left to do; the weights must match either way).
    while not os.path.exists(killed) and process.poll() is None:
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert os.path.exists(killed)
    run(["train", "--data", data, "--epochs", "3", "--checkpoint", killed, "--resume"], env=fault)
    a, b = group(whole, "params"), group(killed, "params")
    assert sorted(a) == sorted(b)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
    ta, tb = group(whole, "train"), group(killed, "train")
    np.testing.assert_array_equal(ta["loss_scale"], tb["loss_scale"])
    assert ta["loss_scale"][2] >= 1, ta["loss_scale"]  # skipped steps counted in the checkpoint
    for name in ta:
        np.testing.assert_array_equal(ta[name], tb[name], err_msg=name)


def test_resume_in_the_other_precision_names_the_flag(work):
    directory, data = work
    checkpoint = os.path.join(directory, "precision.h5")
    run(train(data, "--epochs", "1", "--checkpoint", checkpoint))
    code, _, err, _ = run(train(data, "--epochs", "2", "--checkpoint", checkpoint, "--resume", precision="fp32"),
                          check=False)
    assert code == 2, err
    assert "--precision fp32" in err and "fp16" in err, err


def test_non_finite_weights_are_still_divergence(work):
    _, data = work
    code, _, err, _ = run(train(data, "--epochs", "1"), check=False, env=dict(VULKAN, TESSERA_FAULT="nan"))
    assert code == 4, err
    assert "diverged" in err, err


def test_checkpoint_runs_in_either_precision(work):
    directory, data = work
    checkpoint = os.path.join(directory, "interchange.h5")
    run(train(data, "--epochs", "1", "--checkpoint", checkpoint))
    with h5py.File(data, "r") as f:
        images = f["x"][:40].astype(np.float32) / 255.0
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    x = ((images - mean) / std).transpose(0, 3, 1, 2).astype(np.float32)
    source = os.path.join(directory, "images.h5")
    with h5py.File(source, "w") as f:
        f["x"] = x
    logits = {}
    for precision in ("fp32", "fp16"):
        out = os.path.join(directory, f"logits-{precision}.h5")
        run(["forward", "--model", checkpoint, "--input", source, "--output", out, "--batch", "16",
             "--precision", precision])
        with h5py.File(out, "r") as f:
            logits[precision] = f["logits"][()]
    full, half = logits["fp32"], logits["fp16"]
    # fp16 activations through four layers: a few units of 2^-11 of the logits' scale.
    assert np.abs(half - full).max() <= 1e-2 * np.abs(full).max(), (np.abs(half - full).max(), np.abs(full).max())
    assert (half.argmax(1) == full.argmax(1)).mean() >= 0.95


def test_plan_counts_fp16_activations_and_matches_the_peak(work):
    _, data = work
    plans = {}
    for precision in ("fp32", "fp16"):
        _, out, _, _ = run(train(data, "--dry-run", precision=precision))
        plans[precision] = json.loads(out.splitlines()[0])
    for category in ("activations", "activation gradients"):
        assert plans["fp16"]["bytes"][category] < 0.6 * plans["fp32"]["bytes"][category], plans
    assert plans["fp16"]["bytes"]["parameters"] == plans["fp32"]["bytes"]["parameters"], plans
    _, _, _, report = run(train(data, "--epochs", "1"))
    final = [line for line in report if line["type"] == "final"][0]
    planned = plans["fp16"]["total_bytes"]
    assert abs(final["peak_device_bytes"] - planned) <= 0.1 * planned, (final["peak_device_bytes"], planned)

"""Data-parallel training with the real binary, on lavapipe (two devices are the one physical
device opened twice, and MPI ranks are processes on this machine over loopback TCP).

- `--devices 0,0` equals one device on the same global batch: the same losses per epoch over two
  epochs and the same weights, with SGD (momentum) and with Adam, on small-cnn (dropout: each
  replica draws the masks of its samples' places in the whole batch).
- Batch norm keeps per-device statistics (as PyTorch DDP): `--devices 0,0 --batch 32` equals one
  device with `--batch 16 --accumulate 2` (each micro-batch its own statistics, gradients summed
  with the same weights), on a model with batch norm and dropout: same training losses and weights.
- `--sync-bn` (statistics over every replica's samples) equals one device on the same global batch
  on that model, with SGD and Adam, an even and an uneven split (33 = 17 + 16), and two MPI ranks.
- An uneven split (batch 33 over two devices, 17 + 16, and three) with a short last validation
  batch of one sample counts every sample exactly once (train_samples, val_samples) and equals one
  device, also with class weights (each replica's weighted mean scaled by its share of the
  batch's weight) and with --accumulate.
- With --precision fp16 and a loss scale that overflows the first steps, `--devices 0,0` equals one
  device: the same skipped steps and scales (each replica checks the summed gradient).
- `mpirun -np 2` equals `--devices 0,0` and one device (rank 0's checkpoint: the same weights).
- A rank killed with SIGKILL ends the job with a non-zero exit within 30 s of the kill; a job
  killed after its first checkpoint and resumed under mpirun ends with the same weights as an
  uninterrupted run.
- Processes of an MPI job that see different data exit 5 before any collective could hang.
- Impossible flags exit 2 naming the flag; --dry-run prints one plan per device.
Every run is under the Khronos validation layer and must print no validation message.
"""
import json
import os
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

from data_tools import devices, on_host_cores, workdir

TESSERA = os.environ.get("TESSERA_BINARY", "build/tools/tessera")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# mpirun as root in a container, over loopback TCP (shared memory's single-copy path needs ptrace rights
# that containers often lack; TCP works everywhere).
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--mca", "btl", "self,tcp"]
COMMON = ["--width", 4, "--epochs", 2, "--seed", 3, "--val-fraction", 0.3]

BN_MODEL = {"name": "bn-dropout", "layers": [
    # No bias before a batch norm (as in ResNet): its gradient is zero but for rounding, which Adam scales up.
    {"name": "conv1", "type": "conv2d", "inputs": ["input"], "out_channels": 6, "kernel": 3, "padding": 1, "bias": False},
    {"name": "bn1", "type": "batch_norm2d"},
    {"name": "relu1", "type": "relu"},
    {"name": "pool1", "type": "max_pool2d", "kernel_size": 2},
    {"name": "flatten", "type": "flatten"},
    {"name": "fc1", "type": "linear", "out_features": 16},
    {"name": "relu2", "type": "relu"},
    {"name": "dropout", "type": "dropout", "p": 0.3},
    {"name": "fc2", "type": "linear", "out_features": 2}]}


@pytest.fixture(autouse=True, scope="module")
def device_zero_opens_more_than_once():
    """Every case opens device 0 two or three times (`--devices 0,0`, two MPI ranks): lavapipe
    may be opened so, a GPU is opened once by design (a GPU machine skips this file)."""
    device = devices(TESSERA)[0]
    if not on_host_cores(device):
        pytest.skip(f"device 0 is a {device['type']} ({device['name']}), which tessera opens once")


def run(args, check=True, mpi=0, env=None, timeout=600):
    command = [str(a) for a in args]
    if mpi:
        command = MPIRUN + ["-np", str(mpi)] + command
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                            env=dict(os.environ, TESSERA_VALIDATION="1", **(env or {})))
    assert "vulkan validation" not in result.stderr.lower(), result.stderr[-3000:]
    if check:
        assert result.returncode == 0, (command, result.returncode, result.stderr[-3000:])
    return result


def epochs(stderr):
    return [json.loads(line) for line in stderr.splitlines() if '"event":"epoch"' in line]


def params(path):
    with h5py.File(path, "r") as f:
        return {name: f["params"][name][()] for name in f["params"]}


def train(work, name, *flags, mpi=0, env=None):
    checkpoint = os.path.join(work, name + ".h5")
    result = run([TESSERA, "train", "--data", os.path.join(work, "task.h5"), *COMMON, *flags,
                  "--checkpoint", checkpoint, "--overwrite"], mpi=mpi, env=env)
    records = epochs(result.stderr)
    assert [r["epoch"] for r in records] == [1, 2], result.stderr[-3000:]
    return records, params(checkpoint)


def assert_same_run(a, b, keys=("train_loss", "val_loss", "train_accuracy", "val_accuracy"), skip=(), tolerance=1e-4):
    (records_a, params_a), (records_b, params_b) = a, b
    for ra, rb in zip(records_a, records_b):
        for key in keys:
            assert abs(ra[key] - rb[key]) <= 1e-5 * max(1.0, abs(ra[key])), (key, ra, rb)
        assert ra["train_samples"] == rb["train_samples"], (ra, rb)
    assert sorted(params_a) == sorted(params_b)
    for name in params_a:
        if any(word in name for word in skip):
            continue
        # Sums in another order differ in the last bits, which Adam scales up where a gradient is
        # near zero; a wrong weight of a replica's gradient moves weights by about the learning rate.
        scale = max(1e-3, float(np.abs(params_a[name]).max()))
        assert np.abs(params_a[name] - params_b[name]).max() <= tolerance * scale, name


def make_task(work, count):
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "make_patch_task.py"), "--out",
                    os.path.join(work, "task.h5"), "--count", str(count), "--size", "16", "--seed", "1"],
                   check=True, capture_output=True)


def test_devices_equal_one_device_sgd_and_adam():
    work = workdir("test_data_parallel_equal")
    make_task(work, 150)
    for optimizer in (["--optimizer", "sgd", "--lr", 0.05, "--momentum", 0.9], ["--optimizer", "adam", "--lr", 0.01]):
        one = train(work, "one", "--model", "small-cnn", "--batch", 32, *optimizer)
        two = train(work, "two", "--model", "small-cnn", "--batch", 32, "--devices", "0,0", *optimizer)
        assert_same_run(one, two)
        assert [r["replica_weight_difference"] for r in two[0]] == [0.0, 0.0]
        assert [r["replicas"] for r in two[0]] == [2, 2]
        # Training moved the weights: the comparison is not of two untouched initialisations.
        assert one[0][0]["train_loss"] != one[0][1]["train_loss"]
    # Accumulation: two micro-batches of 16 per step, each split over the replicas.
    flags = ["--model", "small-cnn", "--batch", 16, "--accumulate", 2, "--optimizer", "adam", "--lr", 0.01]
    assert_same_run(train(work, "one_k2", *flags), train(work, "two_k2", *flags, "--devices", "0,0"))


def bn_model(work):
    model = os.path.join(work, "bn.json")
    with open(model, "w") as f:
        json.dump(BN_MODEL, f)
    return model


def test_batch_norm_per_device_statistics():
    work = workdir("test_data_parallel_bn")
    make_task(work, 150)
    model = bn_model(work)
    flags = ["--model", model, "--optimizer", "adam", "--lr", 0.01]
    two = train(work, "two", *flags, "--batch", 32, "--devices", "0,0")
    halves = train(work, "halves", *flags, "--batch", 16, "--accumulate", 2)
    # Evaluation uses running statistics, which DDP takes from replica 0 alone: only training matches.
    assert_same_run(two, halves, keys=("train_loss", "train_accuracy"), skip=("running_",))
    whole = train(work, "whole", *flags, "--batch", 32)
    assert abs(whole[0][1]["train_loss"] - two[0][1]["train_loss"]) > 1e-4, "per-device statistics differ from the batch's"


def test_sync_bn_equals_one_device():
    work = workdir("test_data_parallel_sync_bn")
    make_task(work, 150)
    model = bn_model(work)
    sgd = ["--optimizer", "sgd", "--lr", 0.05, "--momentum", 0.9]
    # Adam turns the different summation order of the statistics into weight differences of up to
    # about 3e-4 of the weights' scale where a gradient is near zero; a wrong statistic or weight
    # would move them by about the learning rate.
    for optimizer, tolerance in ((sgd, 1e-4), (["--optimizer", "adam", "--lr", 0.01], 1e-3)):
        flags = ["--model", model, "--batch", 32, *optimizer]
        one = train(work, "one", *flags)
        two = train(work, "two", *flags, "--devices", "0,0", "--sync-bn")
        assert_same_run(one, two, tolerance=tolerance)
        assert one[0][0]["train_loss"] != one[0][1]["train_loss"]
    flags = ["--model", model, "--batch", 33, *sgd]
    one = train(work, "one_33", *flags)
    assert_same_run(one, train(work, "two_33", *flags, "--devices", "0,0", "--sync-bn"))
    assert_same_run(one, train(work, "ranks_33", *flags, "--device", 0, "--sync-bn", mpi=2))
    # Without --sync-bn the replicas' statistics differ from the batch's (test_batch_norm_per_device_statistics).
    apart = train(work, "apart_33", *flags, "--devices", "0,0")
    assert abs(apart[0][1]["train_loss"] - one[0][1]["train_loss"]) > 1e-4


def test_fp16_devices_equal_one_device_with_skipped_steps():
    work = workdir("test_data_parallel_fp16")
    make_task(work, 150)
    # A loss scale of 2^30 overflows the first steps' fp16 gradients: every replica must skip the
    # same steps and halve its scale in step, since each checks the summed gradient.
    overflow = {"TESSERA_FAULT": "loss_scale:1073741824"}
    flags = ["--model", "small-cnn", "--batch", 32, "--optimizer", "adam", "--lr", 0.01, "--precision", "fp16"]
    one = train(work, "one", *flags, env=overflow)
    two = train(work, "two", *flags, "--devices", "0,0", env=overflow)
    assert_same_run(one, two)
    assert [r["skipped_steps"] for r in two[0]] == [r["skipped_steps"] for r in one[0]]
    assert [r["loss_scale"] for r in two[0]] == [r["loss_scale"] for r in one[0]]
    assert one[0][0]["skipped_steps"] > 0 and one[0][-1]["loss_scale"] < 1073741824
    assert [r["replica_weight_difference"] for r in two[0]] == [0.0, 0.0]


def test_uneven_split_counts_every_sample_once():
    work = workdir("test_data_parallel_uneven")
    # 113 patches, 34 held out: training 79 (two batches of 33, 17 + 16 per device; 13 dropped as on
    # one device), validation 33 + 1 (the last batch's one sample on the first device only).
    make_task(work, 113)
    flags = ["--model", "small-cnn", "--batch", 33, "--optimizer", "adam", "--lr", 0.01]
    one = train(work, "one", *flags)
    two = train(work, "two", *flags, "--devices", "0,0")
    three = train(work, "three", *flags, "--devices", "0,0,0")
    for records in (one[0], two[0], three[0]):
        assert [r["train_samples"] for r in records] == [66, 66]
        assert [r["val_samples"] for r in records] == [34, 34]
    assert_same_run(one, two)
    assert_same_run(one, three)
    # Class weights: each replica's loss is a weighted mean over its own samples, so its gradient
    # is scaled by its samples' share of the batch's total weight, which differs batch by batch.
    weighted = [*flags, "--class-weights", "1,3"]
    assert_same_run(train(work, "one_weighted", *weighted), train(work, "three_weighted", *weighted, "--devices", "0,0,0"))


def test_mpi_equals_devices_and_one_device():
    work = workdir("test_data_parallel_mpi")
    make_task(work, 150)
    flags = ["--model", "small-cnn", "--batch", 32, "--optimizer", "adam", "--lr", 0.01]
    one = train(work, "one", *flags)
    two = train(work, "two", *flags, "--devices", "0,0")
    ranks = train(work, "ranks", *flags, "--device", 0, mpi=2)
    assert_same_run(two, ranks)
    assert_same_run(one, ranks)
    # Validation scores are gathered from both ranks: the AUC over all 45 samples, as in one process.
    assert [r["val_auc"] for r in ranks[0]] == [r["val_auc"] for r in two[0]]
    # Two ranks of two devices each: four replicas.
    four = train(work, "four", *flags, "--devices", "0,0", mpi=2)
    assert [r["replicas"] for r in four[0]] == [4, 4]
    assert_same_run(one, four)


def test_mpi_rank_killed_ends_the_job():
    work = workdir("test_data_parallel_kill")
    make_task(work, 150)
    # Rank 1 kills itself with SIGKILL right after epoch 1, whose record rank 0 prints just before;
    # rank 0 would otherwise wait for it forever. Timed from that record, not from start-up, which a
    # loaded machine stretches.
    command = MPIRUN + ["-np", "2", TESSERA, "train", "--data", os.path.join(work, "task.h5"), *map(str, COMMON[:2]),
                        "--epochs", "1000", "--model", "small-cnn", "--batch", "32", "--device", "0"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               env=dict(os.environ, TESSERA_VALIDATION="1", TESSERA_FAULT="sigkill:1:1"))
    stderr, killed_at = [], None
    for line in process.stderr:
        stderr.append(line)
        if killed_at is None and '"event":"epoch"' in line:
            killed_at = time.monotonic()
    code = process.wait(timeout=300)
    assert killed_at is not None, "".join(stderr)[-3000:]
    after_kill = time.monotonic() - killed_at
    stderr = "".join(stderr)
    assert code != 0, stderr[-3000:]
    assert "rank 1" in stderr and "signal 9" in stderr, stderr[-3000:]
    assert "vulkan validation" not in stderr.lower(), stderr[-3000:]
    assert len(epochs(stderr)) < 1000
    print(f"the job ended {after_kill:.1f} s after the kill")
    assert after_kill < 30, after_kill  # the bound


def test_mpi_kill_and_resume_equals_uninterrupted():
    work = workdir("test_data_parallel_resume")
    make_task(work, 150)
    flags = ["--model", "small-cnn", "--batch", 32, "--optimizer", "adam", "--lr", 0.01, "--device", 0]
    whole = train(work, "whole", *flags, mpi=2)
    checkpoint = os.path.join(work, "resumed.h5")
    args = [TESSERA, "train", "--data", os.path.join(work, "task.h5"), *COMMON, *flags, "--checkpoint", checkpoint]
    killed = run(args, mpi=2, check=False, env={"TESSERA_FAULT": "sigkill:1:0"})
    assert killed.returncode != 0 and [r["epoch"] for r in epochs(killed.stderr)] == [1], killed.stderr[-3000:]
    resumed = run(args + ["--resume"], mpi=2)
    assert [r["epoch"] for r in epochs(resumed.stderr)] == [2], resumed.stderr[-3000:]
    final = params(checkpoint)
    for name, value in whole[1].items():
        assert np.array_equal(value, final[name]), name


def test_flags_and_plans():
    work = workdir("test_data_parallel_flags")
    make_task(work, 150)
    data = ["train", "--data", os.path.join(work, "task.h5"), "--model", "small-cnn"]
    for args, words in (([*data, "--devices", "0,7"], ["--devices", "device 7"]),
                        ([*data, "--devices", "0,0", "--batch", 1], ["--devices", "2 replicas"]),
                        ([*data, "--devices", "0,0", "--device", 0], ["--devices", "--device"]),
                        ([*data, "--sync-bn"], ["--sync-bn", "this run has one"]),
                        ([*data, "--devices", "0,0", "--sync-bn"], ["--sync-bn", "no batch norm"])):
        result = run([TESSERA, *args], check=False)
        assert result.returncode == 2, (args, result.returncode, result.stderr)
        for word in words:
            assert word in result.stderr, (word, result.stderr)
    plans = run([TESSERA, *data, "--devices", "0,0", "--batch", 33, "--dry-run"])
    lines = [json.loads(line) for line in plans.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 2 and all(line["fits"] for line in lines), plans.stdout
    # The first device takes 17 samples of 33 and also stages whole batches; both hold a gradient
    # exchange buffer. On a discrete GPU (two heaps) those two are host memory, which a device's
    # plan leaves out.
    assert lines[0]["total_bytes"] > lines[1]["total_bytes"] > 0
    one_heap = len(json.loads(run([TESSERA, "info", "--json"]).stdout)["devices"][0]["heaps"]) == 1
    assert all((line["bytes"]["gradient exchange"] > 0) == one_heap for line in lines), lines
    small = run([TESSERA, *data, "--devices", "0,0", "--dry-run", "--device-memory-limit", "64KiB"], check=False)
    assert small.returncode == 3, small.stderr


def test_mpi_processes_that_see_different_data_exit_instead_of_hanging():
    work = workdir("test_data_parallel_disagree")
    make_task(work, 150)
    other = os.path.join(work, "other.h5")
    os.rename(os.path.join(work, "task.h5"), other)
    make_task(work, 113)  # 79 training patches: two steps of 32 where the other process has three
    args = ["train", "--model", "small-cnn", *COMMON, "--batch", 32, "--device", 0]
    command = MPIRUN + ["-np", "1", TESSERA, *map(str, args), "--data", os.path.join(work, "task.h5"), ":",
                        "-np", "1", TESSERA, *map(str, args), "--data", other]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, TESSERA_VALIDATION="1"))
    assert result.returncode == 5, (result.returncode, result.stderr[-3000:])
    assert "see different runs" in result.stderr and "steps per epoch" in result.stderr, result.stderr[-3000:]
    assert "vulkan validation" not in result.stderr.lower()

"""Checks every command makes before work: an output that is an input, an untrained model run
as if trained, empty or non-finite input. Files are read back with h5py.
Run by ctest as: /usr/bin/python3 -m pytest tests/test_cli_checks.py (TESSERA_BINARY names the binary).
"""
import hashlib
import os
import subprocess

import h5py
import numpy as np
import pytest

TESSERA = os.environ.get("TESSERA_BINARY", "build/tools/tessera")


def tessera(*args):
    return subprocess.run([TESSERA, *args], capture_output=True, text=True)


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def write_images(path, images):
    with h5py.File(path, "w") as f:
        f["x"] = images


def test_forward_output_that_is_its_input_is_refused(tmp_path):
    images = tmp_path / "images.h5"
    write_images(images, np.zeros((2, 3, 16, 16), np.float32))
    before = digest(images)
    for output in (tmp_path / "." / "images.h5", tmp_path / "link.h5"):
        if output.name == "link.h5":
            os.symlink(images, output)
        result = tessera("forward", "--model", "small-cnn", "--random-weights", "--input", str(images),
                         "--output", str(output))
        assert result.returncode == 2, result.stderr
        assert "--output" in result.stderr and "--input" in result.stderr
        assert digest(images) == before
    assert not (tmp_path / "images.h5.partial").exists()


@pytest.mark.parametrize("command", ["forward", "extract"])
def test_untrained_model_needs_random_weights(tmp_path, command):
    images = tmp_path / "images.h5"
    write_images(images, np.zeros((2, 3, 16, 16), np.float32))
    if command == "forward":
        args = ["forward", "--input", str(images), "--output", str(tmp_path / "logits.h5")]
    else:
        args = ["extract", "--layer", "pool2", "--tiles", str(tmp_path / "none.lmdb"), "--out", str(tmp_path / "f")]
    result = tessera(*args, "--model", "small-cnn")
    assert result.returncode == 2, result.stderr
    assert "--random-weights" in result.stderr
    assert not (tmp_path / "logits.h5").exists() and not (tmp_path / "f").exists()


def test_forward_of_no_images_is_bad_input(tmp_path):
    images = tmp_path / "empty.h5"
    write_images(images, np.zeros((0, 3, 32, 32), np.float32))
    result = tessera("forward", "--model", "small-cnn", "--random-weights", "--input", str(images),
                     "--output", str(tmp_path / "logits.h5"))
    assert result.returncode == 5, result.stderr
    assert str(images) in result.stderr
    assert not (tmp_path / "logits.h5").exists()


@pytest.mark.parametrize("model", ["small-cnn", "resnet18"])
def test_forward_propagates_nan_like_pytorch(tmp_path, model):
    """ReLU and max pooling keep NaN (PyTorch does), so NaN inputs give NaN logits, not numbers."""
    rng = np.random.default_rng(0)
    images = rng.standard_normal((2, 3, 32, 32)).astype(np.float32)
    images[1, :, 4:12, 4:12] = np.nan
    write_images(tmp_path / "images.h5", images)
    logits_path = tmp_path / "logits.h5"
    result = tessera("forward", "--model", model, "--random-weights", "--input", str(tmp_path / "images.h5"),
                     "--output", str(logits_path))
    assert result.returncode == 0, result.stderr
    with h5py.File(logits_path, "r") as f:
        logits = f["logits"][()]
    assert np.isfinite(logits[0]).all()
    assert np.isnan(logits[1]).all()


@pytest.mark.parametrize("command", ["forward", "extract"])
def test_plan_over_the_memory_limit_is_exit_3_before_any_work(tmp_path, command):
    """The inference path checks its plan against --device-memory-limit before it allocates,
    tiles or writes anything, naming the plan and the budget."""
    if command == "forward":
        write_images(tmp_path / "images.h5", np.zeros((4, 3, 64, 64), np.float32))
        args = ["forward", "--input", str(tmp_path / "images.h5"), "--output", str(tmp_path / "out")]
    else:
        slide = tmp_path / "slide.tiff"
        synth = tessera("synth", str(slide), "--width", "512", "--height", "512", "--seed", "3")
        assert synth.returncode == 0, synth.stderr
        args = ["extract", "--layer", "layer3", "--slides", str(slide), "--size", "64", "--out", str(tmp_path / "out")]
    result = tessera(*args, "--model", "resnet18", "--random-weights", "--device-memory-limit", "4MiB")
    assert result.returncode == 3, result.stderr
    assert "the run needs" in result.stderr and "the budget is 4.0 MiB" in result.stderr, result.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists(), os.listdir(tmp_path)
    # Within the limit the same command runs.
    result = tessera(*args, "--model", "resnet18", "--random-weights", "--device-memory-limit", "1GiB")
    assert result.returncode == 0, result.stderr


def test_no_vulkan_device_is_an_error_that_says_how_to_see_why(tmp_path):
    """A driver manifest that names a missing library leaves the loader with no driver: info and
    a command that needs a device fail (exit 1) and say how to see what the loader tried."""
    manifest = tmp_path / "missing_icd.json"
    manifest.write_text('{"file_format_version": "1.0.0", "ICD": {"library_path": "%s", "api_version": "1.3.0"}}'
                        % (tmp_path / "libnone.so"))
    env = dict(os.environ, VK_DRIVER_FILES=str(manifest), VK_ICD_FILENAMES=str(manifest))
    env.pop("VK_INSTANCE_LAYERS", None)
    write_images(tmp_path / "x.h5", np.zeros((2, 3, 16, 16), np.float32))
    for args in (["info"], ["info", "--json"], ["forward", "--model", "small-cnn", "--random-weights",
                                                "--input", str(tmp_path / "x.h5"), "--output", str(tmp_path / "y.h5")]):
        result = subprocess.run([TESSERA, *args], capture_output=True, text=True, env=env)
        assert result.returncode == 1, (args, result.stdout, result.stderr)
        assert "no Vulkan" in result.stderr and "VK_LOADER_DEBUG" in result.stderr, result.stderr
        assert result.stdout == "" and not (tmp_path / "y.h5").exists()

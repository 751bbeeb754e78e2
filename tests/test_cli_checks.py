"""Checks every command makes before work: an output that is an input, an untrained model run
as if trained, empty or non-finite input. Files are read back with h5py.
Run by ctest as: /usr/bin/python3 -m pytest tests/test_cli_checks.py (TESSERA_BINARY names the binary).
"""
import hashlib
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest

from data_tools import patch_task

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


@pytest.mark.parametrize("name", ["model.safetensors", "model.PT", "model.pth"])
def test_a_checkpoint_named_for_another_format_is_refused(tmp_path, name):
    """Checkpoints are HDF5: a name that says PyTorch's or safetensors' format is exit 2 naming the
    flag, before anything is written."""
    patches = patch_task(str(tmp_path / "patches.h5"), 4, 16)
    result = tessera("train", "--data", patches, "--model", "small-cnn", "--checkpoint", str(tmp_path / name))
    assert result.returncode == 2, result.stderr
    assert "--checkpoint" in result.stderr and "HDF5" in result.stderr and ".h5" in result.stderr, result.stderr
    assert sorted(os.listdir(tmp_path)) == ["patches.h5"]


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


@pytest.mark.parametrize("value, precision, what", [
    (np.nan, "fp32", "is nan: images must be finite"), (np.inf, "fp32", "is inf: images must be finite"),
    (-np.inf, "fp16", "is -inf: images must be finite"),
    (1e5, "fp16", "is 1e+05: --precision fp16 converts images to float16, whose largest value is 65504 (give "
                  "--precision fp32)")])
def test_forward_refuses_a_pixel_that_is_not_finite(tmp_path, value, precision, what):
    """A NaN pixel gave its image a row of NaN logits: a value that is not finite (or, with fp16
    activations, that the upload's conversion makes an infinity) is exit 5 naming the image and the
    pixel, before any work; nothing is written."""
    rng = np.random.default_rng(0)
    images = rng.standard_normal((3, 3, 32, 32)).astype(np.float32)
    images[1, 2, 5, 7] = value
    images[2, 0, 0, 0] = value  # a later one too: the first is named
    write_images(tmp_path / "images.h5", images)
    result = tessera("forward", "--model", "small-cnn", "--random-weights", "--input", str(tmp_path / "images.h5"),
                     "--output", str(tmp_path / "logits.h5"), "--precision", precision)
    assert result.returncode == 5, result.stderr
    assert f"{tmp_path / 'images.h5'}: dataset x: image 1 (channel 2, y 5, x 7) {what}" in result.stderr, result.stderr
    assert os.listdir(tmp_path) == ["images.h5"], os.listdir(tmp_path)
    # Within float16's range the same images run in fp16.
    if np.isfinite(value):
        images[1, 2, 5, 7] = images[2, 0, 0, 0] = 65504
        write_images(tmp_path / "images.h5", images)
        result = tessera("forward", "--model", "small-cnn", "--random-weights", "--input",
                         str(tmp_path / "images.h5"), "--output", str(tmp_path / "logits.h5"), "--precision", "fp16")
        assert result.returncode == 0, result.stderr


def positive_model(tmp_path):
    """small-cnn with every weight made positive and no bias: for an image of one value v >= 0 every
    activation is v times a constant, so its logits are v * K, K computed here in float64."""
    torch = pytest.importorskip("torch")
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
    from tessera_presets import build_preset
    torch.manual_seed(5)
    model = build_preset("small-cnn", 2, (16, 16), 8).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.copy_(parameter.abs() if name.endswith("weight") else torch.zeros_like(parameter))
        constant = model.double()(torch.ones((1, 3, 16, 16), dtype=torch.float64))[0].numpy()
    torch.save(model.float().state_dict(), tmp_path / "positive.pt")
    converter = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "torch_to_tessera.py")
    subprocess.run([sys.executable, converter, "--state-dict", str(tmp_path / "positive.pt"), "--preset",
                    "small-cnn", "--out", str(tmp_path / "positive.h5")], check=True, capture_output=True)
    return str(tmp_path / "positive.h5"), constant


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_forward_refuses_logits_that_are_not_finite(tmp_path, precision):
    """Finite pixels whose logits overflow (past float32's largest, or in fp16 past 65504) are exit 5
    naming the image and the logit; no logits file is written. The images before it are not at fault."""
    model, constant = positive_model(tmp_path)
    largest = 65504.0 if precision == "fp16" else float(np.finfo(np.float32).max)
    assert constant.min() > 0 and constant.max() < 1e4, constant
    values = [1.0, 4 * largest / constant.min(), 1.0]  # image 1's every logit overflows
    images = np.stack([np.full((3, 16, 16), v, np.float32) for v in values])
    assert np.isfinite(images).all() and (precision == "fp32" or images.max() < 65504)
    write_images(tmp_path / "images.h5", images)
    result = tessera("forward", "--model", model, "--input", str(tmp_path / "images.h5"), "--output",
                     str(tmp_path / "logits.h5"), "--precision", precision)
    assert result.returncode == 5, result.stderr
    assert f"{tmp_path / 'images.h5'}: dataset x: image 1: logit 0 is " in result.stderr, result.stderr
    assert "the model's output is not finite" in result.stderr, result.stderr
    assert ("--precision fp32" in result.stderr) == (precision == "fp16"), result.stderr
    assert not (tmp_path / "logits.h5").exists() and not (tmp_path / "logits.h5.partial").exists()
    # Without the image, the others' logits are v * K (to float32's rounding).
    write_images(tmp_path / "images.h5", images[[0, 2]])
    result = tessera("forward", "--model", model, "--input", str(tmp_path / "images.h5"), "--output",
                     str(tmp_path / "logits.h5"), "--precision", precision)
    assert result.returncode == 0, result.stderr
    with h5py.File(tmp_path / "logits.h5", "r") as f:
        logits = f["logits"][()]
    np.testing.assert_allclose(logits, np.stack([constant, constant]), rtol=1e-2 if precision == "fp16" else 1e-5)


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

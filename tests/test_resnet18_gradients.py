"""Whole-model check of training: resnet18's parameter gradients after one step, and the
losses of a few SGD steps, from `tessera train` against PyTorch in float64.

One batch of four 64x64 patches (--val-fraction 0), so an epoch is one step and each epoch's
train_loss is that step's loss. tessera starts from the same weights (tools/torch_to_tessera.py);
after one plain SGD step (no momentum, no weight decay) its gradient is (w0 - w1) / lr.
Run by ctest under pytest (TESSERA_BINARY names the binary).
"""
import json
import os
import subprocess
import sys

import h5py
import numpy as np
import pytest
import torch
import torchvision

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tools"))
from tessera_presets import normalise  # noqa: E402

TESSERA = os.environ.get("TESSERA_BINARY", "build/tools/tessera")
CONVERTER = os.path.join(REPO, "tools", "torch_to_tessera.py")
STEPS, LR = 3, 0.01


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    work = tmp_path_factory.mktemp("resnet18-gradients")
    rng = np.random.default_rng(11)
    images = rng.integers(0, 256, (4, 64, 64, 3), dtype=np.uint8)
    labels = np.array([0, 1, 1, 0], np.uint8)
    data = work / "patches.h5"
    with h5py.File(data, "w") as f:
        f["x"] = images
        f["y"] = labels
    torch.manual_seed(3)
    model = torchvision.models.resnet18(num_classes=2)
    torch.save(model.state_dict(), work / "start.pt")
    start = work / "start.h5"
    subprocess.run([sys.executable, CONVERTER, "--state-dict", str(work / "start.pt"), "--preset", "resnet18",
                    "--out", str(start)], check=True, capture_output=True)
    return work, data, start, model, images, labels


def train(work, data, start, name, epochs, lr):
    checkpoint = work / name
    process = subprocess.run([TESSERA, "train", "--data", str(data), "--model", str(start), "--batch", "4",
                              "--epochs", str(epochs), "--optimizer", "sgd", "--lr", str(lr), "--momentum", "0",
                              "--val-fraction", "0", "--workers", "1", "--checkpoint", str(checkpoint)],
                             capture_output=True, text=True)
    assert process.returncode == 0, process.stderr
    losses = [json.loads(line)["train_loss"] for line in process.stderr.splitlines()
              if line.startswith("{") and '"event":"epoch"' in line]
    with h5py.File(checkpoint, "r") as f:
        params = {}
        f["params"].visititems(lambda n, o: params.__setitem__(n, o[()].astype(np.float64))
                               if isinstance(o, h5py.Dataset) else None)
    return losses, params


def torch_reference(start_model, images, labels, steps, lr):
    model = torchvision.models.resnet18(num_classes=2)
    model.load_state_dict(start_model.state_dict())
    model = model.double().train()
    x = normalise(images).double()
    y = torch.as_tensor(labels.astype(np.int64))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses, first_grads = [], None
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        if first_grads is None:
            first_grads = {name: p.grad.detach().numpy().copy() for name, p in model.named_parameters()}
        optimizer.step()
        losses.append(loss.item())
    return losses, first_grads


def relative_error(actual, expected):
    return float(np.abs(actual - expected).max() / max(np.abs(expected).max(), 1e-12))


def test_parameter_gradients_after_one_step_match_pytorch(task):
    work, data, start, model, images, labels = task
    lr = 1.0  # large, so that w0 - w1 keeps the gradient's digits in float32
    _, after = train(work, data, start, "one_step.h5", 1, lr)
    with h5py.File(start, "r") as f:
        before = {name: f["params"][name][()].astype(np.float64) for name in after}
    _, expected = torch_reference(model, images, labels, 1, lr)
    assert set(expected) <= set(after), sorted(set(expected) - set(after))
    errors = {name: relative_error((before[name] - after[name]) / lr, grad) for name, grad in expected.items()}
    worst = max(errors, key=errors.get)
    # float32 sums over up to 4608-element windows against float64: about 2e-3 at worst here; a
    # wrong backward is off by order 1.
    assert errors[worst] < 1e-2, (worst, errors[worst])
    # Every gradient is really there (a zero or missing gradient would pass a loose check).
    assert all(np.abs(grad).max() > 0 for grad in expected.values())


def test_losses_of_several_steps_match_pytorch(task):
    work, data, start, model, images, labels = task
    losses, _ = train(work, data, start, "steps.h5", STEPS, LR)
    expected, _ = torch_reference(model, images, labels, STEPS, LR)
    assert len(losses) == STEPS
    np.testing.assert_allclose(losses, expected, rtol=1e-3, atol=1e-4)
    assert expected[-1] < expected[0]  # the steps do train

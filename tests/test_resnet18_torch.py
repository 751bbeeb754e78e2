"""resnet18 converted from PyTorch gives PyTorch's logits in `tessera forward`, and one
training step of `tessera train` gives PyTorch's gradients and running statistics.

Run by ctest as: /usr/bin/python3 tests/test_resnet18_torch.py TESSERA_BINARY

A seeded torchvision resnet18 (10 classes) gets non-trivial batch-norm running statistics
and affine parameters, so eval-mode batch norm is really exercised; it is converted with
tools/torch_to_tessera.py, and `tessera forward` runs it on a random normalised input
[2,3,64,64]. The logits must match PyTorch's (computed in float64) with a relative error
max|a-b| / max|b| under 1e-4. Also checks that the converter rejects misshapen and missing
tensors with exit code 5, naming the tensor.

The training step (SGD, no momentum, one batch of 4 random 64x64 patches, train-mode batch
norm) runs resnet18 (ReLUs fused into its batch norms) and a conv/dense net given as a model
graph (ReLUs fused into a convolution and a dense layer); each parameter's gradient
(before - after) / lr and each running statistic must match PyTorch's within 1e-4 relative
to the tensor's largest value.
"""
import copy
import json
import os
import subprocess
import sys
import tempfile
import unittest

import h5py
import numpy as np
import torch
import torchvision

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
from tessera_presets import normalise  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONVERTER = os.path.join(REPO, "tools", "torch_to_tessera.py")
CLASSES = 10
INPUT_SHAPE = (2, 3, 64, 64)
TOLERANCE = 1e-4
EXIT_BAD_INPUT = 5
TESSERA = os.environ.get("TESSERA_BINARY", "build/tools/tessera")


def relative_error(actual, expected):
    return float(np.abs(actual - expected).max() / np.abs(expected).max())


def seeded_resnet(name, seed, classes=CLASSES):
    """A torchvision resnet with random weights and perturbed, calibrated batch-norm statistics."""
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = getattr(torchvision.models, name)(num_classes=classes)
    batch_norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    with torch.no_grad():
        for bn in batch_norms:
            bn.weight.uniform_(0.5, 1.5, generator=generator)
            bn.bias.normal_(0.0, 0.2, generator=generator)
            bn.momentum = None  # cumulative average over the calibration batches
        model.train()
        for _ in range(2):
            model(torch.randn(4, 3, 64, 64, generator=generator))
        for bn in batch_norms:
            bn.running_mean.add_(0.1 * bn.running_var.sqrt()
                                 * torch.randn(bn.running_mean.shape, generator=generator))
            bn.running_var.mul_(torch.empty(bn.running_var.shape).uniform_(0.8, 1.25, generator=generator))
    return model.eval()


# A conv/dense net as a tessera model graph and its PyTorch twin (modules named as the layers).
CONV_DENSE_GRAPH = {"name": "conv-dense", "layers": [
    {"name": "conv", "type": "conv2d", "out_channels": 8, "kernel": 3, "padding": 1},
    {"name": "relu1", "type": "relu"},
    {"name": "pool", "type": "max_pool2d", "kernel_size": 4},
    {"name": "flatten", "type": "flatten"},
    {"name": "fc1", "type": "linear", "out_features": 16},
    {"name": "relu2", "type": "relu"},
    {"name": "fc2", "type": "linear", "out_features": 2}]}


class ConvDense(torch.nn.Module):
    def __init__(self, side):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc1 = torch.nn.Linear(8 * (side // 4) ** 2, 16)
        self.fc2 = torch.nn.Linear(16, 2)

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv(x)), 4)
        return self.fc2(torch.relu(self.fc1(torch.flatten(x, 1))))


def write_graph_checkpoint(path, graph, model):
    """A tessera checkpoint of a model graph with the PyTorch module's parameters."""
    with h5py.File(path, "w") as f:
        f.attrs["model"] = json.dumps(graph)
        for name, value in model.state_dict().items():
            if not name.endswith("num_batches_tracked"):
                f.create_dataset(f"params/{name}", data=value.numpy().astype(np.float32))


def run(command):
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


def check_logits_match_torch(test, tessera, model, checkpoint, work, seed):
    """`tessera forward` of `checkpoint` on a random normalised input [2,3,64,64] gives the
    logits of `model` (eval mode, float64) within TOLERANCE."""
    x = torch.randn(INPUT_SHAPE, generator=torch.Generator().manual_seed(seed))
    inputs, outputs = os.path.join(work, "input.h5"), os.path.join(work, "output.h5")
    with h5py.File(inputs, "w") as f:
        f.create_dataset("x", data=x.numpy().astype(np.float32))
    with torch.no_grad():
        expected = copy.deepcopy(model).double()(x.double()).numpy()
        batch_statistics = copy.deepcopy(model).double().train()(x.double()).numpy()
        float32 = model(x).numpy()
    # Guards that make the comparison meaningful: the logits vary, and running
    # statistics differ from batch statistics (an eval-mode slip would be caught).
    test.assertGreater(float(expected.std()), 1e-2, "reference logits are nearly constant")
    test.assertGreater(relative_error(batch_statistics, expected), 100 * TOLERANCE,
                       "batch-norm running statistics are too close to batch statistics")

    forward = run([tessera, "forward", "--model", checkpoint, "--input", inputs, "--output", outputs])
    test.assertEqual(forward.returncode, 0, f"`tessera forward` exited {forward.returncode}:\n{forward.stderr[-4000:]}")
    with h5py.File(outputs, "r") as f:
        test.assertIn("logits", f, "output.h5 has no dataset 'logits'")
        logits = f["logits"]
        test.assertEqual(logits.dtype, np.float32, "dataset 'logits' is not float32")
        logits = logits[...]
    test.assertEqual(logits.shape, expected.shape, "dataset 'logits' has the wrong shape")
    error = relative_error(logits, expected)
    print(f"{os.path.basename(checkpoint)} logits: tessera vs PyTorch float64 relative error {error:.3g} "
          f"(PyTorch float32: {relative_error(float32, expected):.3g}; limit {TOLERANCE})", file=sys.stderr)
    test.assertLess(error, TOLERANCE, f"tessera logits differ from PyTorch's: relative error {error:.3g}\n"
                    f"tessera:\n{logits}\nPyTorch:\n{expected}")


def convert(state_dict_path, checkpoint_path):
    return run([sys.executable, CONVERTER, "--state-dict", state_dict_path,
                "--preset", "resnet18", "--out", checkpoint_path])


class Resnet18MatchesTorch(unittest.TestCase):
    def setUp(self):
        self.directory = tempfile.TemporaryDirectory(prefix="tessera-resnet18-")
        self.dir = self.directory.name
        self.model = seeded_resnet("resnet18", seed=1234)

    def tearDown(self):
        self.directory.cleanup()

    def path(self, name):
        return os.path.join(self.dir, name)

    def test_forward_logits_match_torch(self):
        torch.save(self.model.state_dict(), self.path("resnet18.pt"))
        converted = convert(self.path("resnet18.pt"), self.path("resnet18.h5"))
        self.assertEqual(converted.returncode, 0, f"converter failed:\n{converted.stderr}")

        check_logits_match_torch(self, TESSERA, self.model, self.path("resnet18.h5"), self.dir, seed=99)

    def check_training_step(self, model, checkpoint):
        """One SGD step of `tessera train` from `checkpoint` against PyTorch's on `model`."""
        lr = 0.1
        generator = np.random.default_rng(5)
        images = generator.integers(0, 256, (4, 64, 64, 3), dtype=np.uint8)
        labels = np.array([0, 1, 1, 0], dtype=np.uint8)
        with h5py.File(self.path("patches.h5"), "w") as f:
            f.create_dataset("x", data=images)
            f.create_dataset("y", data=labels)
        trained = run([TESSERA, "train", "--data", self.path("patches.h5"), "--model", checkpoint, "--epochs", "1",
                       "--batch", "4", "--val-fraction", "0", "--optimizer", "sgd", "--momentum", "0", "--lr", str(lr),
                       "--checkpoint", self.path("trained.h5")])
        self.assertEqual(trained.returncode, 0, f"`tessera train` exited {trained.returncode}:\n{trained.stderr[-4000:]}")

        model = copy.deepcopy(model).double().train()
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.momentum = 0.1  # tessera's (seeded_resnet calibrated with a cumulative average)
        before = {k: v.clone() for k, v in model.state_dict().items()}
        loss = torch.nn.functional.cross_entropy(model(normalise(images).double()), torch.as_tensor(labels).long())
        loss.backward()
        expected = {name: p.grad for name, p in model.named_parameters()}
        expected.update({k: v for k, v in model.state_dict().items() if "running" in k})
        with h5py.File(self.path("trained.h5"), "r") as f:
            for name, reference in expected.items():
                after = torch.as_tensor(f["params"][name][...]).double()
                actual = after if "running" in name else (before[name] - after) / lr
                error = float((actual - reference).abs().max() / reference.abs().max())
                self.assertLess(error, TOLERANCE, f"{name}: relative error {error:.3g}")

    def test_training_step_matches_torch(self):
        model = seeded_resnet("resnet18", seed=77, classes=2)
        torch.save(model.state_dict(), self.path("resnet18.pt"))
        converted = convert(self.path("resnet18.pt"), self.path("resnet18.h5"))
        self.assertEqual(converted.returncode, 0, converted.stderr)
        self.check_training_step(model, self.path("resnet18.h5"))

    def test_conv_dense_training_step_matches_torch(self):
        torch.manual_seed(3)
        model = ConvDense(64)
        write_graph_checkpoint(self.path("conv_dense.h5"), CONV_DENSE_GRAPH, model)
        self.check_training_step(model, self.path("conv_dense.h5"))

    def test_converter_rejects_wrong_shape(self):
        state_dict = self.model.state_dict()
        state_dict["layer3.1.conv2.weight"] = torch.zeros(256, 256, 3, 1)
        torch.save(state_dict, self.path("bad_shape.pt"))
        result = convert(self.path("bad_shape.pt"), self.path("bad_shape.h5"))
        self.assertEqual(result.returncode, EXIT_BAD_INPUT, result.stderr)
        self.assertIn("layer3.1.conv2.weight", result.stderr)
        self.assertIn("[256, 256, 3, 3]", result.stderr)
        self.assertFalse(os.path.exists(self.path("bad_shape.h5")), "rejected checkpoint was written")

    def test_converter_rejects_missing_tensor(self):
        state_dict = self.model.state_dict()
        del state_dict["layer2.0.downsample.1.running_var"]
        torch.save(state_dict, self.path("missing.pt"))
        result = convert(self.path("missing.pt"), self.path("missing.h5"))
        self.assertEqual(result.returncode, EXIT_BAD_INPUT, result.stderr)
        self.assertIn("missing tensor 'layer2.0.downsample.1.running_var'", result.stderr)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        TESSERA = sys.argv.pop(1)
    unittest.main(verbosity=2)

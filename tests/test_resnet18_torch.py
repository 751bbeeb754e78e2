"""resnet18 converted from PyTorch gives PyTorch's logits in `tessera forward`.

Run by ctest as: /usr/bin/python3 tests/test_resnet18_torch.py TESSERA_BINARY

A seeded torchvision resnet18 (10 classes) gets non-trivial batch-norm running statistics
and affine parameters, so eval-mode batch norm is really exercised; it is converted with
tools/torch_to_tessera.py, and `tessera forward` runs it on a random normalised input
[2,3,64,64]. The logits must match PyTorch's (computed in float64) with a relative error
max|a-b| / max|b| under 1e-4. Also checks that the converter rejects misshapen and missing
tensors with exit code 5, naming the tensor.
"""
import copy
import os
import subprocess
import sys
import tempfile
import unittest

import h5py
import numpy as np
import torch
import torchvision

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONVERTER = os.path.join(REPO, "tools", "torch_to_tessera.py")
CLASSES = 10
INPUT_SHAPE = (2, 3, 64, 64)
TOLERANCE = 1e-4
EXIT_BAD_INPUT = 5
TESSERA = os.environ.get("TESSERA_BINARY", "build/tools/tessera")


def relative_error(actual, expected):
    return float(np.abs(actual - expected).max() / np.abs(expected).max())


def seeded_resnet18(seed):
    """resnet18 with random weights and perturbed, calibrated batch-norm statistics."""
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = torchvision.models.resnet18(num_classes=CLASSES)
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


def run(command):
    return subprocess.run(command, capture_output=True, text=True, timeout=600)


def convert(state_dict_path, checkpoint_path):
    return run([sys.executable, CONVERTER, "--state-dict", state_dict_path,
                "--preset", "resnet18", "--out", checkpoint_path])


class Resnet18MatchesTorch(unittest.TestCase):
    def setUp(self):
        self.directory = tempfile.TemporaryDirectory(prefix="tessera-resnet18-")
        self.dir = self.directory.name
        self.model = seeded_resnet18(seed=1234)

    def tearDown(self):
        self.directory.cleanup()

    def path(self, name):
        return os.path.join(self.dir, name)

    def test_forward_logits_match_torch(self):
        torch.save(self.model.state_dict(), self.path("resnet18.pt"))
        converted = convert(self.path("resnet18.pt"), self.path("resnet18.h5"))
        self.assertEqual(converted.returncode, 0, f"converter failed:\n{converted.stderr}")

        x = torch.randn(INPUT_SHAPE, generator=torch.Generator().manual_seed(99))
        with h5py.File(self.path("input.h5"), "w") as f:
            f.create_dataset("x", data=x.numpy().astype(np.float32))
        with torch.no_grad():
            expected = copy.deepcopy(self.model).double()(x.double()).numpy()
            batch_statistics = copy.deepcopy(self.model).double().train()(x.double()).numpy()
            float32 = self.model(x).numpy()
        # Guards that make the comparison meaningful: the logits vary, and running
        # statistics differ from batch statistics (an eval-mode slip would be caught).
        self.assertGreater(float(expected.std()), 1e-2, "reference logits are nearly constant")
        self.assertGreater(relative_error(batch_statistics, expected), 100 * TOLERANCE,
                           "batch-norm running statistics are too close to batch statistics")

        forward = run([TESSERA, "forward", "--model", self.path("resnet18.h5"),
                       "--input", self.path("input.h5"), "--output", self.path("output.h5")])
        self.assertEqual(forward.returncode, 0,
                         f"`tessera forward` exited {forward.returncode}:\n{forward.stderr[-4000:]}")
        with h5py.File(self.path("output.h5"), "r") as f:
            self.assertIn("logits", f, "output.h5 has no dataset 'logits'")
            logits = f["logits"]
            self.assertEqual(logits.dtype, np.float32, "dataset 'logits' is not float32")
            logits = logits[...]
        self.assertEqual(logits.shape, (INPUT_SHAPE[0], CLASSES), "dataset 'logits' has the wrong shape")
        error = relative_error(logits, expected)
        print(f"resnet18 logits: tessera vs PyTorch float64 relative error {error:.3g} "
              f"(PyTorch float32: {relative_error(float32, expected):.3g}; limit {TOLERANCE})",
              file=sys.stderr)
        self.assertLess(error, TOLERANCE,
                        f"tessera logits differ from PyTorch's: relative error {error:.3g}\n"
                        f"tessera:\n{logits}\nPyTorch:\n{expected}")

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

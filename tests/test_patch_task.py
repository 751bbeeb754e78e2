"""tools/make_patch_task.py writes a balanced, shuffled, learnable PCam-layout patch file.

Run by ctest as: /usr/bin/python3 tests/test_patch_task.py TESSERA_BINARY (the binary is
not needed here and is ignored).
"""
import os
import subprocess
import sys
import tempfile
import unittest

import h5py
import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GENERATOR = os.path.join(REPO, "tools", "make_patch_task.py")


def generate(directory, name, count, size, seed, classes=None):
    """Run the generator; (x, y) read back from the file it wrote."""
    path = os.path.join(directory, name)
    command = [sys.executable, GENERATOR, "--out", path, "--count", str(count),
               "--size", str(size), "--seed", str(seed)]
    if classes is not None:
        command += ["--classes", str(classes)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(command)} exited {result.returncode}:\n{result.stderr}")
    with h5py.File(path, "r") as f:
        return f["x"][...], f["y"][...], f["x"].dtype, f["y"].dtype


def dark_fraction(x):
    """Per patch, the fraction of pixels dark in every channel (nucleus-like)."""
    return (x.max(axis=3) < 150).mean(axis=(1, 2))


def best_threshold_accuracy(feature, labels):
    """The best accuracy of `feature > t` as a classifier for label 1, over all t."""
    cuts = np.concatenate([[-np.inf], np.unique(feature)])
    predictions = feature[None, :] > cuts[:, None]                     # [cuts, patches]
    return float((predictions == (labels[None, :] == 1)).mean(axis=1).max())


class PatchTaskTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.directory = tempfile.TemporaryDirectory(prefix="tessera-patch-task-")
        cls.x, cls.y, cls.x_dtype, cls.y_dtype = generate(cls.directory.name, "task.h5", 2001, 32, seed=3)

    @classmethod
    def tearDownClass(cls):
        cls.directory.cleanup()

    def test_layout(self):
        self.assertEqual(self.x_dtype, np.uint8)
        self.assertEqual(self.y_dtype, np.uint8)
        self.assertEqual(self.x.shape, (2001, 32, 32, 3))
        self.assertEqual(self.y.shape, (2001,))

    def test_balanced_binary_labels(self):
        self.assertEqual(sorted(np.bincount(self.y).tolist()), [1000, 1001])

    def test_shuffled(self):
        first_half_ones = int(self.y[:1000].sum())
        changes = int((np.diff(self.y) != 0).sum())
        self.assertTrue(400 < first_half_ones < 600, f"first half has {first_half_ones} ones")
        self.assertTrue(800 < changes < 1200, f"{changes} label changes between neighbours")

    def test_pixels_use_the_range(self):
        self.assertLess(int(self.x.min()), 60)
        self.assertGreater(int(self.x.max()), 240)
        self.assertGreater(float(self.x.std()), 15.0)

    def test_class_one_has_more_nuclei_but_not_separably(self):
        dark = dark_fraction(self.x)
        self.assertGreater(dark[self.y == 1].mean(), 2 * dark[self.y == 0].mean())
        accuracy = best_threshold_accuracy(dark, self.y)
        self.assertTrue(0.75 < accuracy < 0.97,
                        f"a threshold on the dark-pixel fraction classifies {accuracy:.3f}")

    def test_same_seed_same_bytes_other_seed_differs(self):
        x_again, y_again, _, _ = generate(self.directory.name, "again.h5", 2001, 32, seed=3)
        x_other, y_other, _, _ = generate(self.directory.name, "other.h5", 2001, 32, seed=4)
        np.testing.assert_array_equal(x_again, self.x)
        np.testing.assert_array_equal(y_again, self.y)
        self.assertGreater(float((x_other != self.x).mean()), 0.5)
        self.assertFalse(np.array_equal(y_other, self.y))

    def test_more_classes_and_other_size(self):
        x, y, _, _ = generate(self.directory.name, "three.h5", 301, 48, seed=1, classes=3)
        self.assertEqual(x.shape, (301, 48, 48, 3))
        self.assertEqual(np.bincount(y).tolist(), [101, 100, 100])
        dark = dark_fraction(x)
        means = [dark[y == c].mean() for c in range(3)]
        self.assertTrue(means[0] < means[1] < means[2], f"dark fraction per class {means}")

    def test_bad_count_is_a_usage_error(self):
        result = subprocess.run([sys.executable, GENERATOR, "--out", os.devnull, "--count", "0"],
                                capture_output=True, text=True, timeout=60)
        self.assertEqual(result.returncode, 2)
        self.assertIn("--count", result.stderr)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)

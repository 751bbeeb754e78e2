"""End-to-end checks of `tessera train` on a small patch task, read back with h5py.

Same seed, same losses; a killed-and-resumed run ends with the weights of an uninterrupted
one; K micro-batches equal one K-times-larger batch; the memory plan matches the measured
peak; bad input exits with its code and names the culprit.
Run as: /usr/bin/python3 tests/test_train.py TESSERA_BINARY
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

import h5py
import numpy as np

TESSERA = sys.argv[1] if len(sys.argv) > 1 else "build/tools/tessera"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(args, check=True, env=None):
    """Runs tessera; returns (exit code, stdout, stderr, report lines from --report-fd)."""
    read_end, write_end = os.pipe()
    command = [TESSERA] + args + ["--report-fd", str(write_end)] if args[0] == "train" else [TESSERA] + args
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(write_end,),
                               env=env, text=True)
    os.close(write_end)
    with os.fdopen(read_end) as report:
        lines = [json.loads(line) for line in report if line.strip()]
    out, err = process.communicate()
    if check and process.returncode != 0:
        raise AssertionError(f"{command} exited {process.returncode}:\n{err}")
    return process.returncode, out, err, lines


def epochs(stderr):
    return [json.loads(line) for line in stderr.splitlines()
            if line.startswith("{") and '"event":"epoch"' in line]


def params(path):
    with h5py.File(path, "r") as f:
        out = {}
        f["params"].visititems(lambda name, obj: out.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
        return out


class TrainTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="tessera-train-")
        cls.data = os.path.join(cls.dir, "task.h5")
        subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "tools", "make_patch_task.py"), "--out", cls.data,
                        "--count", "320", "--size", "16", "--seed", "3"], check=True, capture_output=True)

    def base(self, *extra):
        """train on the task with settings that flags in `extra` override."""
        flags = {"--data": self.data, "--model": "small-cnn", "--width": "4", "--batch": "16",
                 "--optimizer": "sgd", "--lr": "0.05", "--momentum": "0.9", "--seed": "7",
                 "--workers": "2", "--val-fraction": "0.2"}
        switches = []
        extra = list(extra)
        while extra:
            name = extra.pop(0)
            if extra and not extra[0].startswith("--"):
                flags[name] = extra.pop(0)
            else:
                switches.append(name)
        return ["train"] + [item for pair in flags.items() for item in pair] + switches

    def test_same_seed_same_losses(self):
        _, _, first, _ = run(self.base("--epochs", "2"))
        _, _, second, _ = run(self.base("--epochs", "2"))
        a, b = epochs(first), epochs(second)
        self.assertEqual(len(a), 2)
        for x, y in zip(a, b):
            for key in ("train_loss", "val_loss", "val_accuracy"):
                self.assertEqual(x[key], y[key], key)

    def test_resume_matches_uninterrupted_run(self):
        whole = os.path.join(self.dir, "whole.h5")
        resumed = os.path.join(self.dir, "resumed.h5")
        run(self.base("--epochs", "2", "--optimizer", "adam", "--lr", "0.003", "--checkpoint", whole))
        run(self.base("--epochs", "1", "--optimizer", "adam", "--lr", "0.003", "--checkpoint", resumed))
        run(self.base("--epochs", "2", "--optimizer", "adam", "--lr", "0.003", "--checkpoint", resumed, "--resume"))
        a, b = params(whole), params(resumed)
        self.assertEqual(sorted(a), sorted(b))
        for name in a:
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)
        with h5py.File(resumed, "r") as f:
            self.assertEqual(json.loads(f["train"].attrs["progress"])["epoch"], 2)

    def test_accumulation_equals_larger_batch(self):
        big = os.path.join(self.dir, "big.h5")
        small = os.path.join(self.dir, "accumulated.h5")
        args = ["train", "--data", self.data, "--model", "small-cnn", "--width", "4", "--optimizer", "sgd",
                "--lr", "0.05", "--seed", "5", "--epochs", "1", "--val-fraction", "0.2"]
        run(args + ["--batch", "32", "--accumulate", "1", "--checkpoint", big])
        run(args + ["--batch", "8", "--accumulate", "4", "--checkpoint", small])
        a, b = params(big), params(small)
        for name in a:
            np.testing.assert_allclose(a[name], b[name], rtol=1e-4, atol=1e-5, err_msg=name)

    def test_plan_matches_measured_peak(self):
        _, out, _, _ = run(self.base("--dry-run"))
        plan = json.loads(out.splitlines()[0])
        _, _, _, report = run(self.base("--epochs", "1"))
        final = [line for line in report if line["type"] == "final"][0]
        self.assertLessEqual(abs(final["peak_device_bytes"] - plan["total_bytes"]), 0.1 * plan["total_bytes"])
        self.assertTrue([line for line in report if line["type"] == "intermediate"])

    def test_plan_over_budget_exits_3_before_work(self):
        code, _, err, report = run(self.base("--device-memory-limit", "64KiB"), check=False)
        self.assertEqual(code, 3, err)
        self.assertIn("budget", err)
        self.assertEqual(report, [])

    def test_bad_input(self):
        missing = os.path.join(self.dir, "missing.h5")
        code, _, err, _ = run(["train", "--data", missing], check=False)
        self.assertEqual(code, 5)
        self.assertIn(missing, err)

        no_labels = os.path.join(self.dir, "no_labels.h5")
        with h5py.File(no_labels, "w") as f:
            f["x"] = np.zeros((4, 8, 8, 3), np.uint8)
        code, _, err, _ = run(["train", "--data", no_labels], check=False)
        self.assertEqual(code, 5)
        self.assertIn("dataset y", err)

        model = os.path.join(self.dir, "bad_field.json")
        with open(model, "w") as f:
            json.dump({"layers": [{"name": "c", "type": "conv2d", "kernel": 3, "out_channels": "many"}]}, f)
        code, _, err, _ = run(self.base("--model", model), check=False)
        self.assertEqual(code, 5)
        self.assertIn("'out_channels'", err)

        model = os.path.join(self.dir, "bad_shapes.json")
        with open(model, "w") as f:
            json.dump({"layers": [{"name": "f", "type": "flatten"},
                                  {"name": "a", "type": "linear", "out_features": 4},
                                  {"name": "b", "type": "add", "inputs": ["a", "f"]}]}, f)
        code, _, err, _ = run(self.base("--model", model), check=False)
        self.assertEqual(code, 5)
        self.assertIn("'b'", err)
        self.assertIn("'a'", err)

        code, _, err, _ = run(self.base("--batch", "0"), check=False)
        self.assertEqual(code, 2)
        self.assertIn("--batch", err)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]], verbosity=2)

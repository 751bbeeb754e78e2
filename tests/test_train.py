"""End-to-end checks of `tessera train` on a small patch task, read back with h5py.

Same seed, same losses; a killed-and-resumed run ends with the weights of an uninterrupted
one; K micro-batches equal one K-times-larger batch; the memory plan matches the measured
peak; bad input exits with its code and names the culprit.
Run as: /usr/bin/python3 tests/test_train.py TESSERA_BINARY
"""
import hashlib
import json
import os
import resource
import signal
import shutil
import subprocess
import sys
import tempfile
import unittest

import h5py
import numpy as np
from data_tools import run_with_report

TESSERA = sys.argv[1] if __name__ == "__main__" and len(sys.argv) > 1 else os.environ.get(
    "TESSERA_BINARY", "build/tools/tessera")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(args, check=True, env=None):
    """Runs tessera; returns (exit code, stdout, stderr, report lines from --report-fd)."""
    return run_with_report(TESSERA, args, check, env)


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
        subprocess.run([sys.executable, os.path.join(ROOT, "tools", "make_patch_task.py"), "--out", cls.data,
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
        # The resumed run takes every setting from the checkpoint: only the data and --epochs are given.
        run(["train", "--data", self.data, "--epochs", "2", "--checkpoint", resumed, "--resume"])
        a, b = params(whole), params(resumed)
        self.assertEqual(sorted(a), sorted(b))
        for name in a:
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)
        with h5py.File(resumed, "r") as f:
            self.assertEqual(json.loads(f["train"].attrs["progress"])["epoch"], 2)

        # Resuming a finished run trains nothing and reports the real final metrics, not 0.
        _, _, err, report = run(["train", "--data", self.data, "--epochs", "2", "--checkpoint", resumed, "--resume"])
        self.assertIn("nothing to do", err)
        final = [line for line in report if line["type"] == "final"]
        self.assertEqual(len(final), 1)
        with h5py.File(resumed, "r") as f:
            last = json.loads(f["train"].attrs["progress"])["metrics"]
        self.assertEqual(last["epoch"], 2)
        self.assertGreater(final[0]["value"], 0.1)
        self.assertEqual(final[0]["value"], last["val_loss"])
        self.assertEqual(params(resumed).keys(), a.keys())
        for name in a:
            np.testing.assert_array_equal(a[name], params(resumed)[name], err_msg=name)

    def test_resume_with_other_flags_names_each_difference(self):
        checkpoint = os.path.join(self.dir, "resume_flags.h5")
        run(self.base("--epochs", "1", "--checkpoint", checkpoint))
        before = digest(checkpoint)
        other_data = os.path.join(self.dir, "other_task.h5")
        shutil.copy(self.data, other_data)
        code, _, err, report = run(self.base("--epochs", "2", "--checkpoint", checkpoint, "--resume", "--width", "8",
                                             "--batch", "8", "--seed", "1", "--optimizer", "adam",
                                             "--data", other_data), check=False)
        self.assertEqual(code, 2, err)
        for flag in ("--width 8", "--batch 8", "--seed 1", "--optimizer adam", "--data " + other_data):
            self.assertIn(flag, err)
        self.assertNotIn("--lr", err)
        self.assertEqual(report, [])
        self.assertEqual(digest(checkpoint), before)

    def test_non_finite_weights_are_divergence_and_keep_the_last_checkpoint(self):
        checkpoint = os.path.join(self.dir, "diverging.h5")
        run(self.base("--epochs", "1", "--checkpoint", checkpoint))
        before = digest(checkpoint)
        code, _, err, report = run(self.base("--epochs", "1", "--checkpoint", checkpoint, "--lr", "1e30", "--overwrite"),
                                   check=False)
        self.assertEqual(code, 4, err)
        self.assertIn("diverged", err)
        self.assertEqual([line for line in report if line["type"] == "final"], [])
        self.assertEqual(digest(checkpoint), before)
        self.assertFalse(os.path.exists(checkpoint + ".partial"))

    def test_non_finite_state_the_loss_never_reads_is_divergence(self):
        # A training-mode batch norm normalises by the batch's variance, so a NaN running variance
        # leaves every training loss finite: only the check of the saved state can catch it.
        model = os.path.join(self.dir, "bn.json")
        with open(model, "w") as f:
            json.dump({"name": "bn", "layers": [
                {"name": "conv1", "type": "conv2d", "inputs": ["input"], "out_channels": 4, "kernel": 3,
                 "padding": 1, "bias": False},
                {"name": "bn1", "type": "batch_norm2d"},
                {"name": "relu1", "type": "relu"},
                {"name": "pool1", "type": "global_avg_pool"},
                {"name": "flatten", "type": "flatten"},
                {"name": "fc", "type": "linear", "out_features": 2}]}, f)
        checkpoint = os.path.join(self.dir, "nan_running_var.h5")
        run(self.base("--model", model, "--epochs", "1", "--checkpoint", checkpoint, "--val-fraction", "0"))
        before = digest(checkpoint)
        code, _, err, report = run(self.base("--model", model, "--epochs", "1", "--checkpoint", checkpoint,
                                             "--val-fraction", "0", "--overwrite"), check=False,
                                   env=dict(os.environ, TESSERA_FAULT="nan:bn1.running_var"))
        self.assertEqual(code, 4, err)
        self.assertIn("bn1.running_var holds NaN", err)
        train_losses = [line["metrics"]["train_loss"] for line in report if line["type"] == "intermediate"]
        self.assertEqual(len(train_losses), 1, report)
        self.assertTrue(np.isfinite(train_losses[0]), train_losses)
        self.assertEqual([line for line in report if line["type"] == "final"], [])
        self.assertEqual(digest(checkpoint), before)

    def test_labels_that_are_not_class_indices_are_bad_input(self):
        rng = np.random.default_rng(0)
        x = rng.integers(0, 255, (64, 16, 16, 3), dtype=np.uint8)
        cases = {"y255.h5": np.array([0, 1] * 31 + [255, 1], np.uint8),
                 "int8.h5": np.array([0, 1] * 31 + [-1, 1], np.int8),
                 "float.h5": np.array([0.0, 1.0] * 31 + [0.7, 1.0], np.float32)}
        for name, y in cases.items():
            path = os.path.join(self.dir, name)
            with h5py.File(path, "w") as f:
                f["x"] = x
                f["y"] = y
            code, _, err, report = run(self.base("--data", path, "--epochs", "1"), check=False)
            self.assertEqual(code, 5, name + ": " + err)
            self.assertIn(path, err)
            self.assertEqual(report, [])

        # Data of three classes on a model of two: exit 5 naming the data, not "diverged".
        checkpoint = os.path.join(self.dir, "two_classes.h5")
        run(self.base("--epochs", "1", "--checkpoint", checkpoint))
        three = os.path.join(self.dir, "three_classes.h5")
        with h5py.File(three, "w") as f:
            f["x"] = x
            f["y"] = np.array([0, 1, 2, 1] * 16, np.uint8)
        code, _, err, _ = run(self.base("--data", three, "--model", checkpoint, "--epochs", "1"), check=False)
        self.assertEqual(code, 5, err)
        self.assertIn(three, err)
        self.assertIn("2 classes", err)

    def test_non_finite_or_negative_numeric_flags_exit_2(self):
        for flag, value in (("--lr", "nan"), ("--momentum", "nan"), ("--weight-decay", "nan"),
                            ("--class-weights", "nan,1"), ("--class-weights", "-1,1"), ("--class-weights", "0,0"),
                            ("--val-fraction", "nan"), ("--lr", "inf")):
            code, _, err, report = run(self.base(flag, value, "--epochs", "1"), check=False)
            self.assertEqual(code, 2, f"{flag} {value}: {err}")
            self.assertIn(flag, err)
            self.assertEqual(report, [])

    def test_flags_that_do_not_apply_to_features_are_errors(self):
        features = os.path.join(self.dir, "no_features")
        os.makedirs(features, exist_ok=True)
        labels = os.path.join(self.dir, "labels.csv")
        with open(labels, "w") as f:
            f.write("slide,label\n")
        for flag in (["--batch", "4"], ["--accumulate", "2"], ["--model", "resnet18"], ["--width", "8"],
                     ["--augment"], ["--workers", "3"]):
            code, _, err, report = run(["train", "--features", features, "--labels", labels, *flag], check=False)
            self.assertEqual(code, 2, f"{flag}: {err}")
            self.assertIn(flag[0], err)
            self.assertEqual(report, [])

    def test_checkpoint_write_error_names_the_file_and_keeps_the_last_one(self):
        checkpoint = os.path.join(self.dir, "full_disk.h5")
        run(self.base("--epochs", "1", "--checkpoint", checkpoint))
        before = digest(checkpoint)
        size = os.path.getsize(checkpoint)

        def small_files():
            # A file may not grow past half a checkpoint: writing one fails as on a full disk.
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (size // 2, size // 2))

        command = [TESSERA] + self.base("--epochs", "1", "--checkpoint", checkpoint, "--seed", "8", "--overwrite")
        process = subprocess.run(command, capture_output=True, text=True, preexec_fn=small_files)
        self.assertEqual(process.returncode, 1, process.stderr)
        self.assertIn(checkpoint, process.stderr)
        self.assertIn("disk full", process.stderr)
        self.assertEqual(digest(checkpoint), before)
        self.assertFalse(os.path.exists(checkpoint + ".partial"))

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

        # A field tessera does not implement is an error, not silently dropped.
        model = os.path.join(self.dir, "unknown_field.json")
        with open(model, "w") as f:
            json.dump({"layers": [{"name": "c", "type": "conv2d", "kernel": 3, "out_channels": 4, "dilation": 2},
                                  {"name": "f", "type": "flatten"},
                                  {"name": "fc", "type": "linear", "out_features": 2}]}, f)
        code, _, err, _ = run(self.base("--model", model), check=False)
        self.assertEqual(code, 5, err)
        self.assertIn("'dilation'", err)
        self.assertIn("'c'", err)

    def test_augment_class_weights_and_weight_decay_take_effect(self):
        def final_params(*flags):
            path = os.path.join(self.dir, "effect_" + "_".join(f.strip("-") for f in flags) + ".h5")
            _, _, err, _ = run(self.base("--epochs", "1", "--checkpoint", path, "--overwrite", *flags))
            return params(path), epochs(err)[-1]

        plain, plain_epoch = final_params()
        augmented, _ = final_params("--augment")
        augmented_again, _ = final_params("--augment")
        self.assertFalse(np.array_equal(plain["conv1.weight"], augmented["conv1.weight"]))
        np.testing.assert_array_equal(augmented["conv1.weight"], augmented_again["conv1.weight"])

        # Weight decay shrinks the weights against the same batches.
        decayed, _ = final_params("--weight-decay", "0.5")
        norm = lambda p: np.sqrt(sum(float(np.sum(v.astype(np.float64) ** 2)) for k, v in p.items() if "weight" in k))
        self.assertLess(norm(decayed), 0.95 * norm(plain))

        # Class 0 weighted 0: only class 1 pulls, so the model calls every patch class 1 and its
        # validation accuracy is the share of class 1 among the held-out patches.
        _, weighted_epoch = final_params("--class-weights", "0,1")
        with h5py.File(self.data, "r") as f:
            y = f["y"][()].reshape(-1)
        held_out = y[len(y) - round(0.2 * len(y)):]
        self.assertAlmostEqual(weighted_epoch["val_accuracy"], float(np.mean(held_out == 1)), places=6)
        self.assertNotAlmostEqual(plain_epoch["val_accuracy"], weighted_epoch["val_accuracy"], places=3)

    def test_store_of_one_slide_says_validation_took_it(self):
        slide = os.path.join(self.dir, "one.tiff")
        store = os.path.join(self.dir, "one.lmdb")
        subprocess.run([TESSERA, "synth", slide, "--width", "512", "--height", "512", "--seed", "1"], check=True,
                       capture_output=True)
        subprocess.run([TESSERA, "tile", slide, "--out", store, "--size", "32"], check=True, capture_output=True)
        code, _, err, report = run(["train", "--data", store, "--width", "4", "--batch", "16"], check=False)
        self.assertEqual(code, 2, err)
        self.assertIn("validation", err)
        self.assertIn("--val-fraction 0", err)
        self.assertEqual(report, [])

    def test_output_that_is_an_input_is_refused_before_any_work(self):
        data = os.path.join(self.dir, "own_data.h5")
        shutil.copy(self.data, data)
        before = digest(data)
        link = os.path.join(self.dir, "link_to_data.h5")
        os.symlink(data, link)
        hard = os.path.join(self.dir, "hard_link_to_data.h5")
        os.link(data, hard)
        # The same file by another name: identity, not text, decides.
        for checkpoint in (data, link, hard, os.path.join(self.dir, ".", "own_data.h5")):
            code, _, err, report = run(self.base("--data", data, "--checkpoint", checkpoint), check=False)
            self.assertEqual(code, 2, err)
            self.assertIn("--checkpoint", err)
            self.assertIn("--data", err)
            self.assertEqual(report, [])
            self.assertEqual(digest(data), before)
        self.assertFalse(os.path.exists(data + ".partial"))


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0]], verbosity=2)

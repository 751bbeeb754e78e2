"""tessera train --features: slide-level multiple-instance learning on synthetic CLAM-layout
feature files (h5py). Tumour slides hold a few instances from a shifted distribution among
normal ones; the mean, the gated attention and the dsmil head must classify held-out slides well
above chance, and in fp16 do as well as in fp32 (within fp16's rounding). --dry-run prints a memory
plan that matches the measured peak, and a plan over --device-memory-limit exits 3 before any
work. A corrupt feature file, or in fp16 one beyond fp16's range, exits 5 and names the file;
--data and --features exclude each other."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import h5py
import numpy as np

TESSERA = sys.argv[1] if __name__ == "__main__" and len(sys.argv) > 1 else os.environ.get(
    "TESSERA_BINARY", "build/tools/tessera")
SLIDES, WIDTH = 48, 16


def run(args):
    env = dict(os.environ, TESSERA_VALIDATION="1")
    process = subprocess.run([TESSERA] + args, capture_output=True, text=True, env=env)
    assert "vulkan validation" not in process.stderr, process.stderr
    return process


def epochs(stderr):
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{") and '"event":"epoch"' in line]


def make_features(directory):
    """Tumour slides: 3 to 6 instances shifted along one direction; the rest plain noise."""
    generator = np.random.default_rng(3)
    direction = generator.normal(size=WIDTH)
    direction /= np.linalg.norm(direction)
    rows = ["slide,label"]
    for s in range(SLIDES):
        tumour = s % 2 == 1
        count = int(generator.integers(20, 81))
        features = generator.normal(size=(count, WIDTH)).astype(np.float32)
        if tumour:
            positives = generator.choice(count, size=int(generator.integers(3, 7)), replace=False)
            features[positives] += 4.0 * direction.astype(np.float32)
        name = f"slide{s:02d}"
        with h5py.File(os.path.join(directory, name + ".h5"), "w") as f:
            f["features"] = features
            f["coords"] = np.stack([np.arange(count) * 256, np.zeros(count)], axis=1).astype(np.int64)
        rows.append(f"{name},{'tumor' if tumour else 'normal'}")
    return "\n".join(rows) + "\n"


def main():
    work = tempfile.mkdtemp(prefix="tessera-mil-")
    try:
        features = os.path.join(work, "features")
        os.makedirs(features)
        labels = os.path.join(work, "slides.csv")
        with open(labels, "w") as f:
            f.write(make_features(features))

        results = {}
        for head, lr in (("attention", "0.002"), ("mean", "0.01"), ("dsmil", "0.002")):
            for precision in ("fp32", "fp16"):
                checkpoint = os.path.join(work, f"{head}-{precision}.h5")
                flags = ["train", "--features", features, "--labels", labels, "--head", head, "--optimizer", "adam",
                         "--precision", precision]
                process = run(flags + ["--dry-run"])
                assert process.returncode == 0, process.stderr
                plan = json.loads(process.stdout.splitlines()[0])
                assert plan["fits"] and plan["bytes"]["optimizer state"] > 0, plan
                process = run(flags + ["--epochs", "15", "--lr", lr, "--seed", "1", "--val-fraction", "0.5",
                                       "--checkpoint", checkpoint])
                assert process.returncode == 0, process.stderr
                history = epochs(process.stderr)
                assert len(history) == 15, process.stderr
                final = history[-1]
                assert abs(final["peak_device_bytes"] - plan["total_bytes"]) <= 0.1 * plan["total_bytes"], (final, plan)
                assert final["val_slides"] == SLIDES // 2 and final["train_slides"] == SLIDES // 2, final
                results[head, precision] = final
                print(f"{head} {precision}: held-out accuracy {final['val_accuracy']:.3f} on {final['val_slides']} "
                      f"slides (train {final['train_accuracy']:.3f}, val loss {final['val_loss']:.4f}, "
                      f"activations {plan['bytes']['activations']} B)")
                with h5py.File(checkpoint, "r") as f:
                    if head == "dsmil":  # dsmil.py's names; fcc's Conv1d weight [C, C, D] as [C, C*D]
                        assert f["params/i_classifier.fc.0.weight"].shape == (2, WIDTH)
                        assert f["params/b_classifier.q.2.weight"].shape == (128, 128)
                        assert f["params/b_classifier.fcc.weight"].shape == (2, 2 * WIDTH)
                        continue
                    assert "classifier.weight" in f["params"] and f["params/classifier.weight"].shape == (2, WIDTH)
                    assert f["params/classifier.weight"].dtype == np.float32
                    if head == "attention":
                        assert f["params/attention_V.weight"].shape == (128, WIDTH)
            # fp16 bags and activations, fp32 weights and sums: the same run within fp16's rounding.
            fp32, fp16 = results[head, "fp32"], results[head, "fp16"]
            assert fp16["val_accuracy"] >= fp32["val_accuracy"] - 1.0 / (SLIDES // 2), (fp16, fp32)
            assert abs(fp16["val_loss"] - fp32["val_loss"]) <= 0.02 * fp32["val_loss"], (fp16, fp32)
            assert fp16["loss_scale"] == 65536 and fp16["skipped_steps"] == 0, fp16
        assert results["attention", "fp32"]["val_accuracy"] >= 0.8, results
        assert results["mean", "fp32"]["val_accuracy"] >= 0.65, results
        assert results["dsmil", "fp32"]["val_accuracy"] >= 0.8, results

        # Features beyond fp16's range are named, exit 5, rather than trained on as infinities.
        wide = os.path.join(work, "wide")
        shutil.copytree(features, wide)
        with h5py.File(os.path.join(wide, "slide07.h5"), "r+") as f:
            f["features"][0, 0] = 1e5
        process = run(["train", "--features", wide, "--labels", labels, "--epochs", "1", "--precision", "fp16"])
        assert process.returncode == 5 and "slide07.h5" in process.stderr and "fp16" in process.stderr, process.stderr
        assert run(["train", "--features", wide, "--labels", labels, "--epochs", "1"]).returncode == 0

        # A plan over the budget: exit 3 and the plan with --dry-run; exit 3 before any epoch without.
        flags = ["train", "--features", features, "--labels", labels, "--device-memory-limit", "64KiB"]
        process = run(flags + ["--dry-run"])
        assert process.returncode == 3 and not json.loads(process.stdout.splitlines()[0])["fits"], process.stderr
        process = run(flags + ["--epochs", "1"])
        assert process.returncode == 3 and "budget" in process.stderr and not epochs(process.stderr), process.stderr

        # A truncated feature file is named, exit 5.
        broken = os.path.join(features, "slide05.h5")
        with open(broken, "r+b") as f:
            f.truncate(os.path.getsize(broken) // 2)
        for head in ("attention", "dsmil"):
            process = run(["train", "--features", features, "--labels", labels, "--head", head, "--epochs", "1"])
            assert process.returncode == 5, (process.returncode, process.stderr)
            assert "slide05.h5" in process.stderr, process.stderr

        # A slide listed without a feature file is named too.
        with open(labels) as f:
            rows = [row for row in f if not row.startswith("slide05,")]
        with open(labels, "w") as f:
            f.writelines(rows + ["missing_slide,tumor\n"])
        process = run(["train", "--features", features, "--labels", labels, "--epochs", "1"])
        assert process.returncode == 5 and "missing_slide.h5" in process.stderr, process.stderr

        # One source, not both, not neither.
        assert run(["train", "--features", features, "--data", labels, "--labels", labels]).returncode == 2
        assert run(["train", "--epochs", "1"]).returncode == 2
        print("ok")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_mil():
    main()


def test_one_staged_copy_where_two_do_not_fit(tmp_path):
    """Under a budget that holds the run with one staged copy of each bag but not with two, the
    plan takes one (--dry-run says so) and training gives the same bytes as with two, within it."""
    generator = np.random.default_rng(5)
    features = tmp_path / "features"
    features.mkdir()
    rows = ["slide,label"]
    for s in range(4):
        with h5py.File(features / f"s{s}.h5", "w") as f:
            f["features"] = generator.normal(size=(3000 + 500 * s, 2048)).astype(np.float32)
        rows.append(f"s{s},{('normal', 'tumor')[s % 2]}")
    (tmp_path / "labels.csv").write_text("\n".join(rows) + "\n")
    flags = ["--json", "train", "--features", str(features), "--labels", str(tmp_path / "labels.csv"), "--head", "mean",
             "--val-fraction", "0.5", "--epochs", "2"]
    process = run(flags + ["--dry-run"])
    assert process.returncode == 0, process.stderr
    two = json.loads(process.stdout.splitlines()[0])
    bag = 4500 * 2048 * 4  # the largest bag, staged
    assert two["staging_slots"] == 2, two
    if two["bytes"]["staging"] == 0:
        return  # a discrete GPU's staging is host memory, which the budget does not bound
    assert two["bytes"]["staging"] >= 2 * bag, two
    # Under the buffers' bytes with two copies, over them with one: the allocator's last blocks
    # shrink to what the budget has left, so the blocks do not decide it.
    limit = (two["total_bytes"] - bag // 2) // 1024
    limited = flags + ["--device-memory-limit", f"{limit}KiB"]
    process = run(limited + ["--dry-run"])
    assert process.returncode == 0, process.stderr
    one = json.loads(process.stdout.splitlines()[0])
    assert one["fits"] and one["staging_slots"] == 1, one
    saved = two["bytes"]["staging"] - one["bytes"]["staging"]
    assert saved >= bag and two["total_bytes"] - one["total_bytes"] == saved, (one, two)
    checkpoints = []
    for name, extra in (("two", []), ("one", ["--device-memory-limit", f"{limit}KiB"])):
        checkpoints.append(tmp_path / f"{name}.ckpt")
        process = run(flags + extra + ["--checkpoint", str(checkpoints[-1])])
        assert process.returncode == 0, process.stderr
        final = epochs(process.stderr)[-1]
        assert final["peak_device_bytes"] <= (limit * 1024 if extra else two["device_bytes"]), final
    with h5py.File(checkpoints[0], "r") as a, h5py.File(checkpoints[1], "r") as b:
        names = []
        a.visit(lambda name: names.append(name) if isinstance(a[name], h5py.Dataset) else None)
        assert names and all(np.array_equal(a[name][()], b[name][()]) for name in names), names


if __name__ == "__main__":
    main()

"""The labels file of tessera train --features, as labs write it: CLAM's own CSV
(`case_id,slide_id,label`, string labels, slide ids with or without the slide's extension), a
spreadsheet's byte order mark, CRLF line ends and quoted fields train with every slide counted
once and string labels mapped to sorted classes (read back from the checkpoint with h5py).
Rows that would train silently wrong are exit 5 naming the file, the row and the slide: a slide
listed twice (with the same label or a conflicting one) and a slide id that is a path outside
--features (`../feats/s1`, an absolute path). So are feature files of two encoders (the attribute
extract writes, even at one width) or of two widths in one cohort.
On lavapipe, whose compiler ends a kernel's loops after 65,535 iterations, a bag of more than
262,140 patches (the heads' kernels loop over a quarter of a bag at most) is exit 3 before any
work, naming the slide, in training, cross-validation and --dry-run alike; a bag of 262,140 passes
the check (test_mil_heads_torch checks the heads against PyTorch on 100,001 patches). A buffer over
the 128 MiB lavapipe binds (TransMIL's first activation at 65,600 patches in fp32) is exit 3 naming
it, before any work, and --dry-run's plan says it does not fit and lists its largest buffers; in
fp16 the same bag's plan fits. Features over that binding that TransMIL's first linear layer alone
reads (it takes them in windows of rows) do not stop the plan."""
import json
import os
import shutil
import sys
import tempfile

import h5py
import numpy as np

from data_tools import run

TESSERA = sys.argv[1] if __name__ == "__main__" and len(sys.argv) > 1 else os.environ.get(
    "TESSERA_BINARY", "build/tools/tessera")
WIDTH = 8


def train(features, labels, *flags, split=("--val-fraction", 0), head="mean"):
    env = dict(os.environ, TESSERA_VALIDATION="1")
    process = run(TESSERA, "train", "--features", features, "--labels", labels, "--epochs", 1, "--head", head,
                  *split, *flags, check=False, env=env)
    assert "vulkan validation" not in process.stderr.lower(), process.stderr
    return process


def two_slides(directory, rows):
    """A cohort of two slides of 1,536 zero features, `rows` patches and 20, labelled a and b:
    the directory and its labels file."""
    os.makedirs(directory)
    for s, count in enumerate((rows, 20)):
        with h5py.File(os.path.join(directory, f"slide_{s}.h5"), "w") as f:
            f["features"] = np.zeros((count, 1536), dtype=np.float32)
    labels = os.path.join(directory, "labels.csv")
    write_labels(labels, "slide,label\nslide_0,a\nslide_1,b\n")
    return directory, labels


def epochs(stderr):
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{") and '"event":"epoch"' in line]


def write_labels(path, text, bom=False):
    with open(path, "wb") as f:
        f.write((b"\xef\xbb\xbf" if bom else b"") + text.encode())


def main():
    work = tempfile.mkdtemp(prefix="tessera-mil-labels-")
    try:
        features = os.path.join(work, "features")
        os.makedirs(features)
        generator = np.random.default_rng(1)
        for s in range(6):
            with h5py.File(os.path.join(features, f"slide_{s}.h5"), "w") as f:
                f["features"] = generator.normal(size=(10, WIDTH)).astype(np.float32)
                f["coords"] = np.zeros((10, 2), dtype=np.int64)
        labels = os.path.join(work, "labels.csv")

        # CLAM's CSV as CLAM ships it, from Excel: BOM, CRLF, a quoted field, an extension on a slide id.
        write_labels(labels, "case_id,slide_id,label\r\n"
                             "patient_0,slide_0,tumor_tissue\r\n"
                             "patient_0,slide_1.svs,normal_tissue\r\n"
                             "\"patient_1, left\",slide_2,tumor_tissue\r\n"
                             "patient_2,slide_3,normal_tissue\r\n", bom=True)
        checkpoint = os.path.join(work, "head.h5")
        process = train(features, labels, "--checkpoint", checkpoint)
        assert process.returncode == 0, process.stderr
        final = epochs(process.stderr)[-1]
        assert final["train_slides"] == 4 and final["val_slides"] == 0, final
        with h5py.File(checkpoint, "r") as f:
            model = json.loads(f.attrs["model"])
        assert model["classes"] == ["normal_tissue", "tumor_tissue"], model

        # tessera's own two columns with a BOM: the header is a header, not a slide named "\ufeffslide".
        write_labels(labels, "slide,label\n" + "".join(f"slide_{s},{s % 2}\n" for s in range(6)), bom=True)
        process = train(features, labels)
        assert process.returncode == 0, process.stderr
        assert epochs(process.stderr)[-1]["train_slides"] == 6, process.stderr

        # Refused, exit 5, naming the file, the row and the slide.
        cases = {
            "conflict": ("slide,label\nslide_0,1\nslide_1,0\nslide_0,0\n", "row 4", "slide_0"),
            "repeat": ("slide_0,1\nslide_1,0\nslide_1,0\n", "row 3", "slide_1"),
            "extension repeat": ("slide_id,label\nslide_0,1\nslide_1,0\nslide_0.svs,1\n", "row 4", "slide_0"),
            "parent": ("slide,label\nslide_0,1\n../features/slide_1,0\n", "row 3", "../features/slide_1"),
            "absolute": (f"slide,label\nslide_0,1\n{features}/slide_1,0\n", "row 3", f"{features}/slide_1"),
            "missing": ("slide,label\nslide_0,1\nslide_9,0\n", "row 3", "slide_9.h5"),
            "fields": ("case_id,slide_id,label\np0,slide_0,1\np1,slide_1\n", "row 3", "3 as the header has"),
        }
        for name, (text, row, slide) in cases.items():
            write_labels(labels, text)
            process = train(features, labels)
            assert process.returncode == 5, (name, process.returncode, process.stderr)
            assert "labels.csv" in process.stderr and row in process.stderr and slide in process.stderr, (
                name, process.stderr)
            assert not epochs(process.stderr), (name, process.stderr)

        # Feature files that cannot make one cohort: exit 5 naming them. Of two encoders (named by
        # the attribute extract writes) even at one width; of two widths.
        write_labels(labels, "slide,label\n" + "".join(f"slide_{s},{s % 2}\n" for s in range(6)))
        for s, encoder in ((0, "uni"), (3, "phikon-v2")):
            with h5py.File(os.path.join(features, f"slide_{s}.h5"), "a") as f:
                f["features"].attrs["encoder"] = encoder
        process = train(features, labels)
        assert process.returncode == 5, process.stderr
        assert ("slide_3.h5: features made by encoder 'phikon-v2', but " + os.path.join(features, "slide_0.h5") +
                "'s by 'uni'") in process.stderr, process.stderr
        with h5py.File(os.path.join(features, "slide_3.h5"), "a") as f:
            f["features"].attrs["encoder"] = "uni"
        assert train(features, labels).returncode == 0  # one encoder named, and files that name none
        with h5py.File(os.path.join(features, "slide_4.h5"), "w") as f:
            f["features"] = generator.normal(size=(10, WIDTH + 1)).astype(np.float32)
            f["coords"] = np.zeros((10, 2), dtype=np.int64)
        process = train(features, labels)
        assert process.returncode == 5 and f"slide_4.h5: features have width {WIDTH + 1}, other slides {WIDTH}" in (
            process.stderr), process.stderr

        # Bags that lavapipe's kernels cannot pool whole: exit 3 naming the slide; the bound passes
        # the check (a dry run: training it would take minutes here).
        lavapipe = "llvmpipe" in run(TESSERA, "info", "--json", env=dict(os.environ)).stdout
        for rows in (262140, 262141):
            with h5py.File(os.path.join(features, "slide_4.h5"), "w") as f:
                f["features"] = generator.normal(size=(rows, WIDTH)).astype(np.float32)
                f["coords"] = np.zeros((rows, 2), dtype=np.int64)
            splits = [("--val-fraction", 0, "--dry-run")]
            if rows == 262141:
                splits += [("--val-fraction", 0), ("--folds", 2)]
            for split in splits:
                process = train(features, labels, split=split)
                if rows == 262141 and lavapipe:
                    assert process.returncode == 3, (split, process.stderr)
                    assert "slide_4's bag holds 262141 patches" in process.stderr and "65535" in process.stderr, (
                        split, process.stderr)
                    assert not epochs(process.stderr), process.stderr
                else:
                    assert process.returncode == 0, (rows, split, process.stderr)

        # A buffer over what lavapipe binds (128 MiB): TransMIL's _fc1 output [65,600, 512] in fp32
        # (its q, k and v, [S, 512] each with S = 1 + 257^2, are as large). The plan names it,
        # --dry-run and training alike, before any work; in fp16 it is half that, and the plan fits.
        with h5py.File(os.path.join(features, "slide_4.h5"), "w") as f:
            f["features"] = generator.normal(size=(65600, WIDTH)).astype(np.float32)
        for precision, split in (("fp32", ("--val-fraction", 0, "--dry-run")), ("fp32", ("--val-fraction", 0)),
                                 ("fp16", ("--val-fraction", 0, "--dry-run"))):
            process = train(features, labels, "--precision", precision, split=split, head="transmil")
            if precision == "fp16" or not lavapipe:
                assert process.returncode == 0, (precision, split, process.stderr)
                continue
            assert process.returncode == 3, (split, process.stderr)
            assert "for _fc1.1, over the largest that" in process.stderr, process.stderr
            assert not epochs(process.stderr), process.stderr
            if "--dry-run" in split:
                plan = json.loads(process.stdout.splitlines()[-1])
                assert not plan["fits"] and plan["oversized_buffer"] == {
                    "name": "_fc1.1", "bytes": 65600 * 512 * 4, "largest_bytes": 128 << 20}, plan
                largest = plan["largest_buffers"]
                assert [b["bytes"] for b in largest] == sorted((b["bytes"] for b in largest), reverse=True), largest
                assert largest[0] == {"name": "sequence", "bytes": 66050 * 512 * 4} and len(largest) == 12, largest

        # Issue 33's bag: 100,000 patches of 1,536 features in fp16 (307 MB staged, over the 128 MiB
        # lavapipe binds) are read by the layers that take them (linear layers and the MIL pools)
        # a window of rows at a time, and every head's plan fits lavapipe's 2 GiB: the plan names
        # no buffer over the binding, though the features' buffer is the largest it lists.
        wide, wide_labels = two_slides(os.path.join(work, "wide"), 100000)
        for head in ("transmil", "attention", "dsmil", "clam-sb", "mean", "max"):
            process = train(wide, wide_labels, "--precision", "fp16", split=("--val-fraction", 0, "--dry-run"),
                            head=head)
            assert process.returncode == 0, (head, process.stderr)
            plan = json.loads(process.stdout.splitlines()[-1])
            assert "oversized_buffer" not in plan, (head, plan)
            assert plan["largest_buffers"][0] == {"name": "features.0.0", "bytes": 100000 * 1536 * 2}, (head, plan)
            if lavapipe:
                assert plan["fits"] and plan["device_bytes"] <= plan["budget_bytes"] == 2 << 30, (head, plan)
            if head == "transmil" and lavapipe and plan["bytes"]["staging"] > 0:
                # With the bag staged in the budget, keeping q, k and v from forward would not fit:
                # backward computes them again, in scratch the layers share. (The discrete-GPU
                # layer stages in host memory, and the plan that keeps them fits.)
                assert "layer1.attn.q (scratch shared by layers)" in [b["name"] for b in plan["largest_buffers"]], plan
        # With room to spare, TransMIL's attention keeps what its backward reads from forward, each
        # layer its own (its pseudo-inverse's iterates, 14.7 MB a layer, are the largest buffers).
        narrow, narrow_labels = two_slides(os.path.join(work, "narrow"), 300)
        process = train(narrow, narrow_labels, "--precision", "fp16", split=("--val-fraction", 0, "--dry-run"),
                        head="transmil")
        assert process.returncode == 0, process.stderr
        names = [b["name"] for b in json.loads(process.stdout.splitlines()[-1])["largest_buffers"]]
        assert "layer1.attn.pinv_z" in names and "layer2.attn.pinv_z" in names, names
        print("ok")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_mil_labels():
    main()


if __name__ == "__main__":
    main()

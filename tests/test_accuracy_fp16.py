"""Mixed precision learns as well as float: small-cnn trained with `--precision fp16` reaches
the validation accuracy of the same run in fp32 within one point, on the patch task
(tools/make_patch_task.py) and on the tiles of held-out synthetic slides (tumour or not, labels
from the slides' ground truth; --val-fraction holds out whole slides). Same seed, data and
order in both runs: only the precision differs. The validation sets are large enough that one
point is many samples (a single patch or tile is not a point)."""
import json
import os
import shutil

from data_tools import run, synth, workdir

TESSERA = os.environ.get("TESSERA_BINARY", "build/tools/tessera")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VULKAN = dict(os.environ, TESSERA_VALIDATION="1")
TRAIN = ["--model", "small-cnn", "--width", 8, "--batch", 32, "--optimizer", "sgd", "--lr", 0.05,
         "--momentum", 0.9, "--seed", 5, "--val-fraction", 0.5]


def final_epoch(*args):
    result = run(TESSERA, "train", *args, env=VULKAN)
    assert "vulkan validation" not in result.stderr.lower(), result.stderr
    return [json.loads(line) for line in result.stderr.splitlines() if '"event":"epoch"' in line][-1]


def compare(name, data, epochs):
    runs = {precision: final_epoch("--data", data, *TRAIN, "--epochs", epochs, "--precision", precision)
            for precision in ("fp32", "fp16")}
    full, half = runs["fp32"]["val_accuracy"], runs["fp16"]["val_accuracy"]
    print(f"{name}: val accuracy fp32 {full:.4f}, fp16 {half:.4f} (loss scale {runs['fp16']['loss_scale']}, "
          f"{runs['fp16']['skipped_steps']:.0f} skipped steps)")
    assert full > 0.75, runs["fp32"]  # the task is learnt: the comparison means something
    assert abs(half - full) <= 0.01, runs


def test_patch_task():
    work = workdir("test_accuracy_fp16_patches")
    try:
        data = os.path.join(work, "task.h5")
        run("/usr/bin/python3", os.path.join(ROOT, "tools", "make_patch_task.py"), "--out", data, "--count", 3000,
            "--size", 32, "--seed", 11)
        compare("patch task, 1500 held-out patches", data, 3)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_tiles_of_held_out_slides():
    work = workdir("test_accuracy_fp16_slides")
    try:
        slides, geojsons = [], []
        for index in range(8):
            path = os.path.join(work, f"slide{index}.tiff")
            synth(TESSERA, path, 1536, 1536, 200 + index, *([] if index % 2 == 0 else ["--no-tumour"]))
            slides.append(path)
            geojsons.append(os.path.join(work, f"slide{index}.geojson"))
        store = os.path.join(work, "tiles.lmdb")
        run(TESSERA, "tile", *slides, "--out", store, "--size", 32, "--labels", *geojsons, "--allow-empty-labels",
            "--workers", 2)
        compare("tiles of 4 held-out slides", store, 3)
    finally:
        shutil.rmtree(work, ignore_errors=True)

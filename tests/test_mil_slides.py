"""The slide-level pipeline end to end with the real binary: synthetic slides, half with tumour
and half without (synth --no-tumour), tiled into one store, features extracted by a small CNN,
slides.csv from the slides' ground truth, and a gated attention head trained on the features
that must classify held-out slides (tumour or not) well above chance, with no validation message."""
import json
import os
import shutil
import sys
import time

from data_tools import run, summary, synth, workdir

TESSERA = sys.argv[1] if __name__ == "__main__" and len(sys.argv) > 1 else os.environ.get(
    "TESSERA_BINARY", "build/tools/tessera")
SLIDES, SIZE, TILE = 24, 1024, 32
# A randomly initialised small-cnn of width 8 up to pool2: 16 features a tile, which already set
# tumour tiles apart (darker, denser nuclei), though by small amounts on a large common offset.
BACKBONE = {"preset": "small-cnn", "width": 8}
# On such features Adam (one slide a step) now and then learns attention that down-weights the
# tumour tiles and stalls at chance (1 train seed in 10); SGD with momentum converged for 10 of 10.
HEAD_FLAGS = ["--head", "attention", "--epochs", 30, "--optimizer", "sgd", "--lr", 0.5, "--momentum", 0.9]


def vulkan(*args):
    """A command that creates a Vulkan device, under the validation layer."""
    result = run(TESSERA, *args, env=dict(os.environ, TESSERA_VALIDATION="1"))
    assert "vulkan validation" not in result.stderr.lower(), result.stderr
    return result


def epochs(stderr):
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{") and '"event":"epoch"' in line]


def main():
    started = time.monotonic()
    work = workdir("test_mil_slides")
    try:
        slides, geojsons, rows = [], [], ["slide,label"]
        for index in range(SLIDES):
            name = f"slide{index:02d}"
            path = os.path.join(work, name + ".tiff")
            made = synth(TESSERA, path, SIZE, SIZE, 100 + index, *([] if index % 2 == 0 else ["--no-tumour"]))
            tumour = made["tumour_regions"] > 0
            assert tumour == (index % 2 == 0), made
            slides.append(path)
            geojsons.append(os.path.join(work, name + ".geojson"))
            rows.append(f"{name},{'tumor' if tumour else 'normal'}")
        labels = os.path.join(work, "slides.csv")
        with open(labels, "w") as f:
            f.write("\n".join(rows) + "\n")

        store = os.path.join(work, "tiles.lmdb")
        tiled = summary(run(TESSERA, "tile", *slides, "--out", store, "--size", TILE, "--labels", *geojsons,
                            "--unannotated", "Normal", "--allow-empty-labels", "--workers", 2))
        for index, entry in enumerate(tiled["slides"]):
            tumour_tiles = entry["label_counts"].get("1", 0)
            assert (tumour_tiles > 0) == (index % 2 == 0), (index, entry)

        model = os.path.join(work, "backbone.json")
        with open(model, "w") as f:
            json.dump(BACKBONE, f)
        features = os.path.join(work, "features")
        extracted = summary(vulkan("extract", "--model", model, "--random-weights", "--layer", "pool2", "--tiles", store,
                                   "--out", features, "--batch", 64))
        expected = sorted([f"slide{index:02d}.h5" for index in range(SLIDES)] + ["runs"])  # runs/: the run's report
        assert sorted(os.listdir(features)) == expected, extracted

        process = vulkan("train", "--features", features, "--labels", labels, *HEAD_FLAGS, "--seed", 1,
                         "--val-fraction", 0.5)
        final = epochs(process.stderr)[-1]
        assert final["val_slides"] == SLIDES // 2 and final["train_slides"] == SLIDES // 2, final
        print(f"attention head on {BACKBONE} {TILE}-px tile features: held-out accuracy "
              f"{final['val_accuracy']:.3f} on {final['val_slides']} slides (train {final['train_accuracy']:.3f}, "
              f"val loss {final['val_loss']:.3f}); {time.monotonic() - started:.1f} s")
        assert final["val_accuracy"] >= 0.8, final
        print("ok")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_mil_slides():
    main()


if __name__ == "__main__":
    main()

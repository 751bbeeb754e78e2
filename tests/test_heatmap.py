"""tessera heatmap: a synthetic slide, a feature file on its tile grid (h5py) whose tiles inside
the slide's tumour polygons are shifted along one direction, and an attention head trained on
it among synthetic bags. The PNG has the thumbnail's size, and the colour map over tumour tiles
differs from that over normal tiles (viridis: yellow-green for high attention, purple for low);
a mean head's scores lie in [0, 1].
Bad input exits 5 and names the file: a missing feature file, a truncated checkpoint, coords
outside the slide (named with the slide)."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import h5py
import numpy as np
from PIL import Image

from data_tools import tumour_polygons

TESSERA = sys.argv[1] if __name__ == "__main__" and len(sys.argv) > 1 else os.environ.get(
    "TESSERA_BINARY", "build/tools/tessera")
SIZE, TILE, WIDTH, BAGS = 2048, 128, 16, 24


def run(args):
    env = dict(os.environ, TESSERA_VALIDATION="1")
    process = subprocess.run([TESSERA] + [str(a) for a in args], capture_output=True, text=True, env=env)
    assert "vulkan validation" not in process.stderr.lower(), process.stderr
    return process


def polygons(geojson):
    """The exterior rings of the tumour polygons, as [K,2] arrays of level-0 x, y."""
    return [np.asarray(polygon[0], dtype=np.float64) for polygon in tumour_polygons(geojson)]


def inside(points, ring):
    """Even-odd ray casting: which of `points` [P,2] lie inside `ring`."""
    x, y = points[:, 0:1], points[:, 1:2]
    x0, y0 = ring[:, 0], ring[:, 1]
    x1, y1 = np.roll(x0, -1), np.roll(y0, -1)
    crosses = (y0 > y) != (y1 > y)
    with np.errstate(divide="ignore", invalid="ignore"):
        at = x0 + (y - y0) * (x1 - x0) / (y1 - y0)
    return np.sum(crosses & (x < at), axis=1) % 2 == 1


def attention_logits(checkpoint, features_path):
    """The attention head's logit per tile, in float64 from the checkpoint's parameters."""
    with h5py.File(checkpoint, "r") as f:
        p = {name: f["params"][name][()].astype(np.float64) for name in f["params"]}
    with h5py.File(features_path, "r") as f:
        x = f["features"][()].astype(np.float64)
    v = np.tanh(x @ p["attention_V.weight"].T + p["attention_V.bias"])
    u = 1 / (1 + np.exp(-(x @ p["attention_U.weight"].T + p["attention_U.bias"])))
    return ((v * u) @ p["attention_w.weight"].T + p["attention_w.bias"])[:, 0]


def write_features(path, features, coords, patch_size=TILE):
    with h5py.File(path, "w") as f:
        f["features"] = features.astype(np.float32)
        f["coords"] = coords.astype(np.int64)
        f["coords"].attrs["patch_size"] = patch_size
        f["coords"].attrs["patch_level"] = 0
        f["coords"].attrs["downsample"] = np.array([1.0, 1.0])
        f["coords"].attrs["level_dim"] = np.array([SIZE, SIZE])
        f["coords"].attrs["name"] = "s"


def main():
    work = tempfile.mkdtemp(prefix="tessera-heatmap-")
    try:
        slide = os.path.join(work, "s.tiff")
        process = run(["synth", slide, "--width", SIZE, "--height", SIZE, "--seed", 1])
        assert process.returncode == 0, process.stderr

        grid = np.arange(0, SIZE, TILE)
        coords = np.stack(np.meshgrid(grid, grid), axis=-1).reshape(-1, 2)
        centres = coords + TILE / 2
        tumour = np.zeros(len(coords), dtype=bool)
        for ring in polygons(os.path.join(work, "s.geojson")):
            tumour |= inside(centres, ring)
        assert 4 <= tumour.sum() < len(coords) // 2, tumour.sum()

        generator = np.random.default_rng(5)
        direction = generator.normal(size=WIDTH)
        direction /= np.linalg.norm(direction)
        features_dir = os.path.join(work, "features")
        os.makedirs(features_dir)
        slide_features = generator.normal(size=(len(coords), WIDTH))
        slide_features[tumour] += 4.0 * direction
        slide_file = os.path.join(features_dir, "s.h5")
        write_features(slide_file, slide_features, coords)
        rows = ["slide,label", "s,tumor"]
        for b in range(BAGS):
            count = int(generator.integers(20, 81))
            bag = generator.normal(size=(count, WIDTH))
            if b % 2:
                bag[generator.choice(count, size=int(generator.integers(3, 7)), replace=False)] += 4.0 * direction
            write_features(os.path.join(features_dir, f"bag{b:02d}.h5"), bag, np.zeros((count, 2)))
            rows.append(f"bag{b:02d},{'tumor' if b % 2 else 'normal'}")
        labels = os.path.join(work, "slides.csv")
        with open(labels, "w") as f:
            f.write("\n".join(rows) + "\n")

        model = os.path.join(work, "attention.h5")
        process = run(["train", "--features", features_dir, "--labels", labels, "--head", "attention", "--epochs", 15,
                       "--optimizer", "adam", "--lr", "0.002", "--seed", 1, "--val-fraction", 0,
                       "--checkpoint", model])
        assert process.returncode == 0, process.stderr

        def heatmap(out, alpha, features=slide_file, checkpoint=model):
            return run(["heatmap", "--features", features, "--model", checkpoint, "--slide", slide, "--out", out,
                        "--max-size", 512, "--alpha", alpha])

        painted, plain = os.path.join(work, "heat.png"), os.path.join(work, "plain.png")
        process = heatmap(painted, 0.5)
        assert process.returncode == 0, process.stderr
        summary = json.loads(process.stdout.strip().splitlines()[-1])
        assert summary["tiles"] == len(coords), summary
        assert heatmap(plain, 0.0).returncode == 0

        image = np.asarray(Image.open(painted).convert("RGB"), dtype=np.float64)
        base = np.asarray(Image.open(plain).convert("RGB"), dtype=np.float64)
        assert image.shape == (512, 512, 3) and base.shape == image.shape, (image.shape, base.shape)
        assert (summary["width"], summary["height"]) == (512, 512), summary

        # What the colour map added, averaged over tumour and over normal tiles (their inner pixels).
        scale = 512 / SIZE
        masks = {True: np.zeros((512, 512), dtype=bool), False: np.zeros((512, 512), dtype=bool)}
        for (x, y), is_tumour in zip(coords, tumour):
            x0, y0 = int(x * scale) + 2, int(y * scale) + 2
            masks[bool(is_tumour)][y0:y0 + int(TILE * scale) - 4, x0:x0 + int(TILE * scale) - 4] = True
        overlay = image - 0.5 * base
        high, low = overlay[masks[True]].mean(axis=0), overlay[masks[False]].mean(axis=0)
        print(f"colour map over tumour tiles {np.round(high, 1)}, over normal tiles {np.round(low, 1)}")
        # Viridis: high scores are yellow-green (more green, less blue) than low scores' purple.
        assert high[1] - low[1] > 25 and low[2] - high[2] > 5, (high, low)

        # Each tile's colour follows the attention logit computed here from the checkpoint's
        # parameters (Ilse et al.: w . (tanh(V x) * sigmoid(U x))): viridis's green rises with
        # the score, so the tiles' greens must rank as the logits do.
        expected = attention_logits(model, slide_file)
        greens = np.array([overlay[int(y * scale) + 2:int((y + TILE) * scale) - 2,
                                   int(x * scale) + 2:int((x + TILE) * scale) - 2, 1].mean() for x, y in coords])
        ranks = lambda v: np.argsort(np.argsort(v))
        correlation = np.corrcoef(ranks(expected), ranks(greens))[0, 1]
        assert correlation > 0.98, correlation
        assert np.argmax(greens) == np.argmax(expected) and np.argmin(greens) == np.argmin(expected)

        # A mean head scores each tile by its tumour probability, within [0, 1].
        mean_model = os.path.join(work, "mean.h5")
        process = run(["train", "--features", features_dir, "--labels", labels, "--head", "mean", "--epochs", 5,
                       "--optimizer", "adam", "--lr", "0.01", "--seed", 1, "--val-fraction", 0,
                       "--checkpoint", mean_model])
        assert process.returncode == 0, process.stderr
        process = heatmap(os.path.join(work, "mean.png"), 0.5, checkpoint=mean_model)
        assert process.returncode == 0, process.stderr
        summary = json.loads(process.stdout.strip().splitlines()[-1])
        assert 0 <= summary["score_min"] < summary["score_max"] <= 1, summary

        # Bad input: each names the file, exit 5.
        missing = os.path.join(work, "absent.h5")
        process = heatmap(os.path.join(work, "x.png"), 0.5, features=missing)
        assert process.returncode == 5 and "absent.h5" in process.stderr, process.stderr
        broken = os.path.join(work, "broken.h5")
        with open(model, "rb") as f:
            data = f.read()
        with open(broken, "wb") as f:
            f.write(data[:len(data) // 2])
        process = heatmap(os.path.join(work, "x.png"), 0.5, checkpoint=broken)
        assert process.returncode == 5 and "broken.h5" in process.stderr, process.stderr
        outside = os.path.join(work, "outside.h5")
        write_features(outside, slide_features, coords + SIZE // 2)
        process = heatmap(os.path.join(work, "x.png"), 0.5, features=outside)
        assert process.returncode == 5, process.stderr
        assert "outside.h5" in process.stderr and "s.tiff" in process.stderr, process.stderr
        assert not os.path.exists(os.path.join(work, "x.png"))
        print("ok")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_heatmap():
    main()


if __name__ == "__main__":
    main()

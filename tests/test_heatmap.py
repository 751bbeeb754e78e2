"""tessera heatmap: a synthetic slide, a feature file on its tile grid (h5py) whose tiles inside
the slide's tumour polygons are shifted from the normal tiles' cluster, and an attention head trained on
it among synthetic bags. Each tile's colour is viridis at the head's probability of "tumor" for
that tile alone (computed here from the checkpoint's parameters), on the fixed 0..1 scale; the
legend band under the thumbnail holds the colour bar from viridis(0) to viridis(1) and its text.
Mean, max and dsmil heads score tiles too (dsmil by its instance classifier); a clam-mb head by its
attention to the last class, and a transmil head by its class token's attention, as each tile's
percentile in the slide.
A tumour-free synthetic slide is dark under the fixed scale and has a bright spot only under
--scale slide. Bad input exits 5 and names the file: a missing feature file, a truncated
checkpoint, coords outside the slide, and the features of another slide (by the name and size
the feature file records), named with the slide. The PNG follows the writer discipline: an
existing one is replaced only with --overwrite (exit 2 naming --out otherwise, the file unchanged),
a link at --out is refused and with --overwrite replaced by the PNG, never written through, an
input given as --out is exit 2 and unchanged, and no temporary or lock file is left."""
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
# matplotlib's viridis at nine even steps (the colour map the legend names).
VIRIDIS = np.array([[68, 1, 84], [71, 44, 122], [59, 81, 139], [44, 113, 142], [33, 144, 141], [39, 173, 129],
                    [92, 200, 99], [170, 220, 50], [253, 231, 37]], dtype=np.float64)


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


def viridis(position):
    at = np.clip(position, 0, 1) * 8
    low = np.minimum(at.astype(int), 7)
    t = (at - low)[..., None]
    return VIRIDIS[low] + t * (VIRIDIS[low + 1] - VIRIDIS[low])


def tumour_probability(checkpoint, features_path, classifier="classifier"):
    """The head's probability of its last class for each tile alone, in float64 from the checkpoint."""
    with h5py.File(checkpoint, "r") as f:
        weight, bias = f[f"params/{classifier}.weight"][()].astype(np.float64), f[f"params/{classifier}.bias"][()]
    with h5py.File(features_path, "r") as f:
        x = f["features"][()].astype(np.float64)
    logits = x @ weight.T + bias
    logits -= logits.max(axis=1, keepdims=True)
    return (np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True))[:, -1]


def clam_attention_percentiles(checkpoint, features_path):
    """A clam-mb head's attention to its last class for each tile (model_clam.py's A_raw), as
    its percentile in the slide: scipy's rankdata(average) / n, as CLAM's to_percentiles."""
    with h5py.File(checkpoint, "r") as f:
        p = {name: f["params"][name][()].astype(np.float64) for name in f["params"]}
    with h5py.File(features_path, "r") as f:
        x = f["features"][()].astype(np.float64)
    linear = lambda x, name: x @ p[name + ".weight"].T + p[name + ".bias"]
    h = np.maximum(linear(x, "attention_net.0"), 0)
    gate = np.tanh(linear(h, "attention_net.3.attention_a.0")) / (1 + np.exp(-linear(h, "attention_net.3.attention_b.0")))
    scores = linear(gate, "attention_net.3.attention_c")[:, -1]
    order = np.argsort(scores, kind="stable")
    ranks = np.empty(len(scores))
    ranks[order] = np.arange(1, len(scores) + 1)
    for value in np.unique(scores):  # ties: their mean rank
        ranks[scores == value] = ranks[scores == value].mean()
    return ranks / len(scores)


def tile_means(image, coords, scale):
    """Each tile's mean colour over its inner pixels of the thumbnail."""
    return np.array([image[int(y * scale) + 2:int((y + TILE) * scale) - 2,
                           int(x * scale) + 2:int((x + TILE) * scale) - 2].reshape(-1, 3).mean(axis=0)
                     for x, y in coords])


def check_legend(image, height):
    """Under the thumbnail: text (black pixels), then the colour bar from viridis(0) to viridis(1)."""
    band = image[height:]
    assert band.shape[0] >= 30, band.shape
    black = np.all(band < 30, axis=2)
    assert black[:12].sum() > 50, "no legend text"
    rows = [r for r in range(band.shape[0]) if np.abs(band[r, 8] - VIRIDIS[0]).max() <= 3]
    assert rows, "no colour bar"
    bar = band[rows[0] + 1]
    assert np.abs(bar[band.shape[1] - 5] - VIRIDIS[-1]).max() <= 6, bar[-5]
    assert np.all(np.diff(bar[8:band.shape[1] - 5, 1]) >= -1), "the bar's green must rise"


def write_features(path, features, coords, patch_size=TILE, name="s", level_dim=(SIZE, SIZE)):
    with h5py.File(path, "w") as f:
        f["features"] = features.astype(np.float32)
        f["coords"] = coords.astype(np.int64)
        f["coords"].attrs["patch_size"] = patch_size
        f["coords"].attrs["patch_level"] = 0
        f["coords"].attrs["downsample"] = np.array([1.0, 1.0])
        f["coords"].attrs["level_dim"] = np.array(level_dim)
        f["coords"].attrs["name"] = name


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

        # Features of like tiles cluster, as a CNN's do: normal tiles spread around one point,
        # tumour tiles shifted from it along one direction.
        generator = np.random.default_rng(5)
        direction = generator.normal(size=WIDTH)
        direction /= np.linalg.norm(direction)
        centre = generator.normal(size=WIDTH)
        normal = lambda count: centre + 0.3 * generator.normal(size=(count, WIDTH))
        features_dir = os.path.join(work, "features")
        os.makedirs(features_dir)
        slide_features = normal(len(coords))
        slide_features[tumour] += 4.0 * direction
        slide_file = os.path.join(features_dir, "s.h5")
        write_features(slide_file, slide_features, coords)
        rows = ["slide,label", "s,tumor"]
        for b in range(BAGS):
            count = int(generator.integers(20, 81))
            bag = normal(count)
            if b % 2:
                bag[generator.choice(count, size=int(generator.integers(3, 7)), replace=False)] += 4.0 * direction
            write_features(os.path.join(features_dir, f"bag{b:02d}.h5"), bag, np.zeros((count, 2)))
            rows.append(f"bag{b:02d},{'tumor' if b % 2 else 'normal'}")
        labels = os.path.join(work, "slides.csv")
        with open(labels, "w") as f:
            f.write("\n".join(rows) + "\n")

        model = os.path.join(work, "attention.h5")
        process = run(["train", "--features", features_dir, "--labels", labels, "--head", "attention", "--epochs", 30,
                       "--optimizer", "adam", "--lr", "0.002", "--seed", 1, "--val-fraction", 0,
                       "--checkpoint", model])
        assert process.returncode == 0, process.stderr

        def heatmap(out, alpha, features=slide_file, checkpoint=model, on=slide, *flags):
            return run(["heatmap", "--features", features, "--model", checkpoint, "--slide", on, "--out", out,
                        "--max-size", 512, "--alpha", alpha, *flags])

        painted, plain = os.path.join(work, "heat.png"), os.path.join(work, "plain.png")
        process = heatmap(painted, 0.5)
        assert process.returncode == 0, process.stderr
        summary = json.loads(process.stdout.strip().splitlines()[-1])
        assert summary["tiles"] == len(coords), summary
        assert summary["colour_map"] == "viridis" and summary["scale"] == "fixed", summary
        assert summary["scale_range"] == [0, 1] and summary["score"] == "probability of class 'tumor'", summary
        assert heatmap(plain, 0.0).returncode == 0

        image = np.asarray(Image.open(painted).convert("RGB"), dtype=np.float64)
        base = np.asarray(Image.open(plain).convert("RGB"), dtype=np.float64)
        assert summary["thumbnail"] == [512, 512], summary
        assert image.shape == (512 + summary["legend_height"], 512, 3) and base.shape == image.shape, image.shape
        check_legend(image.astype(np.uint8), 512)

        # Each tile: (1 - alpha) * thumbnail + alpha * viridis(p), p the head's probability of "tumor"
        # for that tile alone, computed here from the checkpoint's parameters.
        scale = 512 / SIZE
        expected = tumour_probability(model, slide_file)
        painted_tiles = tile_means(image[:512], coords, scale)
        predicted = 0.5 * tile_means(base[:512], coords, scale) + 0.5 * viridis(expected)
        error = np.abs(painted_tiles - predicted).max()
        print(f"tumour tiles p {expected[tumour].mean():.3f}, normal {expected[~tumour].mean():.3f}; "
              f"largest colour error {error:.2f}")
        assert error < 2.0, error
        assert expected[tumour].mean() > 0.7 and expected[~tumour].mean() < 0.3, expected

        # The writer discipline (common/output.h).
        def unchanged(path, run_it):
            with open(path, "rb") as f:
                before = f.read()
            process = run_it()
            with open(path, "rb") as f:
                assert f.read() == before, path
            return process

        process = unchanged(painted, lambda: heatmap(painted, 0.0))
        assert process.returncode == 2 and "--out" in process.stderr and "heat.png" in process.stderr and \
               "--overwrite" in process.stderr, process.stderr
        assert heatmap(painted, 0.0, slide_file, model, slide, "--overwrite").returncode == 0
        with open(painted, "rb") as f, open(plain, "rb") as g:
            assert f.read() == g.read(), "replaced: now the plain thumbnail"
        victim, link = os.path.join(work, "victim.txt"), os.path.join(work, "link.png")
        with open(victim, "w") as f:
            f.write("not yours\n")
        os.symlink(victim, link)
        process = unchanged(victim, lambda: heatmap(link, 0.5))
        assert process.returncode == 2 and "link.png" in process.stderr, process.stderr
        process = unchanged(victim, lambda: heatmap(link, 0.5, slide_file, model, slide, "--overwrite"))
        assert process.returncode == 0 and not os.path.islink(link), process.stderr
        assert Image.open(link).size == (512, 512 + summary["legend_height"])
        for given, flag in ((slide_file, "--features"), (model, "--model"), (slide, "--slide")):
            process = unchanged(given, lambda: heatmap(given, 0.5, slide_file, model, slide, "--overwrite"))
            assert process.returncode == 2 and f"is the input {flag}" in process.stderr, process.stderr
        assert not [name for name in os.listdir(work) if name.endswith((".partial", ".lock"))], os.listdir(work)

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

        # A max head, as the mean: a max over one tile is that tile, so its score is the
        # classifier's probability for the tile alone; a dsmil head's, its instance classifier's
        # (from the checkpoint here).
        for head, classifier in (("max", "classifier"), ("dsmil", "i_classifier.fc.0")):
            head_model = os.path.join(work, f"{head}.h5")
            process = run(["train", "--features", features_dir, "--labels", labels, "--head", head, "--epochs", 5,
                           "--optimizer", "adam", "--lr", "0.01", "--seed", 1, "--val-fraction", 0,
                           "--checkpoint", head_model])
            assert process.returncode == 0, process.stderr
            process = heatmap(os.path.join(work, f"{head}.png"), 0.5, checkpoint=head_model)
            assert process.returncode == 0, process.stderr
            summary = json.loads(process.stdout.strip().splitlines()[-1])
            expected = tumour_probability(head_model, slide_file, classifier)
            assert abs(summary["score_min"] - expected.min()) < 1e-5, (head, summary, expected.min())
            assert abs(summary["score_max"] - expected.max()) < 1e-5, (head, summary, expected.max())

        # A clam head scores each tile by its attention (clam-mb: the last class's column) as its
        # percentile in the slide (CLAM's create_heatmaps.py to_percentiles), here from the
        # checkpoint's parameters in float64; the tumour tiles draw the most attention.
        clam_model = os.path.join(work, "clam-mb.h5")
        process = run(["train", "--features", features_dir, "--labels", labels, "--head", "clam-mb", "--epochs", 5,
                       "--optimizer", "adam", "--lr", "0.002", "--seed", 1, "--val-fraction", 0,
                       "--checkpoint", clam_model])
        assert process.returncode == 0, process.stderr
        out = os.path.join(work, "clam-mb.png")
        process = heatmap(out, 1.0, checkpoint=clam_model)
        assert process.returncode == 0, process.stderr
        summary = json.loads(process.stdout.strip().splitlines()[-1])
        assert summary["score"] == "attention percentile of class 'tumor'", summary
        expected = clam_attention_percentiles(clam_model, slide_file)
        colours = tile_means(np.asarray(Image.open(out).convert("RGB"), dtype=np.float64)[:512], coords, scale)
        assert np.abs(colours - viridis(expected)).max() < 6, np.abs(colours - viridis(expected)).max()
        assert expected[tumour].mean() > 0.75, expected[tumour].mean()

        # A transmil head scores each tile by the attention its second layer gives it from the class
        # token (checked against a CPU reference in test_op_nystrom_attention), as its percentile:
        # the whole inference graph (the PPEG's combined kernel, the class-attention output) runs.
        transmil_model = os.path.join(work, "transmil.h5")
        process = run(["train", "--features", features_dir, "--labels", labels, "--head", "transmil", "--epochs", 1,
                       "--attention-hidden", 16, "--seed", 1, "--val-fraction", 0, "--checkpoint", transmil_model])
        assert process.returncode == 0, process.stderr
        process = heatmap(os.path.join(work, "transmil.png"), 1.0, checkpoint=transmil_model)
        assert process.returncode == 0, process.stderr
        summary = json.loads(process.stdout.strip().splitlines()[-1])
        assert summary["score"] == "class-token attention percentile", summary
        assert summary["score_max"] == 1.0 and 0 < summary["score_min"] <= 1 / len(coords) * 2, summary

        # A slide without tumour, its tiles' features all from the normal distribution: dark under the
        # fixed scale; --scale slide stretches its own small range so that its top tile is yellow.
        free = os.path.join(work, "free.tiff")
        process = run(["synth", free, "--width", SIZE, "--height", SIZE, "--seed", 2, "--no-tumour"])
        assert process.returncode == 0, process.stderr
        free_features = os.path.join(work, "free.h5")
        write_features(free_features, normal(len(coords)), coords, name="free")
        colours = {}
        for mode in ("fixed", "slide"):
            out = os.path.join(work, f"free-{mode}.png")
            process = heatmap(out, 1.0, free_features, model, free, "--scale", mode)
            assert process.returncode == 0, process.stderr
            summary = json.loads(process.stdout.strip().splitlines()[-1])
            picture = np.asarray(Image.open(out).convert("RGB"), dtype=np.float64)
            check_legend(picture.astype(np.uint8), 512)
            colours[mode] = tile_means(picture[:512], coords, scale)
        print(f"tumour-free slide: p up to {summary['score_max']:.3f}; mean tile colour fixed "
              f"{np.round(colours['fixed'].mean(axis=0), 1)}, brightest green fixed {colours['fixed'][:, 1].max():.0f}, "
              f"stretched {colours['slide'][:, 1].max():.0f}")
        assert summary["score_max"] < 0.5 and summary["scale"] == "slide", summary
        # Dark: viridis below 0.25 (green under 82) on average and for nine tiles in ten.
        assert colours["fixed"][:, 1].mean() < 60 and np.percentile(colours["fixed"][:, 1], 90) < 82, colours["fixed"]
        assert colours["slide"][:, 1].max() > 220, colours["slide"].max(axis=0)

        # The features of one slide over another: refused by the name, and by the size, each recorded.
        process = heatmap(os.path.join(work, "x.png"), 0.5, slide_file, model, free)
        assert process.returncode == 5, process.stderr
        assert "s.h5" in process.stderr and "free.tiff" in process.stderr, process.stderr
        resized = os.path.join(work, "resized.h5")
        write_features(resized, slide_features, coords, name="free", level_dim=(SIZE, SIZE // 2))
        process = heatmap(os.path.join(work, "x.png"), 0.5, resized, model, free)
        assert process.returncode == 5, process.stderr
        assert "resized.h5" in process.stderr and "free.tiff" in process.stderr and "2048x1024" in process.stderr

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
        # A head's checkpoint that says what it is but lacks a parameter: named with the file.
        lacking = os.path.join(work, "lacking.h5")
        shutil.copy(model, lacking)
        with h5py.File(lacking, "r+") as f:
            del f["params/classifier.weight"]
        process = heatmap(os.path.join(work, "x.png"), 0.5, checkpoint=lacking)
        assert process.returncode == 5, process.stderr
        assert "lacking.h5" in process.stderr and "classifier.weight" in process.stderr, process.stderr
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

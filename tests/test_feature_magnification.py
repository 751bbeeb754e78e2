"""Feature files' magnifications as TRIDENT writes them (trident/IO.py coords_to_h5: the
magnification asked for, and level0_magnification from WSI._fetch_magnification's buckets of the
pixel size), so that TRIDENT's users, who filter on `target_magnification == 20`, find them.

- An encoder trained at 0.5 um/px (vit-b16) on a slide of 0.4571 um/px reads 245-pixel tiles at
  level 0 and shrinks them to 224: target_magnification 20 (an integer), level0_magnification 20.
  Before: 20 * 224 / 245 = 18.29. The same encoder on CMU-1-Small-Region (0.499 um/px): 20 and 20.
- A CNN read at level 1 of a 40x SVS whose level 1 is 2000 of level 0's 4001 pixels (downsample
  2.0005): 20, not 40 / 2.0005 = 19.995; at level 2 (1000 pixels, 4.001): 10, not 9.9975; at a
  level of downsample 3: 40 / 3, a float, as TRIDENT's `%g` names such a magnification.
- --coords: TRIDENT's file's magnifications are copied as TRIDENT copies them; CLAM's (no
  magnification) at patch_level 1 gives level 1's (20 of a 40x slide).
Each run is a few small tiles (--size 64, vit-b16 on 2 to 4 tiles).
"""
import os
import sys

import h5py
import numpy as np
import pytest
import tifffile

TESTS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, TESTS)
from slide_files import pyramid, write_tiff  # noqa: E402
from test_extract_live import CMU, tessera  # noqa: E402

SVS_40X = "Aperio Image Library v11.2.1 \r\n{width}x{height} (256x256) JPEG/RGB Q=90|AppMag = 40|MPP = 0.2500"


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return str(tmp_path_factory.mktemp("magnification"))


def magnifications(path):
    with h5py.File(path, "r") as f:
        attributes = f["coords"].attrs
        level0, target = attributes["level0_magnification"], attributes["target_magnification"]
        return level0, target, f["coords"].shape[0]


def tissue_like(height, width, seed):
    rng = np.random.default_rng(seed)
    return rng.integers(120, 220, (height, width, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def odd_svs(work):
    """A 40x SVS of 4001 x 1024 pixels with levels of 2000 x 512 (downsample 2.00025, as the
    average of width's and height's), 1333 x 341 (3.0) and 1000 x 256 (4.0005)."""
    path = os.path.join(work, "odd.svs")
    image = tissue_like(1024, 4001, 1)
    write_tiff(path, pyramid(image, (2, 3, 4)), description=SVS_40X.format(width=4001, height=1024))
    return path


def cnn_magnifications(work, slide, name, *flags):
    out = os.path.join(work, name)
    tessera("extract", "--model", "small-cnn", "--random-weights", "--layer", "conv1", "--slides", slide,
            "--out", out, "--size", 64, "--tissue", "none", *flags)
    return magnifications(os.path.join(out, os.path.splitext(os.path.basename(slide))[0] + ".h5"))


@pytest.mark.parametrize("level, expected", [(0, 40), (1, 20), (3, 10)])
def test_a_cnn_at_a_level_has_its_whole_magnification(work, odd_svs, level, expected):
    level0, target, tiles = cnn_magnifications(work, odd_svs, f"level{level}", "--level", level)
    assert tiles > 0
    assert (level0, target) == (40, expected), (level, level0, target)
    assert isinstance(target, np.integer), type(target)


def test_a_level_of_downsample_3_is_a_fraction(work, odd_svs):
    # The 1333-pixel level: 4001 / 1333 and 1024 / 341 average to 3.0019, within 0.1 of 3.
    level0, target, _ = cnn_magnifications(work, odd_svs, "level-3x", "--level", 2)
    assert level0 == 40 and isinstance(target, (float, np.floating)) and abs(target - 40 / 3) < 1e-9, target


def test_an_encoder_has_its_own_magnification(work):
    slide = os.path.join(work, "fine.tif")
    mpp = 0.4571
    tifffile.imwrite(slide, tissue_like(490, 490, 2), tile=(256, 256), photometric="rgb",
                     resolution=(1e4 / mpp, 1e4 / mpp), resolutionunit="CENTIMETER")
    out = os.path.join(work, "encoder")
    tessera("extract", "--encoder", "vit-b16", "--random-weights", "--slides", slide, "--out", out,
            "--tissue", "none", "--batch", 2)
    level0, target, tiles = magnifications(os.path.join(out, "fine.h5"))
    with h5py.File(os.path.join(out, "fine.h5"), "r") as f:
        read = f["coords"].attrs["patch_size"]
    assert read == 245 and tiles == 4, (read, tiles)  # 224 * 0.5 / 0.4571 pixels of level 0
    assert (level0, target) == (20, 20) and isinstance(target, np.integer), (level0, target)


def test_an_encoder_on_cmu(work):
    out = os.path.join(work, "cmu")
    tessera("extract", "--encoder", "vit-b16", "--random-weights", "--slides", CMU, "--out", out,
            "--tissue-threshold", 115, "--min-tissue", 0.5, "--batch", 2)
    level0, target, _ = magnifications(os.path.join(out, "CMU-1-Small-Region.h5"))
    assert (level0, target) == (20, 20), (level0, target)


def write_coords(directory, name, attributes, patches):
    os.makedirs(directory, exist_ok=True)
    with h5py.File(os.path.join(directory, name), "w") as f:
        dataset = f.create_dataset("coords", data=np.asarray(patches, dtype=np.int64), maxshape=(None, 2),
                                   chunks=(1, 2))
        for key, value in attributes.items():
            dataset.attrs[key] = value


def test_coords_files_give_theirs(work, odd_svs):
    trident = os.path.join(work, "trident-coords")
    # TRIDENT >= 0.2.4 at --mag 20 on a 40x slide, 64-pixel patches: patch_size_level0 128.0, target 20.0 (a float).
    write_coords(trident, "odd_patches.h5", {"patch_size": 64, "patch_size_level0": 128.0, "level0_magnification": 40,
                                             "target_magnification": 20.0, "overlap": 0, "name": "odd",
                                             "level0_width": 4001, "level0_height": 1024},
                 [(0, 0), (128, 0)])
    level0, target, tiles = cnn_magnifications_coords(work, odd_svs, trident, "trident")
    assert (level0, target, tiles) == (40, 20, 2), (level0, target, tiles)
    clam = os.path.join(work, "clam-coords")
    # CLAM at patch_level 1: 64 pixels of the 2.00025 level.
    write_coords(clam, "odd.h5", {"patch_size": 64, "patch_level": 1, "name": "odd"}, [(0, 0), (128, 0)])
    level0, target, tiles = cnn_magnifications_coords(work, odd_svs, clam, "clam")
    assert (level0, target, tiles) == (40, 20, 2), (level0, target, tiles)


def cnn_magnifications_coords(work, slide, coords, name):
    out = os.path.join(work, name + "-features")
    tessera("extract", "--model", "small-cnn", "--random-weights", "--layer", "conv1", "--slides", slide,
            "--coords", coords, "--out", out)
    return magnifications(os.path.join(out, "odd.h5"))

"""Tiles of level 1 and above hold the pixels at the level-0 position they record, against
python3-openslide's read_region at that position: an SVS pyramid of real H&E (CMU-1-Small-Region's
pixels, levels at downsample 4.002 and 16.06, read through OpenSlide) and a generic TIFF pyramid
with exact downsamples (tessera's own TIFF reader)."""
import os
import shutil

import numpy as np
import openslide

from data_tools import parse_value, read_store, run, summary, workdir
from slide_files import APERIO, pyramid, write_tiff

TESSERA = os.environ.get("TESSERA_BINARY", "build/tools/tessera")
SLIDES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "testdata",
                      "slides")


def over_white(region):
    """An RGBA region from openslide-python on white, as tessera composites OpenSlide's regions;
    where tiles meet at a fractional offset a pixel is partly transparent and openslide-python's
    un-premultiplied colour is one off from tessera's at most."""
    rgba = np.asarray(region, dtype=np.float64)
    alpha = rgba[..., 3:] / 255
    return rgba[..., :3] * alpha + 255 * (1 - alpha)


def check_level(binary, slide, store, level, size, tolerance):
    """Every tile of `level` against OpenSlide's region at the tile's recorded level-0 x, y:
    equal within `tolerance` (mean absolute difference), and closer there than one level-0
    pixel away."""
    tiled = summary(run(binary, "tile", slide, "--out", store, "--level", level, "--size", size,
                        "--encoding", "raw", "--min-tissue", 0))
    tiles, slides = read_store(store)
    assert len(tiles) == tiled["written"] > 0, tiled
    reader = openslide.OpenSlide(slide)
    downsample = slides[0]["downsample"]
    assert abs(downsample - reader.level_downsamples[level]) < 1e-9, (downsample, reader.level_downsamples)
    off = []
    for key, value in tiles.items():
        tile = parse_value(key, value)
        _, tile_level, row, column = key
        assert tile_level == level
        assert (tile["x"], tile["y"]) == (round(column * size * downsample), round(row * size * downsample)), key
        pixels = np.asarray(tile["image"], dtype=np.int32)

        def difference(dx, dy):
            return np.abs(over_white(reader.read_region((tile["x"] + dx, tile["y"] + dy), level, (size, size))) -
                          pixels)

        here = difference(0, 0)
        assert here.mean() <= tolerance and here.max() <= max(1.5, tolerance * 255), (key, here.mean(), here.max())
        if min(difference(dx, dy).mean() for dx, dy in ((-1, 0), (0, -1), (1, 0), (0, 1))) < here.mean():
            off.append(key)
    assert not off, f"{len(off)} of {len(tiles)} tiles match a position one pixel from the one they record: {off[:5]}"
    print(f"{os.path.basename(slide)} level {level}: {len(tiles)} tiles at their recorded positions")
    return len(tiles)


def main(binary):
    work = workdir("test_data_levels")
    cmu = openslide.OpenSlide(os.path.join(SLIDES, "CMU-1-Small-Region.svs"))
    pixels = np.asarray(cmu.read_region((0, 0), 0, cmu.dimensions).convert("RGB"))

    # SVS through OpenSlide: a tile is OpenSlide's own region at the position it records.
    svs = os.path.join(work, "cmu-pyramid.svs")
    write_tiff(svs, pyramid(pixels, [4, 16]), tile=240, description=APERIO.format(width=2220, height=2967, tile=240))
    assert openslide.OpenSlide(svs).properties["openslide.vendor"] == "aperio"
    for level, size in ((1, 64), (2, 32)):
        check_level(binary, svs, os.path.join(work, f"svs{level}.lmdb"), level, size, 0.001)

    # A generic TIFF pyramid with exact downsamples (2, 4), read by tessera's own reader: the
    # level's pixels as OpenSlide decodes them (both through libjpeg-turbo).
    crop = pixels[:2048, :1536]
    tiff = os.path.join(work, "cmu-pyramid.tiff")
    write_tiff(tiff, pyramid(crop, [2, 4]), tile=256)
    for level in (1, 2):
        check_level(binary, tiff, os.path.join(work, f"tiff{level}.lmdb"), level, 64, 0.5)
    shutil.rmtree(work)
    print("ok")


def test_data_levels():
    main(TESSERA)

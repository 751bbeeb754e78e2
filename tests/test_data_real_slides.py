"""`tessera tile` on real public slides (../shared/testdata/slides, see its README): tissue found
as an independent CLAM-style detection (python3-openslide and numpy) finds it, no glass-only
tile, every broken file refused with exit 5 naming it, and the formats read through libvips and
DCMTK tile."""
import io
import os
import shutil
import struct
import sys

import numpy as np
import openslide
from numpy.lib.stride_tricks import sliding_window_view
from PIL import Image

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


def clam_tissue_fractions(rgb, tile):
    """CLAM's segmentation (saturation, 7x7 median, threshold 8, 4x4 close) of an RGB image; per
    tile of the grid, the fraction of tissue."""
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


def dicom_frames(path):
    """The JPEG fragments of a DICOM file's encapsulated pixel data (after the offset table)."""
    with open(path, "rb") as f:
        data = f.read()
    start = data.index(b"\xe0\x7f\x10\x00OB\x00\x00\xff\xff\xff\xff") + 12
    items = []
    while data[start:start + 4] == b"\xfe\xff\x00\xe0":
        (length,) = struct.unpack_from("<I", data, start + 4)
        items.append(data[start + 8:start + 8 + length])
        start += 8 + length
    return items[1:]


def expect_bad_input(binary, path, store, *words):
    result = run(binary, "tile", path, "--out", store, check=False)
    assert result.returncode == 5, (path, result.returncode, result.stdout, result.stderr)
    for word in (os.path.basename(path), *words):
        assert word in result.stderr, (word, result.stderr)
    print(f"{os.path.basename(path)}: {result.stderr.strip().splitlines()[-1]}")


TESSERA = os.environ.get("TESSERA_BINARY", "build/tools/tessera")


def main(binary):
    work = workdir("test_data_real_slides")

    # H&E, a third of it tissue: the count of tiles at least half tissue agrees with CLAM's.
    cmu = slide("CMU-1-Small-Region.svs")
    reader = openslide.OpenSlide(cmu)
    rgb = np.asarray(reader.read_region((0, 0), 0, reader.dimensions).convert("RGB"))
    # The same tissue where it covers most of the image (a crop around it, read as PNG through
    # libvips): the share of tissue must not matter.
    crop = os.path.join(work, "cmu-crop.png")
    Image.fromarray(rgb[:, 560:1840]).save(crop)
    for path, image in ((cmu, rgb), (crop, rgb[:, 560:1840])):
        fractions = clam_tissue_fractions(image, 256)
        estimate = int((fractions >= 0.5).sum())
        store = os.path.join(work, os.path.basename(path) + ".lmdb")
        tiled = summary(run(binary, "tile", path, "--out", store))["slides"][0]
        tiles, _ = read_store(store)
        print(f"{os.path.basename(path)}: {len(tiles)} tissue tiles, CLAM-style estimate {estimate} of "
              f"{fractions.size}")
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
    # A plain RGB TIFF in strips (libvips): the tissue tiles, pixel for pixel; the same image as PNG
    # gives the same tiles.
    kidney = slide("kidney-ihc-stripped.tif")
    image = np.asarray(Image.open(kidney).convert("RGB"))
    png = os.path.join(work, "kidney.png")
    Image.fromarray(image).save(png)
    stores = {}
    for path in (kidney, png):
        stores[path] = os.path.join(work, os.path.basename(path) + ".lmdb")
        run(binary, "tile", path, "--out", stores[path], "--size", 32, "--encoding", "raw")
    tiles, slides = read_store(stores[kidney])
    assert slides[0]["width"] == 1493 and slides[0]["format"] == "vips:tiffload", slides[0]
    assert len(tiles) >= 2, len(tiles)
    for key, value in tiles.items():
        tile = parse_value(key, value)
        expected = image[tile["y"]:tile["y"] + 32, tile["x"]:tile["x"] + 32]
        assert np.array_equal(np.asarray(tile["image"]), expected), key
        assert 240 <= tile["x"] <= 400 and 450 <= tile["y"] <= 560, f"tile {key} is not on the tissue"
    assert read_store(stores[png])[0] == tiles
    print(f"kidney-ihc-stripped.tif: {len(tiles)} tissue tiles of 32 px, as PIL reads them")

    # A DICOM WSI series (VOLUME and THUMBNAIL files, JPEG baseline): tiles decode like its frame.
    dicom = slide("boxes_0.dcm")
    store = os.path.join(work, "dicom.lmdb")
    run(binary, "tile", dicom, "--out", store, "--size", 8, "--min-tissue", 0, "--encoding", "raw")
    tiles, slides = read_store(store)
    assert slides[0]["format"] == "dicom" and (slides[0]["width"], slides[0]["height"]) == (16, 16), slides[0]
    assert abs(slides[0]["mpp_x"] - 0.499) < 1e-9, slides[0]
    frame = np.asarray(Image.open(io.BytesIO(dicom_frames(dicom)[0])).convert("RGB"), dtype=np.int32)
    assert sorted(key[2:] for key in tiles) == [(0, 0), (0, 1), (1, 0), (1, 1)], sorted(tiles)
    for key, value in tiles.items():
        tile = parse_value(key, value)
        expected = frame[tile["y"]:tile["y"] + 8, tile["x"]:tile["x"] + 8]
        difference = np.abs(np.asarray(tile["image"], dtype=np.int32) - expected)
        assert difference.max() <= 2, (key, difference.max())
    print("boxes_0.dcm (DICOM series): 4 tiles of 8 px, as PIL decodes its JPEG frame")
    shutil.rmtree(work)
    print("ok")


def test_data_real_slides():
    main(TESSERA)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else TESSERA)

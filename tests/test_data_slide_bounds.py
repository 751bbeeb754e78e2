"""Slides that lie about themselves, and slides that give nothing: `tessera tile` trusts what a file
declares only as far as its bytes back it. A truncated pyramid (which lost levels), tiles past
the end of the file, an SVS that crashes OpenSlide 3.4.1 (SIGFPE), DICOM frames of 65535x65535,
a 200000x200000 TIFF without tile data: each exits 5 naming the file, within bounded memory. A
slide too small for the tile size, or without tissue, is named with the reason; a run that
produces no tile does not exit 0."""
import os
import shutil
import struct

import numpy as np
import openslide

from data_tools import read_store, run, run_with_usage, summary, synth, within_memory, workdir
from slide_files import APERIO, DEFLATE, pyramid, write_tiff

TESSERA = os.environ.get("TESSERA_BINARY", "build/tools/tessera")
SLIDES = os.path.normpath(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared",
                                       "testdata", "slides"))
MiB = 1 << 20


def refused(binary, slide, store, *words, code=5, flags=()):
    """`tile` exits `code` naming the slide and `words`, writes no store, and stays under 256 MiB."""
    result = run_with_usage([binary, "tile", slide, "--out", store, *flags], timeout=600)
    exit_code, _, err, peak, _, killed = result
    assert not killed and exit_code == code, (slide, exit_code, err)
    for word in (os.path.basename(slide), *words):
        assert word in err, (word, err)
    assert within_memory(peak, 256 * MiB), (slide, peak)
    assert not os.path.exists(store), "nothing is written for a refused input"
    print(f"{os.path.basename(slide)}: exit {exit_code}, {peak / MiB:.0f} MiB: {err.strip().splitlines()[-1]}")


def cmu_pixels(size):
    reader = openslide.OpenSlide(os.path.join(SLIDES, "CMU-1-Small-Region.svs"))
    return np.asarray(reader.read_region((0, 0), 0, (size, size)).convert("RGB"))


def dicom_with_frame_size(source, target, rows, columns):
    """A copy of a DICOM file whose Rows and Columns (US, explicit VR little endian) say otherwise."""
    with open(source, "rb") as f:
        data = bytearray(f.read())
    for tag, value in ((b"\x28\x00\x10\x00US\x02\x00", rows), (b"\x28\x00\x11\x00US\x02\x00", columns)):
        at = data.index(tag)
        struct.pack_into("<H", data, at + 8, value)
    with open(target, "wb") as f:
        f.write(data)


def main(binary):
    work = workdir("test_data_slide_bounds")
    store = os.path.join(work, "tiles.lmdb")

    # A pyramid cut short loses its last levels: refused, not tiled from the levels left.
    slide = os.path.join(work, "slide.tiff")
    synth(binary, slide, 4096, 4096, 3)
    with open(slide, "rb") as f:
        data = f.read()
    for keep in (len(data) - 1000, len(data) * 9 // 10, len(data) * 3 // 4):
        cut = os.path.join(work, f"cut{keep}.tiff")
        with open(cut, "wb") as f:
            f.write(data[:keep])
        refused(binary, cut, store, "truncated")

    # An SVS pyramid whose tiles lie past the end of the file (OpenSlide reads it through).
    svs = os.path.join(work, "cmu.svs")
    write_tiff(svs, pyramid(cmu_pixels(960), [2]), tile=240, description=APERIO.format(width=960, height=960, tile=240))
    with open(svs, "rb") as f:
        data = f.read()
    cut = os.path.join(work, "cut.svs")
    with open(cut, "wb") as f:
        f.write(data[:len(data) - 20000])
    refused(binary, cut, store, "truncated")

    # OpenSlide 3.4.1 divides by zero opening an SVS whose level 1 has more tiles across than
    # level 0 while level 0 misses a tile: the crash ends a probe process, not tessera.
    crash = os.path.join(work, "crash.svs")
    write_tiff(crash, pyramid(cmu_pixels(480), [2]), tile=[240, 16], empty={(0, 1)},
               description=APERIO.format(width=480, height=480, tile=240))
    refused(binary, crash, store, "OpenSlide crashed")

    # DICOM frames declared 65535x65535 (12.9 GB each) in a 5.5 KB file.
    dicom = os.path.join(work, "dicom")
    os.makedirs(dicom)
    for name in ("boxes_0.dcm", "boxes_1.dcm"):
        shutil.copy(os.path.join(SLIDES, name), dicom)
    dicom_with_frame_size(os.path.join(SLIDES, "boxes_0.dcm"), os.path.join(dicom, "boxes_0.dcm"), 65535, 65535)
    refused(binary, os.path.join(dicom, "boxes_0.dcm"), store, "65535x65535")

    # 200000x200000 declared, no tile holds data (110 s of CPU for nothing, before).
    empty = os.path.join(work, "empty.tiff")
    write_tiff(empty, [(200000, 200000)], tile=256, compression=DEFLATE, bigtiff=True)
    refused(binary, empty, store, "holds no image data")

    # Tiles of 65535 pixels a side in a small file.
    huge_tiles = os.path.join(work, "huge-tiles.tiff")
    write_tiff(huge_tiles, [cmu_pixels(512)], tile=256)
    with open(huge_tiles, "rb") as f:
        data = bytearray(f.read())
    for tag in (322, 323):  # TileWidth, TileLength (LONG, classic TIFF)
        at = data.index(struct.pack("<HHI", tag, 4, 1))
        struct.pack_into("<I", data, at + 8, 65535)
    with open(huge_tiles, "wb") as f:
        f.write(data)
    refused(binary, huge_tiles, store, "65535x65535")

    # Nothing to tile: the slide and the reason are named, and the exit is not 0.
    small = os.path.join(SLIDES, "small.svs")
    refused(binary, small, store, "--size 256", "16x16")
    refused(binary, os.path.join(SLIDES, "CMU-1-Small-Region.svs"), store, "--size 65535", "2220x2967",
            flags=("--size", 65535))
    blank = os.path.join(work, "blank.tiff")
    write_tiff(blank, [np.full((1024, 1024, 3), 240, np.uint8)], tile=256)
    result = run(binary, "tile", blank, "--out", store, check=False)
    assert result.returncode == 5 and "blank.tiff: no tissue tile" in result.stderr, result.stderr
    assert not os.path.exists(store) and "tiles.lmdb is removed" in result.stderr, "a run that stores no tile"
    # With a slide that gives tiles, the others are warnings naming them.
    tissue = os.path.join(work, "tissue.tiff")
    write_tiff(tissue, [cmu_pixels(1024)], tile=256)
    tiled = summary(run(binary, "tile", tissue, blank, small, "--out", store, "--size", 64))
    warnings = {os.path.basename(entry["slide"]): entry.get("warning", "") for entry in tiled["slides"]}
    assert "no tissue tile" in warnings["blank.tiff"] and "no tile of 64 pixels fits" in warnings["small.svs"], warnings
    assert warnings["tissue.tiff"] == "" and tiled["written"] == len(read_store(store)[0]) > 0, tiled
    shutil.rmtree(work)
    print("ok")


def test_data_slide_bounds():
    main(TESSERA)

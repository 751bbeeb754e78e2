"""Every number a slide file or a flag declares is checked before it is used (issue 34's slide part).
Each refusal exits 5 (2 for a flag) naming the file and the field, or the flag; never by a signal,
never with raw library text (`basic_string::substr`, `vector larger than max_size`, a JSON error),
within 1 GiB of peak memory (getrusage of the child, an upper bound), with nothing left at the
output. OME-TIFFs are written with tifffile and their OME-XML edited with tifffile.tiffcomment.

- OME-XML as the OME schema defines it: DimensionOrder a permutation of XYZCT (other letters, one
  without C, one too short: SIGSEGV, tiles of the wrong planes, `basic_string::substr` before);
  SizeX/Y/C/Z/T at least 1 and within limits (SizeZ 0: SIGSEGV; SizeC 0: `vector larger than
  max_size`; 200 million channels in a 32 KB file; 300 channels, stored as 44 before); TiffData
  mapping each plane once to a distinct directory the file has (a negative IFD, an IFD past the
  last, two planes on one IFD: silently wrong tiles; a FirstZ that wrote before the start of a
  vector); SamplesPerPixel agreeing with SizeC and with the directories; as many channels as the
  file holds; SizeX and Type agreeing with the planes. A Latin-1 channel name (a raw JSON error,
  exit 1, before) is kept, its invalid byte replaced by U+FFFD as Python's 'replace' does.
- Sizes from files and flags: a DICOM pixel spacing of 6.5e-9 mm made extract's read size
  overflow to 0 (SIGFPE); tiles past 256 MiB (`tile --size`); a mask's downsample of -1 (taken as
  none); a synthetic slide of more tiles than a TIFF directory numbers (`synth --width/--height`),
  a pixel size a TIFF cannot record (`synth --mpp`), a thumbnail of 100,000 pixels (`heatmap
  --max-size`); a QPTIFF of 300 channels; a patch file whose label shape's product wraps to 1;
  coordinates whose level0_width is 1e300.
- `--intensity-window` on slides that are all 8-bit (ignored before): exit 2 naming the flag and
  the slides; with a 16-bit slide beside an 8-bit one, a warning naming the 8-bit one.
- A slide whose file name is Latin-1 (a raw JSON error naming no file before): exit 5 naming it."""
import json
import os
import re
import shutil
import struct

import h5py
import numpy as np
import tifffile

from data_tools import read_store, run, run_with_usage, summary, within_memory, workdir
from slide_files import ome_tiff

TESSERA = os.environ.get("TESSERA_BINARY", "build/tools/tessera")
SLIDES = os.path.normpath(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared",
                                       "testdata", "slides"))
GiB = 1 << 30
RAW = ("basic_string", "max_size", "json.exception", "std::", "bad_alloc", "terminate")


def refused(command, *words, code=5, outputs=()):
    """Runs tessera; it must exit `code` naming every one of `words`, without raw library text,
    a signal or 1 GiB, and leave none of `outputs`. Returns the error's last line."""
    exit_code, _, err, peak, _, killed = run_with_usage([TESSERA, *command], timeout=300)
    last = err.strip().splitlines()[-1] if err.strip() else ""
    assert not killed and exit_code == code, (command, exit_code, err[-2000:])
    for word in words:
        assert word in last, (word, last)
    for raw in RAW:
        assert raw not in err, (raw, err[-2000:])
    assert within_memory(peak, GiB), (command, peak)
    for output in outputs:
        assert not os.path.exists(output), f"{output} left behind"
    print(f"exit {exit_code}, {peak >> 20} MiB: {last}")
    return last


def planes(count=4, side=512, dtype=np.uint8):
    """`count` grey planes on a dark background, a bright block in each (tissue for fluorescence)."""
    data = np.full((count, side, side), 3, dtype)
    inside = slice(side // 4, 3 * side // 4)
    data[:, inside, inside] = (np.arange(count) * 40 + 60)[:, None, None].astype(dtype)
    return data


def attribute(name, value):
    """An edit of the OME-XML: the first `name="..."` set to `value`, or removed when None."""
    def edit(xml):
        replacement = "" if value is None else f'{name}="{value}"'
        edited, count = re.subn(rf'\b{name}="[^"]*"', replacement, xml, count=1)
        assert count == 1, (name, xml)
        return edited
    return edit


def replace(old, new):
    def edit(xml):
        assert old in xml, (old, xml)
        return xml.replace(old, new)
    return edit


def check_ome_schema(work):
    store = os.path.join(work, "refused.lmdb")
    four = planes()
    cases = [
        # DimensionOrder: the schema's six permutations of XYZCT only.
        ("order-letters", four, attribute("DimensionOrder", "XYQQQ"), ["DimensionOrder", "'XYQQQ'"]),
        ("order-without-c", four, attribute("DimensionOrder", "XYZZT"), ["DimensionOrder", "'XYZZT'"]),
        ("order-short", four, attribute("DimensionOrder", "X"), ["DimensionOrder", "'X'"]),
        ("order-missing", four, attribute("DimensionOrder", None), ["DimensionOrder is missing"]),
        # Sizes at least 1 and within limits.
        ("size-c-0", four, attribute("SizeC", 0), ["SizeC is 0"]),
        ("size-z-0", four, attribute("SizeZ", 0), ["SizeZ is 0"]),
        ("size-x-0", four, attribute("SizeX", 0), ["SizeX is 0"]),
        ("size-t-words", four, attribute("SizeT", "one"), ["SizeT is 'one', not a whole number"]),
        ("size-t-huge", four, attribute("SizeT", 2 ** 62), ["SizeT is 4611686018427387904"]),
        ("channels-200M", planes(1, 64), attribute("SizeC", 200000000), ["SizeC is 200000000", "255"]),
        ("channels-300", planes(300, 64), None, ["SizeC is 300", "not from 1 to 255"]),
        # TiffData: each plane once, on a distinct directory the file has.
        ("ifd-negative", four, attribute("IFD", -1), ["TiffData 0 IFD is -1"]),
        ("ifd-past-last", four, replace('IFD="0" PlaneCount="4"', 'IFD="4" PlaneCount="1"'), ["TiffData 0 IFD is 4"]),
        ("planes-past-last", four, attribute("IFD", 2), ["TiffData 0 PlaneCount is 4 from IFD 2"]),
        ("two-planes-one-ifd", four,
         replace('<TiffData IFD="0" PlaneCount="4"/>',
                 '<TiffData IFD="0" FirstC="0" PlaneCount="1"/><TiffData IFD="0" FirstC="1" PlaneCount="3"/>'),
         ["to one TIFF directory, IFD 0"]),
        ("plane-twice", four,
         replace('<TiffData IFD="0" PlaneCount="4"/>',
                 '<TiffData IFD="0" PlaneCount="4"/><TiffData IFD="3" FirstC="3" PlaneCount="1"/>'),
         ["TiffData 1 PlaneCount", "which TiffData 0 maps too"]),
        ("plane-unmapped", four, attribute("PlaneCount", 3), ["maps no TIFF directory to plane (C 3, Z 0, T 0)"]),
        ("first-z-before-start", four, replace('IFD="0" PlaneCount="4"', 'IFD="0" FirstZ="9223372036854775807"'),
         ["TiffData 0 FirstZ is 9223372036854775807"]),
        # SamplesPerPixel and the channels the file really holds.
        # One RGB channel, one plane, said of three grey planes: a lie the directory gives away.
        ("samples-lie", planes(3), lambda xml: re.sub(r"<Channel .*</Channel>",
                                                       '<Channel ID="Channel:0:0" SamplesPerPixel="3"/>', xml)
         .replace('PlaneCount="3"', 'PlaneCount="1"'),
         ["holds 1 sample a pixel", "SamplesPerPixel says 3"]),
        ("samples-not-size-c", four, attribute("SamplesPerPixel", 3), ["Channel 1 SamplesPerPixel is 1"]),
        ("channels-fewer", four, lambda xml: re.sub(r'<Channel ID="Channel:0:[23]".*?</Channel>', "", xml),
         ["SizeC is 4, but its 2 Channel elements"]),
        ("channels-left-out", four,
         lambda xml: re.sub(r'<Channel ID="Channel:0:[23]".*?</Channel>', "", xml)
         .replace('SizeC="4"', 'SizeC="2"').replace('PlaneCount="4"', 'PlaneCount="2"'),
         ["TIFF directory 2 is another 512x512 plane", "maps to no channel (SizeC 2)"]),
        ("size-x-lie", four, attribute("SizeX", 1024), ["SizeX x SizeY says 1024x512"]),
        ("type-lie", four, attribute("Type", "uint16"), ["8-bit samples", "Type says uint16"]),
        ("type-unknown", four, attribute("Type", "uint12"), ["Type is 'uint12'"]),
        ("physical-size-negative", four, lambda xml: xml.replace("<Pixels ", '<Pixels PhysicalSizeX="-0.5" '),
         ["PhysicalSizeX is '-0.5'"]),
    ]
    for name, data, edit, words in cases:
        tile = (16, 16) if data.shape[1] < 256 else (256, 256)
        slide = ome_tiff(os.path.join(work, f"{name}.ome.tif"), data, edit=edit, tile=tile)
        if name == "channels-200M":
            assert os.path.getsize(slide) < 32 << 10, os.path.getsize(slide)
        print(f"{name}: ", end="")
        refused(["tile", slide, "--out", store, "--size", 64], os.path.basename(slide), *words, outputs=[store])

    # A Latin-1 channel name: kept, its byte replaced (Python decodes it the same way).
    names = ["DAPI", "Caf\xe9", "CD8", "na\xefve"]
    slide = ome_tiff(os.path.join(work, "latin1.ome.tif"), four, names=["DAPI", "Cafe", "CD8", "naive"],
                     edit=lambda xml: xml.replace('Name="Cafe"', 'Name="Caf\xe9"')
                     .replace('Name="naive"', 'Name="na\xefve"').encode("latin-1"))
    store = os.path.join(work, "latin1.lmdb")
    result = run(TESSERA, "tile", slide, "--out", store, "--size", 64, "--tissue", "none")
    entry = summary(result)["slides"][0]
    assert entry["channels"] == 4 and entry["tiles"] == 64, entry
    _, slides = read_store(store)
    expected = [name.encode("latin-1").decode("utf-8", "replace") for name in names]
    assert slides[0]["channel_names"] == expected == ["DAPI", "Caf\ufffd", "CD8", "na\ufffdve"], slides[0]
    print(f"Latin-1 channel names read as {expected}")


def check_sizes(work):
    # A DICOM pixel spacing of 6.5e-9 mm: vit-b16's read square was 2^32 pixels, an int of 0.
    dicom = os.path.join(work, "dicom")
    os.makedirs(dicom)
    spacing = 0.112 / 2 ** 34
    value = f"{spacing:.15e}\\{spacing:.15e}".encode()
    value += b" " * (len(value) % 2)
    for name in ("boxes_0.dcm", "boxes_1.dcm"):
        with open(os.path.join(SLIDES, name), "rb") as f:
            data = bytearray(f.read())
        at = data.index(b"\x28\x00\x30\x00DS")  # PixelSpacing, explicit VR little endian
        old = struct.unpack_from("<H", data, at + 6)[0]
        data[at + 6:at + 8 + old] = struct.pack("<H", len(value)) + value
        with open(os.path.join(dicom, name), "wb") as f:
            f.write(data)
    features = os.path.join(work, "features")
    refused(["extract", "--encoder", "vit-b16", "--random-weights", "--slides", os.path.join(dicom, "boxes_0.dcm"),
             "--out", features], "boxes_0.dcm", "the square encoder vit-b16 reads", "not a number from 1 to 8192",
            outputs=[features])

    # Tiles past 256 MiB, named by the flag (a slide the tile fits).
    big = os.path.join(work, "big.tiff")
    run(TESSERA, "synth", big, "--width", 9600, "--height", 9600, "--seed", 1, "--tile-size", 512)
    store = os.path.join(work, "big.lmdb")
    refused(["tile", big, "--out", store, "--size", 9500], "--size 9500", "big.tiff", "9500 x 9500 pixels x 3",
            "256 MiB", code=2, outputs=[store])

    # A label mask declaring downsample -1 (read as "not declared" before).
    mask = os.path.join(work, "big.mask.tiff")
    values = tifffile.imread(mask)
    tifffile.imwrite(mask, values, metadata=None,
                     description=json.dumps({"downsample": -1, "values": {"0": "other", "1": "Tumor"}}))
    refused(["tile", big, "--labels", mask, "--out", store], "big.mask.tiff", "downsample is -1", outputs=[store])

    # synth: more tiles than a TIFF directory numbers; a pixel size its resolution cannot hold.
    out = os.path.join(work, "huge.tiff")
    refused(["synth", out, "--width", 2 ** 31, "--height", 2 ** 31, "--tile-size", 16], "--width and --height",
            code=2, outputs=[out, out + ".partial", os.path.join(work, "huge.mask.tiff")])
    refused(["synth", out, "--width", 100, "--height", 100, "--mpp", "1e-300"], "--mpp", code=2, outputs=[out])
    refused(["heatmap", "--features", "f.h5", "--model", "m.h5", "--slide", big, "--out", os.path.join(work, "h.png"),
             "--max-size", 100000], "--max-size is 100000", code=2, outputs=[os.path.join(work, "h.png")])

    # A QPTIFF of 300 channels (a FullResolution directory each), 300 stored as 44 before.
    qptiff = os.path.join(work, "wide.qptiff")
    with tifffile.TiffWriter(qptiff) as writer:
        for c in range(300):
            description = (f"<PerkinElmer-QPI-ImageDescription><ImageType>FullResolution</ImageType><Name>C{c}</Name>"
                           "</PerkinElmer-QPI-ImageDescription>")
            writer.write(np.full((16, 16), c % 256, np.uint8), tile=(16, 16), description=description, metadata=None)
    store = os.path.join(work, "wide.lmdb")
    refused(["tile", qptiff, "--out", store, "--size", 8], "wide.qptiff", "QPTIFF channels", "is 300",
            outputs=[store])

    # A patch file whose label shape multiplies to 2^64 + 1, which wrapped to one label a patch.
    patches = os.path.join(work, "patches.h5")
    with h5py.File(patches, "w") as f:
        f.create_dataset("x", data=np.zeros((4, 8, 8, 3), np.uint8))
        f.create_dataset("y", shape=(4, 274177, 67280421310721), dtype=np.uint8, chunks=(1, 1, 1))
    checkpoint = os.path.join(work, "model.h5")
    refused(["train", "--data", patches, "--model", "small-cnn", "--epochs", 1, "--checkpoint", checkpoint],
            "patches.h5", "dataset y shape overflows", outputs=[checkpoint])

    # Coordinates whose level-0 width is 1e300 (a cast of it was undefined).
    coords = os.path.join(work, "coords")
    os.makedirs(coords)
    slide = os.path.join(SLIDES, "CMU-1-Small-Region.svs")
    with h5py.File(os.path.join(coords, "CMU-1-Small-Region_patches.h5"), "w") as f:
        dataset = f.create_dataset("coords", data=np.array([[0, 0]], np.int64))
        dataset.attrs.update({"patch_size": 224, "patch_size_level0": 448, "level0_width": 1e300,
                              "level0_height": 2967})
    refused(["extract", "--encoder", "vit-b16", "--random-weights", "--slides", slide, "--coords", coords,
             "--out", features], "CMU-1-Small-Region_patches.h5", "level0_width is 1e+300", outputs=[features])


def check_intensity_window(work):
    eight = ome_tiff(os.path.join(work, "eight.ome.tif"), planes())
    rgb = os.path.join(SLIDES, "CMU-1-Small-Region.svs")
    store = os.path.join(work, "window.lmdb")
    refused(["tile", eight, rgb, "--out", store, "--size", 64, "--intensity-window", "100,4000"],
            "--intensity-window 100,4000", "all 2 slides are 8-bit", "eight.ome.tif", "CMU-1-Small-Region.svs",
            code=2, outputs=[store])
    features = os.path.join(work, "window-features")
    refused(["extract", "--encoder", "vit-b16", "--random-weights", "--slides", rgb, "--out", features,
             "--intensity-window", "100,4000"], "--intensity-window", "CMU-1-Small-Region.svs", code=2,
            outputs=[features])
    # A 16-bit slide beside the 8-bit one: mapped through the window, the other named in a warning.
    sixteen = ome_tiff(os.path.join(work, "sixteen.ome.tif"), planes(dtype=np.uint16) * 50)
    result = run(TESSERA, "tile", sixteen, eight, "--out", store, "--size", 64, "--intensity-window", "100,4000")
    warnings = [json.loads(line)["warning"] for line in result.stderr.splitlines()
                if line.startswith("{") and "warning" in line]
    assert any("--intensity-window 100,4000 maps the 16-bit slides only" in w and "eight.ome.tif" in w
               for w in warnings), result.stderr
    _, slides = read_store(store)
    by_name = {entry["name"]: entry for entry in slides.values()}
    assert by_name["sixteen.ome.tif"]["intensity_windows"] == [[100, 4000]] * 4, by_name["sixteen.ome.tif"]
    assert by_name["eight.ome.tif"].get("sample_bits", 8) == 8, by_name["eight.ome.tif"]


def check_latin1_path(work):
    slide = os.path.join(work.encode(), b"caf\xe9.svs")
    shutil.copy(os.path.join(SLIDES, "CMU-1-Small-Region.svs"), slide)
    store = os.path.join(work, "latin1-path.lmdb")
    refused(["tile", slide.decode("utf-8", "surrogateescape"), "--out", store],
            "caf\ufffd.svs", "not valid UTF-8", outputs=[store])


def main():
    work = workdir("slide_declared")
    try:
        check_ome_schema(work)
        check_sizes(work)
        check_intensity_window(work)
        check_latin1_path(work)
        print("ok")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_slide_declared():
    main()


if __name__ == "__main__":
    main()

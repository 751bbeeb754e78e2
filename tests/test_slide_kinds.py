"""Every slide a lab owns: fluorescence and multiplex slides tile, the kinds tessera does not read
are refused naming what they hold.

- A fluorescence slide (tessera synth --stain fluorescence: dark background, RGB composite) tiles
  with tissue found automatically, the same tiles as --tissue fluorescence and nearly the same as
  the bright-field slide of the same seed (the same tissue); its tiles equal python3-openslide's
  reads. --tissue none keeps every tile; --min-tissue with it is exit 2.
- A multiplex OME-TIFF (synth --channels 5: a plane a channel, pyramid in SubIFDs), a QPTIFF
  (written here with tifffile, descriptions as Vectra writes them) and a one-plane stripped
  OME-TIFF (a DAPI scan) tile with all their channels:
  each raw tile equals python3-tifffile's read of that level, at every channel. A small CNN
  trains on the 5-channel store (its first convolution takes 5 channels) and extracts features.
- A 16-bit OME-TIFF (as CyCIF, CODEX and Orion scans are; written here with tifffile, pyramid in
  SubIFDs) tiles at 8 bits: each channel through the window of its smallest level's 0.1st and
  99.9th percentiles, recorded in the store's slide entry; tiles equal numpy's mapping of
  tifffile's read, at levels 0 and 1; --intensity-window LOW,HIGH maps every channel alike (and
  is exit 2 when not 0 <= LOW < HIGH <= 65535).
- A 3-channel OME-TIFF (DAPI and two markers) is 3 planes, not RGB: stored raw (never JPEG,
  whose colour transform would mix the channels), its entry says rgb false, its tissue found as
  fluorescence; tiles equal tifffile's.
- Refused, exit 5, naming the file and what it holds, with no store left behind: the real
  multi-channel z-series OME-TIFF (3 channels x 5 z-planes of int8), a 32-bit and a float OME-TIFF,
  an Olympus .vsi (naming the .ets it lacks); --tissue brightfield on 5 channels is exit 2."""
import io
import json
import os
import shutil
import struct
import sys
import zlib

import h5py
import numpy as np
import openslide
import tifffile
import torch
from PIL import Image

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from data_tools import read_store, run, summary, workdir  # noqa: E402
from tessera_presets import normalise  # noqa: E402

TESSERA = os.environ.get("TESSERA_BINARY", "build/tools/tessera")
SHARED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "testdata")
HEADER = struct.Struct("<BBBBHHIIIII")


def tessera(*args, check=True):
    result = run(TESSERA, *args, check=check, env=dict(os.environ, TESSERA_VALIDATION="1"))
    assert "vulkan validation" not in result.stderr.lower(), result.stderr
    return result


def tiles_of(store):
    """{(level, row, column): (header fields, pixels as H x W x C uint8)} of slide 0, checksums verified."""
    tiles, slides = read_store(store)
    out = {}
    for key, value in tiles.items():
        _, encoding, channels, _, width, height, label, x, y, size, crc = HEADER.unpack_from(value)
        assert zlib.crc32(value[:24] + value[28:]) == crc, key
        pixels = value[28:]
        if encoding == 1:
            image = np.asarray(Image.open(io.BytesIO(pixels)).convert("RGB"))
        else:
            image = np.frombuffer(pixels, dtype=np.uint8).reshape(height, width, channels)
        out[key[1:]] = ({"channels": channels, "encoding": encoding, "x": x, "y": y, "label": label}, image)
    return out, slides


def refused(path, *words):
    out = os.path.join(WORK, "refused.lmdb")
    result = tessera("tile", path, "--out", out, check=False)
    assert result.returncode == 5, (path, result.returncode, result.stderr)
    for word in (os.path.basename(path),) + words:
        assert word in result.stderr, (word, result.stderr)
    assert not os.path.exists(out), "a refused slide leaves no store"
    return result.stderr


def check_fluorescence():
    bright, dark = os.path.join(WORK, "bright.tiff"), os.path.join(WORK, "dark.tiff")
    tessera("synth", bright, "--width", 3072, "--height", 2048, "--seed", 3)
    made = summary(tessera("synth", dark, "--width", 3072, "--height", 2048, "--seed", 3, "--stain", "fluorescence"))
    assert made["stain"] == "fluorescence" and made["channels"] == 3, made
    pixels = np.asarray(openslide.OpenSlide(dark).read_region((0, 0), 0, (64, 64)).convert("RGB"))
    assert pixels.max() < 16, "the corner is the dark background"

    keys = {}
    for name, slide, flags in [("bright", bright, []), ("auto", dark, ["--encoding", "raw"]),
                               ("given", dark, ["--tissue", "fluorescence"]), ("none", dark, ["--tissue", "none"])]:
        store = os.path.join(WORK, f"{name}.lmdb")
        result = summary(tessera("tile", slide, "--out", store, "--size", 128, *flags))
        entry = result["slides"][0]
        tiles, _ = tiles_of(store)
        keys[name] = set(tiles)
        print(f"{name}: {entry['tiles']} tiles, tissue {entry['tissue']}")
        if name in ("auto", "given"):
            assert entry["tissue"]["stain"] == "fluorescence", entry
            assert entry["tissue"]["chosen"] == ("automatic" if name == "auto" else "given"), entry
        if name == "auto":  # tiles against an independent reader
            reader = openslide.OpenSlide(dark)
            for header, image in list(tiles.values())[::7]:
                expected = np.asarray(reader.read_region((header["x"], header["y"]), 0, (128, 128)).convert("RGB"))
                assert np.abs(image.astype(int) - expected).max() <= 2, header
    assert keys["auto"] == keys["given"], "automatic is fluorescence"
    overlap = len(keys["auto"] & keys["bright"]) / len(keys["auto"] | keys["bright"])
    assert overlap > 0.93, f"the same tissue under either stain: Jaccard {overlap:.3f}"
    assert len(keys["none"]) == (3072 // 128) * (2048 // 128), len(keys["none"])
    result = tessera("tile", dark, "--out", os.path.join(WORK, "x.lmdb"), "--tissue", "none", "--min-tissue", 0.3,
                     check=False)
    assert result.returncode == 2 and "--min-tissue" in result.stderr, result.stderr


def check_multiplex_ome():
    slide = os.path.join(WORK, "panel.ome.tiff")
    made = summary(tessera("synth", slide, "--width", 2048, "--height", 1536, "--seed", 4, "--stain", "fluorescence",
                           "--channels", 5))
    assert made["format"] == "ome-tiff", made
    with tifffile.TiffFile(slide) as tif:
        assert tif.is_ome
        series = tif.series[0]
        assert series.shape == (5, 1536, 2048) and series.dtype == np.uint8, (series.shape, series.dtype)
        assert len(series.levels) == len(made["levels"]) > 1, len(series.levels)
        levels = [level.asarray() for level in series.levels[:2]]
        names = [c.get("Name") for c in tifffile.xml2dict(tif.ome_metadata)["OME"]["Image"]["Pixels"]["Channel"]]
    assert names[:3] == ["DAPI", "panCK", "Autofluorescence"], names
    for level, size in ((0, 128), (1, 64)):
        store = os.path.join(WORK, f"panel-{level}.lmdb")
        result = summary(tessera("tile", slide, "--out", store, "--size", size, "--level", level))
        entry = result["slides"][0]
        assert entry["channels"] == 5 and entry["encoding"] == "raw", entry
        assert entry["tissue"]["stain"] == "fluorescence" and entry["tissue"]["chosen"] == "automatic", entry
        tiles, slides = tiles_of(store)
        assert slides[0]["channel_names"] == names and slides[0]["format"] == "ome-tiff", slides[0]
        assert 0 < len(tiles) < (2048 // (size << level)) * (1536 // (size << level)), len(tiles)
        for (_, row, column), (header, image) in tiles.items():
            assert header["channels"] == 5, header
            expected = levels[level][:, row * size:(row + 1) * size, column * size:(column + 1) * size]
            assert np.array_equal(image, expected.transpose(1, 2, 0)), (level, row, column)
        print(f"OME-TIFF level {level}: {len(tiles)} tiles of 5 channels equal tifffile's")
    result = tessera("tile", slide, "--out", os.path.join(WORK, "y.lmdb"), "--tissue", "brightfield", check=False)
    assert result.returncode == 2 and "5 channels" in result.stderr, result.stderr

    # The model's input follows the channels: train (tumour tiles against the rest: a classifier
    # needs two classes), then extract with the trained weights.
    store, checkpoint = os.path.join(WORK, "panel-labelled.lmdb"), os.path.join(WORK, "panel.h5")
    tessera("tile", slide, "--out", store, "--size", 64, "--level", 1, "--labels", os.path.join(WORK, "panel.ome.geojson"),
            "--unannotated", "Normal")
    tessera("train", "--data", store, "--model", "small-cnn", "--epochs", 1, "--batch", 8, "--val-fraction", 0,
            "--checkpoint", checkpoint)
    with h5py.File(checkpoint, "r") as f:
        assert f["params/conv1.weight"].shape[1] == 5, f["params/conv1.weight"].shape
    features = os.path.join(WORK, "features")
    tessera("extract", "--model", checkpoint, "--layer", "pool2", "--tiles", store, "--out", features)
    with h5py.File(os.path.join(features, "panel.ome.h5"), "r") as f:
        extracted = f["features"][()]
        assert json.loads(f["features"].attrs["extraction"])["channels"] == 5
    # The same in PyTorch from the checkpoint's weights: input_normalize's (x/255 - 0.5) / 0.5 for
    # channels that are not RGB, then small-cnn to pool2, global-average-pooled.
    with h5py.File(checkpoint, "r") as f:
        weights = {name: torch.as_tensor(f["params"][name][()]) for name in f["params"]}
    images = np.stack([image for _, (_, image) in sorted(tiles_of(store)[0].items())])
    with torch.no_grad():
        x = normalise(images)
        for conv in ("conv1", "conv2"):
            x = torch.max_pool2d(torch.relu(torch.conv2d(x, weights[conv + ".weight"], weights[conv + ".bias"],
                                                         padding=1)), 2)
        expected = x.mean(dim=(2, 3)).numpy()
    np.testing.assert_allclose(extracted, expected, rtol=1e-4, atol=1e-4)
    print(f"5-channel features of {len(images)} tiles equal PyTorch's")


def check_qptiff():
    """Four 8-bit channels as a Vectra writes them: a FullResolution directory each, then the
    ReducedResolution ones, each described in PerkinElmer's XML."""
    path = os.path.join(WORK, "vectra.qptif")
    generator = np.random.default_rng(7)
    full = np.full((4, 1024, 1024), 3, dtype=np.uint8)
    full[:, 256:768, 200:900] = generator.integers(30, 220, size=(4, 512, 700), dtype=np.uint8)
    names = ["DAPI", "Opal 520", "Opal 570", "Opal 690"]

    def description(kind, name):
        return (f'<?xml version="1.0" encoding="utf-8"?><PerkinElmer-QPI-ImageDescription>'
                f'<DescriptionVersion>2</DescriptionVersion><ImageType>{kind}</ImageType>'
                f'<Name>{name}</Name></PerkinElmer-QPI-ImageDescription>')
    with tifffile.TiffWriter(path, bigtiff=True) as writer:
        for c in range(4):
            writer.write(full[c], tile=(256, 256), compression="zlib", description=description("FullResolution", names[c]),
                         metadata=None)
        writer.write(full[0, ::8, ::8], description=description("Thumbnail", ""), metadata=None)
        for c in range(4):
            writer.write(full[c, ::2, ::2], tile=(256, 256), compression="zlib", subfiletype=1,
                         description=description("ReducedResolution", names[c]), metadata=None)
    store = os.path.join(WORK, "vectra.lmdb")
    entry = summary(tessera("tile", path, "--out", store, "--size", 128))["slides"][0]
    assert entry["channels"] == 4 and entry["tissue"]["stain"] == "fluorescence", entry
    tiles, slides = tiles_of(store)
    assert slides[0]["format"] == "qptiff" and slides[0]["channel_names"] == names, slides[0]
    for (_, row, column), (header, image) in tiles.items():
        expected = full[:, row * 128:(row + 1) * 128, column * 128:(column + 1) * 128].transpose(1, 2, 0)
        assert np.array_equal(image, expected), (row, column)
    # The random block is the tissue: 4 x 5 tiles lie wholly inside it (rows 2-5, columns 2-6).
    inside = {(0, r, c) for r in range(2, 6) for c in range(2, 7)}
    assert inside <= set(tiles) and len(tiles) <= 4 * 6, sorted(tiles)
    print(f"QPTIFF: {len(tiles)} tiles of 4 channels equal tifffile's")


def check_single_plane():
    """One grey plane (a DAPI scan as OME-TIFF, stripped): a slide of one channel, its tiles raw."""
    path = os.path.join(WORK, "dapi.ome.tif")
    plane = np.full((512, 512), 5, dtype=np.uint8)
    plane[128:384, 128:448] = np.random.default_rng(2).integers(60, 250, size=(256, 320), dtype=np.uint8)
    tifffile.imwrite(path, plane[None], ome=True, metadata={"axes": "CYX", "Channel": {"Name": ["DAPI"]}},
                     rowsperstrip=64)
    store = os.path.join(WORK, "dapi.lmdb")
    entry = summary(tessera("tile", path, "--out", store, "--size", 64))["slides"][0]
    assert entry["channels"] == 1 and entry["tissue"]["stain"] == "fluorescence", entry
    tiles, slides = tiles_of(store)
    assert slides[0]["channel_names"] == ["DAPI"], slides[0]
    assert {key[1:] for key in tiles} == {(r, c) for r in range(2, 6) for c in range(2, 7)}, sorted(tiles)
    for (_, row, column), (_, image) in tiles.items():
        assert np.array_equal(image[..., 0], plane[row * 64:(row + 1) * 64, column * 64:(column + 1) * 64])


def to_8_bits(samples, window):
    """A 16-bit channel's 8-bit samples through (low, high): clipped, linear, rounded half up."""
    low, high = window
    scaled = ((samples.astype(np.int64) - low) * 510 + (high - low)) // (2 * (high - low))
    return np.clip(scaled, 0, 255).astype(np.uint8)


def check_sixteen_bit():
    """Four 16-bit channels, a dim floor with a tissue block and a few saturated pixels."""
    path = os.path.join(WORK, "cycif.ome.tif")
    generator = np.random.default_rng(16)
    full = generator.integers(180, 260, size=(4, 1024, 1280), dtype=np.uint16)
    for c, brightest in enumerate((9000, 30000, 2500, 14000)):
        full[c, 256:832, 320:1088] = generator.integers(400, brightest, size=(576, 768), dtype=np.uint16)
    full[:, 600:604, 600:604] = 65535
    names = ["DAPI", "CD8", "FOXP3", "panCK"]
    options = dict(tile=(256, 256), compression="zlib", photometric="minisblack")
    with tifffile.TiffWriter(path, bigtiff=True) as writer:
        writer.write(full, subifds=2, metadata={"axes": "CYX", "Channel": {"Name": names}}, **options)
        writer.write(full[:, ::2, ::2], subfiletype=1, **options)
        writer.write(full[:, ::4, ::4], subfiletype=1, **options)
    with tifffile.TiffFile(path) as tif:
        levels = [level.asarray() for level in tif.series[0].levels]
    assert len(levels) == 3 and levels[0].dtype == np.uint16, [level.shape for level in levels]
    windows = []
    for channel in levels[-1]:
        ordered = np.sort(channel, axis=None)
        n = ordered.size
        low, high = int(ordered[(n - 1) // 1000]), int(ordered[-(-(n - 1) * 999 // 1000)])
        windows.append([low, max(high, low + 1)])
    for level, size in ((0, 128), (1, 64)):
        store = os.path.join(WORK, f"cycif-{level}.lmdb")
        entry = summary(tessera("tile", path, "--out", store, "--size", size, "--level", level))["slides"][0]
        assert entry["channels"] == 4 and entry["encoding"] == "raw", entry
        assert entry["tissue"]["stain"] == "fluorescence", entry
        tiles, slides = tiles_of(store)
        assert slides[0]["sample_bits"] == 16 and slides[0]["intensity_windows"] == windows, (slides[0], windows)
        assert slides[0]["channel_names"] == names, slides[0]
        expected_level = np.stack([to_8_bits(levels[level][c], windows[c]) for c in range(4)])
        assert len(tiles) > 0
        for (_, row, column), (header, image) in tiles.items():
            expected = expected_level[:, row * size:(row + 1) * size, column * size:(column + 1) * size]
            assert np.array_equal(image, expected.transpose(1, 2, 0)), (level, row, column)
        # The tissue block is found: every tile wholly inside it is kept.
        inside = {(level, r, c) for r in range(-(-256 // (size << level)), 832 // (size << level))
                  for c in range(-(-320 // (size << level)), 1088 // (size << level))}
        assert inside <= set(tiles), sorted(inside - set(tiles))
        print(f"16-bit OME-TIFF level {level}: {len(tiles)} tiles equal numpy's mapping through windows {windows}")
    # One window for every channel (slides that compare): recorded, and each tile mapped through it.
    store = os.path.join(WORK, "cycif-fixed.lmdb")
    tessera("tile", path, "--out", store, "--size", 128, "--intensity-window", "200,20000")
    tiles, slides = tiles_of(store)
    assert slides[0]["settings"]["intensity_window"] == [200, 20000], slides[0]["settings"]
    assert slides[0]["intensity_windows"] == [[200, 20000]] * 4, slides[0]
    expected_level = np.stack([to_8_bits(levels[0][c], (200, 20000)) for c in range(4)])
    for (_, row, column), (_, image) in tiles.items():
        expected = expected_level[:, row * 128:(row + 1) * 128, column * 128:(column + 1) * 128]
        assert np.array_equal(image, expected.transpose(1, 2, 0)), (row, column)
    for bad in ("5,5", "9,2", "0,70000", "1;2", "-1,9"):
        result = tessera("tile", path, "--out", os.path.join(WORK, "bad.lmdb"), "--intensity-window", bad, check=False)
        assert result.returncode == 2 and "--intensity-window" in result.stderr, (bad, result.stderr)
        assert not os.path.exists(os.path.join(WORK, "bad.lmdb"))


def check_three_planes():
    path = os.path.join(WORK, "three.ome.tif")
    planes = np.full((3, 512, 768), 4, dtype=np.uint8)
    planes[:, 128:384, 256:640] = np.random.default_rng(3).integers(40, 250, size=(3, 256, 384), dtype=np.uint8)
    tifffile.imwrite(path, planes, ome=True, photometric="minisblack", tile=(256, 256),
                     metadata={"axes": "CYX", "Channel": {"Name": ["DAPI", "CD3", "CD20"]}})
    store = os.path.join(WORK, "three.lmdb")
    entry = summary(tessera("tile", path, "--out", store, "--size", 128))["slides"][0]
    assert entry["channels"] == 3 and entry["encoding"] == "raw", entry
    assert entry["tissue"]["stain"] == "fluorescence", entry
    tiles, slides = tiles_of(store)
    assert slides[0]["rgb"] is False and slides[0]["channel_names"] == ["DAPI", "CD3", "CD20"], slides[0]
    assert {key[1:] for key in tiles} == {(r, c) for r in range(1, 3) for c in range(2, 5)}, sorted(tiles)
    for (_, row, column), (header, image) in tiles.items():
        assert header["encoding"] == 0, header
        expected = planes[:, row * 128:(row + 1) * 128, column * 128:(column + 1) * 128].transpose(1, 2, 0)
        assert np.array_equal(image, expected), (row, column)
    result = tessera("tile", path, "--out", os.path.join(WORK, "z.lmdb"), "--tissue", "brightfield", check=False)
    assert result.returncode == 2 and "not RGB" in result.stderr, result.stderr
    print(f"3-plane OME-TIFF: {len(tiles)} raw tiles equal tifffile's")


def check_refusals():
    stderr = refused(os.path.normpath(os.path.join(SHARED, "slides", "multi-channel-z-series.ome.tif")),
                     "z-stack of 5 focal planes", "signed 8-bit (int8)", "3 channels")
    print(stderr.strip().splitlines()[-1])
    wide = os.path.join(WORK, "wide.ome.tif")
    tifffile.imwrite(wide, np.zeros((3, 64, 64), dtype=np.uint32), ome=True, metadata={"axes": "CYX"})
    refused(wide, "32-bit (uint32)")
    real = os.path.join(WORK, "real.ome.tif")
    tifffile.imwrite(real, np.zeros((2, 64, 64), dtype=np.float32), ome=True, metadata={"axes": "CYX"})
    refused(real, "floating-point (float)")
    vsi = os.path.join(WORK, "scan.vsi")
    shutil.copy(os.path.join(SHARED, "slides", "boxes.tiff"), vsi)
    refused(vsi, ".ets", "_scan_")


def main():
    global WORK
    WORK = workdir("slide_kinds")
    try:
        check_fluorescence()
        check_multiplex_ome()
        check_qptiff()
        check_single_plane()
        check_sixteen_bit()
        check_three_planes()
        check_refusals()
        print("ok")
    finally:
        shutil.rmtree(WORK, ignore_errors=True)


def test_slide_kinds():
    main()


if __name__ == "__main__":
    main()

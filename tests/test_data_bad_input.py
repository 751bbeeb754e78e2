"""Bad input to `tessera tile` and `tessera synth`: the exit codes of docs/architecture.md (5 bad
input, 2 bad usage) and messages that name the file, the tile or the flag."""
import json
import os
import shutil
import struct
import sys

from PIL import Image

from data_tools import read_store, run, summary, synth, workdir


TESSERA = os.environ.get("TESSERA_BINARY", "build/tools/tessera")

def expect(result, code, *words):
    assert result.returncode == code, (result.returncode, code, result.stderr)
    for word in words:
        assert word in result.stderr, (word, result.stderr)


def tile_offsets(path):
    """Level 0's tile offsets and byte counts from a little-endian BigTIFF's first directory."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b"II+\x00", "tessera synth writes BigTIFF"
    (directory,) = struct.unpack_from("<Q", data, 8)
    (count,) = struct.unpack_from("<Q", data, directory)
    fields = {}
    for i in range(count):
        tag, kind, n, value = struct.unpack_from("<HHQQ", data, directory + 8 + 20 * i)
        fields[tag] = (n, value)
    def longs(tag):
        n, where = fields[tag]
        return list(struct.unpack_from(f"<{n}Q", data, where)) if n > 1 else [where]
    return longs(324), longs(325)  # TileOffsets, TileByteCounts


def main(binary):
    work = workdir("test_data_bad_input")
    slide = os.path.join(work, "slide.tiff")
    synth(binary, slide, 2048, 2048, 41)
    store = os.path.join(work, "tiles.lmdb")

    missing = os.path.join(work, "absent.svs")
    expect(run(binary, "tile", missing, "--out", store, check=False), 5, "absent.svs")
    assert not os.path.exists(store), "nothing is written when an input is bad"

    truncated = os.path.join(work, "truncated.tiff")
    with open(slide, "rb") as f:
        data = f.read()
    offsets, _ = tile_offsets(slide)
    with open(truncated, "wb") as f:
        f.write(data[: offsets[len(offsets) // 2]])
    expect(run(binary, "tile", truncated, "--out", store, check=False), 5, "truncated.tiff")
    assert not os.path.exists(store), "a run that stores no tile leaves no store"


    # Fluorescence: tissue glowing on a dark background is found as fluorescence, not taken for
    # all tissue: the tiles kept are those of the glowing square [200, 700) x [300, 800) (128 px).
    fluorescence = os.path.join(work, "fluorescence.png")
    glow = Image.new("RGB", (1024, 1024), (4, 6, 8))
    for x in range(200, 700, 3):
        for y in range(300, 800, 3):
            glow.putpixel((x, y), (20, 220, 60))
    glow.save(fluorescence)
    glowing = os.path.join(work, "glow.lmdb")
    entry = summary(run(binary, "tile", fluorescence, "--out", glowing, "--size", 128))["slides"][0]
    assert entry["tissue"]["stain"] == "fluorescence", entry
    tiles, _ = read_store(glowing)
    kept = {(key[2], key[3]) for key in tiles}
    inside = {(r, c) for r in range(2, 6) for c in range(2, 5)}  # wholly in the square
    edge = {(r, c) for r in range(2, 6) for c in (1, 5)}  # 44% and 47% in it: within a mask pixel of half
    assert inside <= kept <= inside | edge, sorted(kept)

    geojson = os.path.join(work, "broken.geojson")
    with open(geojson, "w") as f:
        f.write('{"type": "FeatureCollection", "features": [')
    expect(run(binary, "tile", slide, "--out", store, "--labels", geojson, check=False), 5,
           "broken.geojson: not valid JSON")
    not_geojson = os.path.join(work, "points.geojson")
    with open(not_geojson, "w") as f:
        json.dump({"type": "FeatureCollection", "features": [{"type": "Feature", "properties": {
            "classification": {"name": "Tumor"}}, "geometry": {"type": "Point", "coordinates": [1, 2]}}]}, f)
    expect(run(binary, "tile", slide, "--out", store, "--labels", not_geojson, check=False), 5,
           "points.geojson: 1 feature: 0 polygons, 1 point or line (not areas, unused); none is Tumor")

    # Labels that do not fit the slide: another slide's mask (given in the wrong order), GeoJSON
    # beside the slide, mask values that are not classes.
    wide = os.path.join(work, "wide.tiff")
    synth(binary, wide, 3072, 2048, 43)
    expect(run(binary, "tile", slide, wide, "--out", store, "--labels", os.path.join(work, "wide.mask.tiff"),
               os.path.join(work, "slide.mask.tiff"), check=False), 5, "wide.mask.tiff: does not fit the slide")
    with open(os.path.join(work, "slide.geojson")) as f:
        document = json.load(f)
    for feature in document["features"]:
        feature["geometry"]["coordinates"] = [[[x + 10000, y] for x, y in ring]
                                              for ring in feature["geometry"]["coordinates"]]
    beside = os.path.join(work, "beside.geojson")
    with open(beside, "w") as f:
        json.dump(document, f)
    expect(run(binary, "tile", slide, "--out", store, "--labels", beside, check=False), 5,
           "beside.geojson: 1 feature", "spanning x", "of the slide's 2048x2048: none of them lies on the slide")
    assert not os.path.exists(store), "no store: labels are checked before any tile is written"
    mask = Image.open(os.path.join(work, "slide.mask.tiff"))
    description = mask.tag_v2[270]
    assert '"1":"Tumor"' in description, description
    for value, declared in ((7, True), (255, False)):
        pixels = mask.copy()
        pixels.putpixel((3, 3), value)
        odd = os.path.join(work, f"odd{value}.mask.tiff")
        pixels.save(odd, tiffinfo={270: description} if declared else {})
        expect(run(binary, "tile", slide, "--out", store, "--labels", odd, check=False), 5,
               f"odd{value}.mask.tiff: value {value} (1 pixels) is not a class")
    assert not os.path.exists(store)

    expect(run(binary, "tile", slide, "--out", store, "--encoding", "png", check=False), 2, "--encoding")
    expect(run(binary, "tile", slide, "--out", store, "--level", 7, check=False), 2, "--level")
    expect(run(binary, "tile", slide, slide, "--out", store, "--labels", geojson, check=False), 2, "--labels")
    expect(run(binary, "tile", slide, "--out", store, "--min-tissue", 2, check=False), 2, "--min-tissue")
    # NaN and out-of-range numbers: exit 2 naming the flag, nothing written.
    for flag, value in [("--min-tissue", "nan"), ("--label-coverage", "nan"), ("--tissue-threshold", -1),
                        ("--tissue-threshold", "nan"), ("--size", 0), ("--size", "nan"), ("--quality", "inf"),
                        ("--workers", 0), ("--level", -1), ("--commit-tiles", 0)]:
        expect(run(binary, "tile", slide, "--out", store, flag, value, check=False), 2, flag)
        assert not os.path.exists(store), (flag, value)
    for flag, value in [("--size", 0), ("--size", 1), ("--min-tissue", "nan")]:
        expect(run(binary, "extract", "--model", "small-cnn", "--random-weights", "--layer", "conv1", "--slides", slide, "--out",
                   os.path.join(work, "features"), flag, value, check=False), 2, flag)
        assert not os.path.exists(os.path.join(work, "features")), (flag, value)
    for flag, value in [("--mpp", "nan"), ("--mpp", "inf"), ("--quality", 0), ("--tile-size", "nan"),
                        ("--width", "nan"), ("--workers", 0)]:
        expect(run(binary, "synth", os.path.join(work, "x.tiff"), "--width", 64, "--height", 64, flag, value,
                   check=False), 2, flag)
        assert not os.path.exists(os.path.join(work, "x.tiff")), (flag, value)
    expect(run(binary, "synth", os.path.join(work, "x.tiff"), "--width", 0, "--height", 10, check=False), 2, "--width")

    # A corrupt JPEG tile in the middle of level 0: named, counted, skipped; the run goes on.
    reference = summary(run(binary, "tile", slide, "--out", os.path.join(work, "reference.lmdb")))["slides"][0]
    reference_tiles, _ = read_store(os.path.join(work, "reference.lmdb"))
    row, column = sorted(key[2:] for key in reference_tiles)[len(reference_tiles) // 2]
    offsets, counts = tile_offsets(slide)
    index = row * 8 + column
    corrupt = os.path.join(work, "corrupt.tiff")
    with open(corrupt, "wb") as f:
        middle = offsets[index] + counts[index] // 2
        f.write(data[:middle] + bytes([0xFF, 0xD3] * 40) + data[middle + 80:])
    result = run(binary, "tile", corrupt, "--out", os.path.join(work, "corrupt.lmdb"))
    warnings = [json.loads(line) for line in result.stderr.splitlines() if '"warning"' in line]
    assert len(warnings) == 1, result.stderr
    assert f"level 0 tile column {column} row {row}: corrupt JPEG" in warnings[0]["error"], warnings
    tiled = summary(result)["slides"][0]
    assert tiled["corrupt_tiles"] == 1 and tiled["written"] == reference["written"] - 1, tiled
    corrupt_tiles, slides = read_store(os.path.join(work, "corrupt.lmdb"))
    assert set(reference_tiles) - set(corrupt_tiles) == {(0, 0, row, column)}
    assert slides[0]["corrupt_tiles"] == 1 and slides[0]["complete"]
    shutil.rmtree(work)
    print("ok")


def test_data_bad_input():
    main(TESSERA)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else TESSERA)

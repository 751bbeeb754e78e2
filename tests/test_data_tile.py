"""tessera synth (with and without tumour) and tessera tile, checked with independent readers:
OpenSlide's command line tool for the slide, python3-lmdb, zlib and PIL for the tile store."""
import os
import shutil
import subprocess
import sys

import numpy as np

from data_tools import parse_value, point_in_polygons, read_store, run, summary, synth, tumour_polygons, workdir


TESSERA = os.environ.get("TESSERA_BINARY", "build/tools/tessera")

def main(binary):
    work = workdir("test_data_tile")
    slide = os.path.join(work, "slide.tiff")
    made = synth(binary, slide, 4096, 4096, 21)
    assert made["levels"] == [[4096, 4096], [2048, 2048], [1024, 1024]], made["levels"]
    assert os.path.exists(os.path.join(work, "slide.mask.tiff"))
    assert 0.1 < made["tissue_fraction"] < 0.6 and 0.005 < made["tumour_fraction"] < made["tissue_fraction"], made

    if shutil.which("openslide-show-properties"):
        properties = subprocess.run(["openslide-show-properties", slide], capture_output=True, text=True, check=True).stdout
        assert "openslide.vendor: 'generic-tiff'" in properties, properties
        assert "openslide.level-count: '3'" in properties, properties
        assert "openslide.level[2].downsample: '4'" in properties, properties

    store = os.path.join(work, "tiles.lmdb")
    geojson = os.path.join(work, "slide.geojson")
    # The synthetic GeoJSON outlines every tumour: the rest of the tissue is normal.
    result = summary(run(binary, "tile", slide, "--out", store, "--labels", geojson, "--unannotated", "Normal",
                         "--workers", 2))
    tiled = result["slides"][0]
    assert tiled["unannotated"] == 0 and tiled["tiles"] == tiled["candidates"], tiled
    tiles, slides = read_store(store)
    assert len(tiles) == tiled["written"] == tiled["tiles"], (len(tiles), tiled)
    assert tiled["copied_jpeg"] == tiled["written"], "aligned 256-pixel tiles are copied, not re-encoded"
    # Tiles at least half tissue: about the tissue area, counted in 256-pixel tiles.
    expected = made["tissue_fraction"] * 256
    assert abs(len(tiles) - expected) < 0.25 * expected, (len(tiles), expected)
    entry = slides[0]
    assert entry["path"] == os.path.abspath(slide) and entry["complete"] and entry["tile_size"] == 256, entry
    assert entry["width"] == 4096 and abs(entry["mpp_x"] - 0.25) < 1e-6, entry

    polygons = tumour_polygons(geojson)
    brightness = {0: [], 1: []}
    for key, value in tiles.items():
        slide_id, level, row, column = key
        tile = parse_value(key, value)
        assert (slide_id, level) == (0, 0) and tile["encoding"] == 1, key
        assert (tile["x"], tile["y"]) == (column * 256, row * 256), (key, tile["x"], tile["y"])
        expected_label = int(point_in_polygons(column * 256 + 128, row * 256 + 128, polygons))
        assert tile["label"] == expected_label, (key, tile["label"])
        pixels = np.asarray(tile["image"], dtype=np.float64)
        brightness[tile["label"]].append(pixels.mean())
    assert len(brightness[1]) >= 3, "some tumour tiles"
    assert sum(map(len, brightness.values())) == len(tiles)
    normal, tumour = np.mean(brightness[0]), np.mean(brightness[1])
    print(f"tiles {len(tiles)}, tumour {len(brightness[1])}, mean brightness normal {normal:.1f} tumour {tumour:.1f}")
    assert normal - tumour > 15, "tumour tiles are darker (denser, larger, darker nuclei)"

    # Labels from the low-resolution mask agree with the polygons.
    mask_store = os.path.join(work, "mask.lmdb")
    run(binary, "tile", slide, "--out", mask_store, "--labels", os.path.join(work, "slide.mask.tiff"))
    mask_tiles, _ = read_store(mask_store)
    assert mask_tiles.keys() == tiles.keys()
    agree = sum(parse_value(k, v)["label"] == parse_value(k, tiles[k])["label"] for k, v in mask_tiles.items())
    assert agree >= len(tiles) - 2, (agree, len(tiles))

    # Raw re-encoding at level 1 with 128-pixel tiles: pixels as the slide has them.
    raw_store = os.path.join(work, "raw.lmdb")
    raw = summary(run(binary, "tile", slide, "--out", raw_store, "--level", 1, "--size", 128, "--encoding", "raw"))
    raw_tiles, raw_slides = read_store(raw_store)
    assert raw["slides"][0]["copied_jpeg"] == 0 and len(raw_tiles) == raw["written"] > 0
    key, value = next(iter(raw_tiles.items()))
    tile = parse_value(key, value)
    assert tile["encoding"] == 0 and tile["width"] == 128 and (tile["x"], tile["y"]) == (key[3] * 256, key[2] * 256)
    assert raw_slides[0]["downsample"] == 2.0

    # --no-tumour: the same tissue, no tumour; its empty GeoJSON with --unannotated Normal labels
    # every tile 0.
    normal = os.path.join(work, "normal.tiff")
    made_normal = synth(binary, normal, 4096, 4096, 21, "--no-tumour")
    assert made_normal["tumour_regions"] == 0 and made_normal["tumour_fraction"] == 0, made_normal
    assert made_normal["tissue_fraction"] == made["tissue_fraction"], (made_normal, made)
    assert tumour_polygons(os.path.join(work, "normal.geojson")) == []
    normal_store = os.path.join(work, "normal.lmdb")
    empty = run(binary, "tile", normal, "--out", normal_store, "--labels", os.path.join(work, "normal.geojson"),
                check=False)
    assert empty.returncode == 5 and "normal.geojson: labels no tile" in empty.stderr, empty.stderr
    assert not os.path.exists(normal_store), "a run that stores no tile leaves no store"
    tiled_normal = summary(run(binary, "tile", normal, "--out", normal_store, "--labels",
                               os.path.join(work, "normal.geojson"), "--unannotated", "Normal", "--allow-empty-labels"))
    assert "labels no tile" in tiled_normal["slides"][0]["warning"], tiled_normal
    normal_tiles, _ = read_store(normal_store)
    assert normal_tiles.keys() == tiles.keys()
    assert all(parse_value(k, v)["label"] == 0 for k, v in normal_tiles.items())
    shutil.rmtree(work)
    print("ok")


def test_data_tile():
    main(TESSERA)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else TESSERA)

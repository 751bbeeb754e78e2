"""GeoJSON as QuPath, HistoQC and the Digital Slide Archive write it labels tiles.

- Every file in ../shared/testdata/annotations labels a slide it covers: QuPath 0.2's bare array
  of MultiPolygon Features (classes Tumor and Invborder, spanning 174,000 pixels) and QuPath
  0.3's single unclassified Feature whose polygon has a hole (with --unclassified-as Tumor).
  The slides are sparse pyramids written here with tifffile (level 0 stores no tile, the lower
  levels hold tissue under the annotations); each tile's label equals an even-odd test of its
  centre against the file's polygons, holes included.
- On a slide it misses, each is refused (exit 5) with a message naming what it found (features,
  polygons by class, holes, their extent) and why it does not apply (off the slide, or no shape
  of the class without --unclassified-as), and no store is left behind where the labels are
  checked before tiling.
- The same tumour polygons of a synthetic slide as a bare array, a bare MultiPolygon (with
  --unclassified-as), DSA's form (class in `group`, 3-D positions) and a GeometryCollection give
  the tiles the labels the FeatureCollection gives."""
import json
import os
import shutil
import struct

import numpy as np
import tifffile

from data_tools import point_in_polygons, read_store, run, summary, workdir

TESSERA = os.environ.get("TESSERA_BINARY", "build/tools/tessera")
ANNOTATIONS = os.path.normpath(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..",
                                            "shared", "testdata", "annotations"))
ARRAY = os.path.join(ANNOTATIONS, "qupath-featurearray.json")
HOLED = os.path.join(ANNOTATIONS, "qupath-feature-with-hole.geojson")
HEADER = struct.Struct("<BBBBHHIIIII")


def tessera(*args, check=True):
    return run(TESSERA, *args, check=check)


def sparse_slide(path, width, height, downsamples, tissue):
    """A pyramid whose level 0 stores no tile (a sparse TIFF: offsets and byte counts 0) and whose
    smaller levels hold pink tissue inside the level-0 box `tissue` on grey glass."""
    tile = 512
    count = -(-width // tile) * -(-height // tile)
    with tifffile.TiffWriter(path, bigtiff=True) as writer:
        # Empty encoded tiles (b"", not None, which newer tifffiles refuse as an iterator's first item): tifffile
        # writes each one's byte count as 0 and its offset as 0.
        writer.write((b"" for _ in range(count)), shape=(height, width, 3), dtype=np.uint8, tile=(tile, tile),
                     compression="zlib", photometric="rgb", metadata=None)
        for d in downsamples:
            image = np.full((height // d, width // d, 3), 245, dtype=np.uint8)
            x0, y0, x1, y1 = (v // d for v in tissue)
            image[y0:y1, x0:x1] = (220, 140, 190)
            writer.write(image, tile=(256, 256), compression="zlib", photometric="rgb", subfiletype=1, metadata=None)


def labels_of(store):
    """{(row, column): (label, level-0 x, y)} of slide 0."""
    tiles, _ = read_store(store)
    out = {}
    for key, value in tiles.items():
        fields = HEADER.unpack_from(value)
        out[key[2:]] = (fields[6], fields[7], fields[8])
    return out


def polygons_of(path, wanted):
    """The polygons (lists of rings of (x, y)) of features classified `wanted` (None: unclassified)."""
    with open(path) as f:
        document = json.load(f)
    features = document if isinstance(document, list) else document.get("features", [document])
    polygons = []
    for feature in features:
        name = (feature.get("properties") or {}).get("classification", {}).get("name")
        if name != wanted:
            continue
        geometry = feature["geometry"]
        parts = [geometry["coordinates"]] if geometry["type"] == "Polygon" else geometry["coordinates"]
        polygons += [[[tuple(p[:2]) for p in ring] for ring in polygon] for polygon in parts]
    return polygons


def check_labels(store, polygons, extent):
    labels = labels_of(store)
    wrong = [(key, label) for key, (label, x, y) in labels.items()
             if label != point_in_polygons(x + extent / 2, y + extent / 2, polygons)]
    assert not wrong, wrong[:5]
    return labels


def refused(args, *words, store_left=False):
    out = os.path.join(WORK, "refused.lmdb")
    shutil.rmtree(out, ignore_errors=True)
    result = tessera("tile", *args, "--out", out, check=False)
    assert result.returncode == 5, (args, result.returncode, result.stderr)
    for word in words:
        assert word in result.stderr, (word, result.stderr)
    assert store_left or not os.path.exists(out), "labels checked before tiling leave no store"
    return result.stderr


def check_shared_files():
    big = os.path.join(WORK, "big.tiff")
    sparse_slide(big, 87040, 174336, (32, 64), (16000, 48000, 87040, 174336))
    for label_class in ("Tumor", "Invborder"):
        store = os.path.join(WORK, f"big-{label_class}.lmdb")
        result = summary(tessera("tile", big, "--out", store, "--level", 1, "--size", 128, "--labels", ARRAY,
                                 "--label-class", label_class, "--unannotated", "Normal"))
        labels = check_labels(store, polygons_of(ARRAY, label_class), 128 * 32)
        positive = sum(label for label, _, _ in labels.values())
        print(f"{os.path.basename(ARRAY)} ({label_class}): {positive} of {len(labels)} tiles labelled")
        assert positive > 20 and result["slides"][0]["label_counts"]["1"] == positive, result

    holed = os.path.join(WORK, "holed.tiff")
    sparse_slide(holed, 14336, 20480, (8, 16), (9000, 15000, 14336, 20480))
    store = os.path.join(WORK, "holed.lmdb")
    tessera("tile", holed, "--out", store, "--level", 1, "--size", 32, "--labels", HOLED, "--unclassified-as", "Tumor",
            "--unannotated", "Normal")
    polygons = polygons_of(HOLED, None)
    labels = check_labels(store, polygons, 256)
    hole = np.array(polygons[0][1])
    in_hole = [key for key, (label, x, y) in labels.items()
               if hole[:, 0].min() < x + 128 < hole[:, 0].max() and hole[:, 1].min() < y + 128 < hole[:, 1].max()
               and point_in_polygons(x + 128, y + 128, [[polygons[0][1]]])]
    assert in_hole and all(labels[key][0] == 0 for key in in_hole), in_hole
    print(f"{os.path.basename(HOLED)}: {sum(l for l, _, _ in labels.values())} tiles labelled, "
          f"{len(in_hole)} in the hole left 0")

    # Why a file does not apply, naming what it holds.
    synthetic = os.path.join(WORK, "small.tiff")
    tessera("synth", synthetic, "--width", 2048, "--height", 2048, "--seed", 1)
    message = refused([synthetic, "--labels", ARRAY], "qupath-featurearray.json", "2 features", "3 Tumor",
                      "5 Invborder", "spanning x 21389 to 75091, y 54671 to 168856", "2048x2048",
                      "none of them lies on the slide")
    print(message.strip().splitlines()[-1])
    message = refused([holed, "--level", 1, "--size", 32, "--labels", HOLED], "qupath-feature-with-hole.geojson",
                      "1 polygon (1 unclassified)", "1 hole", "none is Tumor", "--unclassified-as Tumor",
                      store_left=True)
    print(message.strip().splitlines()[-1])
    result = tessera("tile", synthetic, "--out", os.path.join(WORK, "z.lmdb"), "--unclassified-as", "Tumor",
                     check=False)
    assert result.returncode == 2 and "--unclassified-as" in result.stderr, result.stderr


def check_forms():
    slide = os.path.join(WORK, "s.tiff")
    tessera("synth", slide, "--width", 3072, "--height", 2048, "--seed", 1)
    with open(os.path.join(WORK, "s.geojson")) as f:
        features = json.load(f)["features"]
    assert features, "the synthetic slide has tumour"
    rings = [feature["geometry"]["coordinates"] for feature in features]
    forms = {
        "array": (features, []),
        "multipolygon": ({"type": "MultiPolygon", "coordinates": rings}, ["--unclassified-as", "Tumor"]),
        "dsa": ({"type": "FeatureCollection", "features": [
            {"type": "Feature", "geometry": {"type": "Polygon", "coordinates": [[p + [0] for p in ring[0]]]},
             "properties": {"group": "Tumor", "label": {"value": f"region {i}"}, "lineColor": "rgb(255,0,0)"}}
            for i, ring in enumerate(rings)]}, []),
        "collection": ({"type": "Feature", "properties": {"classification": {"name": "Tumor"}},
                        "geometry": {"type": "GeometryCollection",
                                     "geometries": [{"type": "Polygon", "coordinates": ring} for ring in rings]}}, []),
    }
    reference = os.path.join(WORK, "reference.lmdb")
    tessera("tile", slide, "--out", reference, "--size", 128, "--labels", os.path.join(WORK, "s.geojson"),
            "--unannotated", "Normal")
    expected = labels_of(reference)
    assert sum(label for label, _, _ in expected.values()) > 5, expected
    for name, (document, flags) in forms.items():
        path = os.path.join(WORK, f"{name}.json")
        with open(path, "w") as f:
            json.dump(document, f)
        store = os.path.join(WORK, f"{name}.lmdb")
        tessera("tile", slide, "--out", store, "--size", 128, "--labels", path, "--unannotated", "Normal", *flags)
        assert labels_of(store) == expected, name
    print(f"{len(forms)} other forms give the FeatureCollection's {len(expected)} labels")


def main():
    global WORK
    WORK = workdir("annotations")
    try:
        check_shared_files()
        check_forms()
        print("ok")
    finally:
        shutil.rmtree(WORK, ignore_errors=True)


def test_annotations():
    main()


if __name__ == "__main__":
    main()

"""Sparse GeoJSON annotations (a few small Tumor, Stroma and Necrosis shapes on synthetic slides, as
QuPath users draw them) label only the tissue they claim; the rest is labelled as the user says.

- Without --unannotated the store holds only the tiles a shape claims, and the slide entry's
  `unannotated` (and the summary's) counts the rest of the tissue tiles; with --unannotated Normal
  every tissue tile (the tiles an unlabelled run stores) is stored. Each stored label equals a
  reference computed here in plain Python from the polygons and the tile grid: the class of the
  smallest shape (shoelace area, holes subtracted) at the tile centre, or under --label-rule
  coverage the class with the most of an 8x8 grid of samples (the uncovered ones credited to
  --unannotated's class), if it reaches --label-coverage, ties to the lower label. The shapes'
  vertices lie at 4 mod 8 and their edges are axis-aligned or of slope 2, so no sample or centre
  (multiples of 8) lies on an edge, and the reference cannot differ from tessera by rounding.
- --classes Tumor,Stroma,Normal gives labels 0, 1, 2 as named (Necrosis, not listed, annotates
  nothing and is named in the warning), and `train` on two such slides trains a 3-output model
  that reports validation accuracy and no AUC; --unannotated Other with --classes lacking it is
  exit 2 naming the flag, leaving no store.
- A tile run that fails before it stores a tile leaves no store (no tissue, annotations that claim
  no tissue tile, a disk full at the first commit), so the next run, with any settings, succeeds;
  in a store that holds other slides, the failed slide's entry (no tile) is tiled again by a run
  with other settings, and the other slides' tiles are untouched.
"""
import json
import os
import resource
import shutil
import signal
import struct

import h5py
import numpy as np
import pytest
import tifffile

from data_tools import read_store, run, run_with_report, summary, synth, workdir

TESSERA = os.environ.get("TESSERA_BINARY", "build/tools/tessera")
HEADER = struct.Struct("<BBBBHHIIIII")
SIZE, TILE, SAMPLES = 4096, 128, 8


def tessera(*args, check=True, **kwargs):
    return run(TESSERA, *args, check=check, **kwargs)


@pytest.fixture(scope="module")
def work():
    path = workdir("test_sparse_labels")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def stored(store):
    """{(slide, column, row): (label, level-0 x, y)} of a store's tiles, and its slide entries."""
    tiles, slides = read_store(store)
    out = {}
    for (slide, _, row, column), value in tiles.items():
        fields = HEADER.unpack_from(value)
        out[(slide, column, row)] = (fields[6], fields[7], fields[8])
    return out, slides


def rectangle(x0, y0, x1, y1):
    return [[x0, y0], [x1, y0], [x1, y1], [x0, y1], [x0, y0]]


def shapes_around(candidates):
    """A few small shapes on tissue: a Tumor island inside a Stroma region, a Tumor triangle (edges
    of slope 2), a Tumor band with a hole over its middle tile, a Necrosis square and a Stroma one,
    each around its own tissue tile, far enough apart. [(class, rings)], level-0 coordinates."""
    centres = sorted(candidates)
    chosen = []
    for column, row in centres:
        if all(max(abs(column - c), abs(row - r)) >= 4 for c, r in chosen) and \
                (len(chosen) != 2 or {(column - 1, row), (column + 1, row)} <= candidates):
            chosen.append((column, row))
        if len(chosen) == 5:
            break
    assert len(chosen) == 5, f"five tissue tiles apart from each other among {len(candidates)}"
    (px, py), (qx, qy), (hx, hy), (rx, ry), (sx, sy) = ((c * TILE + TILE // 2, r * TILE + TILE // 2)
                                                        for c, r in chosen)
    return [
        ("Stroma", [rectangle(px - 300, py - 300, px + 300, py + 300)]),
        ("Tumor", [rectangle(px - 60, py - 60, px + 60, py + 60)]),
        ("Tumor", [[[qx - 92, qy + 100], [qx + 100, qy + 100], [qx + 4, qy - 92], [qx - 92, qy + 100]]]),
        ("Tumor", [rectangle(hx - 188, hy - 60, hx + 188, hy + 60), rectangle(hx - 36, hy - 36, hx + 36, hy + 36)]),
        ("Necrosis", [rectangle(rx - 68, ry - 60, rx + 60, ry + 60)]),
        ("Stroma", [rectangle(sx - 124, sy - 60, sx + 124, sy + 60)]),
    ]


def write_geojson(path, shapes):
    features = [{"type": "Feature", "properties": {"objectType": "annotation", "classification": {"name": name}},
                 "geometry": {"type": "Polygon", "coordinates": rings}} for name, rings in shapes]
    with open(path, "w") as f:
        json.dump({"type": "FeatureCollection", "features": features}, f)


def contains(rings, x, y):
    """Even-odd rule over the polygon's rings."""
    inside = False
    for ring in rings:
        for (x1, y1), (x2, y2) in zip(ring, ring[1:] + ring[:1]):
            if (y1 > y) != (y2 > y) and x < (x2 - x1) * (y - y1) / (y2 - y1) + x1:
                inside = not inside
    return inside


def area(rings):
    def shoelace(ring):
        return abs(sum(x1 * y2 - x2 * y1 for (x1, y1), (x2, y2) in zip(ring, ring[1:] + ring[:1]))) / 2
    return max(0.0, shoelace(rings[0]) - sum(shoelace(hole) for hole in rings[1:]))


def reference_label(shapes, label_of, x, y, rule="centre", unannotated=None, coverage=0.5, classes=2):
    """The label of the tile at level-0 (x, y), or None when it is left out."""
    annotating = sorted(((area(rings), label_of(name), rings) for name, rings in shapes
                         if label_of(name) is not None), key=lambda shape: shape[:2])

    def at(px, py):
        return next((label for _, label, rings in annotating if contains(rings, px, py)), None)

    if rule == "centre":
        found = at(x + TILE / 2, y + TILE / 2)
        return unannotated if found is None else found
    counts = [0] * classes
    for sy in range(SAMPLES):
        for sx in range(SAMPLES):
            found = at(x + TILE * (sx + 0.5) / SAMPLES, y + TILE * (sy + 0.5) / SAMPLES)
            if found is not None:
                counts[found] += 1
            elif unannotated is not None:
                counts[unannotated] += 1
    best = max(range(classes), key=lambda label: (counts[label], -label))
    if counts[best] > 0 and counts[best] >= coverage * SAMPLES * SAMPLES:
        return best
    return unannotated


def binary(name):
    return 1 if name == "Tumor" else 0


def three(name):
    return {"Tumor": 0, "Stroma": 1, "Normal": 2}.get(name)


@pytest.fixture(scope="module")
def slides(work):
    """Two synthetic slides with sparse annotations: [(slide, geojson, shapes, {tile: (x, y)})]."""
    made = []
    for seed in (7, 8):
        slide = os.path.join(work, f"slide{seed}.tiff")
        synth(TESSERA, slide, SIZE, SIZE, seed)
        everything = os.path.join(work, f"all{seed}.lmdb")
        tessera("tile", slide, "--out", everything, "--size", TILE)  # no labels: every tissue tile
        tiles, _ = stored(everything)
        origins = {(column, row): (x, y) for (_, column, row), (_, x, y) in tiles.items()}
        shapes = shapes_around(set(origins))
        geojson = os.path.join(work, f"sparse{seed}.geojson")
        write_geojson(geojson, shapes)
        made.append((slide, geojson, shapes, origins))
    return made


def check_store(store, result, shapes, origins, label_of, **rule):
    """Every tissue tile the reference labels is stored with that label, the others are counted."""
    tiles, entries = stored(store)
    expected = {tile: reference_label(shapes, label_of, x, y, **rule) for tile, (x, y) in origins.items()}
    labelled = {tile: label for tile, label in expected.items() if label is not None}
    got = {(column, row): label for (_, column, row), (label, _, _) in tiles.items()}
    assert got == labelled, sorted(set(got.items()) ^ set(labelled.items()))[:6]
    left_out = len(expected) - len(labelled)
    entry, tiled = entries[0], result["slides"][0]
    assert entry["unannotated"] == tiled["unannotated"] == result["unannotated"] == left_out, (entry, tiled)
    assert entry["tiles"] + entry["unannotated"] == entry["candidates"] == len(origins), entry
    counts = {str(label): list(labelled.values()).count(label) for label in set(labelled.values())}
    assert entry["label_counts"] == counts, (entry["label_counts"], counts)
    return labelled, left_out


def test_sparse_annotations_store_only_what_they_claim(work, slides):
    slide, geojson, shapes, origins = slides[0]
    store = os.path.join(work, "sparse.lmdb")
    result = summary(tessera("tile", slide, "--out", store, "--size", TILE, "--labels", geojson))
    labelled, left_out = check_store(store, result, shapes, origins, binary)
    # Tumor (the island, the triangle, the band's two outer tiles) is 1; Stroma and Necrosis 0;
    # the hole's tile and all other tissue are left out.
    assert sorted(labelled.values()).count(1) == 4 and 4 <= len(labelled) < len(origins) // 4, labelled
    print(f"sparse: {len(labelled)} annotated tiles stored, {left_out} of {len(origins)} tissue tiles left out")

    exhaustive = os.path.join(work, "exhaustive.lmdb")
    result = summary(tessera("tile", slide, "--out", exhaustive, "--size", TILE, "--labels", geojson,
                             "--unannotated", "Normal"))
    labelled, left_out = check_store(exhaustive, result, shapes, origins, binary, unannotated=0)
    assert left_out == 0 and len(labelled) == len(origins), "--unannotated Normal: every tissue tile"

    coverage = os.path.join(work, "coverage.lmdb")
    result = summary(tessera("tile", slide, "--out", coverage, "--size", TILE, "--labels", geojson,
                             "--label-rule", "coverage", "--label-coverage", "0.25"))
    labelled, left_out = check_store(coverage, result, shapes, origins, binary, rule="coverage", coverage=0.25)
    assert 0 < len(labelled) and left_out > 0
    # The resumed run's settings record what unannotated tissue became: other settings are refused.
    again = tessera("tile", slide, "--out", coverage, "--size", TILE, "--labels", geojson, "--label-rule", "coverage",
                    "--label-coverage", "0.25", "--unannotated", "Normal", check=False)
    assert again.returncode == 2 and "other settings" in again.stderr, again.stderr


def test_classes_name_labels_in_order_and_train_as_three(work, slides):
    stores = []
    for index, (slide, geojson, shapes, origins) in enumerate(slides):
        store = os.path.join(work, f"three{index}.lmdb")
        result = summary(tessera("tile", slide, "--out", store, "--size", TILE, "--labels", geojson,
                                 "--classes", "Tumor,Stroma,Normal", "--unannotated", "Normal"))
        labelled, left_out = check_store(store, result, shapes, origins, three, unannotated=2, classes=3)
        assert left_out == 0 and set(labelled.values()) == {0, 1, 2}, labelled
        warning = result["slides"][0]["warning"]
        assert f"{geojson}: 1 polygon (1 Necrosis) annotates nothing" in warning and \
               "--classes Tumor,Stroma,Normal" in warning, warning
        stores.append(store)
        if index == 0:
            coverage = os.path.join(work, "three-coverage.lmdb")
            result = summary(tessera("tile", slide, "--out", coverage, "--size", TILE, "--labels", geojson,
                                     "--classes", "Tumor,Stroma,Normal", "--label-rule", "coverage"))
            labelled, left_out = check_store(coverage, result, shapes, origins, three, rule="coverage", classes=3)
            assert left_out > 0 and 2 not in labelled.values(), "no Normal shape: only Tumor and Stroma"

    # Two slides, one held out: a model of three outputs, validation accuracy and no AUC (binary only).
    checkpoint = os.path.join(work, "three.h5")
    code, _, err, report = run_with_report(TESSERA, ["train", "--data", *stores, "--model", "small-cnn", "--width", 4,
                                                     "--batch", 8, "--epochs", 1, "--workers", 1, "--seed", 1,
                                                     "--val-fraction", 0.5, "--checkpoint", checkpoint], check=False)
    assert code == 0, err
    with h5py.File(checkpoint, "r") as f:
        assert f["params/fc2.weight"].shape[0] == 3 and f["params/fc2.bias"].shape == (3,)
    final = [line["metrics"] for line in report if line["type"] == "final"]
    assert final and 0 <= final[0]["val_accuracy"] <= 1 and "val_auc" not in final[0], report
    assert final[0]["val_samples"] > 0 and "error" not in err.lower(), (final, err)


def test_unannotated_class_must_be_one_of_the_classes(work, slides):
    slide, geojson, _, _ = slides[0]
    store = os.path.join(work, "other.lmdb")
    for flags, message in (
            (["--labels", geojson, "--classes", "Tumor,Stroma", "--unannotated", "Other"],
             "--unannotated: 'Other' is not one of --classes Tumor,Stroma"),
            (["--labels", geojson, "--classes", "Tumor,,Stroma"], "--classes: class names separated by commas"),
            (["--labels", geojson, "--classes", "Tumor,Stroma", "--label-class", "Stroma"], "--label-class"),
            (["--unannotated", "Normal"], "--unannotated applies to GeoJSON --labels")):
        result = tessera("tile", slide, "--out", store, "--size", TILE, *flags, check=False)
        assert result.returncode == 2 and message in result.stderr, (flags, result.stderr)
        assert not os.path.exists(store), flags


def limit_file_size(limit):
    def apply():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_a_failed_run_leaves_no_store_in_the_way(work, slides):
    slide, geojson, shapes, origins = slides[0]
    blank = os.path.join(work, "blank.tiff")
    tifffile.imwrite(blank, np.full((1024, 1024, 3), 245, np.uint8), tile=(256, 256), photometric="rgb",
                     compression="zlib")
    store = os.path.join(work, "failed.lmdb")
    # No tissue: exit 5 and no store; the next run, with other settings, tiles into it.
    result = tessera("tile", blank, "--out", store, "--size", TILE, check=False)
    assert result.returncode == 5 and "no tissue tile" in result.stderr, result.stderr
    assert not os.path.exists(store) and not os.path.exists(os.path.join(work, ".failed.lmdb.lock"))
    # Annotations far from the tissue's tiles claim none (--allow-empty-labels lets the run go on):
    # every tissue tile is left out, the run stores nothing and says how to give them a class.
    off = os.path.join(work, "off.geojson")
    write_geojson(off, [("Tumor", [rectangle(4, 4, 60, 60)])])
    result = tessera("tile", slide, "--out", store, "--size", TILE, "--labels", off, "--allow-empty-labels",
                     check=False)
    assert result.returncode == 5 and "--unannotated CLASS" in result.stderr and \
           f"claims any of its {len(origins)} tissue tiles" in result.stderr, result.stderr
    assert not os.path.exists(store)
    # A disk full at the first commit (of the slide's entry, at 16 KiB of data.mdb; of its first 4
    # tiles, at 24 KiB): exit 1 naming the store, and nothing left of it.
    for limit, commit in ((16, "writing 0 tiles"), (24, "writing 4 tiles")):
        result = tessera("tile", slide, "--out", store, "--size", TILE, "--commit-tiles", 4, check=False,
                         preexec_fn=limit_file_size(limit << 10))
        assert result.returncode == 1 and f"failed.lmdb: {commit}" in result.stderr and \
               "no tile was stored: " in result.stderr, result.stderr
        assert not os.path.exists(store), limit
    result = summary(tessera("tile", slide, "--out", store, "--size", TILE, "--labels", geojson))
    assert result["slides"][0]["tiles"] > 0

    # In a store that holds another slide: the failed slide's entry holds no tile, and a run with
    # other settings tiles it again under its id; the other slide's tiles are untouched.
    other, other_geojson, other_shapes, other_origins = slides[1]
    before, _ = read_store(store)
    result = tessera("tile", other, "--out", store, "--size", TILE, "--labels", off, "--allow-empty-labels",
                     check=False)
    assert result.returncode == 5, result.stderr
    tiles, entries = read_store(store)
    assert tiles == before and entries[1]["tiles"] == 0 and entries[1]["complete"], entries[1]
    result = summary(tessera("tile", other, "--out", store, "--size", TILE, "--labels", other_geojson,
                             "--unannotated", "Normal"))
    assert result["slides"][0]["id"] == 1 and result["slides"][0]["status"] == "tiled", result
    tiles, entries = read_store(store)
    assert {key: value for key, value in tiles.items() if key[0] == 0} == before
    assert entries[1]["tiles"] == len(other_origins) and entries[1]["settings"]["unannotated"] == "Normal", entries[1]

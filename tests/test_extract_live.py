"""`tessera extract --slides`: tiles read live from a real slide (CMU-1-Small-Region.svs, 0.499
um/px, so an encoder trained at 0.5 um/px reads 224-pixel tiles of level 0, nothing resized), with
no tile store. Features are checked against torchvision's vit_b_16 (same random weights, float64)
on the pixels OpenSlide reads at the feature file's coords (read_region(...).convert('RGB')).

- Tissue grid: vit-b16's features equal torchvision's (relative error max|a-b|/max|b| < 1e-5, fp32),
  the coords equal `tessera tile`'s with the same size and tissue settings, and the feature file is
  the only thing written under --out.
- Two encoders (vit-b16 and kaiko-vits16, a ViT-S with its own mean and std, random weights) in one run: each encoder's
  features and coords in OUT/<encoder>/ equal a run of that encoder alone, bit for bit, and each
  tile is decoded once. The same holds with the models forced to load one at a time
  (--device-memory-limit between the larger plan and their sum).
- kill -9 during a two-encoder run, then the same command again: both files equal an uninterrupted
  run's bit for bit, and the encoder that had flushed rows resumes after them.
- --coords with a TRIDENT-layout file (patches/SLIDE_patches.h5 as TRIDENT >= 0.2.4's coords_to_h5
  writes it) and a CLAM-layout one (SLIDE.h5): the coords are the file's, in its order, and the
  features equal torchvision's on OpenSlide's pixels there (off tessera's grid).
- Bad input (an encoder named twice, fewer models than encoders, coords of another slide by name
  or size, a patch outside the slide, no coords file for the slide): exit 2 or 5 naming the
  culprit, nothing under --out. A slide that cannot be opened is refused before any work (exit 5,
  nothing written), or with --skip-errors named in `skipped` while the others are extracted.

Few tiles (tissue settings or coords files that keep 1 to 3), --batch 2, and no ViT-L: lavapipe runs
one at about 0.3 tiles/s on two cores (test_extract_vit runs uni).
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np
import openslide
import pytest
import torch
import torchvision

TESTS = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, TESTS)
sys.path.insert(0, os.path.join(os.path.dirname(TESTS), "tools"))
from data_tools import parse_value, read_store  # noqa: E402
from test_vit_timm import relative_error, write_safetensors  # noqa: E402

TESSERA = os.environ.get("TESSERA_BINARY", "build/tools/tessera")
SLIDES = os.path.join(os.path.dirname(os.path.dirname(TESTS)), "shared", "testdata", "slides")
CMU = os.path.join(SLIDES, "CMU-1-Small-Region.svs")
NAME = "CMU-1-Small-Region"
WIDTH, HEIGHT = 2220, 2967  # CMU-1-Small-Region's level 0
TILE = 224
EXIT_USAGE, EXIT_BAD_INPUT = 2, 5
TOLERANCE = 1e-5
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
# Tissue settings that keep few of CMU's 49 default tissue tiles (the grid is still tessera's).
THREE_TILES = ["--tissue-threshold", 100, "--min-tissue", 0.7]
TWO_TILES = ["--tissue-threshold", 95, "--min-tissue", 0.9]
ONE_TILE = ["--tissue-threshold", 115, "--min-tissue", 0.5]
# Khronos validation on, as ctest sets it.
ENV = dict(os.environ, TESSERA_VALIDATION=os.environ.get("TESSERA_VALIDATION", "1"))
TWO_ENCODERS = ["--encoder", "vit-b16,kaiko-vits16", "--random-weights", "--slides", CMU, "--batch", 2, *TWO_TILES]


def tessera(*args, expect=0):
    """Runs tessera; asserts the exit code and that the validation layer said nothing."""
    result = subprocess.run([TESSERA, *map(str, args)], capture_output=True, text=True, env=ENV, timeout=900)
    assert result.returncode == expect, (args, result.returncode, result.stderr[-3000:])
    assert "vulkan validation" not in result.stderr, result.stderr[-3000:]
    return result


def summary_of(result):
    return json.loads(result.stdout.strip().splitlines()[-1])


def read_features(path):
    with h5py.File(path, "r") as f:
        return f["features"][...], f["coords"][...]


def files_under(directory):
    """Every file under `directory`, relative to it, sorted."""
    return sorted(os.path.relpath(os.path.join(root, name), directory)
                  for root, _, names in os.walk(directory) for name in names
                  if os.path.relpath(root, directory).split(os.sep)[0] != "runs")  # the runs' reports


def nothing_under(directory):
    return not os.path.exists(directory) or files_under(directory) == []


def seeded_vit_b_16(seed):
    """torchvision's vit_b_16, random, with its layer norms drawn at random too (torchvision
    initialises them to 1 and 0, which would leave them untested); no classification head."""
    torch.manual_seed(seed)
    model = torchvision.models.vit_b_16()
    model.heads = torch.nn.Identity()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.uniform_(0.7, 1.3)
                module.bias.normal_(0.0, 0.1)
    return model.eval()


def openslide_tiles(coords):
    """OpenSlide's 224x224 RGB pixels of level 0 at level-0 (x, y) corners, uint8 [N,224,224,3]."""
    with openslide.OpenSlide(CMU) as slide:
        return np.stack([np.asarray(slide.read_region((int(x), int(y)), 0, (TILE, TILE)).convert("RGB"))
                         for x, y in coords])


def torchvision_features(model, coords):
    """vit_b_16's class token in float64 on OpenSlide's tiles, normalised as the vit-b16 preset
    says (x/255, ImageNet mean and std)."""
    x = torch.from_numpy(openslide_tiles(coords)).permute(0, 3, 1, 2).double() / 255
    mean = torch.tensor(IMAGENET_MEAN, dtype=torch.float64).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD, dtype=torch.float64).view(1, 3, 1, 1)
    with torch.no_grad():
        return model((x - mean) / std).numpy()


def check_against_torchvision(model, features, coords, what):
    expected = torchvision_features(model, coords)
    assert float(expected.std()) > 1e-2, "the reference's features are nearly constant"
    assert features.dtype == np.float32 and features.shape == (len(coords), 768), features.shape
    error = relative_error(features.astype(np.float64), expected)
    print(f"{what}: {len(coords)} tiles, relative error {error:.3g} against torchvision in float64", file=sys.stderr)
    assert error < TOLERANCE, (what, error)


@pytest.fixture(scope="module")
def work():
    with tempfile.TemporaryDirectory(prefix="tessera-extract-live-") as directory:
        yield directory


@pytest.fixture(scope="module")
def vit_b16(work):
    """(torchvision's model in float64, its weights as .safetensors with torchvision's names)."""
    model = seeded_vit_b_16(26)
    weights = os.path.join(work, "vit_b_16.safetensors")
    write_safetensors(weights, model.state_dict())
    return model.double(), weights


@pytest.fixture(scope="module")
def two_encoder_run(work):
    """vit-b16 and kaiko-vits16 (random weights) in one run on a two-tile tissue grid: (out, summary)."""
    out = os.path.join(work, "both")
    return out, summary_of(tessera("extract", *TWO_ENCODERS, "--out", out))


def test_tissue_grid_features_equal_torchvision_and_coords_equal_tile(work, vit_b16):
    """--slides on tessera's tissue grid: the coords are `tessera tile`'s (same size and tissue
    settings), the features torchvision's vit_b_16 on OpenSlide's pixels there, every tile decoded
    once, and the feature file is all that is written under --out (no tile store)."""
    model, weights = vit_b16
    out = os.path.join(work, "live")
    summary = summary_of(tessera("extract", "--encoder", "vit-b16", "--model", weights, "--slides", CMU,
                                 "--out", out, "--batch", 2, *THREE_TILES))
    assert files_under(out) == [NAME + ".h5"], files_under(out)
    features, coords = read_features(os.path.join(out, NAME + ".h5"))
    assert len(coords) > 2, coords  # more than one batch of 2

    store = os.path.join(work, "tiles.lmdb")
    tessera("tile", CMU, "--out", store, "--size", TILE, "--encoding", "raw", *THREE_TILES)
    tiles, _ = read_store(store)
    tiled = [[parse_value(key, tiles[key])["x"], parse_value(key, tiles[key])["y"]] for key in sorted(tiles)]
    assert coords.tolist() == tiled, (coords.tolist(), tiled)
    assert summary["tiles"] == summary["decoded_tiles"] == summary["times"]["decoded_tiles"] == len(coords), summary
    check_against_torchvision(model, features, coords, "tissue grid, vit-b16")


def test_two_encoders_equal_single_runs_with_one_decode_per_tile(work, two_encoder_run):
    """vit-b16 and kaiko-vits16 in one run: each OUT/<encoder>/ file equals that encoder
    run alone, bit for bit; tiles are decoded once for both, held together or one at a time."""
    both, summary = two_encoder_run
    assert files_under(both) == [f"kaiko-vits16/{NAME}.h5", f"vit-b16/{NAME}.h5"], files_under(both)
    assert summary["devices"][0]["models_together"] is True, summary["devices"]
    for encoder, width in (("vit-b16", 768), ("kaiko-vits16", 384)):
        alone = os.path.join(work, "alone-" + encoder)
        tessera("extract", "--encoder", encoder, "--random-weights", "--slides", CMU, "--batch", 2, *TWO_TILES,
                "--out", alone)
        expected_features, expected_coords = read_features(os.path.join(alone, NAME + ".h5"))
        features, coords = read_features(os.path.join(both, encoder, NAME + ".h5"))
        assert features.shape == (len(coords), width) and len(coords) > 0, (encoder, features.shape)
        assert np.array_equal(coords, expected_coords), encoder
        assert np.array_equal(features, expected_features), f"{encoder}: features differ from its run alone"
        assert float(features.std()) > 1e-3, encoder
    tiles = len(coords)
    assert summary["tiles"] == summary["decoded_tiles"] == tiles, (summary["tiles"], summary["decoded_tiles"])
    assert summary["slides"][0]["times"]["decoded_tiles"] == tiles, summary["slides"][0]

    plans = summary_of(tessera("extract", *TWO_ENCODERS, "--out", os.path.join(work, "dry"), "--dry-run"))
    device = plans["devices"][0]
    larger = max(model["plan"]["total"] for model in device["models"])
    together = device["together"]["total"]
    assert larger < together, device
    assert nothing_under(os.path.join(work, "dry"))
    limit = (larger + together) // 2
    apart = os.path.join(work, "apart")
    swapped = summary_of(tessera("extract", *TWO_ENCODERS, "--out", apart, "--device-memory-limit", limit))
    assert swapped["devices"][0]["models_together"] is False, swapped["devices"]
    assert swapped["tiles"] == swapped["decoded_tiles"] == tiles, (swapped["tiles"], swapped["decoded_tiles"])
    for encoder in ("vit-b16", "kaiko-vits16"):
        features, coords = read_features(os.path.join(apart, encoder, NAME + ".h5"))
        expected_features, expected_coords = read_features(os.path.join(both, encoder, NAME + ".h5"))
        assert np.array_equal(coords, expected_coords) and np.array_equal(features, expected_features), encoder


def flushed_rows(feature_file):
    """Rows a feature file's .partial holds (its .partial.rows), or None."""
    try:
        with open(feature_file + ".partial.rows") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def test_killed_two_encoder_run_resumes_to_identical_files(work, two_encoder_run):
    """SIGKILL once vit-b16 has flushed rows or a file is complete, then the same command: both
    files equal the uninterrupted run's bit for bit, each encoder resuming after its flushed rows."""
    uninterrupted, _ = two_encoder_run
    out = os.path.join(work, "killed")
    command = [TESSERA, "extract", *map(str, TWO_ENCODERS), "--out", out]
    files = {encoder: os.path.join(out, encoder, NAME + ".h5") for encoder in ("vit-b16", "kaiko-vits16")}
    for attempt in range(3):
        shutil.rmtree(out, ignore_errors=True)
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV,
                                   start_new_session=True)
        while process.poll() is None and not (flushed_rows(files["vit-b16"]) or any(map(os.path.exists,
                                                                                        files.values()))):
            time.sleep(0.01)
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        # Killed with a file left unfinished (not after the run ended, nor between its last rename and exit).
        if process.returncode == -signal.SIGKILL and any(n.endswith(".partial") for n in files_under(out)):
            break
    else:
        pytest.fail(f"no run was killed with a .partial file left: {files_under(out)}")
    complete = {encoder: os.path.exists(path) for encoder, path in files.items()}
    rows = {encoder: flushed_rows(path) or 0 for encoder, path in files.items()}
    print(f"killed after {attempt + 1} start(s): flushed rows {rows}, complete {complete}", file=sys.stderr)

    summary = summary_of(tessera("extract", *TWO_ENCODERS, "--out", out))
    for model in summary["slides"][0]["models"]:
        if complete[model["model"]]:
            assert model["status"] == "already complete", model
        else:
            assert model["resumed_from"] == rows[model["model"]], (model, rows)
    assert files_under(out) == files_under(uninterrupted), files_under(out)
    for encoder in ("vit-b16", "kaiko-vits16"):
        features, coords = read_features(os.path.join(out, encoder, NAME + ".h5"))
        expected_features, expected_coords = read_features(os.path.join(uninterrupted, encoder, NAME + ".h5"))
        assert np.array_equal(coords, expected_coords), encoder
        assert np.array_equal(features, expected_features), f"{encoder}: resumed features differ"


# Off tessera's 224-pixel grid, in no sorted order, each patch inside the slide.
TRIDENT_PATCHES = [(1351, 903), (1120, 672), (1575, 2461)]
CLAM_PATCHES = [(901, 1513), (901, 1737), (1125, 1513)]  # CLAM's x-major order


def write_trident_coords(directory, patches, name=NAME, width=WIDTH, height=HEIGHT):
    """DIRECTORY/patches/NAME_patches.h5 as TRIDENT >= 0.2.4's coords_to_h5 writes it (trident/IO.py):
    int64 [N,2] chunked (1,2), extendable; patch_size_level0 and target_magnification floats
    (--mag is a float since 0.2.4), level0_width/height (since 0.2.2)."""
    os.makedirs(os.path.join(directory, "patches"), exist_ok=True)
    path = os.path.join(directory, "patches", NAME + "_patches.h5")
    coords = np.asarray(patches, dtype=np.int64)
    with h5py.File(path, "w") as f:
        dataset = f.create_dataset("coords", shape=coords.shape, maxshape=(None, 2), chunks=(1, 2), dtype=np.int64)
        dataset[:] = coords
        attributes = {"patch_size": TILE, "patch_size_level0": TILE * 20 // 20.0, "level0_magnification": 20,
                      "target_magnification": 20.0, "overlap": 0, "name": name, "savetodir": directory,
                      "level0_width": width, "level0_height": height}
        for key, value in attributes.items():
            dataset.attrs[key] = value
    return path


def write_clam_coords(directory, patches):
    """DIRECTORY/NAME.h5 as CLAM's create_patches_fp writes patches/NAME.h5 (wsi_core
    WholeSlideImage.process_contour and wsi_utils.save_hdf5)."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, NAME + ".h5")
    coords = np.asarray(patches, dtype=np.int64)
    with h5py.File(path, "w") as f:
        dataset = f.create_dataset("coords", shape=coords.shape, maxshape=(None, 2), chunks=(1, 2), dtype=np.int64)
        dataset[:] = coords
        attributes = {"patch_size": TILE, "patch_level": 0, "downsample": np.array([1.0, 1.0]),
                      "downsampled_level_dim": np.array([WIDTH, HEIGHT]), "level_dim": np.array([WIDTH, HEIGHT]),
                      "name": NAME, "save_path": directory}
        for key, value in attributes.items():
            dataset.attrs[key] = value
    return path


@pytest.mark.parametrize("layout", ["trident", "clam"])
def test_coords_file_patches_in_its_order(work, vit_b16, layout):
    """--coords with TRIDENT's (DIR/patches/SLIDE_patches.h5) or CLAM's (DIR/SLIDE.h5) file: the
    feature file's coords are the file's, in its order, and the features torchvision's there."""
    model, weights = vit_b16
    directory = os.path.join(work, layout + "-coords")
    if layout == "trident":
        patches = TRIDENT_PATCHES
        write_trident_coords(directory, patches)
    else:
        patches = CLAM_PATCHES
        write_clam_coords(directory, patches)
    out = os.path.join(work, layout + "-features")
    summary = summary_of(tessera("extract", "--encoder", "vit-b16", "--model", weights, "--slides", CMU,
                                 "--coords", directory, "--out", out, "--batch", 2))
    assert files_under(out) == [NAME + ".h5"], files_under(out)
    features, coords = read_features(os.path.join(out, NAME + ".h5"))
    assert coords.dtype == np.int64 and coords.tolist() == [list(p) for p in patches], coords.tolist()
    assert summary["tiles"] == summary["decoded_tiles"] == len(patches), summary
    check_against_torchvision(model, features, coords, f"{layout} coords, vit-b16")


def bad_input_cases(work, weights):
    """(what, flags, exit code, texts the message names) of runs refused before any work."""
    def trident(case, patches=TRIDENT_PATCHES, **attributes):
        directory = os.path.join(work, "bad-coords-" + case)
        return directory, write_trident_coords(directory, patches, **attributes)

    renamed, renamed_file = trident("renamed", name="CMU-1")
    wider, wider_file = trident("wider", width=WIDTH + 1)
    outside, outside_file = trident("outside", patches=[(100, 100), (WIDTH, 10)])
    empty = os.path.join(work, "bad-coords-empty")
    os.makedirs(os.path.join(empty, "patches"), exist_ok=True)
    write_trident_coords(os.path.join(work, "bad-coords-other-slide"), TRIDENT_PATCHES)
    os.rename(os.path.join(work, "bad-coords-other-slide", "patches", NAME + "_patches.h5"),
              os.path.join(empty, "patches", "CMU-1_patches.h5"))  # another slide's file only
    vit = ["--encoder", "vit-b16", "--model", weights, "--slides", CMU]
    return [
        ("an encoder named twice", ["--encoder", "vit-b16,vit-b16", "--random-weights", "--slides", CMU],
         EXIT_USAGE, ["--encoder", "vit-b16 is named twice"]),
        ("fewer models than encoders", ["--encoder", "vit-b16,uni", "--model", weights, "--slides", CMU],
         EXIT_USAGE, ["--model", "2 encoders"]),
        ("coords of a slide of another name", [*vit, "--coords", renamed],
         EXIT_BAD_INPUT, [renamed_file, "'CMU-1'", CMU]),
        ("coords of a slide of another size", [*vit, "--coords", wider],
         EXIT_BAD_INPUT, [wider_file, f"{WIDTH + 1}x{HEIGHT}", CMU]),
        ("a patch outside the slide", [*vit, "--coords", outside],
         EXIT_BAD_INPUT, [outside_file, "outside", f"({WIDTH}, 10)"]),
        ("no coords file of the slide", [*vit, "--coords", empty],
         EXIT_BAD_INPUT, [empty, NAME + "_patches.h5", CMU]),
    ]


def test_bad_input_is_refused_naming_the_culprit_with_nothing_written(work, vit_b16):
    """Each refused with exit 2 or 5 and a message naming what is wrong; --out stays empty."""
    for number, (what, flags, code, named) in enumerate(bad_input_cases(work, vit_b16[1])):
        out = os.path.join(work, f"refused-{number}")
        result = tessera("extract", *flags, "--out", out, "--batch", 2, expect=code)
        for text in named:
            assert text in result.stderr, (what, text, result.stderr[-2000:])
        assert nothing_under(out), (what, files_under(out))


def test_unopenable_slide_stops_the_run_before_any_work_or_is_skipped(work):
    """A slide OpenSlide cannot open among good ones: without --skip-errors exit 5 naming it and
    nothing extracted, not even the slide before it (slides are opened before any work); with
    it, exit 0, `skipped` names it and the good slides' files are written."""
    unreadable, empty_slide = os.path.join(SLIDES, "unreadable.svs"), os.path.join(SLIDES, "small.svs")
    slides = ["--slides", CMU, unreadable, empty_slide]
    flags = ["--encoder", "vit-b16", "--random-weights", *slides, "--batch", 2, *ONE_TILE]
    out = os.path.join(work, "unopenable")
    stopped = tessera("extract", *flags, "--out", out, expect=EXIT_BAD_INPUT)
    assert unreadable in stopped.stderr, stopped.stderr[-2000:]
    assert nothing_under(out), files_under(out)

    summary = summary_of(tessera("extract", *flags, "--out", out, "--skip-errors"))
    assert len(summary["skipped"]) == 1 and unreadable in summary["skipped"][0], summary["skipped"]
    statuses = [(slide["slide"], slide["status"]) for slide in summary["slides"]]
    assert statuses == [(NAME, "extracted"), ("unreadable", "failed"), ("small", "extracted")], statuses
    assert files_under(out) == [NAME + ".h5", "small.h5"], files_under(out)
    features, coords = read_features(os.path.join(out, NAME + ".h5"))
    assert len(coords) == 1 and features.shape == (1, 768), features.shape
    _, small_coords = read_features(os.path.join(out, "small.h5"))
    assert small_coords.shape == (0, 2), small_coords.shape  # 16x16 pixels: no 224-pixel tile

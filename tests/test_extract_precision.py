"""extract --precision fp16 against fp32, and features that are not finite, read back with h5py.

A CNN's activations stay fp32 with --precision fp16 (only the stored type changes; an encoder's run
in fp16 too), so its fp16 file must equal numpy's float16 of its fp32 file in every element: the
honest comparison, with no tolerance. Values just below a power of two are among them (HDF5's own
conversion stored 0.031249 as 0.015625, about one value in 3,000). A feature that fp16 would store
as an infinity, or one that is not finite in fp32 (an overflow), is exit 5 naming the slide, the
tile and the feature; that slide's file is never completed (its partial file stays), the slides
before it are, and --skip-errors goes on past it.
"""
import os
import shutil
import subprocess
import sys
import tempfile

import h5py
import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from data_tools import parse_value, read_store, run, summary, synth_raw_store  # noqa: E402
from tessera_presets import build_preset, normalise  # noqa: E402

TESSERA = os.environ.get("TESSERA_BINARY", "build/tools/tessera")
CONVERTER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "torch_to_tessera.py")
SIZE, WIDTH = 32, 48
SLIDES = {"s0": (1024, 768, 11), "s1": (1024, 768, 12), "s2": (1024, 768, 13)}
FLOAT32_MAX = float(np.finfo(np.float32).max)


def save_checkpoint(model, work, name):
    torch.save(model.state_dict(), os.path.join(work, name + ".pt"))
    subprocess.run([sys.executable, CONVERTER, "--state-dict", os.path.join(work, name + ".pt"), "--preset",
                    "small-cnn", "--out", os.path.join(work, name + ".h5")], check=True, capture_output=True)
    return os.path.join(work, name + ".h5")


def extract(model, store, out, *flags, check=True):
    result = run(TESSERA, "extract", "--model", model, "--layer", "pool2", "--tiles", store, "--out", out,
                 "--batch", "32", *flags, check=check)
    assert "vulkan validation" not in result.stderr, result.stderr
    return result


def features_of(out, name):
    with h5py.File(os.path.join(out, name + ".h5"), "r") as f:
        return f["features"][:], f["coords"][:]


def below_a_power_of_two(values):
    """The values that float16 rounds up to the power of two just above them."""
    rounded = values.astype(np.float16).astype(np.float32)
    mantissa, _ = np.frexp(rounded)
    return (np.abs(mantissa) == 0.5) & (np.abs(rounded) > np.abs(values))


def check_fp16_is_numpy_float16_of_fp32(model, store):
    full_out, half_out = os.path.join(WORK, "fp32"), os.path.join(WORK, "fp16")
    extract(model, store, full_out)
    extract(model, store, half_out, "--precision", "fp16")
    near_powers = values = 0
    for name in SLIDES:
        full, coords = features_of(full_out, name)
        half, half_coords = features_of(half_out, name)
        assert half.dtype == np.dtype("<f2") and full.dtype == np.dtype("<f4"), (half.dtype, full.dtype)
        assert np.array_equal(coords, half_coords), name
        expected = full.astype(np.float16)
        differ = np.flatnonzero(half.view(np.uint16) != expected.view(np.uint16))
        assert differ.size == 0, (f"{name}: {differ.size} of {full.size} values differ from numpy's float16, e.g. "
                                  f"{full.flat[differ[0]]!r} stored as {half.flat[differ[0]]!r}")
        near_powers += int(below_a_power_of_two(full).sum())
        values += full.size
    # The values HDF5's conversion halved are there, and come out right.
    assert near_powers > 0, f"no value of {values} lies just below a power of two: the test misses the case"
    print(f"fp16 == float16(fp32) in all {values} values, {near_powers} of them just below a power of two")
    return full_out


def first_refused(features_by_slide):
    """(slide, row, column) of the first value that is not finite, in the slides' order and each's rows."""
    for name, features in features_by_slide.items():
        bad = np.flatnonzero(~np.isfinite(features))
        if bad.size:
            return name, int(bad[0] // features.shape[1]), int(bad[0] % features.shape[1])
    return None


def check_refused_slide(result, out, plain_out, slide, row, column, what):
    """Exit 5 naming the slide, tile and feature; its file not completed; slides before it complete."""
    assert result.returncode == 5, (result.returncode, result.stderr)
    _, coords = features_of(plain_out, slide)
    x, y = coords[row]
    named = f"{slide}: tile {row} (level-0 x {x}, y {y}): feature {column} is {what}"
    assert named in result.stderr, (named, result.stderr)
    assert "finite values only" in result.stderr and "--skip-errors" in result.stderr, result.stderr
    assert not os.path.exists(os.path.join(out, slide + ".h5")), os.listdir(out)
    with h5py.File(os.path.join(out, slide + ".h5.partial"), "r") as f:  # kept, for inspection
        kept = f["features"][:]
    with open(os.path.join(out, slide + ".h5.partial.rows")) as f:
        flushed = int(f.read())
    # It ends at the tile: a rerun resumes there.
    assert flushed == row and kept.shape[0] == row and np.isfinite(kept).all(), (flushed, kept.shape, row)
    names = list(SLIDES)
    statuses = [s["status"] for s in summary(result)["slides"]]
    before, after = names.index(slide), len(names) - names.index(slide) - 1
    # The slides in flight when the writer found the value may finish; none is started after.
    assert statuses[:before + 1] == ["extracted"] * before + ["failed"], statuses
    assert all(status in ("extracted", "not started") for status in statuses[before + 1:]), statuses
    assert len(statuses) == before + 1 + after
    for name, status in zip(names, statuses):
        if status == "extracted":
            features, _ = features_of(out, name)
            assert np.isfinite(features).all(), name


def check_fp16_overflow_refused(torch_model, store, plain_out):
    """conv2 scaled so that the largest feature passes 65504: finite in fp32, an infinity in fp16."""
    largest = max(np.abs(features_of(plain_out, name)[0]).max() for name in SLIDES)
    scaled = build_preset("small-cnn", 2, (SIZE, SIZE), WIDTH).eval()
    scaled.load_state_dict(torch_model.state_dict())
    with torch.no_grad():
        factor = 65520 * 1.01 / float(largest)
        scaled.conv2.weight.mul_(factor)
        scaled.conv2.bias.mul_(factor)
    model = save_checkpoint(scaled, WORK, "scaled_fp16")
    full_out, out = os.path.join(WORK, "scaled_fp32"), os.path.join(WORK, "scaled_fp16")
    extract(model, store, full_out)
    full = {name: features_of(full_out, name)[0] for name in SLIDES}
    assert all(np.isfinite(features).all() for features in full.values())
    with np.errstate(over="ignore"):
        slide, row, column = first_refused({name: features.astype(np.float16) for name, features in full.items()})
    value = full[slide][row, column]
    result = extract(model, store, out, "--precision", "fp16", check=False)
    check_refused_slide(result, out, plain_out, slide, row, column,
                        f"{value:.4g}, past float16's largest value (65504): extract it with --precision fp32")
    print(f"fp16 overflow refused: {slide} tile {row} feature {column} = {value}")


def check_fp32_overflow_refused(torch_model, store, tiles, slides, plain_out):
    """conv2's first channel made positive and scaled so that a few tiles' largest value passes float32's
    largest: those tiles' first feature is inf, predicted here in float64."""
    positive = build_preset("small-cnn", 2, (SIZE, SIZE), WIDTH).eval()
    positive.load_state_dict(torch_model.state_dict())
    with torch.no_grad():
        positive.conv2.weight[0].abs_()
        positive.conv2.bias[0].abs_()
        largest = {}  # by slide: each tile's largest value of conv2's first channel, in float64
        double = positive.double()
        for slide_id, entry in slides.items():
            name = entry["name"].rsplit(".", 1)[0]
            keys = sorted(k for k in tiles if k[0] == slide_id)
            images = np.stack([np.asarray(parse_value(k, tiles[k])["image"]) for k in keys])
            hidden = double.pool(torch.relu(double.conv1(normalise(images).double())))
            largest[name] = double.conv2(hidden)[:, 0].amax(dim=(1, 2)).numpy()
        ordered = np.sort(np.concatenate(list(largest.values())))[::-1]
        # A threshold in a gap of at least 0.1% among the largest (float32's rounding is 1e-7): no
        # rounding decides a tile.
        gap = next(k for k in range(len(ordered) - 1) if ordered[k] > 1.001 * ordered[k + 1])
        assert gap < 20, ordered[:20]
        factor = FLOAT32_MAX / float(np.sqrt(ordered[gap] * ordered[gap + 1]))
        positive = positive.float()
        positive.conv2.weight[0].mul_(factor)
        positive.conv2.bias[0].mul_(factor)
    model = save_checkpoint(positive, WORK, "overflow_fp32")
    expected = {name: np.where(values * factor > FLOAT32_MAX, np.inf, 0.0)[:, None] for name, values in largest.items()}
    slide, row, column = first_refused(expected)
    out = os.path.join(WORK, "overflow_fp32")
    check_refused_slide(extract(model, store, out, check=False), out, plain_out, slide, row, column, "inf")
    print(f"fp32 overflow refused: {slide} tile {row} feature {column}")
    # --skip-errors: the slide is named and skipped (its partial kept), the others extracted.
    result = extract(model, store, out, "--skip-errors")
    statuses = {s["slide"]: s["status"] for s in summary(result)["slides"]}
    assert statuses[slide] == "failed" and list(statuses.values()).count("failed") == 1, statuses
    assert len(summary(result)["skipped"]) == 1 and f"{slide}: tile {row}" in summary(result)["skipped"][0]
    assert not os.path.exists(os.path.join(out, slide + ".h5"))
    assert os.path.exists(os.path.join(out, slide + ".h5.partial"))
    for name in SLIDES:
        if name != slide:
            features, _ = features_of(out, name)
            assert np.isfinite(features).all(), name


def test_extract_precision():
    global WORK
    WORK = tempfile.mkdtemp(prefix="tessera_precision_")
    try:
        store = synth_raw_store(TESSERA, WORK, SLIDES, SIZE)
        tiles, slides = read_store(store)
        torch.manual_seed(3)
        torch_model = build_preset("small-cnn", 2, (SIZE, SIZE), WIDTH).eval()
        model = save_checkpoint(torch_model, WORK, "model")
        plain_out = check_fp16_is_numpy_float16_of_fp32(model, store)
        check_fp16_overflow_refused(torch_model, store, plain_out)
        check_fp32_overflow_refused(torch_model, store, tiles, slides, plain_out)
    finally:
        shutil.rmtree(WORK, ignore_errors=True)

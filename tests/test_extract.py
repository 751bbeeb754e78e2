"""tessera extract: CLAM-layout feature files read with h5py, coords against the tile store
(read with python3-lmdb), features against PyTorch on the same tiles, a SIGKILLed run and one stopped
by a full disk resumed to identical files, fp16, a layer name that does not exist, and a slide that fails alone."""
import json
import os
import resource
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

import h5py
import lmdb
import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from data_tools import parse_value, read_store, run, summary, synth_raw_store  # noqa: E402
from tessera_presets import build_preset, normalise  # noqa: E402

TESSERA = sys.argv[1] if __name__ == "__main__" and len(sys.argv) > 1 else os.environ.get(
    "TESSERA_BINARY", "build/tools/tessera")
CONVERTER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "torch_to_tessera.py")
SIZE, WIDTH = 32, 8
SLIDES = {"s0": (640, 384, 3), "s1": (512, 384, 4), "s2": (448, 320, 5)}


def make_checkpoint(work):
    torch.manual_seed(7)
    model = build_preset("small-cnn", 2, (SIZE, SIZE), WIDTH).eval()
    torch.save(model.state_dict(), os.path.join(work, "model.pt"))
    subprocess.run([sys.executable, CONVERTER, "--state-dict", os.path.join(work, "model.pt"), "--preset", "small-cnn",
                    "--out", os.path.join(work, "model.h5")], check=True, capture_output=True)
    return model


def reference_features(model, images):
    """small-cnn up to pool2, global-average-pooled: [N, 2*WIDTH]."""
    with torch.no_grad():
        x = normalise(images)
        x = model.pool(torch.relu(model.conv1(x)))
        x = model.pool(torch.relu(model.conv2(x)))
        return x.mean(dim=(2, 3)).numpy()


def read_features(path):
    with h5py.File(path, "r") as f:
        return f["features"][:], f["coords"][:], dict(f["coords"].attrs), dict(f["features"].attrs)


def extract(store, out, *flags, check=True):
    result = run(TESSERA, "extract", "--model", MODEL, "--layer", "pool2", "--tiles", store, "--out", out, *flags,
                 check=check)
    assert "vulkan validation" not in result.stderr, result.stderr
    return result


def check_clam_and_trident_attributes(coords, features, entry, name):
    """Every attribute under the name, type and dataset CLAM's and TRIDENT's readers use (read
    from their source: CLAM wsi_core/WholeSlideImage.py process_contour, TRIDENT trident/IO.py
    coords_to_h5 and wsi_objects/WSI.py extract_features); strings come back as str, not bytes."""
    for attrs, key in [(coords, "name"), (coords, "save_path"), (coords, "savetodir"), (features, "name"),
                       (features, "savetodir"), (features, "encoder"), (features, "pooling")]:
        assert type(attrs[key]) is str, (key, type(attrs[key]))
    integer = lambda value: np.asarray(value).dtype == np.int64 and np.asarray(value).shape == ()
    # CLAM
    assert list(coords["downsampled_level_dim"]) == [entry["level_width"], entry["level_height"]], coords
    assert np.asarray(coords["downsampled_level_dim"]).dtype == np.int64
    assert coords["save_path"] == "." and coords["savetodir"] == "." and features["savetodir"] == ".", coords
    # TRIDENT: the synthetic slides are 0.25 um/px, TRIDENT's 40x; tiles at level 0 are read at 40x.
    for key, value in [("patch_size", SIZE), ("patch_size_level0", SIZE), ("level0_magnification", 40),
                       ("target_magnification", 40), ("overlap", 0), ("level0_width", entry["width"]),
                       ("level0_height", entry["height"])]:
        assert integer(coords[key]) and coords[key] == value, (key, coords[key])
    assert features["name"] == name and features["encoder"] == MODEL + ":pool2", features


def check_layout_coords_and_features(store, tiles, slides, model):
    out = os.path.join(WORK, "plain")
    result = summary(extract(store, out, "--batch", "8"))
    assert result["extraction"]["pooling"] == "global_average", result
    for slide_id, entry in slides.items():
        name = entry["name"].rsplit(".", 1)[0]
        features, coords, coord_attrs, feature_attrs = read_features(os.path.join(out, name + ".h5"))
        assert not os.path.exists(os.path.join(out, name + ".h5.partial"))
        keys = sorted(k for k in tiles if k[0] == slide_id)
        values = [parse_value(k, tiles[k]) for k in keys]
        assert features.dtype == np.float32 and features.shape == (len(keys), 2 * WIDTH), features.shape
        assert coords.dtype == np.int64 and coords.shape == (len(keys), 2)
        assert coords.tolist() == [[v["x"], v["y"]] for v in values], name
        assert coord_attrs["patch_size"] == SIZE and coord_attrs["patch_level"] == 0, coord_attrs
        assert list(coord_attrs["level_dim"]) == [entry["level_width"], entry["level_height"]], coord_attrs
        assert list(coord_attrs["downsample"]) == [1.0, 1.0] and coord_attrs["name"] == name, coord_attrs
        assert feature_attrs["pooling"] == "global_average", feature_attrs
        check_clam_and_trident_attributes(coord_attrs, feature_attrs, entry, name)
        images = np.stack([np.asarray(v["image"]) for v in values])
        expected = reference_features(model, images)
        np.testing.assert_allclose(features, expected, rtol=1e-4, atol=1e-4, err_msg=name)
    # Finished slides are skipped.
    again = summary(extract(store, out))
    assert all(s["status"] == "already complete" for s in again["slides"]), again
    return out


def check_other_settings_refused(store, plain):
    """Complete files made with another layer or precision are never kept as this run's."""
    files = {name: open(os.path.join(plain, name), "rb").read() for name in os.listdir(plain) if name.endswith(".h5")}
    for flags in (["--precision", "fp16"], ["--layer", "conv2"]):
        layer = flags[1] if flags[0] == "--layer" else "pool2"
        precision = flags[1] if flags[0] == "--precision" else "fp32"
        result = run(TESSERA, "extract", "--model", MODEL, "--layer", layer, "--tiles", store, "--out", plain,
                     "--precision", precision, check=False)
        assert result.returncode == 2, (flags, result.returncode, result.stderr)
        assert ".h5" in result.stderr and "another --out" in result.stderr, result.stderr
        assert {name: open(os.path.join(plain, name), "rb").read() for name in os.listdir(plain)
                if name.endswith(".h5")} == files


def check_fp16(store, plain):
    out = os.path.join(WORK, "fp16")
    extract(store, out, "--precision", "fp16", "--compression", "gzip")
    for name in SLIDES:
        half, _, _, _ = read_features(os.path.join(out, name + ".h5"))
        full, _, _, _ = read_features(os.path.join(plain, name + ".h5"))
        assert half.dtype == np.float16, half.dtype
        # A CNN runs in fp32 either way: its fp16 file is numpy's float16 of its fp32 file, to the bit
        # (tests/test_extract_precision.py covers the values just below a power of two).
        assert np.array_equal(half.view(np.uint16), full.astype(np.float16).view(np.uint16)), name


def flushed_rows(out):
    rows = 0
    for name in os.listdir(out) if os.path.isdir(out) else []:
        if name.endswith(".rows"):
            try:
                with open(os.path.join(out, name)) as f:
                    rows += int(f.read() or 0)
            except (OSError, ValueError):
                pass
        elif name.endswith(".h5"):
            rows += 1
    return rows


def check_kill_and_resume(store, plain):
    out = os.path.join(WORK, "killed")
    for attempt in range(3):
        process = subprocess.Popen([TESSERA, "extract", "--model", MODEL, "--layer", "pool2", "--tiles", store,
                                    "--out", out, "--batch", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while process.poll() is None and flushed_rows(out) < 4 * (attempt + 1):
            time.sleep(0.002)
        if process.poll() is not None:
            break
        process.send_signal(signal.SIGKILL)
        process.wait()
    assert attempt > 0, "the first run ended before it could be killed"
    result = summary(extract(store, out, "--batch", "2"))
    statuses = [(s["status"], s.get("resumed_from", 0)) for s in result["slides"]]
    assert any(status != "extracted" for status, _ in statuses), statuses
    print(f"killed {attempt} time(s); then {statuses}")
    for name in SLIDES:
        features, coords, attrs, _ = read_features(os.path.join(out, name + ".h5"))
        expected_features, expected_coords, expected_attrs, _ = read_features(os.path.join(plain, name + ".h5"))
        assert coords.tolist() == expected_coords.tolist(), name
        assert len({tuple(c) for c in coords.tolist()}) == len(coords), f"{name}: duplicated tiles"
        np.testing.assert_allclose(features, expected_features, rtol=1e-6, atol=1e-6, err_msg=name)
        assert attrs.keys() == expected_attrs.keys()
    assert not [n for n in os.listdir(out) if "partial" in n], os.listdir(out)


def check_full_disk(store, plain):
    out = os.path.join(WORK, "full")

    def limit_file_size():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))

    result = subprocess.run([TESSERA, "extract", "--model", MODEL, "--layer", "pool2", "--tiles", store, "--out", out,
                             "--batch", "4"], capture_output=True, text=True, preexec_fn=limit_file_size)
    assert result.returncode == 1, (result.returncode, result.stderr)
    assert "disk full" in result.stderr and ".h5.partial" in result.stderr, result.stderr
    extract(store, out, "--batch", "4")
    for name in SLIDES:
        features, coords, _, _ = read_features(os.path.join(out, name + ".h5"))
        expected_features, expected_coords, _, _ = read_features(os.path.join(plain, name + ".h5"))
        assert coords.tolist() == expected_coords.tolist(), name
        np.testing.assert_allclose(features, expected_features, rtol=1e-6, atol=1e-6, err_msg=name)


def check_unknown_layer(store):
    result = run(TESSERA, "extract", "--model", MODEL, "--layer", "layer9", "--tiles", store, "--out",
                 os.path.join(WORK, "unknown"), check=False)
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "layer9" in result.stderr and "conv1" in result.stderr and "pool2" in result.stderr, result.stderr


def check_unreadable_slide_stops_the_run(store, tiles):
    """Without --skip-errors the run stops at a slide it cannot read (exit 5 naming it), the slides
    before it complete and the ones after not started; with it, that slide is named and the others
    are extracted (exit 0)."""
    broken = os.path.join(WORK, "broken.lmdb")
    shutil.copytree(store, broken)
    key = sorted(k for k in tiles if k[0] == 1)[3]
    env = lmdb.open(broken, max_dbs=2)
    with env.begin(write=True) as txn:
        db = env.open_db(b"tiles", txn=txn, create=False)
        value = bytearray(txn.get(struct.pack(">IIII", *key), db=db))
        value[-1] ^= 0xFF  # a pixel byte: the checksum no longer matches
        txn.put(struct.pack(">IIII", *key), bytes(value), db=db)
    env.close()
    out = os.path.join(WORK, "broken")
    result = extract(broken, out, "--batch", "2", check=False)
    assert result.returncode == 5, (result.returncode, result.stderr)
    assert "s1" in result.stderr and "slide 1" in result.stderr and "--skip-errors" in result.stderr, result.stderr
    statuses = [s["status"] for s in summary(result)["slides"]]
    assert statuses == ["extracted", "failed", "not started"], statuses
    assert os.path.exists(os.path.join(out, "s0.h5")) and not os.path.exists(os.path.join(out, "s2.h5"))
    assert not os.path.exists(os.path.join(out, "s1.h5"))
    skipped = summary(extract(broken, out, "--batch", "2", "--skip-errors"))
    assert [s["status"] for s in skipped["slides"]] == ["already complete", "failed", "extracted"], skipped
    assert len(skipped["skipped"]) == 1 and "slide 1" in skipped["skipped"][0], skipped["skipped"]
    assert os.path.exists(os.path.join(out, "s2.h5")) and not os.path.exists(os.path.join(out, "s1.h5"))


def check_from_slides(plain):
    """--slides reads the slide itself on tile's grid: no store, the same tiles and coordinates as
    the raw store's, and so the same features to the bit (at another batch size)."""
    out = os.path.join(WORK, "from_slides")
    slide = os.path.join(WORK, "s2.tiff")
    result = summary(run(TESSERA, "extract", "--model", MODEL, "--layer", "pool2", "--slides", slide, "--out",
                         out, "--size", str(SIZE), "--batch", "16", "--workers", "2"))
    assert sorted(os.listdir(out)) == ["runs", "s2.h5"], os.listdir(out)  # runs/: the run's report
    assert result["decoded_tiles"] == result["tiles"] > 0, result
    features, coords, attrs, feature_attrs = read_features(os.path.join(out, "s2.h5"))
    stored, stored_coords, stored_attrs, _ = read_features(os.path.join(plain, "s2.h5"))
    assert np.array_equal(coords, stored_coords) and np.array_equal(features, stored), "live and stored tiles differ"
    assert (attrs["patch_size"], attrs["patch_level"]) == (stored_attrs["patch_size"], stored_attrs["patch_level"])
    assert json.loads(feature_attrs["slide"])["settings"]["source"] == "slide", feature_attrs["slide"]


def test_extract():
    global WORK, STORE, MODEL
    WORK = tempfile.mkdtemp(prefix="tessera_extract_")
    try:
        STORE = synth_raw_store(TESSERA, WORK, SLIDES, SIZE)
        tiles, slides = read_store(STORE)
        model = make_checkpoint(WORK)
        MODEL = os.path.join(WORK, "model.h5")
        plain = check_layout_coords_and_features(STORE, tiles, slides, model)
        check_fp16(STORE, plain)
        check_other_settings_refused(STORE, plain)
        check_kill_and_resume(STORE, plain)
        check_full_disk(STORE, plain)
        check_unknown_layer(STORE)
        check_unreadable_slide_stops_the_run(STORE, tiles)
        check_from_slides(plain)
        print("test_extract: all passed")
    finally:
        shutil.rmtree(WORK, ignore_errors=True)


if __name__ == "__main__":
    test_extract()

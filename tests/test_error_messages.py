"""Inputs that used to crash tessera or fail with a message that named nothing:

- Malformed model JSON (seven shapes of it) is exit 5 naming the file and where in it, never exit 1
  with a bare nlohmann message; {"layers": []} and a model without parameters were SIGSEGV in
  `train` (with --dry-run too) and are exit 5 naming the file.
- Feature files that are not what a head trains on (`features` a group, a dataset that declares
  10^12 rows it does not hold, strings) are exit 5 naming the file and what is wrong, never a bare
  std::bad_alloc or map::at.
- `--device-memory-limit 0` and one past 2^64 bytes are exit 2; a limit above what the device has
  is said (a warning) and the plan is checked against the device, not the limit.
"""
import json
import os
import subprocess

import h5py
import numpy as np
import pytest

from data_tools import patch_task

TESSERA = os.environ.get("TESSERA_BINARY", "build/tools/tessera")


def tessera(*args):
    return subprocess.run([TESSERA, *map(str, args)], capture_output=True, text=True, timeout=600)


def expect(result, code, *words):
    assert result.returncode == code, (code, result.returncode, result.stderr[-2000:])
    for word in words:
        assert word in result.stderr, (word, result.stderr[-2000:])


@pytest.fixture(scope="module")
def patches(tmp_path_factory):
    return patch_task(tmp_path_factory.mktemp("patches") / "p.h5", 32, 16)


MALFORMED = {
    "array.json": ("[1, 2]", "the model"),
    "layers-number.json": ('{"layers": 5}', "/layers"),
    "layer-number.json": ('{"layers": [5]}', "/layers/0"),
    "no-name.json": ('{"layers": [{"type": "relu"}]}', "/layers/0"),
    "preset-number.json": ('{"preset": 5}', "preset"),
    "classes-text.json": ('{"preset": "small-cnn", "classes": "two"}', "the model"),
    "inputs-text.json": ('{"layers": [{"name": "fc", "type": "linear", "out_features": 2, "inputs": "x"}]}',
                         "/layers/0"),
    "field-text.json": ('{"layers": [{"name": "flat", "type": "flatten"}, '
                        '{"name": "fc", "type": "linear", "out_features": "2"}]}', "/layers/1"),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_model_json_names_the_file_and_where(tmp_path, patches, name):
    text, where = MALFORMED[name]
    model = tmp_path / name
    model.write_text(text)
    for flags in ([], ["--dry-run"]):
        result = tessera("train", "--data", patches, "--model", model, "--epochs", 1, "--batch", 8, *flags)
        expect(result, 5, str(model), where)
        assert "[json.exception" not in result.stderr.splitlines()[-1][:20], result.stderr


@pytest.mark.parametrize("layers", [[], [{"name": "flat", "type": "flatten"}]], ids=["no-layers", "no-parameters"])
def test_models_with_nothing_to_train_are_bad_input_not_a_crash(tmp_path, patches, layers):
    model = tmp_path / "model.json"
    model.write_text(json.dumps({"layers": layers}))
    for flags in ([], ["--dry-run"]):
        result = tessera("train", "--data", patches, "--model", model, "--epochs", 1, "--batch", 8, *flags)
        expect(result, 5, str(model))
        assert "layers" in result.stderr or "no parameters" in result.stderr, result.stderr


def bag(path, make):
    with h5py.File(path, "w") as f:
        make(f)


FEATURE_FILES = {
    "group": (lambda f: f.create_group("features").create_dataset("x", data=np.zeros((2, 4), np.float32)),
              "not a dataset"),
    "declares": (lambda f: f.create_dataset("features", shape=(10 ** 12, 4), maxshape=(None, 4), chunks=(1, 4),
                                            dtype=np.float32), "declares"),
    "strings": (lambda f: f.create_dataset("features", data=np.array([b"a", b"b"])), "does not hold numbers"),
}


@pytest.mark.parametrize("kind", sorted(FEATURE_FILES))
def test_broken_feature_files_name_the_file_and_the_fault(tmp_path, kind):
    make, words = FEATURE_FILES[kind]
    features = tmp_path / "features"
    features.mkdir()
    for slide in ("a", "b"):
        bag(features / f"{slide}.h5", lambda f: f.create_dataset("features", data=np.ones((3, 4), np.float32)))
    bag(features / "c.h5", make)
    labels = tmp_path / "labels.csv"
    labels.write_text("slide,label\na,0\nb,1\nc,1\n")
    result = tessera("train", "--features", features, "--labels", labels, "--epochs", 1, "--val-fraction", 0)
    expect(result, 5, str(features / "c.h5"), words)
    assert "bad_alloc" not in result.stderr and "map::at" not in result.stderr, result.stderr


@pytest.mark.parametrize("limit", ["0", "0GiB", "99999999999999999999GiB"])
def test_impossible_memory_limits_are_usage_errors(patches, limit):
    expect(tessera("train", "--data", patches, "--batch", 8, "--dry-run", "--device-memory-limit", limit), 2,
           "--device-memory-limit")


def test_a_limit_above_the_device_is_said_and_not_trusted(patches):
    result = tessera("train", "--data", patches, "--batch", 8, "--dry-run", "--device-memory-limit", "64TiB")
    expect(result, 0, "--device-memory-limit", "more than")
    plan = json.loads(result.stdout.splitlines()[0])
    assert plan["budget_bytes"] < 64 << 40, plan
    assert plan["fits"] == (plan["device_bytes"] <= plan["budget_bytes"]), plan

"""Bad weights, model descriptions and JSON inputs (issue 34): every one is exit 5 naming the file
and the field, never a signal, with a peak resident size under 1 GiB (getrusage of the child: an
upper bound, see test_fuzz_slides.py) and nothing left under the output.

- JSON nested 100000 levels deep (a SIGSEGV before: every recursive walk of the parsed value) as
  a safetensors header (forward), a ViT description (extract --encoder, also --dry-run), a model
  description (train --model, also --dry-run), a checkpoint's `model` attribute (forward), a
  GeoJSON labels file (tile --labels) and a tile store's slide entry (extract --tiles): refused
  at 64 levels, naming the file; error messages quote 80 bytes of the input at most.
- safetensors: a header length over 64 MiB (a sparse file of 100 MB) and past the file; a 63 MiB
  header of 22 million empty objects (2.2 GB before, refused at 2^20 values now); a tensor
  named twice (nlohmann kept the last); NaN or Inf in F32, F16 and BF16 weights, naming the
  tensor and the first bad index as numpy finds it; data_offsets past the file, a byte count
  that does not match the shape, a shape whose product passes 2^64. A checkpoint holding a NaN
  weight, named by dataset and index.
- Descriptions: a ViT of depth 100000 (also under --dry-run), absurd width, heads, mlp ratio,
  patch size, image size, tokens, registers; a normalisation std of 1e-300 (all-NaN features
  before), a mean too large for a float, microns per pixel of 1e6; a graph of 100000 layers;
  a conv2d of 70000 channels before a batch norm: `train --dry-run` planned it and the run then
  dispatched 70000 workgroups, past Vulkan's guaranteed 65535 (a validation error, undefined on
  a GPU); now refused naming out_channels. Likewise a linear layer of 4198400 input features
  (65600 workgroups for its input gradient). A padding that makes an output of 2^55 values.
"""
import json
import os
import shutil
import struct

import h5py
import numpy as np
import pytest

from data_tools import patch_task, run, run_with_usage, within_memory, workdir

TESSERA = os.environ.get("TESSERA_BINARY", "build/tools/tessera")
SLIDES = os.path.normpath(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared",
                                       "testdata", "slides"))
BOXES = os.path.join(SLIDES, "boxes.tiff")
CMU = os.path.join(SLIDES, "CMU-1-Small-Region.svs")  # 0.499 um/px: read at VIT's 0.5
GiB = 1 << 30
TIME_LIMIT = 300
DEEP = 100000

# A ViT small enough to run in a second: 32-pixel images in 16-pixel patches, 4 tokens and a class token.
VIT = {"family": "vit", "image_size": 32, "patch_size": 16, "width": 16, "depth": 1, "heads": 2,
       "preprocessing": {"microns_per_pixel": 0.5}}


def vit_tensors(seed=0):
    """timm's names and shapes for VIT, random values."""
    rng = np.random.default_rng(seed)
    width, hidden, tokens = 16, 64, 5
    shapes = {"cls_token": [1, 1, width], "pos_embed": [1, tokens, width],
              "patch_embed.proj.weight": [width, 3, 16, 16], "patch_embed.proj.bias": [width],
              "blocks.0.norm1.weight": [width], "blocks.0.norm1.bias": [width],
              "blocks.0.attn.qkv.weight": [3 * width, width], "blocks.0.attn.qkv.bias": [3 * width],
              "blocks.0.attn.proj.weight": [width, width], "blocks.0.attn.proj.bias": [width],
              "blocks.0.norm2.weight": [width], "blocks.0.norm2.bias": [width],
              "blocks.0.mlp.fc1.weight": [hidden, width], "blocks.0.mlp.fc1.bias": [hidden],
              "blocks.0.mlp.fc2.weight": [width, hidden], "blocks.0.mlp.fc2.bias": [width],
              "norm.weight": [width], "norm.bias": [width]}
    return {name: (rng.standard_normal(shape) * 0.1).astype(np.float32) for name, shape in shapes.items()}


def tensor_bytes(value, dtype):
    if dtype == "F32":
        return value.astype("<f4").tobytes()
    if dtype == "F16":
        return value.astype("<f2").tobytes()
    return (value.astype("<f4").view("<u4") >> 16).astype("<u2").tobytes()  # BF16: float32's upper halves


def safetensors_bytes(tensors, dtypes=None, header_edit=None):
    """The format by hand: u64 header length, JSON header, data. `header_edit(text)` changes the
    header's text before its length is taken."""
    dtypes = dtypes or {}
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, value in tensors.items():
        dtype = dtypes.get(name, "F32")
        raw = tensor_bytes(value, dtype)
        header[name] = {"dtype": dtype, "shape": list(value.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header)
    if header_edit:
        text = header_edit(text)
    encoded = text.encode()
    return struct.pack("<Q", len(encoded)) + encoded + b"".join(blobs)


def write(path, content):
    with open(path, "wb" if isinstance(content, bytes) else "w") as f:
        f.write(content)
    return path


def tessera(*args):
    code, out, err, peak, _, killed = run_with_usage([TESSERA, *args], timeout=TIME_LIMIT)
    return code, out, err, peak, killed


def assert_refused(result, code, needles, output=None):
    exit_code, _, err, peak, killed = result
    assert not killed, f"still running after {TIME_LIMIT} s"
    assert exit_code == code, f"exit {exit_code}, wanted {code}: {err[-2000:]}"
    for needle in needles:
        assert needle in err, f"{needle!r} not in: {err[-2000:]}"
    assert within_memory(peak, GiB), f"peak {peak / GiB:.2f} GiB"
    # Each error line quotes at most a short excerpt of the input.
    assert max(len(line) for line in err.splitlines()) < 2000, err[:3000]
    if output:
        assert not os.path.exists(output) or not os.listdir(output), os.listdir(output)


@pytest.fixture(scope="module")
def work():
    path = workdir("test_bad_models")
    yield path
    shutil.rmtree(path)


@pytest.fixture(scope="module")
def vit(work):
    """(description, valid weights, input images) of VIT."""
    description = write(os.path.join(work, "vit.json"), json.dumps(VIT))
    weights = write(os.path.join(work, "vit.safetensors"), safetensors_bytes(vit_tensors()))
    images = os.path.join(work, "images.h5")
    with h5py.File(images, "w") as f:
        f["x"] = np.random.default_rng(1).standard_normal((2, 3, 32, 32)).astype(np.float32)
    return description, weights, images


def forward_vit(work, description, weights, images):
    output = os.path.join(work, "features.h5")
    result = tessera("forward", "--encoder", description, "--model", weights, "--input", images, "--output", output)
    assert not os.path.exists(output) or result[0] == 0, "a refused run left its output"
    if os.path.exists(output):
        os.remove(output)
    return result


def test_the_valid_vit_runs(work, vit):
    """The control: the same ViT and weights run, and their features are finite."""
    description, weights, images = vit
    output = os.path.join(work, "control.h5")
    run(TESSERA, "forward", "--encoder", description, "--model", weights, "--input", images, "--output", output)
    with h5py.File(output, "r") as f:
        features = f["logits"][...]
    assert features.shape == (2, 16) and np.isfinite(features).all()
    os.remove(output)


def nested_in(value):
    """`value` as JSON text with "@" replaced by an array nested DEEP levels: inside an object,
    where a copy, a comparison or a message's dump of the value recursed once per level."""
    return json.dumps(value).replace('"@"', "[" * DEEP + "]" * DEEP)


def test_deeply_nested_json_is_refused_wherever_it_enters(work, vit):
    description, _, images = vit
    nested = "JSON refused: nested deeper than 64 levels"
    # A safetensors header.
    header = nested_in({"cls_token": {"dtype": "F32", "shape": "@", "data_offsets": [0, 64]}}).encode()
    weights = write(os.path.join(work, "deep.safetensors"), struct.pack("<Q", len(header)) + header + bytes(64))
    assert_refused(forward_vit(work, description, weights, images), 5, [weights, nested])
    # A ViT description, for extract (a plan, and a run).
    deep_vit = write(os.path.join(work, "deep-vit.json"), nested_in({**VIT, "width": "@"}))
    out = os.path.join(work, "features")
    for dry in (["--dry-run"], []):
        assert_refused(tessera("extract", "--encoder", deep_vit, "--random-weights", "--slides", CMU, "--out", out,
                               *dry), 5, [deep_vit, nested], out)
    # A model description for train, and a checkpoint's model attribute.
    model = nested_in({"name": "deep", "layers": [{"name": "fc", "type": "linear", "out_features": "@"}]})
    deep_model = write(os.path.join(work, "deep-model.json"), model)
    patches = patch_task(os.path.join(work, "patches.h5"), 64, 16)
    checkpoint = os.path.join(work, "trained.h5")
    for dry in (["--dry-run"], []):
        assert_refused(tessera("train", "--data", patches, "--model", deep_model, "--batch", 4,
                               "--checkpoint", checkpoint, *dry), 5, [deep_model, nested])
        assert not os.path.exists(checkpoint)
    deep_checkpoint = os.path.join(work, "deep-checkpoint.h5")
    with h5py.File(deep_checkpoint, "w") as f:
        f.attrs["model"] = model
        f["params/fc.weight"] = np.zeros((2, 3 * 32 * 32), np.float32)
    output = os.path.join(work, "logits.h5")
    assert_refused(tessera("forward", "--model", deep_checkpoint, "--input", images, "--output", output), 5,
                   [deep_checkpoint, "attribute 'model'", nested])
    assert not os.path.exists(output)
    # GeoJSON labels: no store is made.
    # GeoJSON labels, as GeometryCollections in GeometryCollections (read by recursion before):
    # no store is made.
    collections = DEEP // 2
    labels = write(os.path.join(work, "deep.geojson"), '{"type": "GeometryCollection", "geometries": [' * collections +
                   '{"type": "Point", "coordinates": [0, 0]}' + "]}" * collections)
    store = os.path.join(work, "labelled.lmdb")
    assert_refused(tessera("tile", BOXES, "--out", store, "--size", 64, "--labels", labels), 5, [labels, nested])
    assert not os.path.exists(store)


def test_a_deeply_nested_slide_entry_is_refused(work):
    lmdb = pytest.importorskip("lmdb")
    store = os.path.join(work, "boxes.lmdb")
    run(TESSERA, "tile", BOXES, "--out", store, "--size", 64, "--min-tissue", 0)
    env = lmdb.open(store, max_dbs=2)
    with env.begin(write=True) as txn:
        slides = env.open_db(b"slides", txn=txn, create=False)
        entry = json.loads(txn.get(struct.pack(">I", 0), db=slides))
        txn.put(struct.pack(">I", 0), nested_in({**entry, "settings": "@"}).encode(), db=slides)
    env.close()
    out = os.path.join(work, "store-features")
    assert_refused(tessera("extract", "--model", "small-cnn", "--layer", "fc1", "--random-weights", "--tiles", store,
                           "--out", out), 5,
                   [store, "slide 0: slide entry: JSON refused: nested deeper than 64 levels"], out)


def test_safetensors_headers_that_lie_are_refused(work, vit):
    description, _, images = vit
    tensors = vit_tensors()
    valid = safetensors_bytes(tensors)
    cases = {}
    # A 100 MB header, said and held (a sparse file: nothing is written), and one said past the file.
    sparse = os.path.join(work, "huge-header.safetensors")
    with open(sparse, "wb") as f:
        f.write(struct.pack("<Q", 100_000_000) + b"{")
        f.truncate(8 + 100_000_000)
    cases[sparse] = ["a header of 100000000 bytes (at most 67108864)"]
    cases[write(os.path.join(work, "past-end.safetensors"), struct.pack("<Q", 5_000_000) + valid[8:])] = [
        "the header is said to hold 5000000 bytes, but the file has"]
    # 63 MiB of empty objects, within the size: 2.2 GB and 5 s to parse before; now refused at the
    # 2^20th value.
    objects = os.path.join(work, "objects.safetensors")
    count = (63 << 20) // 3
    with open(objects, "wb") as f:
        f.write(struct.pack("<Q", 1 + 3 * count) + b"[")
        for _ in range(count // 65536):
            f.write(b"{}," * 65536)
        f.write(b"{}," * (count % 65536 - 1) + b"{}]")
    cases[objects] = ["the header: JSON refused: more than 1048576 values"]
    # A tensor named twice: the first one would have been lost.
    twice = write(os.path.join(work, "twice.safetensors"), safetensors_bytes(
        tensors, header_edit=lambda text: text.replace(
            '"norm.bias": ', '"norm.weight": {"dtype": "F32", "shape": [16], "data_offsets": [0, 64]}, "norm.bias": ')))
    cases[twice] = ['the key "norm.weight" is given twice in one object']
    # Offsets past the data, a byte count that is not the shape's, a shape past 2^64 values.
    past = write(os.path.join(work, "offsets.safetensors"), safetensors_bytes(
        tensors, header_edit=lambda text: text.replace('"data_offsets": [0, 64]', '"data_offsets": [0, 999999999]', 1)))
    cases[past] = ["tensor 'cls_token' lies at bytes [0, 999999999) of data"]
    short = write(os.path.join(work, "count.safetensors"), safetensors_bytes(
        tensors, header_edit=lambda text: text.replace('"shape": [1, 1, 16]', '"shape": [1, 2, 16]', 1)))
    cases[short] = ["tensor 'cls_token' holds 64 bytes, but 32 F32 values of shape [1,2,16] take 128"]
    overflow = write(os.path.join(work, "overflow.safetensors"), safetensors_bytes(
        tensors, header_edit=lambda text: text.replace('"shape": [1, 1, 16]', f'"shape": [{1 << 62}, 4, 4]', 1)))
    cases[overflow] = ["tensor 'cls_token' has shape", "more than 2^64 values"]
    for path, needles in cases.items():
        assert_refused(forward_vit(work, description, path, images), 5, [path, *needles])


@pytest.mark.parametrize("dtype", ["F32", "F16", "BF16"])
def test_non_finite_weights_are_refused_naming_tensor_and_index(work, vit, dtype):
    description, _, images = vit
    tensors = vit_tensors()
    bad = {"F32": ("blocks.0.attn.qkv.weight", 7, np.nan), "F16": ("patch_embed.proj.bias", 3, np.inf),
           "BF16": ("norm.weight", 5, -np.inf)}[dtype]
    name, index, value = bad
    tensors[name].reshape(-1)[index] = value
    # Where numpy finds the first non-finite value, as tessera reads the file (the dtype's rounding).
    stored = {"F32": np.float32, "F16": np.float16, "BF16": np.float32}[dtype]
    first = int(np.flatnonzero(~np.isfinite(tensors[name].astype(stored)))[0])
    assert first == index
    path = write(os.path.join(work, f"nonfinite-{dtype}.safetensors"),
                 safetensors_bytes(tensors, dtypes={name: dtype for name in tensors}))
    shown = "NaN" if np.isnan(value) else "+Inf" if value > 0 else "-Inf"
    assert_refused(forward_vit(work, description, path, images), 5,
                   [path, f"tensor '{name}' ({dtype}) holds {shown} at index {first} (of {tensors[name].size}"])


def test_a_checkpoint_with_a_nan_weight_is_refused(work, vit):
    _, _, images = vit
    checkpoint = os.path.join(work, "nan-checkpoint.h5")
    model = {"name": "linear", "layers": [{"name": "flatten", "type": "flatten"},
                                          {"name": "fc", "type": "linear", "out_features": 2}]}
    weight = np.random.default_rng(2).standard_normal((2, 3 * 32 * 32)).astype(np.float32)
    weight[1, 17] = np.nan
    with h5py.File(checkpoint, "w") as f:
        f.attrs["model"] = json.dumps(model)
        f["params/fc.weight"] = weight
        f["params/fc.bias"] = np.zeros(2, np.float32)
    output = os.path.join(work, "nan-logits.h5")
    first = int(np.flatnonzero(np.isnan(weight))[0])
    assert_refused(tessera("forward", "--model", checkpoint, "--input", images, "--output", output), 5,
                   [f"{checkpoint}: dataset params/fc.weight holds NaN at index {first} (of 6144"])
    assert not os.path.exists(output)


# (field overrides of VIT, what the message names)
ABSURD_VITS = {
    "depth": ({"depth": 100000}, "field 'depth' must be an integer from 1 to 256, got 100000"),
    "width": ({"width": 1 << 20, "heads": 1}, "field 'width' must be an integer from 1 to 16384"),
    "heads": ({"heads": 17}, "field 'heads' must be an integer from 1 to 16, got 17"),
    "mlp_ratio": ({"mlp_ratio": 1e300}, "field 'mlp_ratio' must be above 0 and at most 16"),
    "patch_size": ({"patch_size": 64}, "field 'patch_size' must be at most image_size 32"),
    "image_size": ({"image_size": 1 << 40}, "field 'image_size' must be an integer from 1 to 65535"),
    "tokens": ({"image_size": 8192, "patch_size": 16}, "field 'image_size' gives 262145 tokens"),
    "registers": ({"register_tokens": 65535}, "field 'register_tokens' gives 65540 tokens"),
    "norm_eps": ({"norm_eps": -1}, "field 'norm_eps' must be above 0 and at most 1"),
    "std": ({"preprocessing": {"std": [1e-300, 0.2, 0.2]}}, "field 'std' must hold numbers from 0.001 to 1000"),
    "mean": ({"preprocessing": {"mean": [1e300, 0.5, 0.5]}}, "field 'mean' must hold numbers from -1000 to 1000"),
    "microns_per_pixel": ({"preprocessing": {"microns_per_pixel": 1e6}},
                          "field 'microns_per_pixel' must be above 0 and at most 100"),
}


@pytest.mark.parametrize("case", sorted(ABSURD_VITS))
def test_absurd_vit_descriptions_are_refused_before_any_plan(work, case):
    overrides, message = ABSURD_VITS[case]
    path = write(os.path.join(work, f"absurd-{case}.json"), json.dumps({**VIT, **overrides}))
    out = os.path.join(work, f"absurd-{case}")
    for dry in (["--dry-run"], []):
        assert_refused(tessera("extract", "--encoder", path, "--random-weights", "--slides", CMU, "--out", out, *dry),
                       5, [path, message], out)


def test_absurd_graphs_are_refused_before_any_plan(work):
    patches = patch_task(os.path.join(work, "graph-patches.h5"), 64, 16)
    layers = [{"name": f"relu{i}", "type": "relu"} for i in range(100000)]
    many = write(os.path.join(work, "many-layers.json"), json.dumps({"name": "many", "layers": layers}))
    # 70000 channels at 1x1 (a 16-pixel stride): a plan of 82 MB that fits, but Vulkan guarantees
    # 65535 workgroups a dispatch dimension, and batch norm takes one a channel.
    wide = write(os.path.join(work, "wide.json"), json.dumps({"name": "wide", "layers": [
        {"name": "conv1", "type": "conv2d", "out_channels": 70000, "kernel": 1, "stride": 16},
        {"name": "bn1", "type": "batch_norm2d"}, {"name": "pool", "type": "global_avg_pool"},
        {"name": "flatten", "type": "flatten"}, {"name": "fc", "type": "linear", "out_features": 2}]}))
    # 4198400 features into a linear layer: its input gradient's 4198400 rows were 65600
    # workgroups on lavapipe (a plan of 338 MB that fit, then a validation error).
    flat = write(os.path.join(work, "flat.json"), json.dumps({"name": "flat", "layers": [
        {"name": "conv1", "type": "conv2d", "out_channels": 16400, "kernel": 1},
        {"name": "flatten", "type": "flatten"}, {"name": "fc", "type": "linear", "out_features": 2}]}))
    width = write(os.path.join(work, "wide-preset.json"), json.dumps({"preset": "small-cnn", "width": 1 << 33}))
    # Every field within its bound, but a padding that makes an output of 3.6e16 values (a plan
    # of 2^58 bytes before: a wider one wrapped past 2^64).
    padded = write(os.path.join(work, "padded.json"), json.dumps({"name": "padded", "layers": [
        {"name": "conv1", "type": "conv2d", "out_channels": 65535, "kernel": 1, "padding": 65535},
        {"name": "pool", "type": "global_avg_pool"}, {"name": "flatten", "type": "flatten"},
        {"name": "fc", "type": "linear", "out_features": 2}]}))
    cases = {many: "/layers: holds 100000 layers (at most 4096)",
             wide: "layer 'conv1': field 'out_channels' must be an integer from 1 to 65535, got 70000",
             width: "field 'width' must be an integer from 1 to 16383, got 8589934592",
             padded: "layer 'conv1': conv2d's output [4,65535,131086,131086] holds more than 2^40 values",
             flat: "layer 'fc' (linear) cannot take the output of 'flatten' [4,4198400]: linear: 4198400 input "
                   "features (at most 1048576)"}
    checkpoint = os.path.join(work, "graph.h5")
    for path, message in cases.items():
        for dry in (["--dry-run"], []):
            assert_refused(tessera("train", "--data", patches, "--model", path, "--batch", 4, "--checkpoint", checkpoint,
                                   *dry), 5, [path, message])
            assert not os.path.exists(checkpoint)

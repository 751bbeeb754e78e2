"""Fuzzing what describes a model (fixed seeds, as tests/test_fuzz_slides.py does for slides):
safetensors weights of a small ViT (its header's JSON changed value by value, keys given twice,
nesting, the header length set to boundary values, data bytes changed, files cut short; run by
`forward --encoder`), ViT descriptions (run by `forward --model ... --random-weights`) and a CNN
graph (batch norm, residual add, pooling; trained one epoch by `train`, forward and backward),
their JSON changed the same way and byte by byte. Each run exits 0, 2, 3 (a plan past the
device) or 5, never by a signal or at the time limit, with no Vulkan validation message (a
dispatch past the device's limits, a buffer past its range: what a plan must refuse first), a peak
resident size under 1 GiB and every error line under 2000 characters; exit 5 names the file; a
refused run leaves no output."""
import copy
import json
import os
import random
import shutil
import struct

import h5py
import numpy as np

from data_tools import patch_task, run_with_usage, within_memory, workdir
from test_bad_models import VIT, safetensors_bytes, vit_tensors

TESSERA = os.environ.get("TESSERA_BINARY", "build/tools/tessera")
GiB = 1 << 30
MUTANTS, CUTS = 40, 4  # per corpus: 3 corpora, 132 runs
TIME_LIMIT = 300
NUMBERS = [0, 1, -1, 2, 3, 15, 16, 17, 255, 256, 65535, 65536, 2 ** 31 - 1, 2 ** 31, 2 ** 32, 2 ** 53, 2 ** 63 - 1,
           2 ** 63, 2 ** 64 - 1, 2 ** 64, 10 ** 30, 0.5, -0.0, 1e-300, 1e300, float("nan"), float("inf")]
VALUES = NUMBERS + [None, True, False, "", "x" * 1000, "\u00e9", [], {}, [1, 2, 3], {"a": 1}]
DEPTHS = [63, 64, 65, 100000]
NEST = "\u0000nest\u0000"  # a marker json.dumps writes as "\u0000nest\u0000", replaced by nesting

GRAPH = {"name": "graph", "layers": [
    {"name": "conv1", "type": "conv2d", "inputs": ["input"], "out_channels": 8, "kernel": 3, "padding": 1,
     "bias": False},
    {"name": "bn1", "type": "batch_norm2d"},
    {"name": "relu1", "type": "relu"},
    {"name": "conv2", "type": "conv2d", "out_channels": 8, "kernel": 3, "padding": 1, "stride": 1},
    {"name": "add", "type": "add", "inputs": ["conv2", "relu1"]},
    {"name": "pool", "type": "max_pool2d", "kernel_size": 2},
    {"name": "gap", "type": "global_avg_pool"},
    {"name": "flatten", "type": "flatten"},
    {"name": "fc", "type": "linear", "out_features": 2}]}


def paths(value, prefix=()):
    """Every place in a JSON value, as a tuple of keys and indices."""
    yield prefix
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        yield from paths(item, prefix + (key,))


def value_at(document, place):
    for key in place:
        document = document[key]
    return document


def is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def mutate_value(document, generator):
    """A copy of `document` with one to three values changed: a number to a neighbour, a multiple
    or a boundary value (most often, so that many runs get past the checks to a plan and a run),
    or any value replaced, removed, added or nested (the NEST marker, made deep in the text)."""
    document = copy.deepcopy(document)
    for _ in range(generator.choice([1, 1, 2, 3])):
        places = [place for place in paths(document) if place]
        if not places:
            break
        numbers = [place for place in places if is_number(value_at(document, place))]
        place = generator.choice(numbers if numbers and generator.random() < 0.5 else places)
        parent = value_at(document, place[:-1])
        key, kind = place[-1], generator.random()
        value = parent[key]
        if is_number(value) and kind < 0.7:
            parent[key] = generator.choice([value + 1, value - 1, value * 2, value // 2 if isinstance(value, int)
                                            else value / 2, value * generator.choice([16, 1000, 10 ** 6]),
                                            generator.randrange(65), generator.choice(NUMBERS)])
        elif kind < 0.8:
            parent[key] = generator.choice(VALUES)
        elif kind < 0.87:
            del parent[key]
        elif kind < 0.94:
            parent[key] = NEST
        elif isinstance(parent, dict):
            parent[generator.choice(["dilation", "groups", "extra", key + "_"])] = generator.choice(VALUES)
    return document


def json_text(document, generator):
    depth = generator.choice(DEPTHS)
    return json.dumps(document).replace(json.dumps(NEST), "[" * depth + "]" * depth)


def mutate_text(text, generator):
    """Byte-level damage to JSON text: a key given twice, bytes changed, a cut."""
    data = bytearray(text.encode())
    kind = generator.random()
    if kind < 0.4:
        keys = [i for i in range(len(text)) if text.startswith('": ', i)]
        if keys:
            end = generator.choice(keys)
            start = text.rfind('"', 0, end)
            if start > 0 and text[start - 1] in "{ ":
                key = text[start:end + 1]
                return (text[:start] + key + ': 1, ' + text[start:]).encode()
    if kind < 0.8:
        for _ in range(generator.randint(1, 4)):
            data[generator.randrange(len(data))] = generator.choice([0, 0x22, 0x5B, 0x7B, 0x7D, 0x80, 0xFF,
                                                                     generator.randrange(256)])
        return bytes(data)
    return bytes(data[:generator.randrange(len(data))])


def json_cases(document, generator):
    cases = []
    for _ in range(MUTANTS):
        text = json_text(mutate_value(document, generator), generator)
        cases.append(mutate_text(text, generator) if generator.random() < 0.2 else text.encode())
    clean = json.dumps(document).encode()
    cases += [clean[:generator.randrange(1, len(clean))] for _ in range(CUTS)]
    return cases


def safetensors_cases(tensors, generator):
    clean = safetensors_bytes(tensors)
    header_length = struct.unpack("<Q", clean[:8])[0]
    header = json.loads(clean[8:8 + header_length])
    data = clean[8 + header_length:]
    cases = []
    for _ in range(MUTANTS):
        kind = generator.random()
        if kind < 0.5:  # the header's JSON
            text = json_text(mutate_value(header, generator), generator)
            raw = mutate_text(text, generator) if generator.random() < 0.3 else text.encode()
            cases.append(struct.pack("<Q", len(raw)) + raw + data)
        elif kind < 0.65:  # its length
            length = generator.choice([0, 1, 2, header_length - 1, header_length + 1, 64 << 20, (64 << 20) + 1,
                                       2 ** 31, 2 ** 32, 2 ** 63, 2 ** 64 - 1])
            cases.append(struct.pack("<Q", length) + clean[8:])
        else:  # the values: a NaN, an infinity, any bytes
            damaged = bytearray(data)
            for _ in range(generator.randint(1, 3)):
                at = generator.randrange(0, len(damaged) - 4, 4)
                damaged[at:at + 4] = generator.choice([struct.pack("<f", float("nan")), struct.pack("<f", float("inf")),
                                                       struct.pack("<f", 3e38), bytes(generator.randrange(256)
                                                                                      for _ in range(4))])
            cases.append(clean[:8 + header_length] + bytes(damaged))
    cases += [clean[:generator.randrange(1, len(clean))] for _ in range(CUTS)]
    return cases


def check(name, path, output, result):
    code, _, err, peak, _, killed = result
    last = err.strip().splitlines()[-1] if err.strip() else ""
    if killed:
        return f"still running after {TIME_LIMIT} s"
    if code not in (0, 2, 3, 5):
        return f"exit {code}: {last[:300]}"
    if "vulkan validation" in err:
        return "a validation message: " + next(line for line in err.splitlines() if "vulkan validation" in line)[:300]
    if not within_memory(peak, GiB):
        return f"peak {peak / GiB:.2f} GiB"
    if err and max(len(line) for line in err.splitlines()) >= 2000:
        return "an error line of 2000 characters or more"
    if code == 5 and os.path.basename(path) not in err:
        return f"exit 5 without naming the file: {last[:300]}"
    if code != 0 and output and os.path.exists(output):
        return "a refused run left its output"
    return None


def test_fuzz_models():
    work = workdir("test_fuzz_models")
    images = os.path.join(work, "images.h5")
    with h5py.File(images, "w") as f:
        f["x"] = np.random.default_rng(1).standard_normal((2, 3, 32, 32)).astype(np.float32)
    patches = patch_task(os.path.join(work, "patches.h5"), 16, 16)
    vit = os.path.join(work, "vit.json")
    with open(vit, "w") as f:
        json.dump(VIT, f)
    output = os.path.join(work, "out.h5")

    def forward_weights(path):
        return [TESSERA, "forward", "--encoder", vit, "--model", path, "--input", images, "--output", output]

    def forward_vit(path):
        return [TESSERA, "forward", "--model", path, "--random-weights", "--input", images, "--output", output]

    def train(path):
        return [TESSERA, "train", "--data", patches, "--model", path, "--epochs", 1, "--batch", 8,
                "--val-fraction", 0]

    corpora = {
        "weights.safetensors": (safetensors_cases(vit_tensors(), random.Random(0)), forward_weights, output),
        "vit.json": (json_cases(VIT, random.Random(1)), forward_vit, output),
        "graph.json": (json_cases(GRAPH, random.Random(2)), train, None),
    }
    failures, runs, exits, worst_peak = [], 0, {}, 0
    for name, (cases, command, produced) in corpora.items():
        clean = os.path.join(work, "clean-" + name)
        with open(clean, "wb") as f:
            f.write(safetensors_bytes(vit_tensors()) if name.endswith(".safetensors") else
                    json.dumps(VIT if name == "vit.json" else GRAPH).encode())
        result = run_with_usage(command(clean), timeout=TIME_LIMIT)
        assert result[0] == 0, (name, result[2][-2000:])
        if produced:
            os.remove(produced)
        for index, content in enumerate(cases):
            path = os.path.join(work, f"{index}-{name}")
            with open(path, "wb") as f:
                f.write(content)
            result = run_with_usage(command(path), timeout=TIME_LIMIT)
            runs += 1
            exits[result[0]] = exits.get(result[0], 0) + 1
            worst_peak = max(worst_peak, result[3])
            problem = check(name, path, produced, result)
            if problem:
                kept = os.path.join(work, "failed")
                os.makedirs(kept, exist_ok=True)
                shutil.copy(path, kept)
                failures.append(f"{name} {index} ({os.path.join(kept, os.path.basename(path))}): {problem}")
            if produced and os.path.exists(produced):
                os.remove(produced)
            os.remove(path)
    print(f"{runs} damaged model files: exits {exits}, largest peak {worst_peak / (1 << 20):.0f} MiB")
    assert not failures, "\n".join(failures)
    assert runs >= 120
    shutil.rmtree(work)

"""Sharded slide work for job arrays, with the real binary: `tile --shard K/N` over synthetic
slides into N stores (each task given the slides in another order) puts every slide in exactly
one store, with the same tiles as one `tile` run over all slides; training on the N stores (a
list in any order, or their directory) gives the same losses and bit-identical weights as
training on the one store; `extract --shard` over a store writes only that shard's feature
files (read back with h5py); impossible --shard flags, a store given twice and a slide in two
stores are refused with exit 2; a task left without slides writes an empty store and no files. Stores are read with python3-lmdb (data_tools.read_store)."""
import json
import os
import shutil
import sys

import h5py
import numpy as np

from data_tools import read_store, run, summary, synth, workdir

TESSERA = os.environ.get("TESSERA_BINARY", "build/tools/tessera")
SLIDES, SHARDS, TILE = 5, 3, 32
TRAIN = ["--model", "small-cnn", "--width", 4, "--epochs", 1, "--batch", 16, "--seed", 7, "--val-fraction", 0.3,
         "--optimizer", "adam", "--lr", 0.01]


def vulkan(*args, check=True):
    """A command that creates a Vulkan device, under the validation layer."""
    result = run(TESSERA, *args, check=check, env=dict(os.environ, TESSERA_VALIDATION="1"))
    assert "vulkan validation" not in result.stderr.lower(), result.stderr
    return result


def trained(work, name, *data):
    """(epoch events, checkpoint datasets) of one training run on `data`."""
    checkpoint = os.path.join(work, name + ".h5")
    result = vulkan("train", "--data", *data, *TRAIN, "--checkpoint", checkpoint)
    epochs = [json.loads(line) for line in result.stderr.splitlines() if '"event":"epoch"' in line]
    assert len(epochs) == 1, result.stderr
    datasets = {}
    with h5py.File(checkpoint, "r") as f:
        f.visititems(lambda key, item: datasets.__setitem__(key, item[()]) if isinstance(item, h5py.Dataset) else None)
    assert any(key.startswith("params/") for key in datasets), sorted(datasets)
    return {key: epochs[0][key] for key in ("train_loss", "val_loss", "train_accuracy", "val_accuracy")}, datasets


def tiles_by_slide(store):
    """slide fingerprint -> (slide path, {(level, row, column): value bytes})."""
    tiles, slides = read_store(store)
    result = {entry["fingerprint"]: (entry["path"], {}) for entry in slides.values()}
    for (slide, level, row, column), value in tiles.items():
        result[slides[slide]["fingerprint"]][1][(level, row, column)] = value
    return result


def expect_refused(args, *words):
    result = run(TESSERA, *args, check=False)
    assert result.returncode == 2, (args, result.returncode, result.stderr)
    for word in words:
        assert word in result.stderr, (args, word, result.stderr)


def main():
    work = workdir("test_shards")
    try:
        slides, labels = [], []
        for index in range(SLIDES):
            path = os.path.join(work, f"slide{index}.tiff")
            synth(TESSERA, path, 512, 512, 20 + index)
            slides.append(path)
            labels.append(os.path.join(work, f"slide{index}.geojson"))
        label_of = dict(zip(slides, labels))

        def tile(order, out, *flags):
            given = [slides[i] for i in order]
            return summary(run(TESSERA, "tile", *given, "--labels", *(label_of[s] for s in given), "--out", out,
                               "--size", TILE, "--unannotated", "Normal", "--allow-empty-labels", "--workers", 2,
                               *flags))

        whole = os.path.join(work, "all.lmdb")
        tile([3, 0, 4, 1, 2], whole)
        reordered = os.path.join(work, "reordered.lmdb")
        tile([1, 4, 2, 0, 3], reordered)
        shard_dir = os.path.join(work, "shards")
        os.mkdir(shard_dir)
        orders = [[4, 3, 2, 1, 0], [0, 1, 2, 3, 4], [2, 0, 4, 3, 1]]  # each task's shell gives another order
        shards = []
        for k in range(SHARDS):
            shards.append(os.path.join(shard_dir, f"part{k}.lmdb"))
            done = tile(orders[k], shards[k], "--shard", f"{k}/{SHARDS}")
            assert done["shard"] == {"index": k, "count": SHARDS, "slides": len(done["slides"]), "of": SLIDES}, done

        # Every slide in exactly one shard, by the documented rule (sorted paths, i-th to i mod N),
        # with the same tiles as the one-store run.
        reference = tiles_by_slide(whole)
        assert len(reference) == SLIDES and all(tiles for _, tiles in reference.values()), reference.keys()
        seen = {}
        for k, store in enumerate(shards):
            for fingerprint, (path, tiles) in tiles_by_slide(store).items():
                assert fingerprint not in seen, (fingerprint, seen.get(fingerprint), k)
                seen[fingerprint] = k
                assert sorted(slides).index(path) % SHARDS == k, (path, k)
                assert tiles == reference[fingerprint][1], path
        assert set(seen) == set(reference), (seen, reference.keys())
        assert sorted(list(seen.values()).count(k) for k in range(SHARDS)) == [1, 2, 2], seen

        # Training on the shards equals training on the one store, whatever their order or form.
        expected_metrics, expected_weights = trained(work, "whole", whole)
        assert 0 < expected_metrics["train_loss"] < 10, expected_metrics
        for name, data in [("reordered", [reordered]), ("shards", shards[::-1]), ("directory", [shard_dir])]:
            metrics, weights = trained(work, name, *data)
            assert metrics == expected_metrics, (name, metrics, expected_metrics)
            assert weights.keys() == expected_weights.keys(), name
            for key, value in expected_weights.items():
                assert np.array_equal(weights[key], value), (name, key)
        # A task left without slides (more tasks than slides) writes an empty store that adds nothing.
        empty = os.path.join(work, "empty.lmdb")
        assert tile([0], empty, "--shard", "1/2")["slides"] == []
        assert read_store(empty) == ({}, {})
        metrics, weights = trained(work, "with-empty", *shards, empty)
        assert metrics == expected_metrics and all(np.array_equal(weights[k], v) for k, v in expected_weights.items())
        # ...and the check can fail: two shards are not the cohort.
        partial, _ = trained(work, "partial", *shards[:2])
        assert partial != expected_metrics, partial

        # extract --shard over the whole store writes the feature files of that shard's slides only.
        model = os.path.join(work, "backbone.json")
        with open(model, "w") as f:
            json.dump({"preset": "small-cnn", "width": 4}, f)
        features = os.path.join(work, "features")
        extracted = summary(vulkan("extract", "--model", model, "--random-weights", "--layer", "pool2", "--tiles", whole,
                                   "--out", features, "--shard", f"1/{SHARDS}"))
        in_shard = {os.path.basename(path)[:-5]: len(tiles) for path, tiles in tiles_by_slide(shards[1]).values()}
        assert extracted["shard"] == {"index": 1, "count": SHARDS, "slides": len(in_shard), "of": SLIDES}, extracted
        assert sorted(os.listdir(features)) == sorted([name + ".h5" for name in in_shard] + ["runs"]), os.listdir(features)
        for name, count in in_shard.items():
            with h5py.File(os.path.join(features, name + ".h5"), "r") as f:
                assert f["features"].shape[0] == count and f["coords"].shape == (count, 2), (name, count)
        # The same shard of the shards' directory is the same slides.
        again = summary(vulkan("extract", "--model", model, "--random-weights", "--layer", "pool2", "--tiles", shard_dir,
                               "--out", os.path.join(work, "features-again"), "--shard", f"1/{SHARDS}"))
        assert sorted(s["slide"] for s in again["slides"]) == sorted(in_shard), again

        nothing = os.path.join(work, "features-none")
        idle = summary(vulkan("extract", "--model", model, "--random-weights", "--layer", "pool2", "--tiles", shards[2],
                              "--out", nothing, "--shard", f"1/{SHARDS}"))
        assert idle["slides"] == [] and idle["shard"]["slides"] == 0 and not os.path.exists(nothing), idle

        # Bad flags: exit 2 naming the flag, nothing written.
        for bad in ["3/3", "1/0", "0/0", "-1/3", "nan/3", "1/nan", "1", "1/2/3", "a/b", " 1/3", "1/3x", "", "/3"]:
            out = os.path.join(work, "refused.lmdb")
            expect_refused(["tile", slides[0], "--out", out, "--size", TILE, "--shard", bad], "--shard")
            assert not os.path.exists(out), bad
            expect_refused(["extract", "--model", model, "--random-weights", "--layer", "pool2", "--tiles", whole,
                            "--out", os.path.join(work, "refused"), "--shard", bad], "--shard")
            assert not os.path.exists(os.path.join(work, "refused")), bad
        expect_refused(["tile", slides[0], slides[0], "--out", os.path.join(work, "twice.lmdb"), "--shard", "0/2"],
                       "listed twice")
        expect_refused(["train", "--data", whole, os.path.join(work, ".", "all.lmdb"), *TRAIN], "given twice")
        expect_refused(["train", "--data", shards[0], whole, *TRAIN], "same slide")
        print("ok")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_shards():
    main()


if __name__ == "__main__":
    if len(sys.argv) > 1:
        TESSERA = sys.argv[1]
    main()

"""One writer discipline for every output (common/output.h), seen from the command line:

- An existing checkpoint, feature file, synthetic slide or study export is replaced only by
  --resume or --overwrite; a refused run is exit 2 naming the flag, and the file is unchanged.
- Two runs on one output: the second is refused (exit 1) naming the first (its pid); two
  `extract` runs into one --out leave every feature file whole, as one run writes it.
- A link planted at a temporary name (c.h5.partial, s1.h5.partial, x.tiff.partial) or at a
  tile store's data.mdb is never written through: the file it points to is unchanged.
- A directory that cannot be written fails before any work, with errno's text.
- A feature file is complete only for its slide (the fingerprint of its bytes) and the model's
  identity (a hash of its weights, whether they are random, layer, precision): `extract --shard`
  no longer takes dupB/s1.tiff as done because another shard wrote s1.h5 for dupA/s1.tiff.
- `extract --layer layer5` (no such layer) is exit 2 before anything is created.
Files are read back with h5py.
"""
import hashlib
import json
import os
import shutil
import subprocess
import tempfile

import h5py
import pytest

from data_tools import patch_task, summary, synth

TESSERA = os.environ.get("TESSERA_BINARY", "build/tools/tessera")


def tessera(*args, env=None, **kwargs):
    return subprocess.run([TESSERA, *map(str, args)], capture_output=True, text=True,
                          env=None if env is None else {**os.environ, **env}, **kwargs)


def expect(result, code, *words):
    assert result.returncode == code, (code, result.returncode, result.stderr[-2000:])
    for word in words:
        assert word in result.stderr, (word, result.stderr[-2000:])


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def victim(tmp_path):
    """A file that a link planted at an output points to: nothing may write it."""
    path = tmp_path / "victim.txt"
    path.write_text("not yours\n")
    return path


@pytest.fixture(scope="module")
def patches(tmp_path_factory):
    return patch_task(tmp_path_factory.mktemp("patches") / "p.h5", 64, 16)


def train(patches, checkpoint, *flags, epochs=1):
    return tessera("train", "--data", patches, "--width", 4, "--epochs", epochs, "--batch", 16, "--checkpoint",
                   checkpoint, *flags)


def test_a_checkpoint_is_replaced_only_by_resume_or_overwrite(tmp_path, patches):
    checkpoint = tmp_path / "c.h5"
    expect(train(patches, checkpoint), 0)
    before = digest(checkpoint)
    again = train(patches, checkpoint)
    expect(again, 2, "--checkpoint", str(checkpoint), "--resume", "--overwrite")
    assert digest(checkpoint) == before
    expect(train(patches, checkpoint, "--resume", epochs=2), 0)
    with h5py.File(checkpoint, "r") as f:
        assert json.loads(f["train"].attrs["progress"])["epoch"] == 2
    expect(train(patches, checkpoint, "--overwrite"), 0)
    with h5py.File(checkpoint, "r") as f:
        assert json.loads(f["train"].attrs["progress"])["epoch"] == 1
    expect(train(patches, checkpoint, "--overwrite", "--resume"), 2, "--overwrite")
    assert not [name for name in os.listdir(tmp_path) if name.endswith((".partial", ".lock"))], os.listdir(tmp_path)


def test_a_second_train_on_one_checkpoint_is_refused_naming_the_first(tmp_path, patches):
    gate = tmp_path / "gate"
    gate.mkdir()
    checkpoint = tmp_path / "c.h5"
    first = subprocess.Popen([TESSERA, "train", "--data", str(patches), "--width", "4", "--epochs", "1", "--batch",
                              "16", "--checkpoint", str(checkpoint)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env={**os.environ, "TESSERA_FAULT": f"wait:{gate}", "TESSERA_TRIAL": "0"})
    try:
        while not (gate / "started-0").exists():  # the first holds the lock and waits
            assert first.poll() is None, first.communicate()
        for flags in ([], ["--resume"], ["--overwrite"]):
            second = train(patches, checkpoint, *flags)
            expect(second, 1, str(checkpoint), "in use by another tessera run", f"pid {first.pid}")
        (gate / "go-0").touch()
        out, err = first.communicate(timeout=600)
        assert first.returncode == 0, err
    finally:
        (gate / "go-0").touch()
        first.wait()
    with h5py.File(checkpoint, "r") as f:
        assert json.loads(f["train"].attrs["progress"])["epoch"] == 1


def test_a_link_at_the_temporary_checkpoint_is_not_written_through(tmp_path, patches):
    target = victim(tmp_path)
    os.symlink(target, tmp_path / "c.h5.partial")
    expect(train(patches, tmp_path / "c.h5"), 0)
    assert target.read_text() == "not yours\n"
    assert not os.path.lexists(tmp_path / "c.h5.partial")
    with h5py.File(tmp_path / "c.h5", "r") as f:
        assert "params" in f


def read_only_directory():
    """A directory this process cannot write in, and how to run tessera so that it cannot either:
    as root, permission bits bind nobody, so tessera runs as nobody in a directory it may read."""
    work = tempfile.mkdtemp(prefix="tessera_read_only_")
    os.chmod(work, 0o755)
    locked = os.path.join(work, "runs")
    os.mkdir(locked)
    os.chmod(locked, 0o555)
    if os.geteuid() != 0:
        return work, locked, None

    def as_nobody():
        os.setgid(65534)
        os.setuid(65534)
    return work, locked, as_nobody


def test_a_directory_that_cannot_be_written_fails_before_any_work(patches):
    work, locked, demote = read_only_directory()
    try:
        data = os.path.join(work, "p.h5")
        shutil.copy(patches, data)
        os.chmod(data, 0o644)
        result = subprocess.run([TESSERA, "train", "--data", data, "--width", "4", "--epochs", "3", "--checkpoint",
                                 os.path.join(locked, "c.h5")], capture_output=True, text=True, preexec_fn=demote,
                                env={**os.environ, "XDG_CACHE_HOME": work, "HOME": work})
        expect(result, 1, "c.h5", "cannot write in", "Permission denied")
        assert '"epoch"' not in result.stderr, "an epoch ran before the output was found unwritable"
        assert os.listdir(locked) == []
    finally:
        os.chmod(locked, 0o755)
        shutil.rmtree(work)


def test_synth_never_writes_through_a_link_nor_replaces_a_slide_unasked(tmp_path):
    target = victim(tmp_path)
    slide = tmp_path / "x.tiff"
    os.symlink(target, tmp_path / "x.tiff.partial")
    os.symlink(target, tmp_path / "x.geojson.partial")
    synth(TESSERA, slide, 256, 256, 1)
    assert target.read_text() == "not yours\n"
    before = digest(slide)
    expect(tessera("synth", slide, "--width", 256, "--height", 256, "--seed", 2), 2, "OUT", str(slide), "--overwrite")
    assert digest(slide) == before
    expect(tessera("synth", slide, "--width", 256, "--height", 256, "--seed", 2, "--overwrite"), 0)
    assert digest(slide) != before


def test_a_link_inside_a_tile_store_is_refused(tmp_path):
    target = victim(tmp_path)
    slide = tmp_path / "s.tiff"
    synth(TESSERA, slide, 256, 256, 1)
    store = tmp_path / "s.lmdb"
    store.mkdir()
    os.symlink(target, store / "data.mdb")
    expect(tessera("tile", slide, "--out", store, "--size", 64), 1, "data.mdb", "link")
    assert target.read_text() == "not yours\n"


def test_a_study_export_is_not_written_through_a_link(tmp_path, patches):
    study = tmp_path / "s.sqlite"
    swept = tessera("sweep", "--study", study, "--trials", 1, "--sampler", "random", "--param",
                    "lr=loguniform:1e-3:1e-1", "--", "--data", patches, "--width", 4, "--epochs", 1)
    expect(swept, 0)
    target = victim(tmp_path)
    page = tmp_path / "page.html"
    os.symlink(target, page)
    expect(tessera("sweep", "--study", study, "--export", "html", "--output", page), 2, "--output", "--overwrite")
    expect(tessera("sweep", "--study", study, "--export", "html", "--output", page, "--overwrite"), 0)
    assert target.read_text() == "not yours\n"
    assert not os.path.islink(page) and "<html" in page.read_text().lower()


@pytest.fixture(scope="module")
def dup_stores(tmp_path_factory):
    """Two different slides both named s1.tiff (dupA/, dupB/), each tiled into its own store."""
    work = tmp_path_factory.mktemp("dup")
    stores = []
    for seed, folder in ((1, "dupA"), (2, "dupB")):
        (work / folder).mkdir()
        slide = work / folder / "s1.tiff"
        synth(TESSERA, slide, 512, 512, seed)
        store = work / f"{folder}.lmdb"
        expect(tessera("tile", slide, "--out", store, "--size", 64, "--labels", work / folder / "s1.geojson",
                       "--unannotated", "Normal", "--allow-empty-labels"), 0)
        stores.append(store)
    return stores


def extract(stores, out, *flags, layer="pool2"):
    return tessera("extract", "--model", "small-cnn", "--random-weights", "--layer", layer, "--tiles", *stores,
                   "--out", out, "--batch", 16, *flags)


def test_extract_judges_a_feature_file_by_its_slide_and_model(tmp_path, dup_stores):
    out = tmp_path / "features"
    expect(extract(dup_stores, out, "--shard", "0/2"), 0)
    with h5py.File(out / "s1.h5", "r") as f:
        extraction = json.loads(f["features"].attrs["extraction"])
        slide = json.loads(f["features"].attrs["slide"])
        assert extraction["random_weights"] is True and extraction["weights"].startswith("sha256:"), extraction
        assert slide["path"].endswith(os.path.join("dupA", "s1.tiff")) and slide["fingerprint"], slide
        assert slide["tiles"] == f["features"].shape[0] > 0
    before = digest(out / "s1.h5")
    # Shard 1's slide is dupB/s1.tiff: s1.h5 is another slide's, not this one's finished work.
    other = extract(dup_stores, out, "--shard", "1/2")
    expect(other, 2, "s1.h5", os.path.join("dupA", "s1.tiff"), os.path.join("dupB", "s1.tiff"), "--overwrite")
    assert digest(out / "s1.h5") == before
    # The same slide and model: complete. Another layer: refused before any work.
    assert summary(extract(dup_stores, out, "--shard", "0/2"))["slides"][0]["status"] == "already complete"
    expect(extract(dup_stores, out, "--shard", "0/2", layer="conv1"), 2, "s1.h5", "--overwrite")
    assert digest(out / "s1.h5") == before
    expect(extract(dup_stores, out, "--shard", "1/2", "--overwrite"), 0)
    with h5py.File(out / "s1.h5", "r") as f:
        assert json.loads(f["features"].attrs["slide"])["path"].endswith(os.path.join("dupB", "s1.tiff"))


def test_extract_never_writes_through_a_link(tmp_path, dup_stores):
    out = tmp_path / "features"
    out.mkdir()
    target = victim(tmp_path)
    os.symlink(target, out / "s1.h5.partial")
    os.symlink(target, out / "s1.h5.partial.rows")
    expect(extract(dup_stores[:1], out), 0)
    assert target.read_text() == "not yours\n"
    with h5py.File(out / "s1.h5", "r") as f:
        assert f["features"].shape[0] > 0


def test_extract_of_a_layer_the_model_lacks_creates_nothing(tmp_path, dup_stores):
    out = tmp_path / "never"
    expect(extract(dup_stores[:1], out, layer="layer5"), 2, "--layer layer5")
    assert not out.exists()
    slide = tmp_path / "x.tiff"
    synth(TESSERA, slide, 256, 256, 3)
    expect(tessera("extract", "--model", "small-cnn", "--random-weights", "--layer", "layer5", "--slides", slide,
                   "--out", out, "--size", 64), 2, "--layer layer5")
    assert not out.exists()


def test_two_extract_runs_into_one_out_leave_every_file_whole(tmp_path, dup_stores):
    solo = tmp_path / "solo"
    expect(extract(dup_stores[1:], solo), 0)
    reference = digest_features(solo / "s1.h5")
    for attempt in range(3):
        out = tmp_path / f"shared{attempt}"
        runs = [subprocess.Popen([TESSERA, "extract", "--model", "small-cnn", "--random-weights", "--layer", "pool2",
                                  "--tiles", str(dup_stores[1]), "--out", str(out), "--batch", "16"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
        results = [(run.pid, *run.communicate(timeout=600), run.returncode) for run in runs]
        for pid, out_text, err, code in results:
            assert code in (0, 1), (code, err[-2000:])
            if code == 1:  # the loser names the winner, and never blames the disk
                other = [p for p, *_ in results if p != pid][0]
                assert "in use by another tessera run" in err and f"pid {other}" in err, err[-2000:]
                assert "disk full" not in err, err[-2000:]
        assert digest_features(out / "s1.h5") == reference
        again = extract(dup_stores[1:], out)
        assert summary(again)["slides"][0]["status"] == "already complete", again.stderr


def digest_features(path):
    with h5py.File(path, "r") as f:
        return hashlib.sha256(f["features"][()].tobytes() + f["coords"][()].tobytes()).hexdigest()

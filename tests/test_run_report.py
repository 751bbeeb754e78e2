"""Run reports (docs/architecture.md, "Run reports"): every `tile` and `extract` run writes
OUT/runs/<start>.json, checked here against what the run did, read back independently: tile counts
from the store with python3-lmdb, feature rows from the HDF5 files with h5py. A second run never
replaces the first's report; a run that completes finished files marks them skipped, one that
goes on from a partial file resumed; a slide that fails is failed with its reason (with and
without --skip-errors); a run in progress leaves a valid report marked interrupted after every
slide. `tessera report` prints the newest as a table with totals, --json the file as it is,
--html a page with every string escaped; a report that is not one is exit 5 naming the file."""
import json
import os
import re
import shutil
import signal
import struct
import subprocess

import h5py
import lmdb
import pytest

from data_tools import read_store, run, summary, synth, workdir

TESSERA = os.environ.get("TESSERA_BINARY", "build/tools/tessera")
ENV = dict(os.environ, TESSERA_VALIDATION=os.environ.get("TESSERA_VALIDATION", "1"))
SIZE = 32
# Width, height, seed; the third is named with the characters HTML must escape.
SLIDES = {"s0": (448, 320, 3), "s1": (384, 320, 4), "a<b>&c": (320, 256, 5)}
EXIT_BAD_INPUT = 5


def tessera(*args, check=True):
    result = run(TESSERA, *args, check=check, env=ENV)
    assert "vulkan validation" not in result.stderr.lower(), result.stderr
    return result


def reports(out):
    folder = os.path.join(out, "runs")
    return sorted(os.path.join(folder, name) for name in os.listdir(folder) if name.endswith(".json"))


def load(path):
    with open(path) as f:
        return json.load(f)


def store_tiles(store):
    """Tiles per slide path, from the store's records and keys (python3-lmdb)."""
    tiles, slides = read_store(store)
    counted = {}
    for slide, _, _, _ in tiles:
        counted[slide] = counted.get(slide, 0) + 1
    return {record["path"]: counted.get(slide, 0) for slide, record in slides.items()}


def feature_rows(path):
    with h5py.File(path, "r") as f:
        assert f["features"].shape[0] == f["coords"].shape[0], path
        return f["features"].shape[0]


def extract(store, out, *flags, check=True):
    return tessera("extract", "--model", "small-cnn", "--random-weights", "--layer", "pool2", "--tiles", store,
                   "--out", out, "--batch", 4, *flags, check=check)


@pytest.fixture(scope="module")
def work():
    path = workdir("run_report")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def tiled(work):
    """Three slides tiled into a store: (slide paths, store)."""
    paths = [os.path.join(work, name + ".tiff") for name in SLIDES]
    for path, (width, height, seed) in zip(paths, SLIDES.values()):
        synth(TESSERA, path, width, height, seed)
    store = os.path.join(work, "tiles.lmdb")
    tessera("tile", *paths, "--out", store, "--size", SIZE, "--encoding", "raw")
    return paths, store


def check_header(report, command):
    version = tessera("--version").stdout.split()[1]
    assert report["format"] == "tessera run report" and report["version"] == 1, report
    assert report["command"] == command and report["tessera"] == version, (report["command"], report["tessera"])
    assert report["arguments"][1] == command and report["pid"] > 0 and report["host"], report["arguments"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", report["started"]), report["started"]
    assert report["started"] <= report["ended"] and report["seconds"] >= 0, report


def check_totals(report):
    slides, totals = report["slides"], report["totals"]
    assert totals["slides"] == len(slides)
    assert totals["tiles"] == sum(s.get("tiles", 0) for s in slides), totals
    assert totals["new_tiles"] == sum(s.get("new_tiles", 0) for s in slides), totals
    assert totals["tiles_per_second"] == pytest.approx(totals["new_tiles"] / totals["seconds"], rel=1e-9)
    counts = {}
    for slide in slides:
        counts[slide["status"]] = counts.get(slide["status"], 0) + 1
    assert totals["statuses"] == counts, totals


def test_tile_report_matches_the_store_and_a_second_run_keeps_the_first(work, tiled):
    paths, store = tiled
    [first] = reports(store)
    assert re.fullmatch(r"\d{8}T\d{6}\.\d{3}Z\.json", os.path.basename(first)), first
    report = load(first)
    check_header(report, "tile")
    assert report["outcome"] == "complete" and report["exit_code"] == 0, report
    assert report["settings"]["--size"] == str(SIZE) and report["settings"]["--encoding"] == "raw", report["settings"]
    tiles = store_tiles(store)
    assert [s["path"] for s in report["slides"]] == paths
    assert [s["slide"] for s in report["slides"]] == [name + ".tiff" for name in SLIDES]
    for slide in report["slides"]:
        assert slide["status"] == "done", slide
        assert slide["tiles"] == slide["new_tiles"] == tiles[slide["path"]] > 0, (slide, tiles)
        assert slide["tiles_per_second"] == pytest.approx(slide["new_tiles"] / slide["seconds"], rel=1e-9)
    check_totals(report)

    # Again: every slide complete already, so skipped with nothing new, in a report of its own.
    tessera("tile", *paths, "--out", store, "--size", SIZE, "--encoding", "raw")
    second = [path for path in reports(store) if path != first]
    assert len(second) == 1 and load(first) == report, reports(store)
    again = load(second[0])
    assert [(s["status"], s["tiles"], s["new_tiles"]) for s in again["slides"]] == [
        ("skipped", tiles[path], 0) for path in paths], again["slides"]
    check_totals(again)


@pytest.fixture(scope="module")
def extracted(work, tiled):
    """The store's features, extracted once: their folder."""
    out = os.path.join(work, "features")
    extract(tiled[1], out)
    return out


def test_extract_report_matches_the_feature_files(extracted):
    out = extracted
    [path] = reports(out)
    report = load(path)
    check_header(report, "extract")
    assert report["outcome"] == "complete" and report["settings"]["--layer"] == "pool2", report
    listed = {d["name"]: d["driver"] for d in json.loads(tessera("--json", "info").stdout)["devices"]}
    [device] = report["devices"]
    assert listed.get(device["name"]) == device["driver"] != "" and device["batch"] == 4, (device, listed)
    assert 0 <= device["busy_fraction"] <= 1, device
    assert [s["slide"] for s in report["slides"]] == list(SLIDES)
    for slide in report["slides"]:
        rows = feature_rows(os.path.join(out, slide["slide"] + ".h5"))
        assert slide["status"] == "done" and slide["tiles"] == slide["new_tiles"] == rows > 0, (slide, rows)
        assert 0 <= slide["device_busy_fraction"] <= 1, slide
        times = slide["times"]
        assert slide["device_busy_fraction"] == pytest.approx(times["device_seconds"] / times["device_wall_seconds"])
        assert times["device_seconds"] + times["data_wait_seconds"] <= times["device_wall_seconds"] * (1 + 1e-9), times
    check_totals(report)
    assert 0 <= report["totals"]["device_busy_fraction"] <= 1, report["totals"]
    assert report["totals"]["device_busy_fraction"] == pytest.approx(
        report["devices"][0]["busy_fraction"]), report["totals"]


def test_resumed_extract_marks_slides_resumed_and_skipped(work, tiled):
    _, store = tiled
    out = os.path.join(work, "resumed")
    extract(store, out)
    rows = feature_rows(os.path.join(out, "s1.h5"))
    # What a run killed after its third flushed row of s1 leaves: the partial file and its row count.
    os.rename(os.path.join(out, "s1.h5"), os.path.join(out, "s1.h5.partial"))
    with open(os.path.join(out, "s1.h5.partial.rows"), "w") as f:
        f.write("3\n")
    before = set(reports(out))
    extract(store, out)
    [path] = set(reports(out)) - before
    slides = {s["slide"]: s for s in load(path)["slides"]}
    assert feature_rows(os.path.join(out, "s1.h5")) == rows
    assert (slides["s1"]["status"], slides["s1"]["tiles"], slides["s1"]["new_tiles"], slides["s1"]["resumed_from"]) == (
        "resumed", rows, rows - 3, 3), slides["s1"]
    for name in ("s0", "a<b>&c"):
        assert (slides[name]["status"], slides[name]["new_tiles"]) == ("skipped", 0), slides[name]
        assert slides[name]["tiles"] == feature_rows(os.path.join(out, name + ".h5")), slides[name]
    check_totals(load(path))


def broken_store(work, store):
    """A copy of `store` whose slide 1 (s1) has a tile that fails its checksum."""
    broken = os.path.join(work, "broken.lmdb")
    shutil.copytree(store, broken, ignore=shutil.ignore_patterns("runs"))
    env = lmdb.open(broken, max_dbs=2)
    with env.begin(write=True) as txn:
        db = env.open_db(b"tiles", txn=txn, create=False)
        key = sorted(struct.unpack(">IIII", k) for k, _ in txn.cursor(db=db) if struct.unpack(">I", k[:4])[0] == 1)[2]
        value = bytearray(txn.get(struct.pack(">IIII", *key), db=db))
        value[-1] ^= 0xFF  # a pixel byte: the checksum no longer matches
        txn.put(struct.pack(">IIII", *key), bytes(value), db=db)
    env.close()
    return broken


def test_failed_slide_is_failed_with_its_reason(work, tiled):
    _, store = tiled
    broken = broken_store(work, store)
    stopped = os.path.join(work, "stopped")
    result = extract(broken, stopped, "--workers", 1, check=False)
    assert result.returncode == EXIT_BAD_INPUT, result.stderr
    [path] = reports(stopped)
    report = load(path)
    assert (report["outcome"], report["exit_code"]) == ("failed", EXIT_BAD_INPUT), report
    assert "slide 1" in report["error"] and "--skip-errors" in report["error"], report["error"]
    assert [s["status"] for s in report["slides"]] == ["done", "failed", "not started"], report["slides"]
    assert "slide 1" in report["slides"][1]["error"], report["slides"][1]

    skipping = os.path.join(work, "skipping")
    extract(broken, skipping, "--skip-errors")
    [path] = reports(skipping)
    report = load(path)
    assert report["outcome"] == "complete" and report["exit_code"] == 0, report
    assert [s["status"] for s in report["slides"]] == ["done", "failed", "done"], report["slides"]
    failed = report["slides"][1]
    assert failed["slide"] == "s1" and "slide 1" in failed["error"] and "checksum" in failed["error"].lower(), failed
    assert not os.path.exists(os.path.join(skipping, "s1.h5"))
    for slide in (report["slides"][0], report["slides"][2]):
        assert slide["tiles"] == feature_rows(os.path.join(skipping, slide["slide"] + ".h5")), slide
    check_totals(report)
    table = tessera("report", skipping).stdout
    assert re.search(r"^  s1: failed: .*slide 1", table, re.M), table


def test_run_in_progress_leaves_a_valid_report_marked_interrupted(work, tiled):
    """Each snapshot of the report read while the run goes is whole JSON (written to a temporary
    and renamed); after a slide ends it says so, with the run marked interrupted until it ends."""
    _, store = tiled
    out = os.path.join(work, "in_progress")
    process = subprocess.Popen([TESSERA, "extract", "--model", "small-cnn", "--random-weights", "--layer", "pool2",
                                "--tiles", store, "--out", out, "--batch", "1", "--workers", "1"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    seen = None
    while process.poll() is None and seen is None:
        folder = os.path.join(out, "runs")
        for name in os.listdir(folder) if os.path.isdir(folder) else []:
            if name.endswith(".json"):
                report = load(os.path.join(folder, name))
                if report["outcome"] == "interrupted" and report["slides"][0]["status"] == "done":
                    seen = (os.path.join(folder, name), report)
    if process.poll() is None:
        process.send_signal(signal.SIGKILL)
    process.wait()
    assert seen, "no report after the first slide while the run went on"
    path, report = seen
    assert [s["status"] for s in report["slides"]][1:] == ["not started", "not started"], report["slides"]
    assert report["slides"][0]["tiles"] == report["totals"]["tiles"] > 0, report
    if process.returncode == -signal.SIGKILL:  # what the killed run left: valid, still interrupted
        left = load(path)
        assert left["outcome"] == "interrupted" and left["slides"][0]["status"] == "done", left
        assert "interrupted" in tessera("report", out).stdout


def test_report_command_table_json_and_escaped_html(work, tiled, extracted):
    store, out = tiled[1], extracted
    newest = load(reports(out)[-1])
    table = tessera("report", out).stdout
    lines = table.splitlines()
    assert lines[0].startswith("extract run ") and "complete" in lines[0], table
    for slide in newest["slides"]:
        row = [line for line in lines if line.split()[:1] == [slide["slide"]]]
        assert row and row[0].split()[1:3] == ["done", str(slide["tiles"])], (slide["slide"], table)
    total = [line for line in lines if line.split()[:1] == ["total"]]
    assert total and "3 done" in total[0] and str(newest["totals"]["tiles"]) in total[0].split(), table

    assert json.loads(tessera("report", out, "--json").stdout) == newest
    assert json.loads(tessera("report", "--run", reports(out)[-1], "--json").stdout) == newest

    page = os.path.join(work, "report.html")
    tessera("report", out, "--html", page)
    html = open(page).read()
    assert "a&lt;b&gt;&amp;c" in html and "a<b>&c" not in html and "<b>" not in html, html
    assert 'data-slide="a&lt;b&gt;&amp;c"' in html and "http" not in html.replace("http-equiv", ""), html
    refused = tessera("report", out, "--html", page, check=False)
    assert refused.returncode == 2 and "--overwrite" in refused.stderr, refused.stderr
    tessera("report", out, "--html", page, "--overwrite")

    # The tile store's report names the slide files, escaped the same way.
    tessera("report", store, "--html", page, "--overwrite")
    assert "a&lt;b&gt;&amp;c.tiff" in open(page).read()


def test_corrupt_report_is_refused_naming_the_file(work, extracted):
    out = os.path.join(work, "corrupt")
    shutil.copytree(extracted, out)
    bad = os.path.join(out, "runs", "99991231T235959.999Z.json")  # the newest
    with open(bad, "w") as f:
        f.write('{"format": "tessera run report", "version": 1, "slides": [')
    result = tessera("report", out, check=False)
    assert result.returncode == EXIT_BAD_INPUT and bad in result.stderr, result.stderr
    with open(bad, "w") as f:
        json.dump({"format": "tessera run report", "version": 1, "command": "extract", "started": "x", "ended": "x",
                   "outcome": "complete", "totals": {}, "slides": [{"slide": "s0", "status": "finished"}]}, f)
    result = tessera("report", "--run", bad, check=False)
    assert result.returncode == EXIT_BAD_INPUT, result.stderr
    assert bad in result.stderr and "slides[0].status" in result.stderr and "finished" in result.stderr, result.stderr
    missing = tessera("report", os.path.join(work, "nowhere"), check=False)
    assert missing.returncode == EXIT_BAD_INPUT and "nowhere" in missing.stderr, missing.stderr

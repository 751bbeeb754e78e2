"""Tiling benchmark of issue 3, in one run: prints one JSON object.

On one synthetic slide (100,000 x 100,000 by default): `tessera synth` and `tessera tile` wall
time and peak resident memory (from /usr/bin/time -v), tiling throughput in tiles/s, plain
reads of the store's values with python3-lmdb (no tessera code, no decoding), and `vips dzsave`
cutting the same slide into 256-pixel JPEG tiles, with the ratio of the two wall times.

vips writes every tile of level 0 (glass included), tessera only the tissue tiles, so both
tiles/s and whole-slide wall times are given. With --vips-timeout, a dzsave still running is
stopped and its rate so far reported ("partial": true). Each stage's figures also go to stderr
as they come.

Run: /usr/bin/python3 bench/bench_tiling.py --build build [--size 100000] [--work DIR] [--keep]
     [--vips-timeout SECONDS]
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import lmdb


def timed(command, timeout=None):
    """Runs under /usr/bin/time -v; returns (seconds, peak RSS bytes, stdout, finished)."""
    start = time.monotonic()
    process = subprocess.Popen(["/usr/bin/time", "-v", *map(str, command)], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
        finished = True
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGINT)  # /usr/bin/time passes it on and still reports
        stdout, stderr = process.communicate()
        finished = False
    seconds = time.monotonic() - start
    result = subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
    if finished and result.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, command))} exited {result.returncode}:\n{result.stderr[-3000:]}")
    peak_kib = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", result.stderr).group(1))
    return seconds, peak_kib * 1024, result.stdout, finished


def report(figures, stage):
    print(json.dumps({stage: figures[stage]}), file=sys.stderr, flush=True)


def plain_reads(store):
    """Every value of `tiles` through a cursor, copied out of the map; tiles/s and MB/s."""
    env = lmdb.open(store, readonly=True, lock=False, max_dbs=2)
    tiles = env.open_db(b"tiles", create=False)
    count = size = 0
    start = time.monotonic()
    with env.begin() as txn:
        for _, value in txn.cursor(db=tiles):
            count += 1
            size += len(value)
    seconds = time.monotonic() - start
    env.close()
    return {"tiles": count, "seconds": seconds, "tiles_per_second": count / seconds,
            "megabytes_per_second": size / seconds / 1e6, "bytes": size}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", default="build")
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--work", default=None, help="scratch directory (default: a temporary one)")
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--keep", action="store_true", help="keep the slide and the store")
    parser.add_argument("--vips-timeout", type=float, default=None, help="stop vips dzsave after this long")
    args = parser.parse_args()
    tessera = os.path.abspath(os.path.join(args.build, "tools", "tessera"))
    work = args.work or tempfile.mkdtemp(prefix="tessera_bench_tiling_")
    os.makedirs(work, exist_ok=True)
    slide = os.path.join(work, "slide.tiff")
    store = os.path.join(work, "tiles.lmdb")
    shutil.rmtree(store, ignore_errors=True)
    figures = {"slide": {"width": args.size, "height": args.size}, "workers": args.workers, "cpus": os.cpu_count()}

    seconds, peak, out, _ = timed([tessera, "synth", slide, "--width", args.size, "--height", args.size, "--seed", 1,
                                "--workers", args.workers])
    made = json.loads(out.strip().splitlines()[-1])
    figures["synth"] = {"seconds": seconds, "peak_rss_bytes": peak, "peak_rss_mib": peak / 2**20,
                        "file_bytes": os.path.getsize(slide), "levels": len(made["levels"]),
                        "tissue_fraction": made["tissue_fraction"]}
    report(figures, "synth")

    seconds, peak, out, _ = timed([tessera, "tile", slide, "--out", store, "--labels", made["geojson"],
                                "--unannotated", "Normal", "--workers", args.workers])
    tiled = json.loads(out.strip().splitlines()[-1])
    figures["tile"] = {"seconds": seconds, "peak_rss_bytes": peak, "peak_rss_mib": peak / 2**20,
                       "tiles": tiled["written"], "tiles_per_second": tiled["written"] / seconds,
                       "copied_jpeg": tiled["slides"][0]["copied_jpeg"],
                       "grid_tiles": tiled["slides"][0]["grid"][0] * tiled["slides"][0]["grid"][1],
                       "store_bytes": os.path.getsize(os.path.join(store, "data.mdb"))}
    report(figures, "tile")
    figures["plain_lmdb_reads"] = plain_reads(store)
    report(figures, "plain_lmdb_reads")

    if shutil.which("vips"):
        dz = os.path.join(work, "dz")
        shutil.rmtree(dz + "_files", ignore_errors=True)
        seconds, peak, _, finished = timed(["vips", "dzsave", slide, dz, "--tile-size", 256, "--overlap", 0,
                                            "--depth", "one", "--suffix", ".jpg[Q=90]"], args.vips_timeout)
        files = sum(name.endswith(".jpg") for _, _, names in os.walk(dz + "_files") for name in names)
        grid = ((args.size + 255) // 256) ** 2
        figures["vips_dzsave"] = {"seconds": seconds, "peak_rss_bytes": peak, "peak_rss_mib": peak / 2**20,
                                  "tiles": files, "tiles_per_second": files / seconds, "partial": not finished,
                                  "whole_slide_seconds": seconds if finished else grid * seconds / max(files, 1),
                                  "version": subprocess.run(["vips", "--version"], capture_output=True,
                                                            text=True).stdout.strip()}
        report(figures, "vips_dzsave")
        shutil.rmtree(dz + "_files", ignore_errors=True)
        figures["tile_speedup_over_vips_whole_slide"] = (figures["vips_dzsave"]["whole_slide_seconds"] /
                                                         figures["tile"]["seconds"])
        figures["tile_speedup_over_vips_tiles_per_second"] = (figures["tile"]["tiles_per_second"] /
                                                              figures["vips_dzsave"]["tiles_per_second"])
    if not args.keep and not args.work:
        shutil.rmtree(work)
    print(json.dumps(figures))


if __name__ == "__main__":
    sys.exit(main())

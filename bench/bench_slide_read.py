"""Slide-reading benchmark: the data path alone, slide to normalised encoder input, no device.
Prints one JSON object.

Tessera (build/bench/bench_slide_read: data::read_batches over the slide's tissue tiles, read at
20x (0.5 um/px) for a 224 px encoder, shrunk by tessera's box filter, then normalised to float32
CHW with ImageNet's mean and std on the host) against TRIDENT's way on the same slide and the
same patches, in the same run: a torch Dataset whose __getitem__ does openslide-python's
read_region(level-0 x, y; level; read x read).convert('RGB'), PIL's .resize((224, 224)) (Pillow's
default filter, bicubic, as TRIDENT calls it) and torchvision's ToTensor() + Normalize(ImageNet),
in a DataLoader of batch 32 with as many worker processes as tessera has worker threads.

The slide, unless --slide is given: `tessera synth --mpp 0.25` (40x), whose pyramid halves at
every level (downsamples 1, 2, 4, 8, 16), rewritten with its tiles copied as they are (no
re-encoding) into levels 1, 4 and 16, as a 40x SVS has them: 20x is then not a level, so both
read every patch as 448 px at level 0 and shrink it to 224 (TRIDENT's level choice is checked to
be tessera's). A 20x slide (--slide CMU-1-Small-Region.svs) is read at level 0 with no resize.

Each round runs both, alternating which goes first; each times from the end of its first batch
(the warm-up: threads or processes started, the slide opened) to its last. A "core" is one
worker: tessera's threads, or the DataLoader's processes; besides them each side has a main
thread (tessera normalises there; the DataLoader's main process receives the batches), whose
CPU time the *_cpu_seconds figures include.

Run: /usr/bin/python3 bench/bench_slide_read.py --build build [--workers 1 2] [--rounds 3]
     [--slide PATH | --tessera PATH --size 20000 --seed 1] [--tiles K] [--work DIR] [--keep]
"""
import argparse
import datetime
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import openslide
import PIL
import tifffile
import torch
import torchvision
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
BATCH = 32
KEPT_LEVELS = (0, 2, 4)  # of synth's 1, 2, 4, 8, 16: a 40x SVS's 1, 4, 16


def make_slide(tessera, work, size, seed):
    """A 40x synthetic slide with levels 1, 4, 16; returns its path and what synth wrote."""
    synth = os.path.join(work, "synth.tiff")
    result = subprocess.run([tessera, "synth", synth, "--width", str(size), "--height", str(size), "--seed", str(seed),
                             "--mpp", "0.25", "--overwrite"], capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"tessera synth exited {result.returncode}:\n{result.stderr[-4000:]}")
    made = json.loads(result.stdout.strip().splitlines()[-1])
    slide = os.path.join(work, "slide-40x-1-4-16.tiff")
    # tifffile looks the JPEG encoder up even for tiles handed to it encoded; none is called.
    tifffile.TIFF.COMPRESSORS._codecs.setdefault(7, None)
    with tifffile.TiffFile(synth) as source, tifffile.TiffWriter(slide, bigtiff=True) as out:
        for n, index in enumerate(KEPT_LEVELS):
            page = source.pages[index]

            def encoded_tiles(page=page):
                for offset, count in zip(page.dataoffsets, page.databytecounts):
                    source.filehandle.seek(offset)
                    yield source.filehandle.read(count)

            out.write(encoded_tiles(), shape=page.shape, dtype=np.uint8, tile=(page.tilelength, page.tilewidth),
                      compression="jpeg", photometric="ycbcr", subsampling=(2, 2), subfiletype=1 if n else 0,
                      resolution=(page.tags["XResolution"].value, page.tags["YResolution"].value),
                      resolutionunit="CENTIMETER", description=page.description if n == 0 else None, metadata=None)
    os.remove(synth)
    return slide, {"synth_levels": made["levels"], "synth_downsamples": [made["levels"][0][0] / w for w, _ in
                                                                          made["levels"]],
                   "kept_synth_levels": list(KEPT_LEVELS), "size": size, "seed": seed}


def trident_level(downsamples, mpp, target_magnification=20, patch_size=224):
    """TRIDENT's choice (WSIPatcher._prepare): the magnification bucketed from the MPP, a level within 0.1
    of the downsample, else the coarsest finer one; the read size in that level's pixels."""
    thresholds = ((0.16, 80), (0.2, 60), (0.3, 40), (0.6, 20), (1.2, 10), (2.4, 5))
    magnification = next(m for limit, m in thresholds if mpp < limit)
    downsample = magnification / target_magnification
    patch_size_src = round(patch_size * downsample)
    level = next((i for i, d in enumerate(downsamples) if abs(d - downsample) <= 0.1), None)
    if level is None:
        level = max((i for i, d in enumerate(downsamples) if d <= downsample), key=lambda i: downsamples[i])
    return level, round(patch_size_src / int(downsamples[level]))


class TridentPatches(Dataset):
    """WSIPatcherDataset over WSIPatcher.get_tile_xy with pil=True, and an encoder's eval transforms."""

    def __init__(self, path, coords, level, read_size, image_size):
        self.path, self.coords, self.level, self.read_size, self.image_size = path, coords, level, read_size, image_size
        self.transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
        self.slide = None  # opened in each worker: a forked libtiff handle would share its file offset

    def __len__(self):
        return len(self.coords)

    def __getitem__(self, index):
        if self.slide is None:
            self.slide = openslide.OpenSlide(self.path)
        x, y = (int(v) for v in self.coords[index])
        tile = self.slide.read_region((x, y), self.level, (self.read_size, self.read_size)).convert("RGB")
        tile = tile.resize((self.image_size, self.image_size))  # a copy when the size is already right
        return self.transform(tile), (x, y)


def process_cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def children_cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def trident_round(slide, coords, level, read_size, image_size, workers):
    dataset = TridentPatches(slide, coords, level, read_size, image_size)
    children_before = children_cpu_seconds()
    batches = iter(DataLoader(dataset, batch_size=BATCH, num_workers=workers, pin_memory=False))
    warmup = len(next(batches)[0])
    # CPU from here: the workers' so far is subtracted from what they have used once reaped.
    workers_at_start = sum(process_cpu_seconds(w.pid) for w in batches._workers)
    main_start, start = time.process_time(), time.perf_counter()
    tiles = 0
    for images, _ in batches:
        tiles += len(images)
    seconds = time.perf_counter() - start
    main_cpu = time.process_time() - main_start
    del batches  # workers joined (already, at exhaustion)
    cpu = children_cpu_seconds() - children_before - workers_at_start + main_cpu
    return {"warmup_tiles": warmup, "tiles": tiles, "seconds": seconds, "tiles_per_second": tiles / seconds,
            "cpu_seconds": cpu, "tiles_per_cpu_second": tiles / cpu}


def tessera_round(bench, slide, workers, tiles, coords_path):
    command = [bench, slide, "--workers", str(workers), "--batch", str(BATCH), "--coords-out", coords_path]
    if tiles:
        command += ["--tiles", str(tiles)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"{' '.join(command)} exited {result.returncode}:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def cpu_model():
    with open("/proc/cpuinfo") as info:
        for line in info:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def median_of(rounds, key):
    return statistics.median(r[key] for r in rounds)


def compare(args, bench, slide, work, workers):
    coords_path = os.path.join(work, f"coords-{workers}.csv")
    tessera_runs, trident_runs, coords, first = [], [], None, None
    for round_index in range(args.rounds):
        # Round 0 starts with tessera, whose coordinates TRIDENT's side reads.
        for side in (("tessera", "trident") if round_index % 2 == 0 else ("trident", "tessera")):
            if side == "trident":
                trident_runs.append(trident_round(slide, coords, first["level"], first["read_size"],
                                                  first["image_size"], workers))
                continue
            run = tessera_round(bench, slide, workers, args.tiles, coords_path)
            read_coords = np.loadtxt(coords_path, delimiter=",", dtype=np.int64, ndmin=2)
            if coords is None:
                coords, first = read_coords, run
            elif not np.array_equal(coords, read_coords):
                sys.exit("bench_slide_read read other tiles in another round")
            tessera_runs.append(run)
    tessera_rate, trident_rate = median_of(tessera_runs, "tiles_per_second"), median_of(trident_runs,
                                                                                        "tiles_per_second")
    tessera_cpu_rate = median_of(tessera_runs, "tiles_per_cpu_second")
    trident_cpu_rate = median_of(trident_runs, "tiles_per_cpu_second")
    figures = {
        "workers": workers,
        "patches": len(coords),
        "timed_patches": tessera_runs[0]["tiles"],
        "tessera_tiles_per_second": tessera_rate,
        "trident_tiles_per_second": trident_rate,
        "tessera_tiles_per_second_per_core": tessera_rate / workers,
        "trident_tiles_per_second_per_core": trident_rate / workers,
        "ratio_per_core": tessera_rate / trident_rate,
        "tessera_tiles_per_cpu_second": tessera_cpu_rate,
        "trident_tiles_per_cpu_second": trident_cpu_rate,
        "ratio_per_cpu_second": tessera_cpu_rate / trident_cpu_rate,
        "tessera_stage_thread_seconds_per_tile": {
            stage: median_of(tessera_runs, f"{stage}_seconds") / tessera_runs[0]["tiles"]
            for stage in ("read", "resize", "normalise")},
        "warning": None if tessera_runs[0]["tiles"] >= 10 * BATCH else (
            f"only {tessera_runs[0]['tiles']} patches timed (fewer than 10 batches after the warm-up): both sides "
            "read ahead while the first batch is handed on, so these rates are not the data path's"),
        "tessera_rounds": tessera_runs,
        "trident_rounds": trident_runs,
    }
    print(json.dumps({k: v for k, v in figures.items() if not k.endswith("_rounds")}), file=sys.stderr, flush=True)
    return figures, first


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", required=True, help="build directory holding bench/bench_slide_read")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="worker counts, each compared")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of both, alternating which goes first")
    parser.add_argument("--slide", help="slide to read (default: a synthetic 40x slide with levels 1, 4, 16)")
    parser.add_argument("--tessera", help="tessera executable for `synth` (default: BUILD/tools/tessera)")
    parser.add_argument("--size", type=int, default=20000, help="synthetic slide side in pixels")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--tiles", type=int, default=0, help="read only the first K tissue tiles (0: all)")
    parser.add_argument("--work", help="working directory (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the working directory")
    args = parser.parse_args()
    bench = os.path.join(args.build, "bench", "bench_slide_read")
    work = args.work or tempfile.mkdtemp(prefix="bench_slide_read_")
    os.makedirs(work, exist_ok=True)
    load_start = os.getloadavg()
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    try:
        made = None
        slide = args.slide
        if not slide:
            slide, made = make_slide(args.tessera or os.path.join(args.build, "tools", "tessera"), work, args.size,
                                     args.seed)
        runs, first = [], None
        for workers in args.workers:
            figures, first = compare(args, bench, slide, work, workers)
            runs.append(figures)
        with openslide.OpenSlide(slide) as opened:
            downsamples = list(opened.level_downsamples)
        trident_choice = trident_level(downsamples, first["mpp"])
        if trident_choice != (first["level"], first["read_size"]):
            sys.exit(f"TRIDENT reads level {trident_choice[0]} at {trident_choice[1]} px, tessera level "
                     f"{first['level']} at {first['read_size']} px: not the same patches")
        result = {
            "benchmark": "slide to normalised 224 px encoder input at 20x (0.5 um/px), no device",
            "date": started,
            "cpu": cpu_model(),
            "cpus": os.cpu_count(),
            "load_average_start": load_start,
            "load_average_end": os.getloadavg(),
            "core": "one worker: a tessera read thread or a DataLoader worker process (tiles/s divided by N); "
                    "each side's main thread or process comes on top (tessera normalises there)",
            "slide": os.path.abspath(slide),
            "synthetic": made,
            "mpp": first["mpp"],
            "level_downsamples": first["level_downsamples"],
            "level": first["level"],
            "read_size": first["read_size"],
            "image_size": first["image_size"],
            "resized": first["resized"],
            "note": ("each patch read as {0} px at level {1} and shrunk to {2} (tessera: box filter; TRIDENT: "
                     "PIL's default, bicubic)" if first["resized"] else
                     "each patch read at level {1} at its size, {0} px: no resize on either side").format(
                         first["read_size"], first["level"], first["image_size"]),
            "batch": BATCH,
            "rounds": args.rounds,
            "versions": {"torch": torch.__version__, "torchvision": torchvision.__version__, "pillow": PIL.__version__,
                         "openslide": openslide.__library_version__, "openslide_python": openslide.__version__},
            "ratio_per_core": min(run["ratio_per_core"] for run in runs),
            "runs": runs,
        }
        print(json.dumps(result))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

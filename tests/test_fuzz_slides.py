"""Fuzzing `tessera tile` with damaged slides of every format it reads (fixed seeds): Aperio SVS
(small.svs and a JPEG pyramid of CMU-1-Small-Region's pixels, through OpenSlide), generic tiled
TIFF (boxes.tiff, Deflate), BigTIFF (`tessera synth`), DICOM (the boxes series) and stripped
TIFF (kidney-ihc-stripped.tif, through libvips): bytes changed in the files' structure (TIFF
directories and tag values, DICOM headers, often to boundary values) and in their pixel data, and
files cut short. Each run exits 0 or 5, never by a signal or at the time limit, with a peak
resident size under 1 GiB (getrusage of the child, which on Linux also counts what this test
process held when it started the child: an upper bound); a truncated file is exit 5; exit 0 only
where every tile of the clean file was written or named as corrupt."""
import json
import os
import random
import shutil
import struct

import numpy as np
import openslide
import tifffile

from data_tools import read_store, run, run_with_usage, within_memory, workdir
from slide_files import APERIO, pyramid, write_tiff

TESSERA = os.environ.get("TESSERA_BINARY", "build/tools/tessera")
SLIDES = os.path.normpath(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared",
                                       "testdata", "slides"))
GiB = 1 << 30
MUTANTS, CUTS = 30, 6  # per source: 7 sources, 252 runs
TIME_LIMIT = 300  # seconds of wall time per run: a hang, not a slow run, reaches it
INTERESTING = [0, 1, 2, 0x7F, 0x80, 0xFF, 0xFFFF, 0x10000, 0x7FFFFFFF, 0xFFFFFFFF]


def tiff_regions(path):
    """(structure, data) byte ranges of a TIFF: directories and out-of-line tag values; tiles and strips."""
    structure, data = [], []
    with tifffile.TiffFile(path) as tiff:
        entry = 20 if tiff.is_bigtiff else 12
        head = 8 if tiff.is_bigtiff else 2
        for page in tiff.pages:
            structure.append((page.offset, page.offset + head + entry * len(page.tags) + head * 2))
            for tag in page.tags.values():
                size = tag.count * struct.calcsize("<" + tifffile.TIFF.DATA_FORMATS[tag.dtype][-1])
                if tag.valueoffset != tag.offset + 4 + head:  # out of line
                    structure.append((tag.valueoffset, tag.valueoffset + size))
            data += [(o, o + n) for o, n in zip(page.dataoffsets, page.databytecounts) if n]
    return structure, data


def dicom_regions(path):
    with open(path, "rb") as f:
        content = f.read()
    pixels = content.index(b"\xe0\x7f\x10\x00")
    return [(132, pixels + 12)], [(pixels + 12, len(content))]


def mutate(content, regions, generator):
    """A copy of `content` with a few bytes changed: in the structure (often to a boundary value),
    in the pixel data, or anywhere."""
    structure, data = regions
    mutated = bytearray(content)
    for _ in range(generator.randint(1, 4)):
        kind = generator.random()
        if kind < 0.45 and structure:
            start, end = generator.choice(structure)
            at = generator.randrange(start, max(start + 1, min(end, len(mutated))) if start < len(mutated) else 1)
            value = generator.choice(INTERESTING)
            width = generator.choice([1, 2, 4])
            piece = (value & ((1 << (8 * width)) - 1)).to_bytes(width, "little")
            mutated[at:at + width] = piece[:len(mutated) - at]
        else:
            start, end = generator.choice(data) if kind < 0.8 and data else (0, len(mutated))
            at = generator.randrange(start, min(end, len(mutated)))
            mutated[at] = generator.randrange(256)
    return bytes(mutated)


def named_corrupt(stderr):
    """(level, row, column) of each tile the run named as corrupt and skipped."""
    named = set()
    for line in stderr.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if record.get("warning") == "corrupt tile skipped" and "row" in record:
                named.add((record["level"], record["row"], record["column"]))
    return named


def make_sources(binary, work):
    """name -> (files of the slide, the file to damage, the file to open, tile flags)."""
    cmu = openslide.OpenSlide(os.path.join(SLIDES, "CMU-1-Small-Region.svs"))
    pixels = np.asarray(cmu.read_region((0, 0), 0, (960, 960)).convert("RGB"))
    svs = os.path.join(work, "clean", "cmu.svs")
    os.makedirs(os.path.dirname(svs))
    write_tiff(svs, pyramid(pixels, [4]), tile=240, description=APERIO.format(width=960, height=960, tile=240))
    bigtiff = os.path.join(work, "clean", "synth.tiff")
    run(binary, "synth", bigtiff, "--width", 1024, "--height", 1024, "--seed", 5)
    dicom = [os.path.join(SLIDES, name) for name in ("boxes_0.dcm", "boxes_1.dcm")]
    return {
        "small.svs": ([os.path.join(SLIDES, "small.svs")], 0, ["--size", 16]),
        "cmu.svs": ([svs], 0, ["--size", 240]),
        "boxes.tiff": ([os.path.join(SLIDES, "boxes.tiff")], 0, ["--size", 64]),
        "synth.tiff": ([bigtiff], 0, ["--size", 256]),
        "boxes_0.dcm": (dicom, 0, ["--size", 8]),
        "boxes_1.dcm": (dicom, 1, ["--size", 8]),
        "kidney.tif": ([os.path.join(SLIDES, "kidney-ihc-stripped.tif")], 0, ["--size", 256]),
    }


def tile(binary, slide, store, flags):
    shutil.rmtree(store, ignore_errors=True)
    return run_with_usage([binary, "tile", slide, "--out", store, "--workers", 1, "--min-tissue", 0, *flags],
                          timeout=TIME_LIMIT)


def main(binary):
    work = workdir("test_fuzz_slides")
    store = os.path.join(work, "tiles.lmdb")
    failures, runs, exits, worst_peak, worst_cpu = [], 0, {}, 0, 0.0
    for seed, (name, (files, damaged, flags)) in enumerate(make_sources(binary, work).items()):
        code, _, err, _, _, _ = tile(binary, files[0], store, flags)
        assert code == 0, (name, err)
        clean = {key[1:] for key in read_store(store)[0]}
        assert clean, name
        with open(files[damaged], "rb") as f:
            content = f.read()
        regions = dicom_regions(files[damaged]) if name.endswith(".dcm") else tiff_regions(files[damaged])
        generator = random.Random(seed)
        cases = [("mutant", mutate(content, regions, generator)) for _ in range(MUTANTS)]
        cases += [("cut", content[:generator.randrange(len(content) // 8, len(content))]) for _ in range(CUTS)]
        for index, (kind, damaged_content) in enumerate(cases):
            case = os.path.join(work, f"{name}-{kind}{index}")
            os.makedirs(case)
            slide_files = [shutil.copy(path, case) for path in files]
            with open(slide_files[damaged], "wb") as f:
                f.write(damaged_content)
            code, _, err, peak, cpu, killed = tile(binary, slide_files[0], store, flags)
            runs += 1
            exits[code] = exits.get(code, 0) + 1
            worst_peak, worst_cpu = max(worst_peak, peak), max(worst_cpu, cpu)
            last = err.strip().splitlines()[-1] if err.strip() else ""
            problem = None
            if killed:
                problem = f"still running after {TIME_LIMIT} s"
            elif code not in (0, 5):
                problem = f"exit {code}"
            elif not within_memory(peak, GiB):
                problem = f"peak {peak / GiB:.2f} GiB"
            elif kind == "cut" and code != 5:
                problem = "a truncated file exited 0"
            elif code == 5 and os.path.basename(slide_files[0]) not in err and name not in err:
                problem = "exit 5 without naming the file"
            elif code == 0:
                missing = clean - {key[1:] for key in read_store(store)[0]} - named_corrupt(err)
                if missing:
                    problem = f"{len(missing)} tiles of the clean file neither written nor named: {sorted(missing)[:3]}"
            if problem:
                kept = os.path.join(work, "failed", f"{name}-{kind}{index}")
                shutil.copytree(case, kept)
                failures.append(f"{name} {kind} {index} ({kept}): {problem}: {last}")
            shutil.rmtree(case)
    print(f"{runs} damaged slides: exits {exits}, largest peak {worst_peak / (1 << 20):.0f} MiB, "
          f"most CPU {worst_cpu:.1f} s")
    assert not failures, "\n".join(failures)
    assert runs >= 200
    shutil.rmtree(work)


def test_fuzz_slides():
    main(TESSERA)

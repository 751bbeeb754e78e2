"""Fuzzing `tessera tile` with damaged slides of every format it reads (fixed seeds): Aperio SVS
(small.svs and a JPEG pyramid of CMU-1-Small-Region's pixels, through OpenSlide), generic tiled
TIFF (boxes.tiff, Deflate), BigTIFF (`tessera synth`), DICOM (the boxes series) and stripped
TIFF (kidney-ihc-stripped.tif, through libvips): bytes changed in the files' structure (TIFF
directories and tag values, DICOM headers, often to boundary values) and in their pixel data, and
files cut short. Each run exits 0 or 5, never by a signal or at the time limit, with a peak
resident size under 1 GiB (getrusage of the child, which on Linux also counts what this test
process held when it started the child: an upper bound); a truncated file is exit 5; exit 0 only
where every tile of the clean file was written or named as corrupt.

A second corpus edits the OME-XML of a 4-channel OME-TIFF (tifffile's, rewritten with
tifffile.tiffcomment; fixed seed): attributes of Pixels, Channel and TiffData set to boundary
values, signs, words and the other dimension orders, or removed; TiffData blocks added; Latin-1
bytes in a channel name; the XML cut short. Each is accepted, every channel of every tile then
one of the file's planes at that place, or refused with exit 5 naming the file, never with raw
library text."""
import json
import os
import random
import re
import shutil
import struct

import numpy as np
import openslide
import tifffile

from data_tools import HEADER, read_store, run, run_with_usage, within_memory, workdir
from slide_files import APERIO, ome_tiff, pyramid, write_tiff

TESSERA = os.environ.get("TESSERA_BINARY", "build/tools/tessera")
SLIDES = os.path.normpath(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared",
                                       "testdata", "slides"))
GiB = 1 << 30
MUTANTS, CUTS = 30, 6  # per source: 7 sources, 252 runs
TIME_LIMIT = 300  # seconds of wall time per run: a hang, not a slow run, reaches it
INTERESTING = [0, 1, 2, 0x7F, 0x80, 0xFF, 0xFFFF, 0x10000, 0x7FFFFFFF, 0xFFFFFFFF]
OME_MUTANTS = 80
OME_ATTRIBUTES = ["DimensionOrder", "Type", "SizeX", "SizeY", "SizeC", "SizeZ", "SizeT", "PhysicalSizeX",
                  "SamplesPerPixel", "Name", "IFD", "PlaneCount", "FirstC", "FirstZ", "FirstT"]
OME_VALUES = [0, 1, 2, 3, 4, 5, 255, 256, -1, -4, 2 ** 31, 2 ** 32, 2 ** 63 - 1, 2 ** 64, "", "abc", "1e9", "0x10",
              " 3 ", "+2", "2.5", "nan", "XYZCT", "XYZTC", "XYCTZ", "XYCZT", "XYTCZ", "XYTZC", "XYCCT", "XYZT", "CZTXY",
              "uint8", "uint16", "int8", "float", "uint12"]
RAW = ("basic_string", "max_size", "json.exception", "std::", "bad_alloc", "terminate")


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


def mutate_ome(xml, generator):
    """The OME-XML with one to three edits (OME_ATTRIBUTES set to OME_VALUES or removed, TiffData
    added, Latin-1 in a name, the text cut short); bytes, since Latin-1 is not UTF-8."""
    for _ in range(generator.randint(1, 3)):
        kind = generator.random()
        if kind < 0.6:
            name = generator.choice(OME_ATTRIBUTES)
            found = list(re.finditer(rf'\b{name}="[^"]*"', xml))
            if found:
                match = generator.choice(found)
                value = generator.choice(OME_VALUES + [None])
                xml = xml[:match.start()] + ("" if value is None else f'{name}="{value}"') + xml[match.end():]
        elif kind < 0.75:
            extra = " ".join(f'{name}="{generator.choice(OME_VALUES[:12])}"'
                             for name in generator.sample(["IFD", "PlaneCount", "FirstC", "FirstZ", "FirstT"], 2))
            xml = xml.replace("</Pixels>", f"<TiffData {extra}/></Pixels>")
        elif kind < 0.85:
            xml = xml.replace('SamplesPerPixel="1" Name="', 'SamplesPerPixel="1" Name="\xe9\xff', 1)
        else:
            xml = xml[:generator.randrange(len(xml) // 2, len(xml))]
    return xml.encode("latin-1")


def fuzz_ome(binary, work, store):
    """(runs, exits, failures, worst peak) of `tile` over OME_MUTANTS edits of one OME-TIFF's XML."""
    generator = random.Random(34)
    data = np.full((4, 256, 256), 4, np.uint8)
    data[:, 64:192, 32:224] = np.random.default_rng(34).integers(40, 250, size=(4, 128, 192), dtype=np.uint8)
    clean = ome_tiff(os.path.join(work, "clean", "panel.ome.tif"), data, names=["DAPI", "CD3", "CD8", "CD20"],
                     tile=(64, 64))
    with tifffile.TiffFile(clean) as tiff:
        xml = tiff.pages[0].description
    runs, exits, failures, worst_peak = 0, {}, [], 0
    for index in range(OME_MUTANTS):
        case = os.path.join(work, f"ome-{index}.ome.tif")
        shutil.copy(clean, case)
        tifffile.tiffcomment(case, mutate_ome(xml, generator))
        code, _, err, peak, _, killed = tile(binary, case, store, ["--size", 64])
        runs += 1
        exits[code] = exits.get(code, 0) + 1
        worst_peak = max(worst_peak, peak)
        last = err.strip().splitlines()[-1] if err.strip() else ""
        problem = None
        if killed or code not in (0, 5):
            problem = f"still running after {TIME_LIMIT} s" if killed else f"exit {code}"
        elif not within_memory(peak, GiB):
            problem = f"peak {peak / GiB:.2f} GiB"
        elif any(raw in err for raw in RAW):
            problem = "raw library text"
        elif code == 5 and os.path.basename(case) not in last:
            problem = "exit 5 without naming the file"
        elif code == 0:
            # Accepted: every channel of every tile is one of the file's planes there.
            for (_, _, row, column), value in read_store(store)[0].items():
                _, encoding, channels, _, width, height = HEADER.unpack_from(value)[:6]
                if encoding != 0:
                    problem = f"tile row {row} column {column} is JPEG, not the planes raw"
                    break
                tile_pixels = np.frombuffer(value[28:], np.uint8).reshape(height, width, channels)
                blocks = data[:, row * 64:(row + 1) * 64, column * 64:(column + 1) * 64]
                planes_there = [any(np.array_equal(tile_pixels[..., c], block) for block in blocks)
                                for c in range(channels)]
                if not all(planes_there):
                    problem = f"tile row {row} column {column} holds a channel that is none of the file's planes"
                    break
        if problem:
            kept = os.path.join(work, "failed", os.path.basename(case))
            os.makedirs(os.path.dirname(kept), exist_ok=True)
            shutil.copy(case, kept)
            failures.append(f"OME-XML mutant {index} ({kept}): {problem}: {last}")
        os.remove(case)
    return runs, exits, failures, worst_peak


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
    ome_runs, ome_exits, ome_failures, ome_peak = fuzz_ome(binary, work, store)
    print(f"{ome_runs} OME-XML mutants: exits {ome_exits}, largest peak {ome_peak / (1 << 20):.0f} MiB")
    failures += ome_failures
    assert not failures, "\n".join(failures)
    assert runs >= 200 and ome_runs == OME_MUTANTS and ome_exits.get(0) and ome_exits.get(5)
    shutil.rmtree(work)


def test_fuzz_slides():
    main(TESSERA)

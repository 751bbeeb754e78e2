#!/usr/bin/python3
"""Write a learnable, histology-like patch classification task as a PCam-layout HDF5 file.

Each patch is a pink (eosin-like) background with purple (haematoxylin-like) "nuclei":
soft elliptical blobs at random places. Higher classes have more, larger and darker nuclei,
but the per-class distributions overlap, and every patch gets stain (colour) jitter,
brightness jitter, low-frequency stain unevenness and pixel noise, so the task is learnable
without being trivial. Classes are balanced (counts differ by at most one) and shuffled.

Output: `x` uint8 [N,S,S,3] (RGB), `y` uint8 [N].
Example: /usr/bin/python3 tools/make_patch_task.py --out task.h5 --count 4000 --size 32 --seed 1
"""
import argparse
import sys
import time

import h5py
import numpy as np

BACKGROUND_RGB = np.array([232.0, 178.0, 206.0])  # eosin pink
NUCLEUS_RGB = np.array([72.0, 38.0, 120.0])       # haematoxylin purple
MAX_NUCLEI = 16
CHUNK = 512  # patches rendered at once; bounds memory at larger sizes

# Per-class nucleus statistics, for the lowest and the highest class; classes in between
# are interpolated linearly. Radii are in units of size/32 pixels.
LOW = {"count": 3.5, "radius": (1.3, 2.5), "darkness": (0.45, 0.80)}
HIGH = {"count": 6.0, "radius": (1.9, 3.1), "darkness": (0.60, 0.92)}


def class_parameters(labels, classes):
    """Per-patch nucleus count mean, radius range and darkness range, from the class."""
    t = labels / max(classes - 1, 1)
    def lerp(low, high):
        return low + (high - low) * t
    return {
        "count": lerp(LOW["count"], HIGH["count"]),
        "radius": tuple(lerp(lo, hi) for lo, hi in zip(LOW["radius"], HIGH["radius"])),
        "darkness": tuple(lerp(lo, hi) for lo, hi in zip(LOW["darkness"], HIGH["darkness"])),
    }


def nucleus_coverage(rng, labels, classes, size):
    """Darkness-weighted nucleus coverage in [0,1], shape [n,size,size]."""
    n = labels.shape[0]
    p = class_parameters(labels, classes)
    scale = size / 32.0
    count = np.minimum(rng.poisson(p["count"]), MAX_NUCLEI)
    present = np.arange(MAX_NUCLEI)[None, :] < count[:, None]               # [n,B]
    def per_nucleus(low, high):
        return rng.uniform(low[:, None], high[:, None], size=(n, MAX_NUCLEI))
    radius = per_nucleus(*p["radius"]) * scale
    darkness = per_nucleus(*p["darkness"]) * present
    aspect = rng.uniform(0.7, 1.3, size=(n, MAX_NUCLEI))
    angle = rng.uniform(0.0, np.pi, size=(n, MAX_NUCLEI))
    cy, cx = (rng.uniform(-2.0, size + 2.0, size=(2, n, MAX_NUCLEI)))

    def per_pixel(a):  # [n,B] -> [n,B,1,1] float32, to broadcast over the patch
        return a.astype(np.float32)[:, :, None, None]
    grid = np.arange(size, dtype=np.float32) + 0.5
    dy = grid[None, None, :, None] - per_pixel(cy)                         # [n,B,S,1]
    dx = grid[None, None, None, :] - per_pixel(cx)                         # [n,B,1,S]
    cos, sin = per_pixel(np.cos(angle)), per_pixel(np.sin(angle))
    u = (dx * cos + dy * sin) * per_pixel(aspect)
    v = (dy * cos - dx * sin) / per_pixel(aspect)
    distance = np.sqrt(u * u + v * v)                                       # [n,B,S,S]
    edge = np.minimum((distance - per_pixel(radius)) / np.float32(0.6 * scale), 30.0)
    soft_disc = 1.0 / (1.0 + np.exp(edge))
    return (soft_disc * per_pixel(darkness)).max(axis=1)


def stain_unevenness(rng, n, size):
    """Smooth multiplicative field ~1 +- 0.08: a random low-frequency cosine per patch."""
    grid = np.arange(size) / size
    freq_y, freq_x = rng.uniform(0.5, 2.0, size=(2, n, 1, 1))
    phase_y, phase_x = rng.uniform(0.0, 2 * np.pi, size=(2, n, 1, 1))
    field = (np.cos(2 * np.pi * freq_y * grid[None, :, None] + phase_y)
             * np.cos(2 * np.pi * freq_x * grid[None, None, :] + phase_x))
    return 1.0 + 0.08 * field


def render(rng, labels, classes, size):
    """RGB uint8 patches [n,size,size,3] for the given labels."""
    n = labels.shape[0]
    coverage = nucleus_coverage(rng, labels, classes, size)[..., None]      # [n,S,S,1]
    stain = rng.normal(1.0, 0.06, size=(n, 1, 1, 3))                         # colour jitter
    background = BACKGROUND_RGB * stain * rng.normal(1.0, 0.04, size=(n, 1, 1, 1))
    nucleus = NUCLEUS_RGB * stain
    image = background * (1.0 - coverage) + nucleus * coverage
    image = image * stain_unevenness(rng, n, size)[..., None]
    image += rng.normal(0.0, 12.0, size=image.shape)
    return np.clip(np.rint(image), 0, 255).astype(np.uint8)


def balanced_labels(rng, count, classes):
    """count labels, each class count//classes or one more times, in random order."""
    return rng.permutation(np.arange(count) % classes).astype(np.uint8)


def make_task(count, size, seed, classes):
    """(x uint8 [count,size,size,3], y uint8 [count]) for a seed; deterministic."""
    rng = np.random.default_rng(seed)
    y = balanced_labels(rng, count, classes)
    x = np.empty((count, size, size, 3), dtype=np.uint8)
    chunk = max(1, CHUNK * 32 * 32 // (size * size))
    for start in range(0, count, chunk):
        x[start:start + chunk] = render(rng, y[start:start + chunk], classes, size)
    return x, y


def write_patch_file(path, x, y, seed):
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=x, chunks=(min(len(x), 64),) + x.shape[1:])
        f.create_dataset("y", data=y)
        f.attrs["generator"] = "tools/make_patch_task.py"
        f.attrs["seed"] = seed


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--out", required=True, help="HDF5 file to write (overwritten)")
    parser.add_argument("--count", type=int, required=True, help="number of patches N")
    parser.add_argument("--size", type=int, default=32, help="patch side S in pixels (default 32)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--classes", type=int, default=2, help="number of classes (default 2)")
    args = parser.parse_args(argv)
    if args.count < 1:
        parser.error(f"--count must be at least 1, got {args.count}")
    if args.size < 4:
        parser.error(f"--size must be at least 4, got {args.size}")
    if not 2 <= args.classes <= 255:
        parser.error(f"--classes must be in 2..255, got {args.classes}")
    return args


def main(argv=None):
    args = parse_args(argv)
    started = time.perf_counter()
    x, y = make_task(args.count, args.size, args.seed, args.classes)
    write_patch_file(args.out, x, y, args.seed)
    per_class = np.bincount(y, minlength=args.classes).tolist()
    print(f"wrote {args.out}: x uint8 {list(x.shape)}, y uint8 [{len(y)}], "
          f"per class {per_class}, {time.perf_counter() - started:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

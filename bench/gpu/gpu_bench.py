"""Tessera beside PyTorch on one GPU, in one run; prints one JSON object (and writes it to --out).

- GEMM TFLOP/s, a row-major 4096^3 product of random values: tessera's kernel (bench_gemm
  --gemm) in fp32 and fp16 (fp32 sums), PyTorch's torch.mm in fp32 (TF32 off: the same
  arithmetic) and fp16;
- resnet18 training images/s at batch 64 on 3x224x224 (2 classes, SGD with momentum): `tessera
  train` fp32 and --precision fp16 (the second epoch, after a warm-up epoch: its images/s includes
  reading the patch file), PyTorch fp32 (TF32 off, and its default with TF32 convolutions as a
  note) and AMP fp16 with channels_last (device time of a step, CUDA events);
- resnet50 layer3 (CLAM's features) tiles/s: `tessera extract` over the tiles of a synthetic
  slide (reading, decoding and the HDF5 writes included) in fp32 and fp16, PyTorch's trunk fp32
  and AMP channels_last on device tensors;
- ViT-L/16 of UNI's shape (`--encoder uni`, random weights) tiles/s: `tessera extract` over the
  same tiles in fp32 and fp16, PyTorch's plain reference of it (tools/vit_reference.py) fp32 and
  AMP on device tensors, and a TESSERA_PROFILE of the fp32 run; each extraction with its device
  time and busy and data-wait fractions;
- TESSERA_PROFILE of one resnet18 training step in fp32 and fp16 (device time per kernel), and
  the driver's statistics of every pipeline it makes (TESSERA_PIPELINE_STATISTICS: registers,
  spills, shared memory, where the driver tells);
- a sweep of the GEMM's shared-memory tiles (TESSERA_GEMM_TILES: outputs a side per invocation,
  reduction depth, invocations) at 4096^3 in fp32 and fp16, to choose the defaults from.
PyTorch figures are medians of CUDA-event times after warm-up. Where tessera's device is a CPU
(lavapipe: a check of the bundle without a GPU) every size shrinks so that it finishes (as with
--quick); where PyTorch has no CUDA it runs on the CPU (AMP as bfloat16 autocast, timed by the
clock), so that every path runs; those figures check the script, they measure nothing.

Run: python3 bench/gpu/gpu_bench.py --root TREE --out bench.json [--quick] [--deadline EPOCH]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np

SIZES = {"gemm": 4096, "batch": 64, "side": 224, "steps": 6, "slide": 6144, "extract_batch": 64}
QUICK = {"gemm": 256, "batch": 2, "side": 64, "steps": 2, "slide": 1024, "extract_batch": 4}


class Tessera:
    def __init__(self, root, deadline):
        self.root, self.deadline = root, deadline
        self.binary = os.path.join(root, "build", "tools", "tessera")

    def run(self, args, env=None, binary=None):
        timeout = max(10, self.deadline - time.time())
        return subprocess.run([binary or self.binary, *args], capture_output=True, text=True, check=True,
                              timeout=timeout, env=dict(os.environ, **(env or {})))


def last_json(text, key):
    for line in reversed(text.splitlines()):
        if line.startswith("{") and key in line:
            return json.loads(line)
    raise RuntimeError(f"no JSON line with {key} in:\n{text[-2000:]}")


def attempt(results, key, function, *args):
    """results[key] = function(*args), or the error, so one failure leaves the other figures."""
    started = time.time()
    try:
        results[key] = function(*args)
    except subprocess.CalledProcessError as error:
        results[key] = {"error": f"exit {error.returncode}", "stderr_tail": (error.stderr or "")[-3000:]}
    except Exception as error:  # noqa: BLE001 (a benchmark reports what broke and goes on)
        results[key] = {"error": f"{type(error).__name__}: {error}"}
    print(f"{key}: {time.time() - started:.1f} s {json.dumps(results[key])[:300]}", file=sys.stderr, flush=True)


# 8x8 outputs spilled on an H200 and took tens of seconds a pipeline to compile: not swept.
GEMM_TILES = ("4,16,256", "4,8,256", "4,16,128", "4,8,128", "2,16,256", "4,16,64")


def statistics_lines(stderr):
    """The pipeline statistics a run printed (TESSERA_PIPELINE_STATISTICS), by kernel and constants."""
    lines = [json.loads(line) for line in stderr.splitlines() if '"event":"pipeline_statistics"' in line]
    return {f"{line['kernel']} {line['constants']}": line["executables"] for line in lines}


def tessera_gemm(tessera, n, precision, env=None):
    out = tessera.run(["--gemm", str(n), "--precision", precision], env=env,
                      binary=os.path.join(tessera.root, "build", "bench", "bench_gemm"))
    result = json.loads(out.stdout)
    if env and "TESSERA_PIPELINE_STATISTICS" in env:
        result["pipeline_statistics"] = statistics_lines(out.stderr)
    return result


def gemm_tile_sweep(tessera, n):
    """TFLOP/s of the n^3 product under each TESSERA_GEMM_TILES, fp32 and fp16."""
    sweep = {}
    for tiles in GEMM_TILES:
        for precision in ("fp32", "fp16"):
            if time.time() > tessera.deadline - 30:
                return sweep
            try:
                figure = tessera_gemm(tessera, n, precision, {"TESSERA_GEMM_TILES": tiles})["tflops"]
            except subprocess.CalledProcessError as error:
                figure = f"exit {error.returncode}: {(error.stderr or '')[-300:]}"
            sweep.setdefault(tiles, {})[precision] = figure
    return sweep


def patch_file(work, batch, side, steps):
    path = os.path.join(work, f"patches-{batch}-{side}.h5")
    if not os.path.exists(path):
        rng = np.random.default_rng(0)
        with h5py.File(path, "w") as f:
            f["x"] = rng.integers(0, 256, (batch * steps, side, side, 3), dtype=np.uint8)
            f["y"] = rng.integers(0, 2, batch * steps, dtype=np.uint8)
    return path


def tessera_train(tessera, work, sizes, precision, epochs, profile):
    data = patch_file(work, sizes["batch"], sizes["side"], sizes["steps"] if epochs > 1 else 1)
    run = tessera.run(["train", "--data", data, "--model", "resnet18", "--batch", str(sizes["batch"]),
                       "--epochs", str(epochs), "--val-fraction", "0", "--optimizer", "sgd", "--momentum", "0.9",
                       "--lr", "0.01", "--precision", precision, "--workers", str(min(8, os.cpu_count() or 1))],
                      env={"TESSERA_PROFILE": "1", "TESSERA_PIPELINE_STATISTICS": "1"} if profile else None)
    epoch_lines = [json.loads(line) for line in run.stderr.splitlines() if '"event":"epoch"' in line]
    result = {"batch": sizes["batch"], "side": sizes["side"], "images_per_second": epoch_lines[-1]["images_per_second"],
              "first_epoch_images_per_second": epoch_lines[0]["images_per_second"]}
    if profile:
        result["profile"] = last_json(run.stderr, '"event":"profile"')
        result["pipeline_statistics"] = statistics_lines(run.stderr)
    return result


def tessera_extract(tessera, work, sizes, precision):
    slide, store = os.path.join(work, "slide.tiff"), os.path.join(work, "tiles.lmdb")
    if not os.path.exists(store):
        # At 0.5 um/px, the magnification ViT encoders read (tessera_vit_extract reads this store too).
        tessera.run(["synth", slide, "--width", str(sizes["slide"]), "--height", str(sizes["slide"]), "--seed", "1",
                     "--mpp", "0.5"])
        tessera.run(["tile", slide, "--out", store, "--size", "224"])
    run = tessera.run(["extract", "--model", "resnet50", "--random-weights", "--layer", "layer3", "--tiles", store,
                       "--out", os.path.join(work, "features-" + precision), "--batch", str(sizes["extract_batch"]),
                       "--precision", precision])
    return extraction_figures(run, sizes)


def extraction_figures(run, sizes):
    """tiles/s, and where the run's time went: the device busy, or waiting for tiles."""
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    return {"batch": sizes["extract_batch"], "tiles": summary["tiles"],
            "tiles_per_second": summary["features_per_second"], "seconds": summary["seconds"],
            "device_seconds": summary["device_seconds"], "device_busy_fraction": summary["device_busy_fraction"],
            "data_wait_fraction": summary["data_wait_fraction"]}


def tessera_vit_extract(tessera, work, sizes, precision, profile=False):
    store = os.path.join(work, "tiles.lmdb")  # tessera_extract made it
    run = tessera.run(["extract", "--encoder", "uni", "--random-weights", "--tiles", store,
                       "--out", os.path.join(work, "uni-" + precision + ("-profile" if profile else "")),
                       "--batch", str(sizes["extract_batch"]), "--precision", precision],
                      env={"TESSERA_PROFILE": "1", "TESSERA_PIPELINE_STATISTICS": "1"} if profile else None)
    result = extraction_figures(run, sizes)
    if profile:
        result["profile"] = last_json(run.stderr, '"event":"profile"')
        result["pipeline_statistics"] = statistics_lines(run.stderr)
    return result


def torch_figures(root, sizes, results):
    import torch  # noqa: PLC0415 (absent where the bundle is checked without a GPU)
    sys.path.insert(0, os.path.join(root, "tools"))
    from tessera_presets import Resnet50Trunc, build_preset  # noqa: PLC0415
    from vit_reference import VisionTransformer  # noqa: PLC0415

    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    torch.backends.cudnn.benchmark = True
    results["device"] = torch.cuda.get_device_name(device) if cuda else "cpu (no CUDA: a check of this script)"
    results["torch"], results["cuda"] = torch.__version__, torch.version.cuda
    # fp16 autocast and matrix products are CUDA's; a CPU's are bfloat16.
    amp_dtype = torch.float16 if cuda else torch.bfloat16
    if hasattr(torch.amp, "GradScaler"):
        grad_scaler = torch.amp.GradScaler
    else:  # before torch 2.3 (Debian's 1.13, where the script is checked)
        grad_scaler = lambda _, **options: torch.cuda.amp.GradScaler(**options)  # noqa: E731

    def median_ms(step, warmup=5 if cuda else 1, iterations=20 if cuda else 3):
        for _ in range(warmup):
            step()
        times = []
        for _ in range(iterations):
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                step()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end))
            else:
                start = time.perf_counter()
                step()
                times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)

    def tf32(on):
        torch.backends.cuda.matmul.allow_tf32 = on
        torch.backends.cudnn.allow_tf32 = on

    def gemm(dtype):
        n = sizes["gemm"]
        a = torch.rand(n, n, device=device, dtype=dtype) * 2 - 1
        b = torch.rand(n, n, device=device, dtype=dtype) * 2 - 1
        return {"n": n, "dtype": str(dtype), "tflops": 2 * n ** 3 / (median_ms(lambda: torch.mm(a, b)) / 1e3) / 1e12}

    def resnet18_train(amp, channels_last):
        torch.manual_seed(0)
        batch, side = sizes["batch"], sizes["side"]
        model = build_preset("resnet18", 2, (side, side)).to(device)
        x = torch.randn(batch, 3, side, side, device=device)
        y = torch.randint(0, 2, (batch,), device=device)
        if channels_last:
            model, x = model.to(memory_format=torch.channels_last), x.to(memory_format=torch.channels_last)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        scaler = grad_scaler("cuda", enabled=amp and cuda)

        def step():
            with torch.autocast(device.type, dtype=amp_dtype, enabled=amp):
                loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()

        return {"batch": batch, "side": side, "images_per_second": batch / (median_ms(step) / 1e3)}

    def resnet50_extract(amp):
        batch = sizes["extract_batch"]
        model = Resnet50Trunc(build_preset("resnet50", 1000, (224, 224))).to(device).eval()
        x = torch.randn(batch, 3, 224, 224, device=device)
        if amp:
            model, x = model.to(memory_format=torch.channels_last), x.to(memory_format=torch.channels_last)

        def step():
            with torch.no_grad(), torch.autocast(device.type, dtype=amp_dtype, enabled=amp):
                model(x)

        return {"batch": batch, "tiles_per_second": batch / (median_ms(step) / 1e3)}

    def vit_extract(amp):
        batch = sizes["extract_batch"]
        model = VisionTransformer({"preset": "uni"}).to(device).eval()
        x = torch.randn(batch, 3, 224, 224, device=device)

        def step():
            with torch.no_grad(), torch.autocast(device.type, dtype=amp_dtype, enabled=amp):
                model(x)

        return {"batch": batch, "tiles_per_second": batch / (median_ms(step) / 1e3)}

    tf32(False)
    attempt(results, "gemm_fp32", gemm, torch.float32)
    attempt(results, "gemm_fp16", gemm, amp_dtype)
    attempt(results, "resnet18_train_fp32", resnet18_train, False, False)
    attempt(results, "resnet18_train_amp_channels_last", resnet18_train, True, True)
    attempt(results, "resnet50_layer3_extract_fp32", resnet50_extract, False)
    attempt(results, "resnet50_layer3_extract_amp_channels_last", resnet50_extract, True)
    if cuda:  # minutes on a CPU
        attempt(results, "vit_uni_extract_fp32", vit_extract, False)
        attempt(results, "vit_uni_extract_amp", vit_extract, True)
    tf32(True)
    attempt(results, "resnet18_train_fp32_default_tf32", resnet18_train, False, False)
    if cuda:  # tessera's runs that follow get the memory back
        torch.cuda.empty_cache()


def ratio(ours, theirs, key):
    if isinstance(ours, dict) and isinstance(theirs, dict) and ours.get(key) and theirs.get(key):
        return round(ours[key] / theirs[key], 3)
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", required=True, help="the bundle's source tree (build/, tools/)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--quick", action="store_true", help="small sizes, for a check on a CPU device")
    parser.add_argument("--deadline", type=float, default=time.time() + 3600, help="epoch seconds")
    args = parser.parse_args()
    tessera = Tessera(os.path.abspath(args.root), args.deadline)
    result = {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "tessera": {}, "pytorch": {}}
    ours, theirs = result["tessera"], result["pytorch"]

    def measure(results, key, function, *function_args):
        """One figure, unless the deadline has passed; the file is rewritten after each, so a run
        cut short keeps what it measured."""
        if time.time() > args.deadline - 10:
            results[key] = {"error": "not run: out of time"}
        else:
            attempt(results, key, function, *function_args)
        with open(args.out, "w") as out:
            json.dump(result, out, indent=1)

    measure(result, "info", lambda: json.loads(tessera.run(["info", "--json"]).stdout))
    on_cpu = [d.get("type") for d in result["info"].get("devices", [{}])[:1]] == ["cpu"]
    sizes = result["sizes"] = QUICK if args.quick or on_cpu else SIZES
    # PyTorch first (a minute on a GPU), then tessera's figures, the targets' first.
    try:
        torch_figures(tessera.root, sizes, theirs)
    except Exception as error:  # noqa: BLE001
        theirs["unavailable"] = f"{type(error).__name__}: {error}"
    with tempfile.TemporaryDirectory() as work:
        measure(ours, "gemm_fp16", tessera_gemm, tessera, sizes["gemm"], "fp16")
        for precision in ("fp16", "fp32"):
            measure(ours, "resnet18_train_" + precision, tessera_train, tessera, work, sizes, precision, 2, False)
        measure(ours, "gemm_fp32", tessera_gemm, tessera, sizes["gemm"], "fp32", {"TESSERA_PIPELINE_STATISTICS": "1"})
        measure(ours, "gemm_tiles", gemm_tile_sweep, tessera, sizes["gemm"])
        for precision in ("fp16", "fp32"):
            measure(ours, "resnet18_step_profile_" + precision, tessera_train, tessera, work, sizes, precision, 1, True)
        for precision in ("fp16", "fp32"):
            measure(ours, "resnet50_layer3_extract_" + precision, tessera_extract, tessera, work, sizes, precision)
        if sizes is SIZES:
            for precision in ("fp16", "fp32"):
                measure(ours, "vit_uni_extract_" + precision, tessera_vit_extract, tessera, work, sizes, precision)
            measure(ours, "vit_uni_extract_profile_fp32", tessera_vit_extract, tessera, work, sizes, "fp32", True)
    result["ratios"] = {
        "gemm_fp32": ratio(ours.get("gemm_fp32"), theirs.get("gemm_fp32"), "tflops"),
        "gemm_fp16": ratio(ours.get("gemm_fp16"), theirs.get("gemm_fp16"), "tflops"),
        "resnet18_train_fp32": ratio(ours.get("resnet18_train_fp32"), theirs.get("resnet18_train_fp32"),
                                     "images_per_second"),
        "resnet18_train_fp16_vs_amp": ratio(ours.get("resnet18_train_fp16"),
                                            theirs.get("resnet18_train_amp_channels_last"), "images_per_second"),
        "resnet50_layer3_extract_fp32": ratio(ours.get("resnet50_layer3_extract_fp32"),
                                              theirs.get("resnet50_layer3_extract_fp32"), "tiles_per_second"),
        "resnet50_layer3_extract_fp16_vs_amp": ratio(ours.get("resnet50_layer3_extract_fp16"),
                                                     theirs.get("resnet50_layer3_extract_amp_channels_last"),
                                                     "tiles_per_second"),
        "vit_uni_extract_fp32": ratio(ours.get("vit_uni_extract_fp32"), theirs.get("vit_uni_extract_fp32"),
                                      "tiles_per_second"),
        "vit_uni_extract_fp16_vs_amp": ratio(ours.get("vit_uni_extract_fp16"), theirs.get("vit_uni_extract_amp"),
                                             "tiles_per_second"),
    }
    with open(args.out, "w") as out:
        json.dump(result, out, indent=1)
    print(json.dumps(result["ratios"]))


if __name__ == "__main__":
    main()

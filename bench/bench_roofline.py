"""Where tessera's longest kernels stand against this machine's ceilings (issue 36): prints one
JSON object.

The ceilings: the cores' single-precision FMA peak, computed from lscpu (cores, clock, vector
width: llvmpipe compiles for 8-float AVX2 vectors, 2 FMA pipes a core assumed, as on every AMD
core since Zen and Intel's since Haswell; lscpu does not say) and measured by an FMA loop, and
memory bandwidth from a copy far past the last-level cache (`build/bench/bench_cpu_limits`);
torch.matmul's GFLOPS at 1024^3 on as many threads as cores, the peer of `bench_gemm`, beside.

The workloads, each under TESSERA_PROFILE=1 (device seconds per layer and kernel): resnet18
training (batch 16, 224 px, 2 steps), resnet50 layer3 extraction (CLAM's features, batch 8) and
ViT-L/16 extraction (`--encoder uni`, random weights, batch 4). For each workload's longest
kernels: the share of its device time, GFLOPS (the layer's FLOPs, from its shapes, per
command) and GB/s (the least bytes the kernel must move: its operands read once and its result
written once, fp32), and each as a fraction of the measured ceilings. A kernel whose layer has
no cost model here (the loss, the optimizer) reports its time alone.

The machine is shared: `load` holds the load average before and after, and every figure is
noisy in proportion (a second process on a 2-core machine halves a figure).

With `--only attention`: ViT-L's attention kernel at 197, 261 and 785 tokens (UNI, Hibou-L,
CONCH v1.5; random weights, 4 tiles in one batch), its GFLOPS beside the qkv and proj layers'.

Run: /usr/bin/python3 bench/bench_roofline.py --build build [--longest 8] [--only KIND ...] [--out FILE]
"""
import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np

FLOAT_BYTES = 4
FMA_PIPES_ASSUMED = 2
LLVMPIPE_VECTOR_FLOATS = 8


def lscpu():
    fields = {}
    for line in subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines():
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields


def clock_ghz(fields):
    """The cores' clock: lscpu's maximum where it gives one, else /proc/cpuinfo's (under a
    hypervisor the TSC's, a lower bound of what the cores reach)."""
    if fields.get("CPU max MHz"):
        return float(fields["CPU max MHz"]) / 1e3, "lscpu CPU max MHz"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("cpu MHz"):
                return float(line.split(":")[1]) / 1e3, "/proc/cpuinfo cpu MHz"
    raise RuntimeError("no clock in lscpu or /proc/cpuinfo")


def machine_limits(build):
    fields = lscpu()
    flags = set(fields.get("Flags", "").split())
    cores = int(fields["CPU(s)"])
    ghz, clock_source = clock_ghz(fields)
    per_core = FMA_PIPES_ASSUMED * LLVMPIPE_VECTOR_FLOATS * 2 * ghz
    measured = json.loads(subprocess.run([os.path.join(build, "bench", "bench_cpu_limits")], capture_output=True,
                                         text=True, check=True).stdout)
    return {
        "cpu": fields.get("Model name"), "cores": cores, "clock_ghz": ghz, "clock_source": clock_source,
        "avx2": "avx2" in flags, "avx512f": "avx512f" in flags, "fma": "fma" in flags,
        "l3": fields.get("L3 cache"),
        "fma_peak_gflops_computed": {
            "per_core": round(per_core, 1), "all_cores": round(per_core * cores, 1),
            "how": f"{FMA_PIPES_ASSUMED} FMA pipes (assumed) x {LLVMPIPE_VECTOR_FLOATS} floats (llvmpipe's AVX2 "
                   "vectors; AVX-512 on Zen 4 is two 256-bit halves, no more FMAs a cycle) x 2 FLOPs x clock"},
        "measured": measured,
    }


def torch_matmul_gflops(threads, n=1024):
    import torch
    torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    for _ in range(3):
        torch.matmul(a, b)
    best = 0.0
    for _ in range(10):
        start = time.perf_counter()
        torch.matmul(a, b)
        best = max(best, 2 * n ** 3 / (time.perf_counter() - start) / 1e9)
    return {"n": n, "threads": threads, "best_gflops": round(best, 1), "torch": torch.__version__}


# Cost models: layer name -> {"forward": (flops, bytes), "backward ...": ...} per command, at the
# workload's batch. Names are PyTorch's (torchvision's resnets) and timm's (ViTs), as tessera's.

def conv_costs(batch, cin, cout, kernel, out_hw, in_hw):
    macs = batch * cout * out_hw[0] * out_hw[1] * cin * kernel[0] * kernel[1]
    x = batch * cin * in_hw[0] * in_hw[1] * FLOAT_BYTES
    y = batch * cout * out_hw[0] * out_hw[1] * FLOAT_BYTES
    w = cout * cin * kernel[0] * kernel[1] * FLOAT_BYTES
    return {"conv2d_forward": (2 * macs, x + w + y), "conv2d_backward_data": (2 * macs, y + w + x),
            "conv2d_backward_weight": (2 * macs, x + y + w)}


def elementwise_costs(batch_shape_in, batch_shape_out):
    """A kernel that reads its input and writes its output once: bytes only."""
    return (0, (int(np.prod(batch_shape_in)) + int(np.prod(batch_shape_out))) * FLOAT_BYTES)


def resnet_costs(model_name, batch, side):
    """Per layer of torchvision's resnet: conv kernels' FLOPs and bytes, and bytes of the
    elementwise layers (batch norm, ReLU, pooling), from the shapes forward hooks see."""
    import torch
    import torchvision
    model = getattr(torchvision.models, model_name)(num_classes=2)
    costs = {}

    def hook(name):
        def record(module, inputs, output):
            x = inputs[0]
            if isinstance(module, torch.nn.Conv2d):
                costs[name] = conv_costs(batch, module.in_channels, module.out_channels, module.kernel_size,
                                         output.shape[2:], x.shape[2:])
            elif isinstance(module, torch.nn.Linear):
                flops = 2 * batch * module.in_features * module.out_features
                data = (x.numel() + output.numel() + module.weight.numel()) * FLOAT_BYTES
                costs[name] = {"gemm": (flops, data)}
            else:
                costs[name] = {"*": elementwise_costs(x.shape, output.shape)}
        return record

    for name, module in model.named_modules():
        if name and not list(module.children()):
            module.register_forward_hook(hook(name))
    with torch.no_grad():
        model(torch.zeros(batch, 3, side, side))
    return costs


def vit_costs(width, depth, patch, side, batch, mlp_ratio=4.0):
    tokens = (side // patch) ** 2 + 1
    hidden = int(width * mlp_ratio)
    rows = batch * tokens

    def linear(inp, out):
        return {"gemm": (2 * rows * inp * out, (rows * inp + inp * out + rows * out) * FLOAT_BYTES)}

    activation = rows * width * FLOAT_BYTES
    costs = {"patch_embed.proj": conv_costs(batch, 3, width, (patch, patch), (side // patch,) * 2, (side, side))}
    for b in range(depth):
        p = f"blocks.{b}."
        costs[p + "attn.qkv"] = linear(width, 3 * width)
        costs[p + "attn.proj"] = linear(width, width)
        costs[p + "mlp.fc1"] = linear(width, hidden)
        costs[p + "mlp.fc2"] = linear(hidden, width)
        # scores and the weighted sum: 2 products of tokens x tokens x width; q, k, v read, out written
        costs[p + "attn.attend"] = {"attention_forward": (4 * batch * tokens * tokens * width, 4 * activation)}
        for name in ("norm1", "norm2", "ls1", "ls2"):
            costs[p + name] = {"*": (0, 2 * activation)}
        for name in ("residual1", "residual2"):
            costs[p + name] = {"*": (0, 3 * activation)}
        costs[p + "mlp.act"] = {"*": (0, 2 * rows * hidden * FLOAT_BYTES)}
    return costs


# ViT-L encoders at the token counts of issue 36's attention item: (preset, tokens, tile px, um/px).
ATTENTION_ENCODERS = (("uni", 197, 224, 0.5), ("hibou-l", 261, 224, 0.5), ("conch-v1.5", 785, 448, 256 / 448))


def attention_against_products(profile, tokens, batch, width=1024):
    """The attention kernel's GFLOPS beside the qkv and proj layers' (the matrix kernels on the
    same activations), summed over the blocks: whether attention is within 2x of them."""
    totals = {"attend": [0.0, 0.0], "products": [0.0, 0.0]}
    rows = batch * tokens
    for entry in profile["kernels"]:
        if " prepare " in entry["name"]:  # the weights' repacking at load, once
            continue
        layer = entry["name"].split(" ")[0]
        if layer.endswith("attn.attend"):
            flops, kind = 4 * batch * tokens * tokens * width, "attend"
        elif layer.endswith("attn.qkv") or layer.endswith("attn.proj"):
            flops, kind = 2 * rows * width * (3 * width if layer.endswith("qkv") else width), "products"
        else:
            continue
        totals[kind][0] += flops * entry["commands"]
        totals[kind][1] += entry["seconds"]
    gflops = {kind: round(f / s / 1e9, 2) if s else None for kind, (f, s) in totals.items()}
    return {"tokens": tokens, "batch": batch, "attention_gflops": gflops["attend"],
            "qkv_and_proj_gflops": gflops["products"], "attention_seconds": round(totals["attend"][1], 2),
            "device_seconds": round(profile["seconds"], 2),
            "products_over_attention": round(gflops["products"] / gflops["attend"], 2) if gflops["attend"] else None}


def kernel_cost(costs, entry_name):
    """(flops, bytes) of one command of a profile entry "<layer> [backward ]<kernel>", or None."""
    parts = entry_name.split(" ")
    layer, kernel = parts[0], parts[-1]
    layer_costs = costs.get(layer)
    if layer_costs is None:
        return None
    for key in (kernel, re.sub(r"_(subgroup|tiled)$", "", kernel)):
        if key in layer_costs:
            return layer_costs[key]
    if "*" in layer_costs:
        flops, data = layer_costs["*"]
        # an elementwise backward reads the input and the output's gradient, writes the input's
        return (flops, data * 3 // 2) if "backward" in parts else (flops, data)
    return None


def synthetic_tiles(tessera, work, name, side, tile=224, mpp=0.5):
    """A tile store of every `tile` px tile of a synthetic side x side slide (tissue or not) at
    `mpp` um/px: by default 224 px at 0.5, what most ViT encoders read."""
    slide, store = os.path.join(work, name + ".tiff"), os.path.join(work, name + ".lmdb")
    subprocess.run([tessera, "synth", slide, "--width", str(side), "--height", str(side), "--seed", "1",
                    "--mpp", str(mpp)], check=True,
                   capture_output=True)
    subprocess.run([tessera, "tile", slide, "--out", store, "--size", str(tile), "--min-tissue", "0"], check=True,
                   capture_output=True)
    return store


def profiled(command, env_extra=None):
    run = subprocess.run(command, capture_output=True, text=True, env=dict(os.environ, TESSERA_PROFILE="1",
                                                                           **(env_extra or {})))
    if run.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({run.returncode}):\n{run.stderr[-3000:]}")
    for line in reversed(run.stderr.splitlines()):
        if '"event":"profile"' in line:
            return json.loads(line), run
    raise RuntimeError(f"no profile line from {' '.join(command)}")


def kind_of(entry_name):
    """The entry with block indices replaced by *: every block's fc1, every layer1 block's conv1."""
    return re.sub(r"^(blocks|layer\d)\.\d+\.", r"\1.*.", entry_name)


def rates(flops, data, seconds, limits):
    """GFLOPS and GB/s of `flops` and `data` bytes over `seconds`, and their fractions of the
    measured ceilings (all cores)."""
    peak = limits["measured"]["fma_gflops_all_cores"]
    bandwidth = limits["measured"]["copy_gbytes_per_second_all_cores"]
    row = {}
    if flops:
        row["gflops"] = round(flops / seconds / 1e9, 2)
        row["of_fma_peak"] = round(flops / seconds / 1e9 / peak, 3)
        row["flops_per_byte"] = round(flops / data, 1)
    row["gbytes_per_second"] = round(data / seconds / 1e9, 3)
    row["of_copy_bandwidth"] = round(data / seconds / 1e9 / bandwidth, 4)
    return row


def summarise(profile, costs, limits, longest):
    """The longest entries (layer and kernel) and the longest kinds (an entry summed over the
    blocks that repeat it), each with its share of the device time and its rates."""
    kinds, modelled = {}, [0, 0, 0.0]
    entries = []
    for entry in profile["kernels"]:
        cost = kernel_cost(costs, entry["name"])
        flops, data = (cost[0] * entry["commands"], cost[1] * entry["commands"]) if cost else (None, None)
        row = {"name": entry["name"], "share": round(entry["share"], 4), "seconds": round(entry["seconds"], 3),
               "commands": entry["commands"]}
        if cost and entry["seconds"] > 0:
            row.update(rates(flops, data, entry["seconds"], limits))
            modelled[0] += flops
            modelled[1] += data
            modelled[2] += entry["seconds"]
        entries.append(row)
        kind = kinds.setdefault(kind_of(entry["name"]), {"name": kind_of(entry["name"]), "share": 0.0, "seconds": 0.0,
                                                         "commands": 0, "flops": 0, "bytes": 0, "modelled": True})
        kind["share"] += entry["share"]
        kind["seconds"] += entry["seconds"]
        kind["commands"] += entry["commands"]
        if cost:
            kind["flops"] += flops
            kind["bytes"] += data
        else:
            kind["modelled"] = False
    longest_kinds = []
    for kind in sorted(kinds.values(), key=lambda k: -k["seconds"])[:longest]:
        row = {"name": kind["name"], "share": round(kind["share"], 4), "seconds": round(kind["seconds"], 3),
               "commands": kind["commands"]}
        if kind["modelled"] and kind["seconds"] > 0:
            row.update(rates(kind["flops"], kind["bytes"], kind["seconds"], limits))
        longest_kinds.append(row)
    return {"device_seconds": round(profile["seconds"], 2),
            "modelled": {"share": round(modelled[2] / profile["seconds"], 3),
                         **(rates(modelled[0], modelled[1], modelled[2], limits) if modelled[2] else {})},
            "longest_kinds": longest_kinds, "longest_kernels": entries[:longest]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--longest", type=int, default=8)
    parser.add_argument("--only", choices=["limits", "resnet18", "resnet50", "vit", "attention"], action="append",
                        help="attention: UNI, Hibou-L and CONCH v1.5 (197, 261, 785 tokens), not in the default set")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    tessera = os.path.join(args.build, "tools", "tessera")
    only = set(args.only or ["limits", "resnet18", "resnet50", "vit"])
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "host": platform.node(), "load_before": os.getloadavg(),
              "note": "shared machine: figures are noisy, a busy second core halves them; see load"}
    result["tessera_info"] = subprocess.run([tessera, "info"], capture_output=True, text=True).stdout.strip()[:2000]
    limits = machine_limits(args.build)
    result["limits"] = limits
    result["torch_matmul"] = torch_matmul_gflops(limits["cores"])
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="tessera-roofline-") as work:
        if "resnet18" in only:
            batch, side, steps = 16, 224, 2
            patches = os.path.join(work, "patches.h5")
            with h5py.File(patches, "w") as f:
                f["x"] = rng.integers(0, 256, (batch * steps, side, side, 3), dtype=np.uint8)
                f["y"] = rng.integers(0, 2, batch * steps, dtype=np.uint8)
            profile, _ = profiled([tessera, "train", "--data", patches, "--model", "resnet18", "--batch", str(batch),
                                   "--epochs", "1", "--val-fraction", "0", "--optimizer", "sgd", "--momentum", "0.9",
                                   "--lr", "0.01"])
            result["resnet18_train"] = {"batch": batch, "side": side, "steps": steps,
                                        **summarise(profile, resnet_costs("resnet18", batch, side), limits,
                                                    args.longest)}
        if "resnet50" in only:
            batch = 8
            store = synthetic_tiles(tessera, work, "r50", 1024)
            profile, _ = profiled([tessera, "extract", "--model", "resnet50", "--random-weights", "--layer", "layer3",
                                   "--tiles", store, "--out", os.path.join(work, "r50"), "--batch", str(batch)])
            result["resnet50_layer3_extract"] = {"batch": batch, **summarise(
                profile, resnet_costs("resnet50", batch, 224), limits, args.longest)}
        if "vit" in only:
            batch = 4  # a slide of 2 x 2 tiles: ViT-L takes seconds a tile here
            store = synthetic_tiles(tessera, work, "vit", 448)
            profile, _ = profiled([tessera, "extract", "--encoder", "uni", "--random-weights", "--tiles", store,
                                   "--out", os.path.join(work, "vit"), "--batch", str(batch)])
            result["vit_l16_extract"] = {"encoder": "uni (ViT-L/16, 224 px)", "batch": batch, **summarise(
                profile, vit_costs(1024, 24, 16, 224, batch), limits, args.longest)}
        if "attention" in only:
            result["attention_by_tokens"] = {}
            for encoder, tokens, tile, mpp in ATTENTION_ENCODERS:
                batch = 4
                store = synthetic_tiles(tessera, work, encoder, 2 * tile, tile, mpp)
                profile, _ = profiled([tessera, "extract", "--encoder", encoder, "--random-weights", "--tiles", store,
                                       "--out", os.path.join(work, encoder), "--batch", str(batch)])
                result["attention_by_tokens"][encoder] = attention_against_products(profile, tokens, batch)
    result["load_after"] = os.getloadavg()
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    sys.exit(main())

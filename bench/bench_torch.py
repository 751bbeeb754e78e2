#!/usr/bin/python3
"""PyTorch peer figures for tessera's benchmark; prints one JSON object on stdout.

Measures, with the same shapes as tessera's bench:
- GEMM GFLOPS for a 1024x1024 by 1024x1024 float32 torch.mm (2*1024^3 flops per product);
- images/second for forward (eval mode, no grad) and for a training step (train mode,
  forward + softmax cross-entropy + backward + SGD step with momentum 0.9) of
  small-cnn (width 32, 2 classes) at batch 64 on 3x96x96, and
  resnet18 (1000 classes) at batch 16 on 3x224x224;
- tiles/second of CLAM's resnet50_trunc features (resnet50 through layer3, average pooled,
  1024 per tile; eval mode, no grad) at batch 8 on 3x224x224, the figure that `tessera
  extract --model resnet50 --layer layer3` is compared with (PyTorch's excludes tile reading).
Each figure takes the median over --iterations timed runs after --warmup untimed runs.
CPU runs use all cores (torch.set_num_threads(os.cpu_count())); the 1-minute load average
at the start is reported, since other work on the machine lowers the CPU figures.
Example: /usr/bin/python3 bench/bench_torch.py --device cpu
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torchvision
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
from tessera_presets import Resnet50Trunc, build_preset  # noqa: E402

GEMM_N = 1024
MODELS = (  # name, batch, side, classes
    ("small-cnn", 64, 96, 2),
    ("resnet18", 16, 224, 1000),
)


def synchronise(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(step, device, warmup, iterations):
    """Median wall time of step() over `iterations` runs, after `warmup` runs."""
    for _ in range(warmup):
        step()
    synchronise(device)
    times = []
    for _ in range(iterations):
        started = time.perf_counter()
        step()
        synchronise(device)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def gemm_gflops(device, warmup, iterations):
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(GEMM_N, GEMM_N, generator=generator).to(device)
    b = torch.randn(GEMM_N, GEMM_N, generator=generator).to(device)
    out = torch.empty(GEMM_N, GEMM_N, device=device)
    seconds = median_seconds(lambda: torch.mm(a, b, out=out), device, warmup, 4 * iterations)
    return 2 * GEMM_N ** 3 / seconds / 1e9


def model_images_per_second(name, batch, side, classes, device, warmup, iterations):
    """(forward images/s, training-step images/s) for one preset."""
    torch.manual_seed(0)
    model = build_preset(name, classes, (side, side)).to(device)
    x = torch.randn(batch, 3, side, side, device=device)
    y = torch.randint(0, classes, (batch,), device=device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def forward():
        with torch.no_grad():
            model(x)

    def train_step():
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    model.eval()
    forward_seconds = median_seconds(forward, device, warmup, iterations)
    model.train()
    train_seconds = median_seconds(train_step, device, warmup, iterations)
    return batch / forward_seconds, batch / train_seconds


def resnet50_trunc_tiles_per_second(batch, side, device, warmup, iterations):
    torch.manual_seed(0)
    model = Resnet50Trunc(build_preset("resnet50", 1000, (side, side))).to(device).eval()
    x = torch.randn(batch, 3, side, side, device=device)

    def extract():
        with torch.no_grad():
            model(x)

    return batch / median_seconds(extract, device, warmup, iterations)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where to run (default cpu)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs per figure (default 1)")
    parser.add_argument("--iterations", type=int, default=3,
                        help="timed runs per model figure, 4x that for GEMM (default 3)")
    return parser.parse_args(argv)


def device_description(device):
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({torch.get_num_threads()} threads)"


def main(argv=None):
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda: this torch has no usable CUDA device", file=sys.stderr)
        return 1
    device = torch.device(args.device)
    torch.set_num_threads(os.cpu_count())
    torch.backends.cudnn.benchmark = True
    result = {"framework": "pytorch", "torch": torch.__version__, "torchvision": torchvision.__version__,
              "device": device_description(device),
              "load_average_1min": round(os.getloadavg()[0], 2),
              "gemm_1024_gflops": round(gemm_gflops(device, args.warmup, args.iterations), 2)}
    for name, batch, side, classes in MODELS:
        forward, train = model_images_per_second(name, batch, side, classes, device,
                                                 args.warmup, args.iterations)
        key = name.replace("-", "_")
        result[key] = {"batch": batch, "input": [3, side, side], "classes": classes,
                       "forward_images_per_s": round(forward, 2),
                       "train_step_images_per_s": round(train, 2)}
    result["resnet50_layer3_extract"] = {
        "batch": 8, "input": [3, 224, 224], "feature_width": 1024,
        "tiles_per_s": round(resnet50_trunc_tiles_per_second(8, 224, device, args.warmup, args.iterations), 2)}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

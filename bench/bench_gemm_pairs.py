#!/usr/bin/python3
"""Two builds' GEMM kernels back to back, against PyTorch, on one machine.

Each round runs `bench_gemm --layouts` (the 1024^3 product in each layout) of the old build, of
the new one and PyTorch's torch.mm at 1024^3 on as many threads as cores, one after the other,
with the 1-minute load average before each: the machine is shared, so only figures taken
minutes apart, under the load recorded with them, compare. Prints one JSON object.

    /usr/bin/python3 bench/bench_gemm_pairs.py --old OLD_BUILD --new build --rounds 3
"""
import argparse
import json
import os
import subprocess
import time

import torch


def tessera_layouts(build):
    out = subprocess.run([os.path.join(build, "bench", "bench_gemm"), "--layouts"], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def torch_gflops(n=1024, runs=12):
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(n, n, generator=generator), torch.randn(n, n, generator=generator)
    out = torch.empty(n, n)
    torch.mm(a, b, out=out)  # warm-up
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        torch.mm(a, b, out=out)
        times.append(time.perf_counter() - started)
    times.sort()
    return 2 * n ** 3 / times[len(times) // 2] / 1e9


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", required=True, help="build directory of the baseline")
    parser.add_argument("--new", required=True, help="build directory under test")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(os.cpu_count())
    rounds = []
    for _ in range(args.rounds):
        entry = {}
        for name, build in (("old", args.old), ("new", args.new)):
            load = os.getloadavg()[0]
            result = tessera_layouts(build)
            entry[name] = {"load_average_1min": load, "gflops": result["gemm_1024_gflops_by_layout"],
                           "gflops_per_cpu_second": result["gemm_1024_gflops_per_cpu_second_by_layout"]}
        entry["torch"] = {"load_average_1min": os.getloadavg()[0], "threads": torch.get_num_threads(),
                          "gflops": torch_gflops()}
        rounds.append(entry)
    layouts = rounds[0]["new"]["gflops"].keys()
    best = {name: {layout: max(r[name]["gflops"][layout] for r in rounds) for layout in layouts}
            for name in ("old", "new")}
    best["torch"] = max(r["torch"]["gflops"] for r in rounds)
    print(json.dumps({"device": result["device"], "rounds": rounds, "best": best,
                      "new_over_old": {layout: best["new"][layout] / best["old"][layout] for layout in layouts},
                      "new_over_torch": {layout: best["new"][layout] / best["torch"] for layout in layouts}},
                     indent=1))


if __name__ == "__main__":
    main()

"""TESSERA_PROFILE=1: tessera forward prints one profile line on stderr when it ends, with the
device time of every command named by layer and kernel; the entries add up to the total, each
kernel ran once per batch, and the validation layer sees the timestamp queries as correct. In the
same run TESSERA_PIPELINE_STATISTICS=1 gives each pipeline's compiler statistics where the device
offers them (NVIDIA), else one line saying it does not (lavapipe)."""
import json
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

TESSERA = sys.argv[1] if __name__ == "__main__" and len(sys.argv) > 1 else os.environ.get(
    "TESSERA_BINARY", "build/tools/tessera")
IMAGES, BATCH = 6, 2


def device_variant(kernels, name):
    """The profile entry of layer and kernel `name` in the variant the device runs
    (compute/kernel_variants.cpp): lavapipe's register kernel (conv2d_forward, gemm), a GPU's
    shared-memory tiled one (conv2d_forward_tiled, gemm_tiled) or the quad-texel GEMM."""
    found = [kernels[variant] for variant in (name, name + "_tiled", name + "_quads") if variant in kernels]
    assert len(found) == 1, (name, sorted(kernels))
    return found[0]


def check_pipeline_statistics(stderr, kernels):
    lines = [json.loads(line) for line in stderr.splitlines() if '"event":"pipeline_statistics"' in line]
    if "does not offer VK_KHR_pipeline_executable_properties" in stderr:
        assert not lines, lines[:1]
        return
    # Every kernel the profile names was made once with its statistics, each with some.
    made = {line["kernel"] for line in lines}
    # Transfers (a discrete GPU's staging copies) are timed too, and have no pipeline.
    profiled = {name.split(" ")[-1] for name in kernels if not name.startswith(("upload ", "download "))}
    profiled -= {"copy", "fill"}
    assert profiled <= made, (sorted(profiled - made), sorted(made))
    for line in lines:
        assert line["executables"] and all(executable["statistics"] for executable in line["executables"]), line


def main():
    with tempfile.TemporaryDirectory(prefix="tessera-profile-") as work:
        images = os.path.join(work, "x.h5")
        with h5py.File(images, "w") as f:
            f["x"] = np.random.default_rng(0).standard_normal((IMAGES, 3, 32, 32), dtype=np.float32)
        env = dict(os.environ, TESSERA_VALIDATION="1", TESSERA_PROFILE="1", TESSERA_PIPELINE_STATISTICS="1")
        process = subprocess.run([TESSERA, "forward", "--model", "small-cnn", "--random-weights", "--input", images, "--output",
                                  os.path.join(work, "logits.h5"), "--batch", str(BATCH)],
                                 capture_output=True, text=True, env=env)
        assert process.returncode == 0, process.stderr
        assert "vulkan validation" not in process.stderr.lower(), process.stderr
        profiles = [json.loads(line) for line in process.stderr.splitlines() if '"event":"profile"' in line]
        assert len(profiles) == 1, process.stderr
        profile = profiles[0]
        kernels = {entry["name"]: entry for entry in profile["kernels"]}
        for name in ("conv1 conv2d_forward", "pool1 max_pool2d_forward", "fc2 gemm"):
            entry = device_variant(kernels, name)
            assert entry["commands"] == IMAGES // BATCH, entry
        # relu1 runs in conv1's epilogue (fusion), so it records nothing of its own.
        assert not any(name.startswith("relu1 ") for name in kernels), sorted(kernels)
        assert all(entry["seconds"] >= 0 for entry in profile["kernels"])
        assert profile["seconds"] > 0
        # Device time of the kernels lies within the wall time forward measured around its runs
        # (a wrong timestamp period would put it far outside). The copies of uploads and
        # downloads through staging buffers (a discrete GPU's), and the weights' preparation
        # ("conv1 prepare ...", once, when the model is loaded), run outside them.
        forward = [json.loads(line) for line in process.stdout.splitlines() if '"forward_seconds"' in line][0]
        in_runs = sum(e["seconds"] for e in profile["kernels"]
                      if not e["name"].startswith(("upload ", "download ")) and " prepare " not in e["name"])
        assert 0 < in_runs <= forward["forward_seconds"], (in_runs, forward)
        assert abs(sum(entry["share"] for entry in profile["kernels"]) - 1) < 1e-6
        seconds = [entry["seconds"] for entry in profile["kernels"]]
        assert seconds == sorted(seconds, reverse=True), "entries are not longest first"
        check_pipeline_statistics(process.stderr, kernels)
        print(f"profile: {len(kernels)} entries, {profile['seconds'] * 1e3:.1f} ms of device time")


def test_profile():
    main()


if __name__ == "__main__":
    main()

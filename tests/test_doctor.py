"""`tessera doctor` and `tessera --version`, the real binary against independent references:
- on lavapipe: exit 0; the device, its heaps, memory types and limits as `vulkaninfo` reports
  them; kernel variants for it; every slide format proven by a file read back.
- under VK_LAYER_TESSERA_discrete_gpu (set here, as tools/run-tests.sh sets it): the device is
  a discrete GPU with device memory the host cannot map and a non-coherent host type.
- with no Vulkan driver (VK_DRIVER_FILES / VK_ICD_FILENAMES at a missing or empty manifest):
  exit 1, the VK_LOADER_DEBUG=all hint, and the formats still checked.
- --model/--encoder: a small ViT's weights load (tensors and values counted by PyTorch) and its
  plan fits; a truncated file, a file missing a tensor and a plan over the budget are exit 1
  naming the problem and its fix; with --weights fp16 (--precision fp16's default) a weight past
  65504 is named, and the plan counts the large weights in 2 bytes.
- --out: a missing folder's free space is its parent's (os.statvfs); a path under a file fails.
- readable ok/FAIL lines on a terminal (pty), JSON lines through a pipe.
- --version: `git describe --tags --always --dirty` and the commit, and cmake/version.cmake's
  answers for a tagged repository and for a tree outside git (a source tarball).
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

import test_terminal_output as terminal_output
from data_tools import devices, on_host_cores

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
sys.path.insert(0, os.path.join(ROOT, "tests"))
TESSERA = os.path.abspath(os.environ.get("TESSERA_BINARY", "build/tools/tessera"))
BUILD = os.path.dirname(os.path.dirname(TESSERA))
LAYER_DIR = os.path.join(BUILD, "tests", "support", "discrete_gpu")
ENV = dict(os.environ, TESSERA_VALIDATION="1")
SMALL = {"family": "vit", "image_size": 64, "patch_size": 16, "width": 48, "depth": 2, "heads": 3,
         "mlp": "swiglu", "mlp_ratio": 2.0, "class_token": True, "register_tokens": 4, "layer_scale": 1e-5,
         "position_embedding": "patches", "final_norm": "tokens", "output": "class_token_and_patch_mean",
         "preprocessing": {"mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25], "microns_per_pixel": 0.5}}
FORMATS = ["TIFF / BigTIFF", "OpenSlide", "OME-TIFF", "DICOM (VL Whole Slide Microscopy)", "JPEG 2000 in SVS",
           "other images"]


def doctor(*args, env=None):
    """(exit code, JSON records, stderr) of `tessera doctor ARGS` through a pipe."""
    result = subprocess.run([TESSERA, "doctor", *map(str, args)], capture_output=True, text=True,
                            env=env or ENV, timeout=600)
    assert "vulkan validation" not in result.stderr.lower(), result.stderr
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert records[-1]["check"] == "summary", (result.returncode, result.stderr)
    assert records[-1]["ready"] == (result.returncode == 0), result.stdout
    return result.returncode, records, result.stderr


def of(records, check):
    return [r for r in records if r["check"] == check]


def vulkaninfo(env):
    """What vulkaninfo (vulkan-tools) reports of device 0: the reference for doctor's numbers."""
    text = subprocess.run(["vulkaninfo"], capture_output=True, text=True, env=env, timeout=120, check=True).stdout
    number = lambda name: int(re.search(rf"\b{name}\s*=\s*(0x[0-9a-fA-F]+|\d+)", text).group(1), 0)  # noqa: E731
    types = [(int(heap), int(flags, 16)) for heap, flags in
             re.findall(r"heapIndex\s*=\s*(\d+)\s*\n\s*propertyFlags\s*=\s*0x([0-9a-fA-F]+)", text)]
    return {"instance": re.search(r"Vulkan Instance Version: (\S+)", text).group(1),
            "type": re.search(r"deviceType\s*=\s*PHYSICAL_DEVICE_TYPE_(\w+)", text).group(1).lower().replace("_", "-"),
            "name": re.search(r"deviceName\s*=\s*(.+)", text).group(1).strip(),
            "heaps": [int(s) for s in re.findall(r"memoryHeaps\[\d+\]:\s*\n\s*size\s*=\s*(\d+)", text)],
            "types": types, "max_storage_buffer_range": number("maxStorageBufferRange"),
            "non_coherent_atom_size": number("nonCoherentAtomSize"), "subgroup_size": number("subgroupSize")}


def check_device_against(device, reference):
    assert device["name"] == reference["name"]
    assert device["type"] == reference["type"]
    assert [h["bytes"] for h in device["memory"]["heaps"]] == reference["heaps"]
    flags = [(t["heap"], t["device_local"] | t["host_visible"] << 1 | t["host_coherent"] << 2 | t["host_cached"] << 3)
             for t in device["memory"]["types"]]
    assert flags == [(heap, bits & 0xF) for heap, bits in reference["types"]]
    limits = device["limits"]
    for name in ("max_storage_buffer_range", "non_coherent_atom_size", "subgroup_size"):
        assert limits[name] == reference[name], name
    assert limits["largest_buffer"] <= limits["max_storage_buffer_range"]
    gemm = device["kernel_variants"]["gemm"]
    if gemm["kind"] == "shared_memory":
        assert 0 < gemm["shared_bytes"] <= limits["max_compute_shared_memory"] // 2
    assert gemm["workgroup"] <= limits["max_workgroup_invocations"]
    if device["kernel_variants"]["reductions"]["kind"] == "subgroup":
        assert limits["subgroup_arithmetic"]


@pytest.fixture
def lavapipe():
    """Skips a test of lavapipe's own figures where device 0 is a GPU (the GPU bundle's run);
    wherever device 0 runs on the CPU (CI) the test runs and asserts that it is lavapipe."""
    device = devices(TESSERA)[0]
    if not on_host_cores(device):
        pytest.skip(f"device 0 is {device['name']} ({device['type']}): this test checks lavapipe")


def test_lavapipe_is_ready_with_its_device_formats_and_variants(lavapipe):
    code, records, _ = doctor()
    assert code == 0, records[-1]
    reference = vulkaninfo(ENV)
    assert of(records, "loader")[0]["version"] == reference["instance"]
    assert any(r["status"] == "ok" and r["library"].endswith("libvulkan_lvp.so") for r in of(records, "driver"))
    devices = of(records, "device")
    assert len(devices) >= 1 and all(d["status"] == "ok" for d in devices)
    lavapipe = devices[0]
    assert lavapipe["type"] == "cpu" and lavapipe["default"]
    check_device_against(lavapipe, reference)
    # lavapipe's subgroups are SIMD lanes: the register tiles and shared-memory trees of a CPU.
    assert lavapipe["kernel_variants"]["gemm"]["kind"] == "registers"
    quads = lavapipe["kernel_variants"]["gemm"]["quad_texels"]
    assert (quads["rows_per_lane"], quads["columns"]) == (4, min(8, reference["subgroup_size"]))
    assert lavapipe["kernel_variants"]["reductions"]["kind"] == "shared_memory"
    assert lavapipe["kernel_variants"]["layer_norm"] == {"workgroup": reference["subgroup_size"], "subgroup_sum": True}
    formats = {r["format"]: r for r in of(records, "format")}
    for name in FORMATS:
        found = [r for f, r in formats.items() if f.startswith(name)]
        assert len(found) == 1 and found[0]["status"] == "ok", (name, formats)
    import openslide
    assert any(r["reader"] == "OpenSlide " + openslide.__library_version__ for r in formats.values())
    # Debian's DCMTK has no JPEG 2000 decoder: reported, not a fault.
    j2k = formats["JPEG 2000 in DICOM"]
    assert j2k["status"] == "not available" and not j2k["required"]


def test_discrete_gpu_layer_shows_device_memory_the_host_cannot_map(lavapipe):
    assert os.path.exists(os.path.join(LAYER_DIR, "VkLayer_tessera_discrete_gpu.json")), LAYER_DIR
    env = dict(ENV, VK_ADD_LAYER_PATH=LAYER_DIR,
               VK_INSTANCE_LAYERS="VK_LAYER_KHRONOS_validation:VK_LAYER_TESSERA_discrete_gpu")
    code, records, _ = doctor(env=env)
    assert code == 0, records[-1]
    device = of(records, "device")[0]
    assert device["type"] == "discrete-gpu" and device["default"]
    check_device_against(device, vulkaninfo(env))
    types = device["memory"]["types"]
    assert types[0]["device_local"] and not types[0]["host_visible"]
    assert any(t["host_visible"] and not t["host_coherent"] and t["host_cached"] for t in types)
    assert device["limits"]["non_coherent_atom_size"] == 256
    assert [h["device_local"] for h in device["memory"]["heaps"]] == [True, False]
    # The variants follow the reported type where the ops look at it (layer norm's row workgroup:
    # a GPU's, past one subgroup), and lavapipe's 8-lane subgroups where they look at those (gemm).
    layer_norm = device["kernel_variants"]["layer_norm"]
    assert layer_norm["workgroup"] > device["limits"]["subgroup_size"] and not layer_norm["subgroup_sum"]
    assert device["kernel_variants"]["gemm"]["kind"] == "registers"


@pytest.mark.parametrize("manifest", ["missing", "empty"])
def test_no_vulkan_driver_is_exit_1_with_the_loader_hint(manifest, tmp_path):
    path = tmp_path / "driver.json"
    if manifest == "empty":
        path.write_text("")
    env = dict(ENV, VK_DRIVER_FILES=str(path), VK_ICD_FILENAMES=str(path))
    env.pop("TESSERA_VALIDATION")
    code, records, stderr = doctor(env=env)
    assert code == 1
    drivers = of(records, "driver")
    assert [d["manifest"] for d in drivers] == [str(path)] and drivers[0]["status"] == "fail"
    devices = of(records, "devices")
    assert len(devices) == 1 and devices[0]["status"] == "fail" and not of(records, "device")
    assert "VK_LOADER_DEBUG=all tessera doctor" in devices[0]["fix"]
    assert "mesa-vulkan-drivers" in devices[0]["fix"]
    assert {p["check"] for p in records[-1]["problems"]} == {"driver", "devices"}
    # The formats need no device: still checked, and ready.
    assert all(r["status"] != "fail" for r in of(records, "format")) and len(of(records, "format")) == 7
    assert "doctor: 2 problems" in stderr


def test_no_driver_on_a_terminal_says_fail_and_the_hint():
    env = dict(ENV, VK_DRIVER_FILES="/nonexistent/driver.json", VK_ICD_FILENAMES="/nonexistent/driver.json")
    code, lines = on_terminal(["doctor"], env)
    assert code == 1
    assert any(line.startswith("FAIL  no Vulkan device") for line in lines), lines
    assert any("fix: " in line and "VK_LOADER_DEBUG=all tessera doctor" in line for line in lines), lines
    summary = next(i for i, line in enumerate(lines) if line.startswith("NOT READY: 2 problems"))
    assert [line[:4] for line in lines[summary + 1:summary + 3]] == ["  - "] * 2, lines
    assert lines[-1] == "tessera: doctor: 2 problems (each above, with its fix)", lines
    assert not any(line.lstrip().startswith("{") for line in lines)


def on_terminal(args, env):
    """(exit code, lines) of tessera ARGS with stdout and stderr on a pty, in `env`."""
    original = terminal_output.ENV
    terminal_output.ENV = env
    try:
        return terminal_output.on_terminal(args)
    finally:
        terminal_output.ENV = original


def test_terminal_lines_and_json_lines(tmp_path):
    code, lines = on_terminal(["doctor", "--out", str(tmp_path)], ENV)
    assert code == 0, lines
    assert lines[0].startswith("ok    tessera ")
    assert any(re.match(r"ok    device 0: .*\([a-z-]+, Vulkan 1\.\d+\.\d+, .*\), the default$", line) for line in lines)
    assert any(line.strip().startswith("heap 0: ") for line in lines)
    assert any(line.strip().startswith("kernels: gemm ") for line in lines)
    assert any(line.startswith("ok    OpenSlide") for line in lines)
    assert any(line.startswith("--    JPEG 2000 in DICOM") for line in lines)
    assert lines[-1] == "ready: everything asked is ready"
    # --json on a terminal: the records a pipe gets.
    code, lines = on_terminal(["doctor", "--json", "--out", str(tmp_path)], ENV)
    assert code == 0
    records = [json.loads(line) for line in lines]
    assert records[-1] == {"check": "summary", "ready": True, "problems": []}


def test_out_missing_folder_and_path_under_a_file(tmp_path):
    missing = tmp_path / "runs" / "features"
    code, records, _ = doctor("--out", missing)
    assert code == 0, records[-1]
    out = of(records, "out")[0]
    assert out["status"] == "ok" and not out["exists"] and out["existing"] == str(tmp_path)
    stat = os.statvfs(tmp_path)
    # Other processes write meanwhile: within 256 MiB of what statvfs says.
    assert abs(out["free_bytes"] - stat.f_bavail * stat.f_frsize) < 256 << 20
    assert out["capacity_bytes"] == stat.f_blocks * stat.f_frsize
    assert not missing.exists() and not (tmp_path / "runs").exists()  # doctor makes nothing
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, records, stderr = doctor("--out", blocker / "features")
    assert code == 1
    out = of(records, "out")[0]
    assert out["status"] == "fail" and str(blocker) in out["message"] and "not a folder" in out["message"]
    assert records[-1]["problems"] == [{"check": "out", "problem": out["message"], "fix": out["fix"]}]
    assert "doctor: 1 problem " in stderr


@pytest.fixture(scope="module")
def small_vit(tmp_path_factory):
    import torch  # noqa: F401  (test_vit_timm's reference)
    from test_vit_timm import randomised, write_safetensors
    folder = tmp_path_factory.mktemp("doctor-vit")
    encoder = folder / "small-vit.json"
    encoder.write_text(json.dumps(SMALL))
    state = {k: v.float() for k, v in randomised(SMALL, seed=3).state_dict().items()}
    weights = folder / "small-vit.safetensors"
    write_safetensors(str(weights), state)
    return {"folder": folder, "encoder": encoder, "weights": weights, "state": state,
            "write": write_safetensors}


def test_weights_that_fit_load_and_the_plan_fits(small_vit):
    code, records, _ = doctor("--model", small_vit["weights"], "--encoder", small_vit["encoder"], "--batch", 4)
    assert code == 0, records[-1]
    weights = of(records, "weights")[0]
    state = small_vit["state"]
    assert weights["tensors"] == len(state)
    assert weights["values"] == sum(v.numel() for v in state.values())
    assert weights["features"] == 2 * SMALL["width"]  # class token and patch mean
    plan = of(records, "plan")[0]
    assert plan["status"] == "ok" and plan["fits"] and plan["batch"] == 4
    assert plan["plan"]["total"] <= plan["budget_bytes"]
    assert not plan["plan"]["streams_weights"]  # auto: it fits resident
    # --stream-weights as extract takes it: on plans the blocks' weights streamed, off resident.
    for streaming, streams in (("on", True), ("off", False)):
        code, records, _ = doctor("--model", small_vit["weights"], "--encoder", small_vit["encoder"], "--batch", 4,
                                  "--stream-weights", streaming)
        plan = of(records, "plan")[0]["plan"]
        assert code == 0 and plan["streams_weights"] == streams, plan
        assert (plan["streaming"]["streamed_bytes"] > 0) == streams, plan


def test_weights_that_do_not_fit_or_are_broken_are_exit_1(small_vit):
    folder, encoder = small_vit["folder"], small_vit["encoder"]
    truncated = folder / "truncated.safetensors"
    truncated.write_bytes(small_vit["weights"].read_bytes()[:-1000])
    code, records, _ = doctor("--model", truncated, "--encoder", encoder)
    assert code == 1
    weights = of(records, "weights")[0]
    assert weights["status"] == "fail" and str(truncated) in weights["message"] and weights["exit_code"] == 5
    assert "truncated" in weights["fix"] and not of(records, "plan")

    state = dict(small_vit["state"])
    dropped = sorted(state)[0]
    del state[dropped]
    missing = folder / "missing.safetensors"
    small_vit["write"](str(missing), state)
    code, records, _ = doctor("--model", missing, "--encoder", encoder)
    assert code == 1
    assert f"missing tensor '{dropped}'" in of(records, "weights")[0]["message"]

    code, records, _ = doctor("--model", encoder, "--encoder", encoder)  # the description, not weights
    assert code == 1
    weights = of(records, "weights")[0]
    assert weights["exit_code"] == 2 and "must hold the weights" in weights["message"] and "--model" in weights["fix"]

    state = dict(small_vit["state"])
    poisoned = sorted(state)[-1]
    state[poisoned] = state[poisoned].clone()
    state[poisoned].view(-1)[1] = float("nan")
    nan = folder / "nan.safetensors"
    small_vit["write"](str(nan), state)
    code, records, _ = doctor("--model", nan, "--encoder", encoder)
    assert code == 1
    weights = of(records, "weights")[0]
    assert f"tensor '{poisoned}'" in weights["message"] and weights["exit_code"] == 5

    code, records, _ = doctor("--model", small_vit["weights"], "--encoder", encoder, "--device-memory-limit", "1MiB",
                              "--batch", 32)
    assert code == 1
    assert of(records, "weights")[0]["status"] == "ok"
    plan = of(records, "plan")[0]
    assert plan["status"] == "fail" and plan["batch"] == 32
    assert plan["budget_bytes"] == 1 << 20 and plan["plan"]["total"] > plan["budget_bytes"]
    assert [p["check"] for p in records[-1]["problems"]] == ["plan"]
    # The batch the fix names does fit, and twice it does not.
    batch = int(re.search(r"--batch (\d+) fits", plan["fix"]).group(1))
    assert 1 <= batch < 32
    code, records, _ = doctor("--model", small_vit["weights"], "--encoder", encoder, "--device-memory-limit", "1MiB",
                              "--batch", batch)
    assert code == 0 and of(records, "plan")[0]["plan"]["total"] <= 1 << 20
    code, records, _ = doctor("--model", small_vit["weights"], "--encoder", encoder, "--device-memory-limit", "1MiB",
                              "--batch", 2 * batch)
    assert code == 1 and not of(records, "plan")[0]["fits"]


def test_fp16_weights_are_checked_in_fp16s_range_and_planned_in_16_bits(small_vit):
    folder, encoder = small_vit["folder"], small_vit["encoder"]
    state = dict(small_vit["state"])
    name = "blocks.0.attn.qkv.weight"
    state[name] = state[name].clone()
    state[name][0, 2] = 7e4  # a float, not a half: past fp16's 65504
    big = folder / "big.safetensors"
    small_vit["write"](str(big), state)
    code, records, _ = doctor("--model", big, "--encoder", encoder, "--weights", "fp16")
    assert code == 1
    weights = of(records, "weights")[0]
    assert weights["exit_code"] == 5 and f"tensor '{name}'" in weights["message"] and "65504" in weights["message"]
    code, records, _ = doctor("--model", big, "--encoder", encoder, "--weights", "fp32", "--batch", 1)
    assert code == 0 and of(records, "weights")[0]["weights"] == "fp32"
    fp32 = of(records, "plan")[0]["plan"]["bytes"]["parameters"]
    # --precision fp16 stores the weights in fp16 unless --weights says otherwise.
    code, records, _ = doctor("--model", small_vit["weights"], "--encoder", encoder, "--precision", "fp16",
                              "--batch", 1)
    assert code == 0 and of(records, "weights")[0]["weights"] == "fp16"
    fp16 = of(records, "plan")[0]["plan"]["bytes"]["parameters"]
    assert 0.5 * fp32 < fp16 < 0.6 * fp32  # biases, norms, gammas and tokens stay fp32


def test_model_without_encoder_is_a_bad_flag(small_vit):
    result = subprocess.run([TESSERA, "doctor", "--model", str(small_vit["weights"])], capture_output=True,
                            text=True, env=ENV, timeout=60)
    assert result.returncode == 2 and "--model and --encoder go together" in result.stderr
    for flag in (["--batch", "4"], ["--stream-weights", "on"]):
        result = subprocess.run([TESSERA, "doctor", *flag], capture_output=True, text=True, env=ENV, timeout=60)
        assert result.returncode == 2 and f"{flag[0]} is for the plan" in result.stderr, result.stderr


def git(*args, cwd=ROOT):
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def test_version_is_git_describe_and_the_commit():
    if subprocess.run(["git", "rev-parse"], cwd=ROOT, capture_output=True).returncode != 0:
        pytest.skip("not a git checkout: version.cmake's tarball case is tested below")
    line = subprocess.run([TESSERA, "--version"], capture_output=True, text=True, check=True).stdout.strip()
    match = re.fullmatch(r"tessera (\S+) \(commit ([0-9a-f]{40})\)", line)
    assert match, line
    assert match.group(2) == git("rev-parse", "HEAD")
    # The build saw the tree as it was then: compared without -dirty.
    described = git("describe", "--tags", "--always", "--dirty").removesuffix("-dirty")
    version = match.group(1).removesuffix("-dirty")
    if re.fullmatch(r"[0-9a-f]{7,}", described):  # no tag: the project version and the commit
        assert re.fullmatch(r"\d+\.\d+\.\d+\+g" + described, version), (version, described)
    else:
        assert version == described.removeprefix("v"), (version, described)


def configured_version(source, out):
    subprocess.run(["cmake", f"-DSOURCE_DIR={source}", "-DPROJECT_VERSION=0.1.0", f"-DOUTPUT={out}", "-P",
                    os.path.join(ROOT, "cmake", "version.cmake")], check=True, capture_output=True)
    text = open(out).read()
    return re.search(r'version\(\) \{ return "([^"]*)"', text).group(1), re.search(r'commit\(\) \{ return "([^"]*)"',
                                                                                 text).group(1)


@pytest.mark.skipif(shutil.which("git") is None or shutil.which("cmake") is None, reason="needs git and cmake")
def test_version_cmake_tagged_dirty_and_tarball(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t")
    for args in (["init", "-q"], ["commit", "-q", "--allow-empty", "-m", "one"], ["tag", "v2.3.4"]):
        subprocess.run(["git", *args], cwd=repo, check=True, env=env)
    head = git("rev-parse", "HEAD", cwd=repo)
    assert configured_version(repo, tmp_path / "a.cpp") == ("2.3.4", head)
    (repo / "file").write_text("x")
    subprocess.run(["git", "add", "file"], cwd=repo, check=True)
    assert configured_version(repo, tmp_path / "b.cpp") == ("2.3.4-dirty", head)
    subprocess.run(["git", "commit", "-q", "-m", "two"], cwd=repo, check=True, env=env)
    head = git("rev-parse", "HEAD", cwd=repo)
    assert configured_version(repo, tmp_path / "c.cpp") == (f"2.3.4-1-g{head[:7]}", head)
    # A source tarball, even unpacked inside another repository: the project version.
    tarball = repo / "tessera-0.1.0"
    tarball.mkdir()
    assert configured_version(tarball, tmp_path / "d.cpp") == ("0.1.0", "unknown")
    outside = tempfile.mkdtemp(prefix="tessera-tarball-")
    try:
        assert configured_version(outside, tmp_path / "e.cpp") == ("0.1.0", "unknown")
    finally:
        shutil.rmtree(outside)

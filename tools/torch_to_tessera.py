#!/usr/bin/python3
"""Convert a PyTorch state_dict into a tessera checkpoint (HDF5).

The checkpoint has a root attribute `model`, the JSON preset reference (e.g.
{"preset": "resnet18", "classes": 1000}; small-cnn adds "width"), and one float32 dataset
per tensor under `params/`, named as the state_dict keys and laid out as PyTorch lays them
out (conv OIHW, linear [out,in], batch norm weight/bias/running_mean/running_var).
`num_batches_tracked` is skipped; optimizer state (`train/`) is tessera's to write.

Every name and shape is checked against the preset; a missing, unexpected or misshapen
tensor is an error (exit code 5) that names the tensor and the input file.

CTransPath (the `ctranspath` preset, a Swin: compute/swin.h) takes its checkpoint as it ships,
torch.save({'model': state_dict}) with its own module names; its derived buffers
(relative_position_index, attn_mask) are skipped as num_batches_tracked is.

Vision transformers (the `vit` family, compute/vit.h: the presets of compute/vit_presets.json,
by tessera's name or TRIDENT's, or a model JSON {"family": "vit", ...} given with
--model) take timm's parameter names, and torchvision's vit_b_16 names, which are renamed to
timm's. Their checkpoint's `model` is the preset reference (with the head's classes, 0 for an
encoder) or the JSON.

Examples:
  /usr/bin/python3 tools/torch_to_tessera.py --state-dict resnet18.pt --preset resnet18 --out r18.h5
  /usr/bin/python3 tools/torch_to_tessera.py --torchvision resnet18 --seed 1 --classes 10 \\
      --preset resnet18 --out r18.h5
  # ImageNet resnet50 (torchvision.models.resnet50(weights="IMAGENET1K_V1").state_dict()
  # saved with torch.save); `tessera extract --layer layer3` then gives CLAM's resnet50_trunc
  # features (1024 per tile):
  /usr/bin/python3 tools/torch_to_tessera.py --state-dict resnet50.pt --preset resnet50 --out r50.h5
  # UNI (MahmoodLab/UNI's pytorch_model.bin, timm's names); torchvision's vit_b_16 state_dict:
  /usr/bin/python3 tools/torch_to_tessera.py --state-dict pytorch_model.bin --preset uni --out uni.h5
  /usr/bin/python3 tools/torch_to_tessera.py --state-dict vit_b_16.pth --preset vit-b16 --out vitb16.h5
"""
import argparse
import json
import os
import sys

import h5py
import numpy as np
import torch

from swin_reference import SWIN_PRESETS, SwinTransformer, derived_buffer
from tessera_presets import PRESETS, build_preset, preset_reference
from vit_reference import (VIT_PRESETS, TRIDENT_NAMES, expected_vit_shapes, is_vit_description, timm_parameter_name,
                            vit_preset_name)

EXIT_BAD_INPUT = 5
SKIPPED_SUFFIX = "num_batches_tracked"


class ConversionError(Exception):
    """A state_dict that does not fit the preset; the message names tensors and the file."""


def load_state_dict(path):
    """A state_dict from a torch.save file holding a state_dict or a whole nn.Module."""
    try:
        # A whole nn.Module, or a checkpoint dict with more than tensors (CTransPath's), needs the
        # full unpickler: torch 2.6 made weights_only=True the default, which refuses them; 1.13
        # (Debian's) takes the argument and has False as its default. The file is the user's own.
        loaded = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as error:  # a corrupt file makes torch.load raise almost any type
        raise ConversionError(f"{path}: cannot load with torch.load: {error}")
    if isinstance(loaded, torch.nn.Module):
        loaded = loaded.state_dict()
    # CTransPath's checkpoint (as MoCo's and DeiT's): torch.save({'model': state_dict, ...}).
    if isinstance(loaded, dict) and isinstance(loaded.get("model"), dict):
        loaded = loaded["model"]
    if not isinstance(loaded, dict) or not all(torch.is_tensor(v) for v in loaded.values()):
        raise ConversionError(f"{path}: expected a state_dict (name -> tensor) or an nn.Module, "
                              f"got {type(loaded).__name__}")
    return loaded


def seeded_torchvision(name, seed, classes):
    """A torchvision model with PyTorch's default init from torch.manual_seed(seed)."""
    torch.manual_seed(seed)
    return build_preset(name, classes, (224, 224)).state_dict()


def infer_classes(preset, state_dict, source):
    key = "fc2.weight" if preset == "small-cnn" else "fc.weight"
    if key not in state_dict:
        raise ConversionError(f"{source}: tensor '{key}' is missing (needed to infer --classes)")
    return int(state_dict[key].shape[0])


def infer_width(state_dict, source):
    if "conv1.weight" not in state_dict:
        raise ConversionError(f"{source}: tensor 'conv1.weight' is missing (needed to infer --width)")
    return int(state_dict["conv1.weight"].shape[0])


def expected_shapes(preset, classes, width):
    """name -> shape the preset needs, in PyTorch's order. The input size only changes
    small-cnn's fc1 input (2*width per pooled pixel); it is built here for 4x4 input."""
    model = build_preset(preset, classes, (4, 4), width)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()
            if not k.endswith(SKIPPED_SUFFIX)}


def shape_fits(preset, name, shape, expected):
    """small-cnn's fc1.weight may have any positive multiple of 2*width inputs."""
    if preset == "small-cnn" and name == "fc1.weight" and len(shape) == 2:
        return shape[0] == expected[0] and shape[1] > 0 and shape[1] % expected[1] == 0
    return shape == expected


def validate(preset, classes, width, state_dict, source):
    """The tensor names to write; raises ConversionError listing every missing, unexpected,
    misshapen and non-floating tensor."""
    expected = expected_shapes(preset, classes, width)
    given = {k: v for k, v in state_dict.items() if not k.endswith(SKIPPED_SUFFIX)}
    problems = [f"missing tensor '{k}' {list(s)}" for k, s in expected.items() if k not in given]
    problems += [f"unexpected tensor '{k}' {list(v.shape)}" for k, v in given.items()
                 if k not in expected]
    problems += [f"tensor '{k}' has shape {list(v.shape)}, preset {preset} needs "
                 + (f"[{expected[k][0]}, a multiple of {expected[k][1]}]" if k == "fc1.weight"
                    and preset == "small-cnn" else str(list(expected[k])))
                 for k, v in given.items()
                 if k in expected and not shape_fits(preset, k, tuple(v.shape), expected[k])]
    problems += [f"tensor '{k}' has dtype {v.dtype}, expected floating point"
                 for k, v in given.items() if not v.is_floating_point()]
    if problems:
        details = f"classes {classes}" + (f", width {width}" if preset == "small-cnn" else "")
        raise ConversionError(f"{source} does not fit preset {preset} ({details}):\n  "
                              + "\n  ".join(problems))
    return list(expected)


def validate_vit(description, state_dict, source, expected=None):
    """The tensor names to write for a ViT description (or a Swin's, given its `expected` shapes);
    raises ConversionError listing every missing, unexpected, misshapen and non-floating tensor
    (names already timm's)."""
    expected = expected or expected_vit_shapes(description)
    problems = [f"missing tensor '{k}' {list(s)}" for k, s in expected.items() if k not in state_dict]
    problems += [f"unexpected tensor '{k}' {list(v.shape)}" for k, v in state_dict.items() if k not in expected]
    problems += [f"tensor '{k}' has shape {list(v.shape)}, the model needs {list(expected[k])}"
                 for k, v in state_dict.items() if k in expected and tuple(v.shape) != expected[k]]
    problems += [f"tensor '{k}' has dtype {v.dtype}, expected floating point"
                 for k, v in state_dict.items() if not v.is_floating_point()]
    if problems:
        raise ConversionError(f"{source} does not fit the ViT {json.dumps(description)}:\n  " + "\n  ".join(problems))
    return list(expected)


def is_swin(description):
    return description.get("family") == "swin" or description.get("preset") in SWIN_PRESETS


def convert_swin(description, state_dict, source):
    """A Swin's (CTransPath's) reference and names, its module's own; the buffers it derives from its
    shape (relative_position_index, attn_mask, num_batches_tracked) skipped."""
    try:
        model = SwinTransformer(description)
    except (AssertionError, KeyError, IndexError, TypeError, ValueError) as error:
        raise ConversionError(f"{json.dumps(description)} is not a Swin tessera builds: {error!r}")
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items() if not derived_buffer(k)}
    state_dict = {k: v for k, v in state_dict.items() if not derived_buffer(k)}
    return description, state_dict, validate_vit(description, state_dict, source, expected)


def convert_vit(description, state_dict, source, classes):
    """A ViT's reference and names, its state_dict renamed to timm's names."""
    renamed = {}
    for name, value in state_dict.items():
        timm_name = timm_parameter_name(name)
        if timm_name in renamed:
            raise ConversionError(f"{source}: two tensors are both '{timm_name}'")
        renamed[timm_name] = value
    if classes is None:
        classes = int(renamed["head.weight"].shape[0]) if "head.weight" in renamed else 0
    reference = dict(description, classes=classes)
    return reference, renamed, validate_vit(reference, renamed, source)


def write_checkpoint(path, reference, state_dict, names):
    """Write via <path>.partial and rename, so a reader never sees half a checkpoint."""
    partial = path + ".partial"
    with h5py.File(partial, "w") as f:
        f.attrs["model"] = json.dumps(reference)
        params = f.create_group("params")
        for name in names:
            array = state_dict[name].detach().to(torch.float32).contiguous().numpy()
            params.create_dataset(name, data=np.ascontiguousarray(array, dtype=np.float32))
    os.replace(partial, path)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--state-dict", metavar="FILE.pt",
                        help="torch.save file with a state_dict (or a whole model)")
    source.add_argument("--torchvision", choices=("resnet18", "resnet50"),
                        help="build a seeded, randomly initialised torchvision model instead")
    parser.add_argument("--seed", type=int, default=0, help="seed for --torchvision (default 0)")
    model = parser.add_mutually_exclusive_group(required=True)
    model.add_argument("--preset", choices=PRESETS + tuple(VIT_PRESETS) + tuple(TRIDENT_NAMES),
                       help="tessera preset (or TRIDENT's name for a ViT preset) to check against")
    model.add_argument("--model", metavar="FILE.json",
                       help="a ViT model JSON ({\"family\": \"vit\", ...}) to check against")
    parser.add_argument("--classes", type=int,
                        help="number of classes (default: from the last layer; 1000 with --torchvision)")
    parser.add_argument("--width", type=int, help="small-cnn width (default: from conv1.weight)")
    parser.add_argument("--out", required=True, help="checkpoint HDF5 to write")
    return parser.parse_args(argv)


def read_vit_description(path):
    try:
        with open(path) as f:
            description = json.load(f)
    except (OSError, ValueError) as error:
        raise ConversionError(f"--model {path}: cannot read a model JSON: {error}")
    if not isinstance(description, dict) or not is_vit_description(description):
        raise ConversionError(f"--model {path}: not a ViT description (\"family\": \"vit\" or a ViT preset)")
    return description


def convert(args):
    if args.torchvision:
        source = f"torchvision {args.torchvision} (seed {args.seed})"
        state_dict = seeded_torchvision(args.torchvision, args.seed, args.classes or 1000)
    else:
        source = args.state_dict
        state_dict = load_state_dict(args.state_dict)
    if args.model or vit_preset_name(args.preset):
        description = {"preset": vit_preset_name(args.preset)} if args.preset else read_vit_description(args.model)
        if is_swin(description):
            reference, state_dict, names = convert_swin(description, state_dict, source)
        else:
            reference, state_dict, names = convert_vit(description, state_dict, source, args.classes)
    else:
        classes = args.classes or infer_classes(args.preset, state_dict, source)
        width = args.width or (infer_width(state_dict, source) if args.preset == "small-cnn" else None)
        names = validate(args.preset, classes, width, state_dict, source)
        reference = preset_reference(args.preset, classes, width)
    write_checkpoint(args.out, reference, state_dict, names)
    count = sum(state_dict[n].numel() for n in names)
    print(f"wrote {args.out}: model {json.dumps(reference)}, {len(names)} tensors, "
          f"{count} values ({count * 4 / 2**20:.1f} MiB float32) from {source}")


def main(argv=None):
    args = parse_args(argv)
    try:
        convert(args)
    except ConversionError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Small vision transformers of the `vit` family against timm's definitions written in plain
PyTorch (tools/vit_reference.py; timm itself is not packaged for Debian): random weights, read
from .safetensors files (written here by hand: an 8-byte little-endian header length, a JSON
header, raw little-endian data) and from a torch.save state_dict converted by
tools/torch_to_tessera.py, run by `tessera forward`.

- A ViT with layer scale, 4 register tokens, timm's packed SwiGLU MLP and no position embedding on
  the class token (no_embed_class, as UNI2-h and H-optimus-0) gives the reference's features
  (float64) with a relative error max|a-b| / max|b| under 1e-4, from .safetensors (F32, and F16
  and BF16 weights against the reference with the same rounded weights) and from a state_dict
  alike; at its trained 32x32 input and at 48x40, where the position embedding is resampled as
  timm's resample_abs_pos_embed (bicubic, antialiased).
- GELU MLPs with the embedding over every token and Virchow2's output (class token joined with
  the mean of the patch tokens), and the mean of patch tokens after timm's fc_norm, likewise.
- A missing, misshapen or unexpected tensor is exit 5 naming it, nothing run; so is a truncated
  or lying .safetensors file; .safetensors weights without --encoder are exit 2.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile
import unittest

import h5py
import numpy as np
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tools"))
from vit_reference import VisionTransformer  # noqa: E402

CONVERTER = os.path.join(REPO, "tools", "torch_to_tessera.py")
TESSERA = os.environ.get("TESSERA_BINARY", "build/tools/tessera")
TOLERANCE = 1e-4
EXIT_USAGE, EXIT_BAD_INPUT = 2, 5

SWIGLU_REGISTERS = {"family": "vit", "image_size": 32, "patch_size": 8, "width": 48, "depth": 2, "heads": 3,
                    "mlp": "swiglu", "mlp_ratio": 2.0, "class_token": True, "register_tokens": 4,
                    "layer_scale": 1e-5, "position_embedding": "patches", "final_norm": "tokens",
                    "output": "class_token"}
GELU_CLASS_AND_MEAN = {"family": "vit", "image_size": 24, "patch_size": 6, "width": 40, "depth": 2, "heads": 2,
                       "mlp": "gelu", "mlp_ratio": 3.0, "register_tokens": 4, "layer_scale": 1e-5,
                       "position_embedding": "tokens", "output": "class_token_and_patch_mean"}
MEAN_POOLED = {"family": "vit", "image_size": 16, "patch_size": 4, "width": 32, "depth": 1, "heads": 4,
               "class_token": False, "position_embedding": "tokens", "final_norm": "pooled",
               "output": "patch_mean", "classes": 5}

SAFETENSORS_DTYPES = {"F32": (torch.float32, "<f4"), "F16": (torch.float16, "<f2"), "BF16": (torch.bfloat16, None),
                      "I64": (torch.int64, "<i8")}


def write_safetensors(path, tensors, dtype="F32"):
    """The format by hand: header length (u64 little-endian), JSON header, raw data."""
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, value in tensors.items():
        # Integer buffers (Swin's relative_position_index, BatchNorm's num_batches_tracked) stay I64.
        tensor_dtype = dtype if value.is_floating_point() else "I64"
        value = value.detach().to(SAFETENSORS_DTYPES[tensor_dtype][0]).contiguous()
        # bfloat16 has no numpy type: its bits are the upper halves of float32's.
        raw = (value.float().numpy().view(np.uint32) >> 16).astype("<u2").tobytes() if tensor_dtype == "BF16" \
            else value.numpy().astype(SAFETENSORS_DTYPES[tensor_dtype][1]).tobytes()
        header[name] = {"dtype": tensor_dtype, "shape": list(value.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)  # the format pads the header to 8 bytes
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def randomised(description, seed):
    """The reference with every parameter random and of a size that matters (timm's own init
    makes tokens 1e-6 and layer scales 1e-5), in eval mode, float64."""
    torch.manual_seed(seed)
    return randomise_parameters(VisionTransformer(description))


def randomise_parameters(model):
    """`model` (seeded by the caller) with random parameters of a size that matters, in eval mode, float64."""
    with torch.no_grad():
        for name, value in model.named_parameters():
            if name.endswith(("gamma", "lambda1")):  # timm's and Hugging Face's layer scales
                value.uniform_(0.5, 1.5)
            elif "norm" in name or "ln_" in name:  # LayerNorms (CONCH's pooler: ln_q, ln_k, ln_contrast)
                value.copy_((1.0 if name.endswith("weight") else 0.0) + 0.2 * torch.randn_like(value))
            elif name.endswith("weight") and value.dim() > 1:  # linear and convolution: activations of unit scale
                value.normal_(0.0, 1.5 / value[0].numel() ** 0.5)
            else:  # biases, tokens, position embeddings
                value.normal_(0.0, 0.3)
    return model.double().eval()


def relative_error(actual, expected):
    return float(np.abs(actual - expected).max() / np.abs(expected).max())


def run(*args):
    return subprocess.run([TESSERA, *map(str, args)], capture_output=True, text=True, timeout=600)


class SmallVitsMatchTimm(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.directory = tempfile.TemporaryDirectory(prefix="tessera-vit-")
        cls.dir = cls.directory.name

    @classmethod
    def tearDownClass(cls):
        cls.directory.cleanup()

    def path(self, name):
        return os.path.join(self.dir, name)

    def write_json(self, name, value):
        with open(self.path(name), "w") as f:
            json.dump(value, f)
        return self.path(name)

    def forward(self, model_args, images, name):
        """`tessera forward` of images [N,3,H,W] (normalised float32) -> its output."""
        inputs, outputs = self.path(name + "-input.h5"), self.path(name + "-output.h5")
        with h5py.File(inputs, "w") as f:
            f.create_dataset("x", data=images.numpy().astype(np.float32))
        if os.path.exists(outputs):
            os.remove(outputs)
        result = run("forward", *model_args, "--input", inputs, "--output", outputs, "--batch", 3)
        self.assertEqual(result.returncode, 0, result.stderr)
        with h5py.File(outputs, "r") as f:
            return f["logits"][...]

    def check(self, description, model_args, reference, images, what, tolerance=TOLERANCE):
        with torch.no_grad():
            expected = reference(images.double()).numpy()
        self.assertGreater(float(expected.std()), 1e-2, "reference features are nearly constant")
        actual = self.forward(model_args, images, what.replace(" ", "-"))
        self.assertEqual(actual.shape, expected.shape)
        error = relative_error(actual.astype(np.float64), expected)
        print(f"{what}: relative error {error:.3g} (limit {tolerance})", file=sys.stderr)
        self.assertLess(error, tolerance, what)

    def images(self, seed, height, width, count=5):
        return torch.randn((count, 3, height, width), generator=torch.Generator().manual_seed(seed))

    def test_swiglu_registers_layer_scale_from_safetensors_and_state_dict(self):
        description = SWIGLU_REGISTERS
        model = randomised(description, seed=1)
        encoder = self.write_json("swiglu.json", description)
        state = model.float().state_dict()
        model.double()
        write_safetensors(self.path("swiglu.safetensors"), state)
        torch.save(state, self.path("swiglu.pt"))
        converted = subprocess.run([sys.executable, CONVERTER, "--state-dict", self.path("swiglu.pt"), "--model",
                                    encoder, "--out", self.path("swiglu.h5")], capture_output=True, text=True)
        self.assertEqual(converted.returncode, 0, converted.stderr)
        for height, width in ((32, 32), (48, 40)):  # trained grid 4x4, and 6x5: resampled
            images = self.images(height + width, height, width)
            self.check(description, ["--model", self.path("swiglu.safetensors"), "--encoder", encoder], model, images,
                       f"swiglu vit {height}x{width} from safetensors")
            self.check(description, ["--model", self.path("swiglu.h5")], model, images,
                       f"swiglu vit {height}x{width} from a state_dict")

    def test_half_precision_weights_in_safetensors(self):
        description = SWIGLU_REGISTERS
        images = self.images(7, 32, 32)
        encoder = self.write_json("swiglu.json", description)
        for dtype in ("F16", "BF16"):
            model = randomised(description, seed=2)
            torch_dtype = SAFETENSORS_DTYPES[dtype][0]
            with torch.no_grad():  # the reference runs on the weights as the file rounds them
                for value in model.parameters():
                    value.copy_(value.to(torch_dtype).double())
            write_safetensors(self.path(f"half-{dtype}.safetensors"), model.float().state_dict(), dtype)
            self.check(description, ["--model", self.path(f"half-{dtype}.safetensors"), "--encoder", encoder],
                       model.double(), images, f"swiglu vit with {dtype} weights")

    def test_gelu_class_token_and_patch_mean(self):
        model = randomised(GELU_CLASS_AND_MEAN, seed=3)
        write_safetensors(self.path("gelu.safetensors"), model.float().state_dict())
        encoder = self.write_json("gelu.json", GELU_CLASS_AND_MEAN)
        self.check(GELU_CLASS_AND_MEAN, ["--model", self.path("gelu.safetensors"), "--encoder", encoder],
                   model.double(), self.images(4, 24, 24), "gelu vit, class token and patch mean")

    def test_patch_mean_with_fc_norm_and_head(self):
        model = randomised(MEAN_POOLED, seed=4)
        write_safetensors(self.path("mean.safetensors"), model.float().state_dict())
        encoder = self.write_json("mean.json", MEAN_POOLED)
        self.check(MEAN_POOLED, ["--model", self.path("mean.safetensors"), "--encoder", encoder], model.double(),
                   self.images(5, 20, 16), "mean-pooled vit with fc_norm and a head")

    def expect_refused(self, result, code, *names):
        self.assertEqual(result.returncode, code, result.stderr)
        for name in names:
            self.assertIn(name, result.stderr)

    def test_missing_misshapen_and_unexpected_tensors_are_named(self):
        description = SWIGLU_REGISTERS
        encoder = self.write_json("swiglu.json", description)
        state = randomised(description, seed=5).float().state_dict()
        broken = dict(state)
        del broken["blocks.1.ls2.gamma"]
        broken["pos_embed"] = torch.zeros(1, 17, 48)
        broken["blocks.0.attn.qkv.weight"] = torch.zeros(144, 47)
        broken["head.weight"] = torch.zeros(3, 48)
        write_safetensors(self.path("broken.safetensors"), broken)
        inputs = self.path("refused-input.h5")
        with h5py.File(inputs, "w") as f:
            f.create_dataset("x", data=np.zeros((1, 3, 32, 32), np.float32))
        output = self.path("refused.h5")
        result = run("forward", "--model", self.path("broken.safetensors"), "--encoder", encoder, "--input", inputs,
                     "--output", output)
        self.expect_refused(result, EXIT_BAD_INPUT, "missing tensor 'blocks.1.ls2.gamma'",
                            "'pos_embed' has shape [1,17,48]", "'blocks.0.attn.qkv.weight' has shape [144,47]",
                            "unexpected tensor 'head.weight'")
        self.assertFalse(os.path.exists(output))
        torch.save(broken, self.path("broken.pt"))
        converted = subprocess.run([sys.executable, CONVERTER, "--state-dict", self.path("broken.pt"), "--model",
                                    encoder, "--classes", "0", "--out", self.path("broken.h5")],
                                   capture_output=True, text=True)
        self.expect_refused(converted, EXIT_BAD_INPUT, "missing tensor 'blocks.1.ls2.gamma'", "'pos_embed' has shape",
                            "'blocks.0.attn.qkv.weight' has shape", "unexpected tensor 'head.weight'")
        self.assertFalse(os.path.exists(self.path("broken.h5")))

    def test_truncated_and_lying_files_are_refused(self):
        description = SWIGLU_REGISTERS
        encoder = self.write_json("swiglu.json", description)
        write_safetensors(self.path("whole.safetensors"), randomised(description, seed=6).float().state_dict())
        with open(self.path("whole.safetensors"), "rb") as f:
            data = f.read()
        (header_length,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + header_length])
        cases = {
            "truncated": data[:len(data) - 100],
            "short-header": data[:8 + header_length // 2],
            "tiny": data[:5],
            "not-json": struct.pack("<Q", 4) + b"{{{{" + data[8 + header_length:],
        }
        lying = dict(header)
        first = next(k for k in lying if k != "__metadata__")
        lying[first] = dict(lying[first], shape=[2] + lying[first]["shape"])  # more values than its bytes
        text = json.dumps(lying).encode()
        cases["lying-shape"] = struct.pack("<Q", len(text)) + text + data[8 + header_length:]
        inputs = self.path("refused-input.h5")
        with h5py.File(inputs, "w") as f:
            f.create_dataset("x", data=np.zeros((1, 3, 32, 32), np.float32))
        for name, content in cases.items():
            path = self.path(name + ".safetensors")
            with open(path, "wb") as f:
                f.write(content)
            result = run("forward", "--model", path, "--encoder", encoder, "--input", inputs, "--output",
                         self.path(name + "-out.h5"))
            self.expect_refused(result, EXIT_BAD_INPUT, path)
            self.assertFalse(os.path.exists(self.path(name + "-out.h5")), name)

    def test_safetensors_needs_an_encoder(self):
        inputs = self.path("usage-input.h5")
        with h5py.File(inputs, "w") as f:
            f.create_dataset("x", data=np.zeros((1, 3, 32, 32), np.float32))
        write_safetensors(self.path("usage.safetensors"), {"x": torch.zeros(1)})
        self.expect_refused(run("forward", "--model", self.path("usage.safetensors"), "--input", inputs, "--output",
                                self.path("usage-out.h5")), EXIT_USAGE, "--encoder")
        self.expect_refused(run("forward", "--model", "small-cnn", "--encoder", "uni", "--random-weights", "--input",
                                inputs, "--output", self.path("usage-out.h5")), EXIT_USAGE, "--encoder")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        TESSERA = sys.argv.pop(1)
    unittest.main(verbosity=2)

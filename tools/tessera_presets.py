"""PyTorch twins of tessera's built-in model presets and its input normalisation.

Shared by the Python tools (checkpoint converter, PyTorch reference trainer, benchmark) and
the tests, so that every comparison with tessera uses one definition of each preset.
Run with Debian's /usr/bin/python3, which has torch and torchvision.
"""
import torch
import torchvision
from torch import nn

PRESETS = ("small-cnn", "resnet18", "resnet50")
SMALL_CNN_DEFAULT_WIDTH = 32
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class SmallCNN(nn.Module):
    """conv-relu-pool, conv-relu-pool, dense-relu-dropout, dense; module names as tessera's."""

    def __init__(self, classes, width, height, image_width):
        super().__init__()
        if height % 4 or image_width % 4:
            raise ValueError(f"small-cnn needs an input size divisible by 4, got {height}x{image_width}")
        self.conv1 = nn.Conv2d(3, width, 3, padding=1)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
        self.fc1 = nn.Linear(2 * width * (height // 4) * (image_width // 4), 4 * width)
        self.fc2 = nn.Linear(4 * width, classes)
        self.pool = nn.MaxPool2d(2)
        self.dropout = nn.Dropout(0.5)

    def forward(self, x):
        x = self.pool(torch.relu(self.conv1(x)))
        x = self.pool(torch.relu(self.conv2(x)))
        x = torch.relu(self.fc1(torch.flatten(x, 1)))
        return self.fc2(self.dropout(x))


def build_preset(name, classes, input_size, width=SMALL_CNN_DEFAULT_WIDTH):
    """A freshly initialised (PyTorch default init) preset for 3 x input_size[0] x input_size[1]."""
    if name == "small-cnn":
        return SmallCNN(classes, width, input_size[0], input_size[1])
    if name in ("resnet18", "resnet50"):
        return getattr(torchvision.models, name)(num_classes=classes)
    raise ValueError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}")


def preset_reference(name, classes, width=SMALL_CNN_DEFAULT_WIDTH):
    """The checkpoint's `model` attribute for a preset (as a dict, to be JSON-encoded)."""
    reference = {"preset": name, "classes": classes}
    if name == "small-cnn":
        reference["width"] = width
    return reference


def normalise(images_uint8_nhwc):
    """uint8 [N,H,W,C] -> float32 NCHW, x/255 then per-channel ImageNet mean/std for RGB (C = 3);
    other channel counts (a multiplex slide's) (x/255 - 0.5) / 0.5, as tessera's input_normalize."""
    x = torch.as_tensor(images_uint8_nhwc).permute(0, 3, 1, 2).float().div_(255.0)
    if x.shape[1] != 3:
        return (x - 0.5) / 0.5
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    return (x - mean) / std


class Resnet50Trunc(nn.Module):
    """CLAM's resnet50_trunc feature extractor: torchvision's resnet50 through layer3, then
    adaptive average pooling to 1x1; [N,3,H,W] -> [N,1024] (CLAM's models/resnet_custom.py)."""

    def __init__(self, resnet50):
        super().__init__()
        self.trunk = nn.Sequential(resnet50.conv1, resnet50.bn1, resnet50.relu, resnet50.maxpool,
                                   resnet50.layer1, resnet50.layer2, resnet50.layer3)
        self.pool = nn.AdaptiveAvgPool2d(1)

    def forward(self, x):
        return torch.flatten(self.pool(self.trunk(x)), 1)

#!/usr/bin/python3
"""Train a tessera preset in PyTorch (CPU) with the same settings as `tessera train`.

The reference for "tessera reaches the accuracy PyTorch reaches". It mirrors tessera train:
- data: PCam-layout HDF5 (`x` uint8 [N,H,W,3], `y` [N] or [N,1,1,1]);
- split: the LAST round(F*N) patches are validation, the rest training, no shuffle;
- input: x/255, then per-channel ImageNet mean/std, NCHW; no augmentation;
- training order reshuffled every epoch from --seed; the last incomplete batch is dropped;
- init: PyTorch's default initialisation, seeded with --seed;
- loss: mean softmax cross-entropy; optimizers with PyTorch semantics (sgd: L2 weight decay
  added to the gradient, momentum without dampening; adam: L2 weight decay; adamw: decoupled
  weight decay; adagrad: initial accumulator 0, eps 1e-10).
Prints one JSON line per epoch on stdout, with the fields of tessera train's epoch event:
{"event":"epoch","epoch":e,"train_loss":..,"train_accuracy":..,"val_loss":..,"val_accuracy":..}
train_loss/train_accuracy are averaged over the epoch's training batches (train mode, as
they were computed during the step); val_* over all validation patches in eval mode.
Defaults are those of tessera train; pass flags explicitly in comparisons all the same.
"""
import argparse
import json
import os
import sys
import time

import h5py
import numpy as np
import torch
from torch import nn

from tessera_presets import PRESETS, SMALL_CNN_DEFAULT_WIDTH, build_preset, normalise

EXIT_BAD_INPUT = 5  # tessera's exit code for missing, corrupt or unreadable data


class BadData(Exception):
    """The patch file is missing or malformed; the message names the file and dataset."""


def load_patches(path):
    """(x uint8 [N,H,W,3], y int64 [N]) from a PCam-layout file; errors name file and dataset."""
    try:
        f = h5py.File(path, "r")
    except OSError as error:
        raise BadData(f"cannot open patch file {path}: {error}")
    with f:
        for name in ("x", "y"):
            if name not in f:
                raise BadData(f"{path}: dataset '{name}' is missing")
        x, y = f["x"], f["y"]
        if x.dtype != np.uint8 or x.ndim != 4 or x.shape[3] != 3:
            raise BadData(f"{path}: dataset 'x' must be uint8 [N,H,W,3], "
                             f"got {x.dtype} {list(x.shape)}")
        if y.shape[0] != x.shape[0] or int(np.prod(y.shape[1:])) != 1:
            raise BadData(f"{path}: dataset 'y' must be [N] or [N,1,1,1] with "
                             f"N={x.shape[0]}, got {list(y.shape)}")
        return x[...], y[...].reshape(-1).astype(np.int64)


def split(count, val_fraction):
    """(train indices, validation indices): the last round(F*N) patches validate."""
    val_count = int(round(val_fraction * count))
    return np.arange(count - val_count), np.arange(count - val_count, count)


def make_optimizer(name, parameters, lr, momentum, weight_decay):
    if name == "sgd":
        return torch.optim.SGD(parameters, lr=lr, momentum=momentum, weight_decay=weight_decay)
    if name == "adam":
        return torch.optim.Adam(parameters, lr=lr, weight_decay=weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(parameters, lr=lr, weight_decay=weight_decay)
    if name == "adagrad":
        return torch.optim.Adagrad(parameters, lr=lr, weight_decay=weight_decay)
    raise ValueError(f"unknown optimizer {name!r}")


def train_epoch(model, optimizer, x, y, order, batch):
    """One pass over full batches in `order`; (mean loss, accuracy) as seen during training."""
    model.train()
    loss_sum, correct, seen = 0.0, 0, 0
    for start in range(0, len(order) - batch + 1, batch):
        index = order[start:start + batch]
        inputs, targets = normalise(x[index]), torch.from_numpy(y[index])
        logits = model(inputs)
        loss = nn.functional.cross_entropy(logits, targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss_sum += loss.item() * batch
        correct += (logits.argmax(1) == targets).sum().item()
        seen += batch
    return loss_sum / seen, correct / seen


@torch.no_grad()
def evaluate(model, x, y, indices, batch):
    """(mean loss, accuracy) over `indices` in eval mode; (None, None) when there are none."""
    if len(indices) == 0:
        return None, None
    model.eval()
    loss_sum, correct = 0.0, 0
    for start in range(0, len(indices), batch):
        index = indices[start:start + batch]
        logits = model(normalise(x[index]))
        targets = torch.from_numpy(y[index])
        loss_sum += nn.functional.cross_entropy(logits, targets, reduction="sum").item()
        correct += (logits.argmax(1) == targets).sum().item()
    return loss_sum / len(indices), correct / len(indices)


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--data", required=True, help="PCam-layout HDF5 patch file")
    parser.add_argument("--model", choices=PRESETS, default="small-cnn", help="preset (default small-cnn)")
    parser.add_argument("--width", type=int, default=SMALL_CNN_DEFAULT_WIDTH,
                        help=f"small-cnn width w (default {SMALL_CNN_DEFAULT_WIDTH})")
    parser.add_argument("--epochs", type=int, default=1, help="epochs (default 1)")
    parser.add_argument("--batch", type=int, default=32, help="batch size (default 32)")
    parser.add_argument("--optimizer", choices=("sgd", "adam", "adamw", "adagrad"), default="sgd",
                        help="optimizer (default sgd)")
    parser.add_argument("--lr", type=float, default=0.01, help="learning rate (default 0.01)")
    parser.add_argument("--momentum", type=float, default=0.0, help="SGD momentum (default 0)")
    parser.add_argument("--weight-decay", type=float, default=0.0, help="weight decay (default 0)")
    parser.add_argument("--seed", type=int, default=0, help="seed for init, dropout, order (default 0)")
    parser.add_argument("--val-fraction", type=float, default=0.1,
                        help="fraction of patches, taken from the end, for validation (default 0.1)")
    parser.add_argument("--threads", type=int, default=os.cpu_count(),
                        help="CPU threads for torch (default: all cores)")
    args = parser.parse_args(argv)
    if not 0.0 <= args.val_fraction < 1.0:
        parser.error(f"--val-fraction must be in [0,1), got {args.val_fraction}")
    if args.batch < 1 or args.epochs < 1:
        parser.error("--batch and --epochs must be at least 1")
    return args


def main(argv=None):
    args = parse_args(argv)
    try:
        return train(args)
    except BadData as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT


def train(args):
    torch.set_num_threads(args.threads)
    x, y = load_patches(args.data)
    classes = int(y.max()) + 1
    train_index, val_index = split(len(x), args.val_fraction)
    if len(train_index) < args.batch:
        raise BadData(f"{args.data}: {len(train_index)} training patches, "
                         f"fewer than one batch of {args.batch}")
    torch.manual_seed(args.seed)
    model = build_preset(args.model, classes, x.shape[1:3], args.width)
    optimizer = make_optimizer(args.optimizer, model.parameters(), args.lr, args.momentum,
                               args.weight_decay)
    order_rng = np.random.default_rng(args.seed)
    print(json.dumps({"event": "start", "model": args.model, "classes": classes,
                      "input": [3, x.shape[1], x.shape[2]], "train": len(train_index),
                      "val": len(val_index),
                      "parameters": sum(p.numel() for p in model.parameters())}), flush=True)
    started = time.perf_counter()
    for epoch in range(1, args.epochs + 1):
        order = order_rng.permutation(train_index)
        train_loss, train_accuracy = train_epoch(model, optimizer, x, y, order, args.batch)
        if not np.isfinite(train_loss):
            print(json.dumps({"event": "diverged", "epoch": epoch}), flush=True)
            return 4
        val_loss, val_accuracy = evaluate(model, x, y, val_index, args.batch)
        print(json.dumps({"event": "epoch", "epoch": epoch, "train_loss": train_loss,
                          "train_accuracy": train_accuracy, "val_loss": val_loss,
                          "val_accuracy": val_accuracy,
                          "seconds": round(time.perf_counter() - started, 2)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

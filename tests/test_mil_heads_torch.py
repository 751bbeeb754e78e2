"""Slide-level heads against PyTorch: each head's loss and parameter gradients for one bag
(tests/head_gradients runs the head's graph and the training loop's loss once on the device,
from weights written here) against the same head written in PyTorch from its published
definition, in float64, on bags of 1, 7, 10,001 and 100,001 instances (clam: 60,001) (relative
error under 1e-4 in fp32; past 65,535, lavapipe's bound on one invocation's loops, the kernels
that reduce over a bag's rows share them among a workgroup); dsmil's combined loss (bag and max-instance terms) from dsmil.py and train_tcga.py, and
its ties of the critical instance in fp32 and fp16; clam-sb's and clam-mb's (bag and instance
clustering terms) from CLAM's model_clam.py and core_utils.py, and their ties of attention in
fp32 and fp16; transmil's (Nystrom attention, PPEG) from TransMIL.py and nystrom_attention.py, on
bags of 1, 2, 7, 10, 17 and 10,001, and in fp16. The max head also on bags whose features tie (the
first instance takes the gradient), trained twice to the same bytes, and its memory plan against the measured peak; --head with an
unknown name exits 2 listing the heads."""
import hashlib
import json
import os
import subprocess

import h5py
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from data_tools import run

TESSERA = os.environ.get("TESSERA_BINARY", "build/tools/tessera")
HEAD_GRADIENTS = os.environ.get("TESSERA_HEAD_GRADIENTS",
                                os.path.join(os.path.dirname(os.path.dirname(TESSERA)), "tests", "head_gradients"))
WIDTH, HIDDEN = 24, 16


def tessera(*args):
    result = run(TESSERA, *args, check=False, env=dict(os.environ, TESSERA_VALIDATION="1"))
    assert "vulkan validation" not in result.stderr.lower(), result.stderr
    return result


def linear_weights(generator, name, inputs, outputs):
    """PyTorch's nn.Linear initialisation, U(-1/sqrt(in), 1/sqrt(in)), as float32."""
    bound = 1 / np.sqrt(inputs)
    return {name + ".weight": generator.uniform(-bound, bound, (outputs, inputs)).astype(np.float32),
            name + ".bias": generator.uniform(-bound, bound, outputs).astype(np.float32)}


def head_weights(head, classes, seed):
    generator = np.random.default_rng(seed)
    weights = {}
    if head == "dsmil":
        # Named as dsmil.py's MILNet state_dict; fcc, Conv1d(C, C, kernel_size=D), as [C, C*D].
        weights.update(linear_weights(generator, "i_classifier.fc.0", WIDTH, classes))
        weights.update(linear_weights(generator, "b_classifier.q.0", WIDTH, HIDDEN))
        weights.update(linear_weights(generator, "b_classifier.q.2", HIDDEN, HIDDEN))
        weights.update(linear_weights(generator, "b_classifier.fcc", classes * WIDTH, classes))
        return weights
    if head == "attention":
        weights.update(linear_weights(generator, "attention_V", WIDTH, HIDDEN))
        weights.update(linear_weights(generator, "attention_U", WIDTH, HIDDEN))
        weights.update(linear_weights(generator, "attention_w", HIDDEN, 1))
    weights.update(linear_weights(generator, "classifier", WIDTH, classes))
    return weights


CLAM_WIDTH = 512  # model_clam.py's size_dict: size[1]


def clam_weights(head, classes, seed):
    """Named as CLAM_SB's and CLAM_MB's state_dict; CLAM-MB's classifiers (Linear(512, 1) a class)
    as one [C, 512] weight and [C] bias, the instance classifiers (Linear(512, 2) a class) as one
    [C, 2, 512] weight and [C, 2] bias."""
    generator = np.random.default_rng(seed)
    weights = linear_weights(generator, "attention_net.0", WIDTH, CLAM_WIDTH)
    weights.update(linear_weights(generator, "attention_net.3.attention_a.0", CLAM_WIDTH, HIDDEN))
    weights.update(linear_weights(generator, "attention_net.3.attention_b.0", CLAM_WIDTH, HIDDEN))
    columns = classes if head == "clam-mb" else 1
    weights.update(linear_weights(generator, "attention_net.3.attention_c", HIDDEN, columns))
    weights.update(linear_weights(generator, "classifiers", CLAM_WIDTH, 1 if head == "clam-mb" else classes))
    if head == "clam-mb":
        bags = [linear_weights(generator, "c", CLAM_WIDTH, 1) for _ in range(classes)]
        weights["classifiers.weight"] = np.concatenate([b["c.weight"] for b in bags])
        weights["classifiers.bias"] = np.concatenate([b["c.bias"] for b in bags])
    instances = [linear_weights(generator, "i", CLAM_WIDTH, 2) for _ in range(classes)]
    weights["instance_classifiers.weight"] = np.stack([i["i.weight"] for i in instances])
    weights["instance_classifiers.bias"] = np.stack([i["i.bias"] for i in instances])
    return weights


def clam_loss(head, p, h, label, k_sample=8, subtyping=False, bag_weight=0.7):
    """CLAM as mahmoodlab/CLAM at commit 0266041353ff716beea80d2ee8a4676adaf7ffb2 defines it
    (models/model_clam.py, CLAM_SB and CLAM_MB with gate=True, dropout 0, instance_eval=True) and
    trains it (utils/core_utils.py train_loop_clam: bag_weight * CrossEntropyLoss of the bag +
    (1 - bag_weight) * the instance loss). Two departures, as tessera's: k = min(k_sample, N)
    (CLAM's topk fails on fewer patches) and topk made stable, so a tie goes to the lowest row."""
    classes = p["instance_classifiers.bias"].shape[0]
    k = min(k_sample, h.shape[0])

    def topk_ids(A, largest):  # torch.topk(A, k)[1] (largest) or torch.topk(-A, k)[1], stable on ties
        return torch.sort(A, descending=largest, stable=True)[1][:k]

    def instance_classifier(i, x):
        return F.linear(x, p["instance_classifiers.weight"][i], p["instance_classifiers.bias"][i])

    def inst_eval(A, h, i):  # top k positives, bottom k negatives
        top_p, top_n = h.index_select(0, topk_ids(A, True)), h.index_select(0, topk_ids(A, False))
        targets = torch.cat([torch.full((k,), 1), torch.full((k,), 0)]).long()
        return F.cross_entropy(instance_classifier(i, torch.cat([top_p, top_n])), targets)

    def inst_eval_out(A, h, i):  # top k as negatives
        return F.cross_entropy(instance_classifier(i, h.index_select(0, topk_ids(A, True))),
                               torch.full((k,), 0).long())

    # attention_net: fc Linear + ReLU, then Attn_Net_Gated
    h = F.relu(F.linear(h, p["attention_net.0.weight"], p["attention_net.0.bias"]))
    a = torch.tanh(F.linear(h, p["attention_net.3.attention_a.0.weight"], p["attention_net.3.attention_a.0.bias"]))
    b = torch.sigmoid(F.linear(h, p["attention_net.3.attention_b.0.weight"], p["attention_net.3.attention_b.0.bias"]))
    A = F.linear(a.mul(b), p["attention_net.3.attention_c.weight"], p["attention_net.3.attention_c.bias"])
    A = F.softmax(torch.transpose(A, 1, 0), dim=1)  # K x N
    total_inst_loss = 0.0
    inst_labels = F.one_hot(torch.tensor([label]), num_classes=classes).squeeze()
    for i in range(classes):
        column = A[i] if head == "clam-mb" else A[0]
        if inst_labels[i].item() == 1:
            total_inst_loss += inst_eval(column, h, i)
        elif subtyping:
            total_inst_loss += inst_eval_out(column, h, i)
    if subtyping:
        total_inst_loss /= classes
    M = torch.mm(A, h)
    if head == "clam-mb":
        logits = torch.stack([F.linear(M[c], p["classifiers.weight"][c:c + 1], p["classifiers.bias"][c:c + 1])[0]
                              for c in range(classes)]).view(1, classes)
    else:
        logits = F.linear(M, p["classifiers.weight"], p["classifiers.bias"])
    return bag_weight * F.cross_entropy(logits, torch.tensor([label])) + (1 - bag_weight) * total_inst_loss


def dsmil_loss(p, h, label):
    """DSMIL as binli123/dsmil-wsi at commit 80465ed534ac49b5e550833da56c27936f0b9440 defines and
    trains it: dsmil.py's MILNet(FCLayer, BClassifier(nonlinear=True, passing_v=False)), as
    train_tcga.py builds it (V = nn.Identity()), and train_tcga.py's loss 0.5 * bag loss + 0.5 *
    the loss of the max over instances of the instance logits, with cross-entropy for its
    BCEWithLogitsLoss (tessera's classes are single-label). torch.sort is made stable so that a tie
    goes to the first instance, as tessera's does."""
    classes = F.linear(h, p["i_classifier.fc.0.weight"], p["i_classifier.fc.0.bias"])  # N x C
    count = p["i_classifier.fc.0.bias"].shape[0]

    def q(x):  # nn.Sequential(nn.Linear(D, 128), nn.ReLU(), nn.Linear(128, 128), nn.Tanh())
        hidden = F.relu(F.linear(x, p["b_classifier.q.0.weight"], p["b_classifier.q.0.bias"]))
        return torch.tanh(F.linear(hidden, p["b_classifier.q.2.weight"], p["b_classifier.q.2.bias"]))

    V = h
    Q = q(h).view(h.shape[0], -1)
    _, m_indices = torch.sort(classes, stable=True, dim=0, descending=True)
    m_feats = torch.index_select(h, dim=0, index=m_indices[0, :])
    q_max = q(m_feats)
    A = torch.mm(Q, q_max.transpose(0, 1))
    A = F.softmax(A / torch.sqrt(torch.tensor(Q.shape[1], dtype=torch.float64)), 0)
    B = torch.mm(A.transpose(0, 1), V).view(1, count, -1)
    bag = F.conv1d(B, p["b_classifier.fcc.weight"].view(count, count, -1), p["b_classifier.fcc.bias"]).view(1, -1)
    max_prediction, _ = torch.max(classes, 0)
    target = torch.tensor([label])
    return 0.5 * F.cross_entropy(bag, target) + 0.5 * F.cross_entropy(max_prediction.view(1, -1), target)


def conv_weights(generator, name, channels, kernel):
    """A depthwise nn.Conv2d(channels, channels, kernel, groups=channels)'s initialisation:
    U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = kernel[0] * kernel[1], as float32."""
    bound = 1 / np.sqrt(kernel[0] * kernel[1])
    return {name + ".weight": generator.uniform(-bound, bound, (channels, 1, *kernel)).astype(np.float32),
            name + ".bias": generator.uniform(-bound, bound, channels).astype(np.float32)}


TRANSMIL_HEADS, TRANSMIL_RESIDUAL_KERNEL = 8, 33  # TransLayer's NystromAttention(heads=8), its default kernel


def transmil_weights(classes, seed, hidden=HIDDEN, features=WIDTH):
    """Named and shaped as TransMIL's state_dict with its 512 as `hidden`; LayerNorms random (not
    PyTorch's ones and zeros) so that their gradients are tested."""
    generator = np.random.default_rng(seed)
    inner = TRANSMIL_HEADS * (hidden // TRANSMIL_HEADS)
    weights = linear_weights(generator, "_fc1.0", features, hidden)
    weights["cls_token"] = generator.normal(size=(1, 1, hidden)).astype(np.float32)  # torch.randn
    for norm in ("layer1.norm", "layer2.norm", "norm"):
        weights[norm + ".weight"] = (1 + 0.2 * generator.normal(size=hidden)).astype(np.float32)
        weights[norm + ".bias"] = (0.2 * generator.normal(size=hidden)).astype(np.float32)
    for layer in ("layer1", "layer2"):
        bound = 1 / np.sqrt(hidden)  # to_qkv: nn.Linear(dim, 3 * inner, bias=False)
        weights[layer + ".attn.to_qkv.weight"] = \
            generator.uniform(-bound, bound, (3 * inner, hidden)).astype(np.float32)
        weights.update(linear_weights(generator, layer + ".attn.to_out.0", inner, hidden))
        bound = 1 / np.sqrt(TRANSMIL_RESIDUAL_KERNEL)  # res_conv: (33, 1) kernels, bias=False
        weights[layer + ".attn.res_conv.weight"] = generator.uniform(
            -bound, bound, (TRANSMIL_HEADS, 1, TRANSMIL_RESIDUAL_KERNEL, 1)).astype(np.float32)
    for name, kernel in (("proj", 7), ("proj1", 5), ("proj2", 3)):
        weights.update(conv_weights(generator, "pos_layer." + name, hidden, (kernel, kernel)))
    weights.update(linear_weights(generator, "_fc2", hidden, classes))
    return weights


def moore_penrose_iter_pinv(x, iters):
    """nystrom_attention.py's: z0 = x^T / (the largest row sum of |x| times the largest column sum,
    each over every head at once), then iters of z = z (13 I - xz (15 I - xz (7 I - xz))) / 4."""
    abs_x = torch.abs(x)
    col, row = abs_x.sum(dim=-1), abs_x.sum(dim=-2)
    z = x.transpose(-1, -2) / (torch.max(col) * torch.max(row))
    identity = torch.eye(x.shape[-1], dtype=x.dtype)[None]
    for _ in range(iters):
        xz = x @ z
        z = 0.25 * z @ (13 * identity - (xz @ (15 * identity - (xz @ (7 * identity - xz)))))
    return z


def nystrom_attention(p, prefix, x, trace, iters=6):
    """NystromAttention(dim, dim_head=dim//8, heads=8, num_landmarks=dim//2, pinv_iterations=6,
    residual=True, residual_conv_kernel=33) without a mask or dropout, on x [1, n, dim]; einops'
    rearrange and reduce written as reshapes ('b n (h d) -> b h n d', '... (n l) d -> ... n d');
    `trace` gets the landmarks, the pinv and the heads' output (padded rows included)."""
    b, n, dim = x.shape
    heads, m = TRANSMIL_HEADS, dim // 2
    remainder = n % m
    if remainder > 0:  # zero rows in front, so that m landmarks of l rows each cover the sequence
        x = F.pad(x, (0, 0, m - remainder, 0), value=0)
    q, k, v = F.linear(x, p[prefix + "to_qkv.weight"]).chunk(3, dim=-1)
    q, k, v = (t.reshape(b, t.shape[1], heads, -1).transpose(1, 2) for t in (q, k, v))
    dim_head = q.shape[-1]
    q = q * dim_head ** -0.5
    l = -(-n // m)  # ceil(n / m), of the unpadded n as the source's
    q_landmarks = q.reshape(b, heads, m, l, dim_head).sum(dim=-2) / l
    k_landmarks = k.reshape(b, heads, m, l, dim_head).sum(dim=-2) / l
    trace[prefix + "q_landmarks"], trace[prefix + "k_landmarks"] = q_landmarks, k_landmarks
    sim1 = q @ k_landmarks.transpose(-1, -2)
    sim2 = q_landmarks @ k_landmarks.transpose(-1, -2)
    sim3 = q_landmarks @ k.transpose(-1, -2)
    attn1, attn2, attn3 = (t.softmax(dim=-1) for t in (sim1, sim2, sim3))
    trace[prefix + "attn2_inv"] = attn2_inv = moore_penrose_iter_pinv(attn2, iters)
    out = (attn1 @ attn2_inv) @ (attn3 @ v)
    kernel = p[prefix + "res_conv.weight"]  # Conv2d(heads, heads, (33, 1), padding=(16, 0), groups=heads, bias=False)
    out = out + F.conv2d(v, kernel, padding=(kernel.shape[2] // 2, 0), groups=heads)
    trace[prefix + "heads"] = out = out.transpose(1, 2).reshape(b, -1, heads * dim_head)
    out = F.linear(out, p[prefix + "to_out.0.weight"], p[prefix + "to_out.0.bias"])
    return out[:, -n:]


def transmil_logits(p, h, trace=None):
    """TransMIL's forward (TransMIL.py: _fc1, the square padding, the class token, TransLayer, PPEG,
    TransLayer, norm, _fc2) on one bag h [n, features]; `trace` (a dict) gets the intermediates."""
    trace = {} if trace is None else trace
    dim = p["cls_token"].shape[-1]

    def layer_norm(x, name):
        return F.layer_norm(x, (dim,), p[name + ".weight"], p[name + ".bias"])  # nn.LayerNorm's eps, 1e-5

    def trans_layer(x, name):
        return x + nystrom_attention(p, name + ".attn.", layer_norm(x, name + ".norm"), trace)

    h = F.relu(F.linear(h, p["_fc1.0.weight"], p["_fc1.0.bias"]))[None]  # [1, n, dim]
    side = int(np.ceil(np.sqrt(h.shape[1])))
    h = torch.cat([h, h[:, :side * side - h.shape[1], :]], dim=1)  # the first rows again, to a square
    trace["sequence"] = h = torch.cat([p["cls_token"], h], dim=1)
    trace["layer1"] = h = trans_layer(h, "layer1")

    # PPEG: the class token kept, the rest a side x side grid (row-major) through three depthwise convs.
    def depthwise(grid, name):  # nn.Conv2d(dim, dim, k, 1, k // 2, groups=dim)
        kernel = p[f"pos_layer.{name}.weight"]
        return F.conv2d(grid, kernel, p[f"pos_layer.{name}.bias"], padding=kernel.shape[-1] // 2, groups=dim)

    cls_token, grid = h[:, 0], h[:, 1:].transpose(1, 2).reshape(1, dim, side, side)
    grid = depthwise(grid, "proj") + grid + depthwise(grid, "proj1") + depthwise(grid, "proj2")
    trace["pos_layer"] = h = torch.cat([cls_token[:, None], grid.flatten(2).transpose(1, 2)], dim=1)
    trace["layer2"] = h = trans_layer(h, "layer2")
    trace["logits"] = logits = F.linear(layer_norm(h, "norm")[:, 0], p["_fc2.weight"], p["_fc2.bias"])
    return logits


def transmil_loss(p, h, label):
    """TransMIL as szc19990412/TransMIL at commit 0db153547b3acbb89459c8cf47fd0fc064f5dfd1 defines it
    (models/TransMIL.py) and trains it (models/model_interface.py: CrossEntropyLoss of the logits),
    with lucidrains/nystrom-attention's NystromAttention and moore_penrose_iter_pinv as of commit
    fbe9ebad6bae24143d7930d6c2b82d6a12d68f76 (0.0.14; the same numbers from 0.0.10 on, which take
    the output's last n rows: TransMIL's requirements.txt pins 0.0.9, which took its first n, the
    bug d7eb229 fixed). Its width 512 (and fc1's input 1024) as `hidden` (and the features' width):
    dim_head = hidden // 8, num_landmarks = hidden // 2; its dropouts (to_out's 0.1) left out."""
    return F.cross_entropy(transmil_logits(p, h), torch.tensor([label]))


def torch_loss(head, weights, features, label, **clam):
    """The head in PyTorch: ABMIL's gated attention (Ilse et al. 2018: tanh(V h) * sigmoid(U h),
    w, softmax over the bag), the mean, or the max over instances per feature (the first instance
    of a tie, as numpy's argmax), then the linear classifier and cross-entropy; dsmil and clam as
    their sources."""
    p = {name: torch.tensor(value, dtype=torch.float64, requires_grad=True) for name, value in weights.items()}
    h = torch.tensor(features, dtype=torch.float64)
    if head in ("dsmil", "clam-sb", "clam-mb", "transmil"):
        loss = dsmil_loss(p, h, label) if head == "dsmil" else transmil_loss(p, h, label) if head == "transmil" \
            else clam_loss(head, p, h, label, **clam)
        loss.backward()
        return loss.item(), {name: t.grad.numpy() for name, t in p.items()}
    if head == "attention":
        gate = torch.tanh(F.linear(h, p["attention_V.weight"], p["attention_V.bias"])) * \
            torch.sigmoid(F.linear(h, p["attention_U.weight"], p["attention_U.bias"]))
        a = torch.softmax(F.linear(gate, p["attention_w.weight"], p["attention_w.bias"]), dim=0)
        z = (a * h).sum(dim=0, keepdim=True)
    elif head == "mean":
        z = h.mean(dim=0, keepdim=True)
    else:
        first = torch.tensor(np.argmax(features, axis=0))
        z = h.gather(0, first[None, :])
    logits = F.linear(z, p["classifier.weight"], p["classifier.bias"])
    loss = F.cross_entropy(logits, torch.tensor([label]))
    loss.backward()
    return loss.item(), {name: t.grad.numpy() for name, t in p.items()}


def device_loss(work, head, weights, features, label, classes, precision="fp32", **clam):
    bag, params, spec, out = (work / f"{head}-{n}" for n in ("bag.h5", "params.h5", "spec.json", "out.json"))
    with h5py.File(bag, "w") as f:
        f["features"] = features
    with h5py.File(params, "w") as f:
        for name, value in weights.items():
            f[name] = value
    spec.write_text(json.dumps({"head": head, "attention_hidden": HIDDEN, "classes": classes, "features": str(bag),
                                "label": label, "params": str(params), "precision": precision, **clam}))
    result = subprocess.run([HEAD_GRADIENTS, str(spec), str(out)], capture_output=True, text=True,
                            env=dict(os.environ, TESSERA_VALIDATION="1"))
    assert result.returncode == 0 and "validation" not in result.stderr.lower(), result.stderr
    answer = json.loads(out.read_text())
    return answer["loss"], {name: np.array(grad["values"]).reshape(grad["shape"])
                            for name, grad in answer["gradients"].items()}


def relative_error(actual, expected):
    return np.linalg.norm(np.asarray(actual, np.float64).ravel() - expected.ravel()) / max(np.linalg.norm(expected), 1e-30)


@pytest.mark.parametrize("head", ["max", "mean", "attention", "dsmil"])
@pytest.mark.parametrize("instances", [1, 7, 10001, 100001])
def test_loss_and_gradients_match_pytorch(tmp_path, head, instances):
    classes = 3 if instances == 7 else 2
    generator = np.random.default_rng(instances)
    features = generator.normal(size=(instances, WIDTH)).astype(np.float32)
    label = instances % classes
    weights = head_weights(head, classes, instances + 1)
    expected_loss, expected = torch_loss(head, weights, features, label)
    loss, gradients = device_loss(tmp_path, head, weights, features, label, classes)
    assert sorted(gradients) == sorted(expected)
    assert abs(loss - expected_loss) <= 1e-4 * abs(expected_loss), (loss, expected_loss)
    for name in expected:
        assert gradients[name].shape == expected[name].shape, name
        if name == "attention_w.bias":
            # A shift of every score leaves the softmax as it is: the exact gradient is 0, and
            # both sides hold rounding alone.
            assert abs(expected[name]).max() < 1e-12 and abs(gradients[name]).max() < 1e-6, gradients[name]
            continue
        assert relative_error(gradients[name], expected[name]) < 1e-4, (name, relative_error(gradients[name], expected[name]))


def assert_matches(loss, gradients, expected_loss, expected, tolerance):
    assert sorted(gradients) == sorted(expected)
    assert abs(loss - expected_loss) <= tolerance * abs(expected_loss), (loss, expected_loss)
    for name in expected:
        assert gradients[name].shape == expected[name].shape, name
        if name == "attention_net.3.attention_c.bias":
            # A shift of every score of a column leaves its softmax and its order as they are:
            # rounding alone (fp16's larger).
            assert abs(expected[name]).max() < 1e-12 and abs(gradients[name]).max() < tolerance / 100, gradients[name]
            continue
        assert relative_error(gradients[name], expected[name]) < tolerance, (name, relative_error(gradients[name], expected[name]))


@pytest.mark.parametrize("head", ["clam-sb", "clam-mb"])
@pytest.mark.parametrize("instances", [1, 7, 10001, 60001])  # 60,001 x 512 floats: within lavapipe's 128 MiB buffers
def test_clam_loss_and_gradients_match_pytorch(tmp_path, head, instances):
    """k_sample 8: a bag of 1 or 7 patches takes every patch as both top and bottom (k = the patch
    count); 3 classes (7 patches) with subtyping, as tessera's default for them is."""
    classes = 3 if instances == 7 else 2
    clam = {"k_sample": 8, "subtyping": classes > 2, "bag_weight": 0.7}
    generator = np.random.default_rng(instances)
    features = generator.normal(size=(instances, WIDTH)).astype(np.float32)
    label = instances % classes
    weights = clam_weights(head, classes, instances + 1)
    expected_loss, expected = torch_loss(head, weights, features, label, **clam)
    loss, gradients = device_loss(tmp_path, head, weights, features, label, classes, **clam)
    assert_matches(loss, gradients, expected_loss, expected, 1e-4)


@pytest.mark.parametrize("instances", [1, 2, 7, 10, 17, 10001])
def test_transmil_loss_and_gradients_match_pytorch(tmp_path, instances):
    """Width 16: 8 heads of 2, 8 landmarks. Sequences (1 + the square) of 2, 5, 10, 17, 26 and
    10,202 rows: fewer rows than landmarks and more, bags padded to the square with their first
    rows again (10: 6 of them), each sequence padded in front with 6, 3 or 7 zero rows to a
    multiple of the landmarks (1 + a square never is one of 8), landmarks of 1 to 1,276 rows.
    Measured: PyTorch in float32 lands within 4e-6 of float64 on these."""
    classes = 2
    features = np.random.default_rng(instances).normal(size=(instances, WIDTH)).astype(np.float32)
    label = instances % classes
    weights = transmil_weights(classes, instances + 1)
    expected_loss, expected = torch_loss("transmil", weights, features, label)
    loss, gradients = device_loss(tmp_path, "transmil", weights, features, label, classes)
    assert_matches(loss, gradients, expected_loss, expected, 1e-4)


def test_transmil_in_fp16_matches_pytorch_within_rounding(tmp_path):
    """Features and activations in fp16: CLAM's fp16 tolerance (its attention and pools rounded too).
    Measured: rounding the reference's inputs, weights and linear, conv and norm outputs to fp16
    moves its loss 4e-4 and its gradients 2e-3 at most."""
    features = np.random.default_rng(17).normal(size=(17, WIDTH)).astype(np.float32)
    weights = transmil_weights(2, 18)
    expected_loss, expected = torch_loss("transmil", weights, features, 1)
    loss, gradients = device_loss(tmp_path, "transmil", weights, features, 1, 2, "fp16")
    assert_matches(loss, gradients, expected_loss, expected, 3e-2)

@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_clam_takes_the_lowest_of_tied_rows_to_the_same_bytes(tmp_path, precision):
    """40 patches that repeat 5 distinct rows: every attention score ties with several others, and the top
    and bottom 3 are the lowest of the tied rows, without subtyping (2 classes) and with it (3);
    the same bag twice gives the same bytes."""
    generator = np.random.default_rng(11)
    features = generator.normal(size=(5, WIDTH)).astype(np.float32)[generator.integers(0, 5, size=40)]
    # fp16: features and weights as fp16 holds them; attention, pools and logits rounded.
    tolerance = 1e-4 if precision == "fp32" else 3e-2
    for head, classes in (("clam-mb", 2), ("clam-sb", 3)):
        clam = {"k_sample": 3, "subtyping": classes > 2, "bag_weight": 0.7}
        weights = clam_weights(head, classes, 12)
        expected_loss, expected = torch_loss(head, weights, features, 1, **clam)
        loss, gradients = device_loss(tmp_path, head, weights, features, 1, classes, precision, **clam)
        assert_matches(loss, gradients, expected_loss, expected, tolerance)
        again = device_loss(tmp_path, head, weights, features, 1, classes, precision, **clam)[1]
        assert all(np.array_equal(gradients[n], again[n]) for n in gradients)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_dsmil_attends_to_the_first_of_tied_critical_instances(tmp_path, precision):
    """Whole-number features: several instances share each class's largest instance logit, and
    the bag attends to the first of them, its max-instance loss reaching the first of them too."""
    generator = np.random.default_rng(6)
    features = generator.integers(-2, 3, size=(301, WIDTH)).astype(np.float32)
    weights = head_weights("dsmil", 2, 8)
    # Each class's logit the sum of two features: its largest, 4, held by about 1 in 25 instances.
    weights["i_classifier.fc.0.weight"] = np.zeros((2, WIDTH), np.float32)
    weights["i_classifier.fc.0.weight"][[0, 0, 1, 1], [0, 1, 2, 3]] = 1
    weights["i_classifier.fc.0.bias"] = np.zeros(2, np.float32)
    logits = features @ weights["i_classifier.fc.0.weight"].T
    assert all((logits[:, c] == logits[:, c].max()).sum() > 1 for c in range(2)), "no tie to test"
    expected_loss, expected = torch_loss("dsmil", weights, features, 1)
    loss, gradients = device_loss(tmp_path, "dsmil", weights, features, 1, 2, precision)
    # fp16: features and instance logits exact (whole numbers); queries, scores and pools rounded.
    tolerance = 1e-4 if precision == "fp32" else 2e-2
    assert abs(loss - expected_loss) <= tolerance * abs(expected_loss), (loss, expected_loss)
    for name in expected:
        assert relative_error(gradients[name], expected[name]) < tolerance, (name, relative_error(gradients[name], expected[name]))


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_max_head_sends_a_tie_to_its_first_instance(tmp_path, precision):
    """Whole numbers in a few values: every feature's max is held by several instances."""
    generator = np.random.default_rng(4)
    features = generator.integers(-2, 3, size=(301, WIDTH)).astype(np.float32)
    weights = head_weights("max", 2, 9)
    expected_loss, expected = torch_loss("max", weights, features, 1)
    loss, gradients = device_loss(tmp_path, "max", weights, features, 1, 2, precision)
    # fp16 activations: the pooled features are exact (whole numbers), the logits rounded once.
    tolerance = 1e-4 if precision == "fp32" else 2e-3
    assert abs(loss - expected_loss) <= tolerance * abs(expected_loss), (loss, expected_loss)
    for name in expected:
        assert relative_error(gradients[name], expected[name]) < tolerance, name


def write_cohort(directory, slides=16):
    """Tumour slides hold a few instances shifted along one direction, as tests/test_mil.py's."""
    features = directory / "features"
    features.mkdir()
    generator = np.random.default_rng(3)
    direction = generator.normal(size=WIDTH).astype(np.float32)
    direction /= np.linalg.norm(direction)
    rows = ["slide,label"]
    for s in range(slides):
        count = int(generator.integers(20, 61))
        bag = generator.normal(size=(count, WIDTH)).astype(np.float32)
        if s % 2:
            bag[generator.choice(count, size=4, replace=False)] += 4 * direction
        with h5py.File(features / f"slide{s:02d}.h5", "w") as f:
            f["features"] = bag
        rows.append(f"slide{s:02d},{'tumor' if s % 2 else 'normal'}")
    labels = directory / "slides.csv"
    labels.write_text("\n".join(rows) + "\n")
    return features, labels


def test_max_head_trains_within_its_plan_to_the_same_bytes_twice(tmp_path):
    features, labels = write_cohort(tmp_path)
    flags = ["train", "--features", features, "--labels", labels, "--head", "max", "--optimizer", "adam",
             "--lr", "0.01", "--seed", "2", "--val-fraction", "0.5"]
    plan = tessera(*flags, "--dry-run")
    assert plan.returncode == 0, plan.stderr
    plan = json.loads(plan.stdout.splitlines()[0])
    digests = []
    for run in range(2):
        checkpoint = tmp_path / f"max{run}.h5"
        result = tessera(*flags, "--epochs", 10, "--checkpoint", checkpoint)
        assert result.returncode == 0, result.stderr
        records = [json.loads(line) for line in result.stderr.splitlines() if '"event":"epoch"' in line]
        final = records[-1]
        assert abs(final["peak_device_bytes"] - plan["total_bytes"]) <= 0.1 * plan["total_bytes"], (final, plan)
        assert final["val_accuracy"] >= 0.75, final
        with h5py.File(checkpoint, "r") as f:
            model = f.attrs["model"]
            model = json.loads(model.decode() if isinstance(model, bytes) else model)
            params = {name: f["params"][name][()] for name in f["params"]}
        assert sorted(params) == ["classifier.bias", "classifier.weight"], sorted(params)
        assert model["head"] == "max" and model["features"] == WIDTH, model
        digests.append(hashlib.sha256(b"".join(params[n].tobytes() for n in sorted(params))).hexdigest())
    assert digests[0] == digests[1]


def test_unknown_head_exits_2_listing_the_heads(tmp_path):
    features, labels = write_cohort(tmp_path, slides=4)
    result = tessera("train", "--features", features, "--labels", labels, "--head", "maxx", "--epochs", 1)
    assert result.returncode == 2, result.stderr
    for head in ("attention", "mean", "max", "dsmil", "clam-sb", "clam-mb", "transmil"):
        assert head in result.stderr, result.stderr

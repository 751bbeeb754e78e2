"""Slide-level heads against PyTorch: each head's loss and parameter gradients for one bag
(tests/head_gradients runs the head's graph and the training loop's loss once on the device,
from weights written here) against the same head written in PyTorch from its published
definition, in float64, on bags of 1, 7, 10,001 and 100,001 instances (clam: 60,001) (relative
error under 1e-4 in fp32; past 65,535, lavapipe's bound on one invocation's loops, the kernels
that reduce over a bag's rows share them among a workgroup); dsmil's combined loss (bag and max-instance terms) from dsmil.py and train_tcga.py, and
its ties of the critical instance in fp32 and fp16; clam-sb's and clam-mb's (bag and instance
clustering terms) from CLAM's model_clam.py and core_utils.py, and their ties of attention in
fp32 and fp16. The max head also on bags whose features tie (the first instance takes the gradient),
trained twice to the same bytes, and its memory plan against the measured peak; --head with an
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


def torch_loss(head, weights, features, label, **clam):
    """The head in PyTorch: ABMIL's gated attention (Ilse et al. 2018: tanh(V h) * sigmoid(U h),
    w, softmax over the bag), the mean, or the max over instances per feature (the first instance
    of a tie, as numpy's argmax), then the linear classifier and cross-entropy; dsmil and clam as
    their sources."""
    p = {name: torch.tensor(value, dtype=torch.float64, requires_grad=True) for name, value in weights.items()}
    h = torch.tensor(features, dtype=torch.float64)
    if head in ("dsmil", "clam-sb", "clam-mb"):
        loss = dsmil_loss(p, h, label) if head == "dsmil" else clam_loss(head, p, h, label, **clam)
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
    for head in ("attention", "mean", "max", "dsmil", "clam-sb", "clam-mb"):
        assert head in result.stderr, result.stderr

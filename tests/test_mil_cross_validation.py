"""tessera train --features --folds K [--seeds N]: cross-validation of a slide-level head on
synthetic CLAM-layout feature files (h5py) with CLAM's `case_id,slide_id,label` CSV.

The folds are checked from the predictions CSV tessera writes (--fold-predictions): every slide
scored once a seed, no case split across folds, each class's cases dealt evenly (within one),
the same folds from the same command and other folds from another seed. Each fold's AUC (the
Mann-Whitney rank statistic, one-vs-rest macro for three classes), balanced accuracy and macro
F1, and their mean and sample std, are recomputed here in numpy from those predictions. Gated
attention (ABMIL), DSMIL, CLAM-SB, CLAM-MB and TransMIL each separate a cohort whose label lies
in a few patches a slide: mean AUC over 5 folds above 0.9; CLAM's flags with another head or out of range
exit 2 naming the flag. Without a case_id column each slide is its own case. On a terminal a table ends
the run (the JSON's numbers), through a pipe a `fold` record per head and the result line; a sweep
takes `cv_auc_mean_less_std` as its objective, each fold an intermediate value, and its HTML report
(rendered by chromium) gives each trial's means and stds as the trials reported them. Bad input: a case with slides of two classes, more folds than a class has cases
(exit 5 naming the case or the fold and class), --folds below 2 and flags that do not go with
--folds (exit 2); an existing predictions file is kept without --overwrite."""
import csv
import json
import os
import re
import sys

import h5py
import numpy as np
import pytest

import test_sweep_report
from data_tools import run
from test_terminal_output import on_terminal

TESSERA = sys.argv[1] if __name__ == "__main__" and len(sys.argv) > 1 else os.environ.get(
    "TESSERA_BINARY", "build/tools/tessera")
WIDTH = 16
ENV = dict(os.environ, TESSERA_VALIDATION="1")


def make_cohort(directory, cases, classes=("normal", "tumor"), seed=3):
    """CLAM's layout: one <slide>.h5 a slide (`features` [N,D] float32, `coords` [N,2] int64) and a
    labels CSV of case_id,slide_id,label. Case c has class c % len(classes) and one to three slides;
    a slide of class k > 0 holds 3 to 6 patches shifted along direction k among plain noise."""
    generator = np.random.default_rng(seed)
    directions = generator.normal(size=(len(classes), WIDTH))
    directions /= np.linalg.norm(directions, axis=1, keepdims=True)
    rows = ["case_id,slide_id,label"]
    for case in range(cases):
        label = case % len(classes)
        for s in range(int(generator.integers(1, 4))):
            count = int(generator.integers(20, 61))
            features = generator.normal(size=(count, WIDTH)).astype(np.float32)
            if label > 0:
                positives = generator.choice(count, size=int(generator.integers(3, 7)), replace=False)
                features[positives] += 4.0 * directions[label].astype(np.float32)
            slide = f"case{case:02d}_slide{s}"
            with h5py.File(os.path.join(directory, slide + ".h5"), "w") as f:
                f["features"] = features
                coords = f.create_dataset("coords", data=np.stack(
                    [np.arange(count) * 256, np.zeros(count)], axis=1).astype(np.int64))
                coords.attrs["patch_size"] = 256
                coords.attrs["patch_level"] = 0
            rows.append(f"patient_{case:02d},{slide}.svs,{classes[label]}")
    return "\n".join(rows) + "\n"


def cohort(tmp_path, name, cases, **kwargs):
    features = tmp_path / name
    features.mkdir()
    labels = tmp_path / f"{name}.csv"
    labels.write_text(make_cohort(str(features), cases, **kwargs))
    return str(features), str(labels)


def train(*args):
    process = run(TESSERA, "train", *args, check=False, env=ENV)
    assert "vulkan validation" not in process.stderr.lower(), process.stderr
    return process


def result_of(process):
    assert process.returncode == 0, process.stderr
    return json.loads(process.stdout.strip().splitlines()[-1])


def read_predictions(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def rank_auc(scores, positive):
    """P(a positive scores above a negative), ties half: the Mann-Whitney U over n1 n0, from the
    average ranks of the scores."""
    scores = np.asarray(scores, dtype=np.float64)
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    start = 0
    while start < len(scores):
        end = start
        while end < len(scores) and sorted_scores[end] == sorted_scores[start]:
            end += 1
        ranks[order[start:end]] = (start + 1 + end) / 2.0
        start = end
    positive = np.asarray(positive, dtype=bool)
    n1, n0 = positive.sum(), (~positive).sum()
    return (ranks[positive].sum() - n1 * (n1 + 1) / 2.0) / (n1 * n0)


def reference_metrics(rows, classes):
    """AUC (of class 1 for two classes, else one-vs-rest macro), balanced accuracy and macro F1."""
    truth = np.array([classes.index(row["label"]) for row in rows])
    probabilities = np.array([[float(row["p_" + name]) for name in classes] for row in rows])
    predicted = probabilities.argmax(axis=1)
    assert [classes[p] for p in predicted] == [row["predicted"] for row in rows]
    scored = [1] if len(classes) == 2 else range(len(classes))
    auc = np.mean([rank_auc(probabilities[:, c], truth == c) for c in scored])
    recalls, f1s = [], []
    for c in range(len(classes)):
        tp = np.sum((predicted == c) & (truth == c))
        recalls.append(tp / np.sum(truth == c))
        f1s.append(2 * tp / (np.sum(predicted == c) + np.sum(truth == c)))
    return auc, np.mean(recalls), np.mean(f1s)


def check_folds(rows, folds, slides):
    """Per seed: every slide once, a case in one fold, each class's cases spread within one."""
    by_seed = {}
    for row in rows:
        by_seed.setdefault(row["seed"], []).append(row)
    for seed, seed_rows in by_seed.items():
        assert sorted(row["slide_id"].removesuffix(".svs") for row in seed_rows) == sorted(slides), seed
        fold_of_case = {}
        for row in seed_rows:
            assert fold_of_case.setdefault(row["case_id"], row["fold"]) == row["fold"], (seed, row)
        assert sorted({int(fold) for fold in fold_of_case.values()}) == list(range(1, folds + 1))
        case_label = {row["case_id"]: row["label"] for row in seed_rows}
        for label in set(case_label.values()):
            counts = [sum(1 for case, fold in fold_of_case.items() if int(fold) == k and case_label[case] == label)
                      for k in range(1, folds + 1)]
            assert max(counts) - min(counts) <= 1 and min(counts) >= 1, (seed, label, counts)
        counts = [sum(1 for fold in fold_of_case.values() if int(fold) == k) for k in range(1, folds + 1)]
        assert max(counts) - min(counts) <= 1, (seed, counts)
    return {seed: {row["slide_id"]: row["fold"] for row in seed_rows} for seed, seed_rows in by_seed.items()}


def check_metrics(result, rows):
    """Each fold's metrics and their spread, against numpy from the predictions tessera wrote."""
    classes = result["classes"]
    values = {name: [] for name in ("auc", "balanced_accuracy", "f1")}
    for fold in result["fold_results"]:
        fold_rows = [row for row in rows if int(row["seed"]) == fold["seed"] and int(row["fold"]) == fold["fold"]]
        assert len(fold_rows) == fold["slides"] > 0
        auc, balanced, f1 = reference_metrics(fold_rows, classes)
        assert fold["auc"] == pytest.approx(auc, abs=1e-12), fold
        assert fold["balanced_accuracy"] == pytest.approx(balanced, abs=1e-12), fold
        assert fold["f1"] == pytest.approx(f1, abs=1e-12), fold
        for name, value in zip(values, (auc, balanced, f1)):
            values[name].append(value)
    for name, folds in values.items():
        summary = result["cv"][name]
        assert summary["folds"] == pytest.approx(folds, abs=1e-12), name
        assert summary["mean"] == pytest.approx(np.mean(folds), abs=1e-12), name
        assert summary["std"] == pytest.approx(np.std(folds, ddof=1), abs=1e-12), name


def test_attention_head_separates_the_cohort_over_five_folds(tmp_path):
    features, labels = cohort(tmp_path, "features", cases=30)
    predictions = str(tmp_path / "predictions.csv")
    result = result_of(train("--features", features, "--labels", labels, "--folds", 5, "--head", "attention",
                             "--optimizer", "adam", "--lr", "0.002", "--epochs", 8, "--seed", 1,
                             "--fold-predictions", predictions))
    rows = read_predictions(predictions)
    slides = [name[:-3] for name in os.listdir(features)]
    check_folds(rows, 5, slides)
    assert result["folds"] == 5 and result["seeds"] == 1 and len(result["fold_results"]) == 5, result
    check_metrics(result, rows)
    print(f"attention, 5 folds: AUC {result['cv']['auc']['mean']:.3f} +- {result['cv']['auc']['std']:.3f}, "
          f"balanced accuracy {result['cv']['balanced_accuracy']['mean']:.3f}, F1 {result['cv']['f1']['mean']:.3f}")
    assert result["cv"]["auc"]["mean"] > 0.9, result["cv"]


def test_dsmil_head_separates_the_cohort_over_five_folds(tmp_path):
    """DSMIL (instance classifier, attention to the critical instance, bag classifier; half its
    bag loss, half its max-instance loss) learns the same cohort."""
    features, labels = cohort(tmp_path, "features", cases=30)
    predictions = str(tmp_path / "predictions.csv")
    result = result_of(train("--features", features, "--labels", labels, "--folds", 5, "--head", "dsmil",
                             "--optimizer", "adam", "--lr", "0.002", "--epochs", 8, "--seed", 1,
                             "--fold-predictions", predictions))
    check_metrics(result, read_predictions(predictions))
    print(f"dsmil, 5 folds: AUC {result['cv']['auc']['mean']:.3f} +- {result['cv']['auc']['std']:.3f}, "
          f"balanced accuracy {result['cv']['balanced_accuracy']['mean']:.3f}, F1 {result['cv']['f1']['mean']:.3f}")
    assert result["head"] == "dsmil" and result["cv"]["auc"]["mean"] > 0.9, result["cv"]


@pytest.mark.parametrize("head", ["clam-sb", "clam-mb"])
def test_clam_heads_separate_the_cohort_over_five_folds(tmp_path, head):
    """CLAM (gated attention, one branch or one a class; 0.7 of its bag loss, 0.3 of its instance
    clustering loss on the top and bottom 8 patches) learns the same cohort; a narrow attention and
    3 epochs keep its 512-wide fc cheap on lavapipe."""
    features, labels = cohort(tmp_path, "features", cases=30)
    result = result_of(train("--features", features, "--labels", labels, "--folds", 5, "--head", head,
                             "--attention-hidden", 32, "--optimizer", "adam", "--lr", "0.004", "--epochs", 3,
                             "--seed", 1))
    print(f"{head}, 5 folds: AUC {result['cv']['auc']['mean']:.3f} +- {result['cv']['auc']['std']:.3f}, "
          f"balanced accuracy {result['cv']['balanced_accuracy']['mean']:.3f}, F1 {result['cv']['f1']['mean']:.3f}")
    assert result["head"] == head and result["cv"]["auc"]["mean"] > 0.9, result["cv"]


def test_transmil_head_separates_the_cohort_over_five_folds(tmp_path):
    """TransMIL (a class token through two Nystrom attention layers, PPEG between) learns the same
    cohort. Width 64 (8 heads of 8, 32 landmarks: a landmark averages 2 or 3 rows of a bag of 20
    to 60) and 6 epochs at 0.001: the PyTorch reference trained so (Adam, a bag a step) gave mean
    AUCs of 0.96 to 0.99 over three seeds (4 epochs: 0.95; width 32: 0.83, width 16: 0.65)."""
    features, labels = cohort(tmp_path, "features", cases=30)
    result = result_of(train("--features", features, "--labels", labels, "--folds", 5, "--head", "transmil",
                             "--attention-hidden", 64, "--optimizer", "adam", "--lr", "0.001", "--epochs", 6,
                             "--seed", 1))
    print(f"transmil, 5 folds: AUC {result['cv']['auc']['mean']:.3f} +- {result['cv']['auc']['std']:.3f}, "
          f"balanced accuracy {result['cv']['balanced_accuracy']['mean']:.3f}, F1 {result['cv']['f1']['mean']:.3f}")
    assert result["head"] == "transmil" and result["cv"]["auc"]["mean"] > 0.9, result["cv"]

@pytest.mark.parametrize("flags", [("--head", "attention", "--k-sample", "4"), ("--head", "clam-sb", "--bag-weight", "1.5"),
                                   ("--head", "clam-mb", "--subtyping", "maybe"),
                                   ("--head", "attention", "--attention-hidden", "0")])
def test_clam_flags_out_of_place_or_range_exit_2_naming_them(tmp_path, flags):
    features, labels = cohort(tmp_path, "features", cases=4)
    result = train("--features", features, "--labels", labels, "--epochs", 1, *flags)
    assert result.returncode == 2 and flags[2] in result.stderr, result.stderr
    # The range as a reader writes it, not CLI11's bounds in 17 digits.
    assert "e+" not in result.stderr and "000000" not in result.stderr, result.stderr


def test_folds_repeat_from_the_seed_and_three_classes_are_scored_one_against_the_rest(tmp_path):
    features, labels = cohort(tmp_path, "features", cases=12, classes=("a", "b", "c"), seed=5)
    runs = []
    for name in ("first", "second"):
        predictions = str(tmp_path / f"{name}.csv")
        result = result_of(train("--features", features, "--labels", labels, "--folds", 3, "--seeds", 2,
                                 "--head", "mean", "--optimizer", "adam", "--lr", "0.01", "--epochs", 2,
                                 "--seed", 7, "--fold-predictions", predictions))
        rows = read_predictions(predictions)
        assert len(result["fold_results"]) == 6 and len(result["cv"]["auc"]["folds"]) == 6, result
        assert [fold["seed"] for fold in result["fold_results"]] == [7, 7, 7, 8, 8, 8], result
        check_metrics(result, rows)
        runs.append((check_folds(rows, 3, [name[:-3] for name in os.listdir(features)]), open(predictions).read()))
    # The same command: the same folds and, the runs being deterministic, the same predictions.
    assert runs[0] == runs[1]
    folds = runs[0][0]
    assert folds["7"] != folds["8"], "another seed deals the cases otherwise"


def test_table_on_a_terminal_and_json_lines_off_it(tmp_path):
    features, labels = cohort(tmp_path, "features", cases=6)
    args = ["train", "--features", features, "--labels", labels, "--folds", 3, "--head", "mean", "--epochs", 1]
    process = train(*args[1:])
    result = result_of(process)
    records = [json.loads(line) for line in process.stderr.splitlines()]
    assert [r["fold"] for r in records if r.get("event") == "fold"] == [1, 2, 3], process.stderr
    folds = [r for r in records if r.get("event") == "fold"]
    assert all(r.pop("task") == "train" for r in folds) and folds == result["fold_results"], (folds, result)
    code, screen = on_terminal(args)
    assert code == 0 and not any(line.lstrip().startswith("{") for line in screen), screen
    assert sum(1 for line in screen if line.startswith("seed 0 fold ")) == 3, screen
    summary = next(line for line in screen if line.startswith("mean (std)"))
    auc = result["cv"]["auc"]
    assert f"{auc['mean']:.4g} ({auc['std']:.4g})" in summary, (summary, auc)
    assert any(line.startswith("3-fold cross-validation by case, 1 seed(s), mean head") for line in screen), screen


def test_sweep_takes_the_folds_mean_less_their_std_as_its_objective(tmp_path):
    features, labels = cohort(tmp_path, "features", cases=12)
    fixed = ["--features", features, "--labels", labels, "--folds", 3, "--head", "mean", "--epochs", 2,
             "--optimizer", "adam"]
    study = str(tmp_path / "study.sqlite")
    process = run(TESSERA, "sweep", "--study", study, "--trials", 2, "--sampler", "grid", "--param",
                  "lr=choice:0.001,0.02", "--objective", "cv_auc_mean_less_std", "--", *fixed, check=False, env=ENV)
    assert process.returncode == 0, process.stderr
    exported = json.loads(run(TESSERA, "sweep", "--study", study, "--export", "json", env=ENV).stdout)
    assert exported["direction"] == "maximize", exported
    for trial in exported["trials"]:
        attempt = trial["attempts"][-1]
        assert trial["state"] == "complete" and len(attempt["intermediate"]) == 3, trial
        # The same train run by hand (runs are deterministic): the trial's value is its mean less std.
        result = result_of(train(*fixed, "--lr", trial["params"]["lr"]))
        auc = result["cv"]["auc"]
        assert trial["value"] == pytest.approx(auc["mean"] - auc["std"], abs=1e-12), (trial, auc)
        assert attempt["intermediate"][0]["value"] == pytest.approx(auc["folds"][0], abs=1e-12), (attempt, auc)
        assert attempt["metrics"]["cv_auc_folds"] == pytest.approx(auc["folds"], abs=1e-12), (attempt, auc)
    # The HTML report, rendered by chromium: a row a trial with each metric's mean and std as the
    # trial's final report gave them, and the plots drawn without a script error.
    page = str(tmp_path / "report.html")
    run(TESSERA, "sweep", "--study", study, "--export", "html", "--output", page, env=ENV)
    body, dom = test_sweep_report.rendered(page)
    assert 'data-rendered="ok"' in body and "data-error" not in body, body
    rows = {int(m.group(1)): dict(re.findall(r'data-([a-z0-9_-]+)="([^"]*)"', m.group(0)))
            for m in re.finditer(r'<tr data-trial="(\d+)"[^>]*>', dom)}
    assert sorted(rows) == [t["number"] for t in exported["trials"]], rows
    for trial in exported["trials"]:
        metrics = trial["attempts"][-1]["metrics"]
        for name in ("auc", "balanced_accuracy", "f1"):
            row = rows[trial["number"]]
            assert float(row[f"{name}-mean"]) == metrics[f"cv_{name}_mean"], (row, metrics)
            assert float(row[f"{name}-std"]) == metrics[f"cv_{name}_std"], (row, metrics)


def test_without_case_ids_each_slide_is_its_own_case(tmp_path):
    features, labels = cohort(tmp_path, "features", cases=6)
    # tessera's own slide,label rows: no case_id column, so slides of one patient may be split.
    plain = tmp_path / "plain.csv"
    rows = [line.split(",") for line in open(labels).read().splitlines()[1:]]
    plain.write_text("slide,label\n" + "".join(f"{slide},{label}\n" for _, slide, label in rows))
    predictions = str(tmp_path / "plain_predictions.csv")
    result = result_of(train("--features", features, "--labels", str(plain), "--folds", 2, "--head", "mean",
                             "--epochs", 1, "--fold-predictions", predictions))
    written = read_predictions(predictions)
    assert len(written) == len(rows) == result["slides"]
    assert all(row["case_id"] == row["slide_id"] for row in written), written
    check_folds(written, 2, [slide.removesuffix(".svs") for _, slide, _ in rows])


def test_fp16_bags_score_as_fp32_within_rounding(tmp_path):
    features, labels = cohort(tmp_path, "features", cases=12)
    written, folds = {}, {}
    for precision in ("fp32", "fp16"):
        predictions = str(tmp_path / f"{precision}.csv")
        folds[precision] = result_of(train("--features", features, "--labels", labels, "--folds", 3, "--head",
                                           "attention", "--epochs", 3, "--optimizer", "adam", "--lr", "0.002",
                                           "--precision", precision, "--fold-predictions", predictions))["fold_results"]
        written[precision] = read_predictions(predictions)
    fp32, fp16 = written["fp32"], written["fp16"]
    assert [(r["fold"], r["slide_id"]) for r in fp32] == [(r["fold"], r["slide_id"]) for r in fp16]
    assert all("skipped_steps" not in f for f in folds["fp32"])
    # A step skipped for an overflowing fp16 gradient (dynamic loss scaling, as PyTorch's
    # GradScaler) changes training by a whole step: the folds that skipped none are compared.
    skipped = {f["fold"]: f["skipped_steps"] for f in folds["fp16"]}
    assert all(f["loss_scale"] >= 1 for f in folds["fp16"]), folds["fp16"]
    compared = [(a, b) for a, b in zip(fp32, fp16) if skipped[int(a["fold"])] == 0]
    assert compared, f"every fold skipped fp16 steps: {skipped}"
    # Measured: at most 1.1e-4 apart on a cohort of this kind (fp16 bags and activations in training).
    difference = max(abs(float(a["p_tumor"]) - float(b["p_tumor"])) for a, b in compared)
    assert difference < 2e-3, (difference, skipped)


def test_bad_input_is_named(tmp_path):
    features, labels = cohort(tmp_path, "features", cases=8)
    flags = ["--features", features, "--labels", labels, "--epochs", 1, "--head", "mean"]

    # A case with slides of two classes: exit 5 naming the case.
    mixed = tmp_path / "mixed.csv"
    text = open(labels).read().splitlines()
    text.append(text[1].replace("normal", "tumor").replace("_slide0", "_slide9"))
    with h5py.File(os.path.join(features, text[-1].split(",")[1].replace(".svs", ".h5")), "w") as f:
        f["features"] = np.zeros((4, WIDTH), dtype=np.float32)
    mixed.write_text("\n".join(text) + "\n")
    process = train("--features", features, "--labels", str(mixed), "--folds", 2, "--epochs", 1)
    assert process.returncode == 5, process.stderr
    case = text[1].split(",")[0]
    assert case in process.stderr and "two classes" in process.stderr, process.stderr
    os.remove(os.path.join(features, text[-1].split(",")[1].replace(".svs", ".h5")))

    # More folds than a class has cases (4 each): exit 5 naming the fold and the class.
    process = train(*flags, "--folds", 5)
    assert process.returncode == 5, process.stderr
    assert "fold" in process.stderr and "'normal'" in process.stderr and "--folds 4" in process.stderr, process.stderr

    # --folds below 2 and flags that do not go with it: exit 2 naming the flag.
    for folds in (1, 0, -3):
        process = train(*flags, "--folds", folds)
        assert process.returncode == 2 and "--folds" in process.stderr, process.stderr
    process = train(*flags, "--folds", 2, "--seeds", 0)
    assert process.returncode == 2 and "--seeds" in process.stderr, process.stderr
    for extra in (["--checkpoint", str(tmp_path / "c.h5")], ["--val-fraction", "0.2"], ["--seeds", "2", "--folds", "0"]):
        process = train(*flags, "--folds", 2, *extra)
        assert process.returncode == 2, (extra, process.stderr)
    process = train(*flags, "--seeds", 2)
    assert process.returncode == 2 and "--folds" in process.stderr, process.stderr

    # An existing predictions file is kept unless --overwrite.
    predictions = tmp_path / "kept.csv"
    predictions.write_text("precious\n")
    process = train(*flags, "--folds", 2, "--fold-predictions", str(predictions))
    assert process.returncode == 2 and "--fold-predictions" in process.stderr, process.stderr
    assert predictions.read_text() == "precious\n"
    result = result_of(train(*flags, "--folds", 2, "--fold-predictions", str(predictions), "--overwrite"))
    assert len(read_predictions(str(predictions))) == result["slides"]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

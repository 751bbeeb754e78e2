"""tessera sweep --export html in a real browser (Debian's headless chromium): a study from a
small real sweep is exported, the page is loaded with scripts on, and the DOM chromium dumps
must carry the page's own marker of a complete render (data-rendered="ok" on <body>, set after
every plot is drawn) and no script error (window.onerror sets data-error; the test checks that
this detector works on a page broken on purpose). The screenshot must show the plots: the
page's only saturated colours are the plotted points and lines, so their pixels are counted.
Also: the page loads nothing from outside (no src= or href= to another resource)."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import pytest
from PIL import Image

HERE = os.path.dirname(os.path.abspath(__file__))
TESSERA = os.environ.get("TESSERA_BINARY") or (sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("-")
                                                else os.path.join(HERE, "..", "build", "tools", "tessera"))


def run(args, **kwargs):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, **kwargs)


def chromium(*args):
    browser = shutil.which("chromium")
    # bench/gpu/run_suite.py names the programs a machine lacks (a GPU machine has no browser):
    # a test that renders a page through this module (test_mil_cross_validation) skips that case there.
    if not browser and "chromium" in os.environ.get("TESSERA_ABSENT_PROGRAMS", "").split(","):
        pytest.skip("chromium is not on this machine (bench/gpu/run_suite.py: TESSERA_ABSENT_PROGRAMS)")
    assert browser, "chromium is not installed (tools/install-deps.sh installs it)"
    return run([browser, "--headless", "--disable-gpu", "--no-sandbox", "--hide-scrollbars",
                "--virtual-time-budget=10000", *args], timeout=300)


def rendered(page, fragment=""):
    dom = chromium("--dump-dom", "file://" + page + fragment).stdout
    body = re.search(r"<body[^>]*>", dom)
    assert body, dom[:2000]
    return body.group(0), dom


def make_study(work):
    data = os.path.join(work, "task.h5")
    made = run([sys.executable, os.path.join(HERE, "..", "tools", "make_patch_task.py"), "--out", data,
                "--count", "64", "--size", "16", "--seed", "1"])
    assert made.returncode == 0, made.stderr
    study = os.path.join(work, "study.sqlite")
    sweep = run([TESSERA, "sweep", "--study", study, "--trials", "4", "--sampler", "grid", "--parallel", "2",
                 "--param", "lr=choice:0.001,0.1", "--param", "width=choice:4,8", "--", "--data", data,
                 "--epochs", "1", "--batch", "16"])
    assert sweep.returncode == 0, sweep.stderr
    return study


def test_html_report_renders_in_chromium():
    work = tempfile.mkdtemp(prefix="tessera_report_")
    try:
        study = make_study(work)
        page = os.path.join(work, "report.html")
        exported = run([TESSERA, "sweep", "--study", study, "--export", "html", "--output", page])
        assert exported.returncode == 0, exported.stderr
        html = open(page, encoding="utf-8").read()
        assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", html), "the page loads an outside resource"
        trials = json.loads(run([TESSERA, "sweep", "--study", study, "--export", "json"]).stdout)["trials"]
        assert sum(t["state"] == "complete" for t in trials) == 4

        body, dom = rendered(page)
        assert 'data-rendered="ok"' in body and "data-error" not in body, body
        # Four points in the history, four in each of the two parameter panels, four lines across
        # the parallel coordinates, and a table row per trial.
        assert dom.count("<circle") == 12, dom.count("<circle")
        assert dom.count("<polyline") == 1 + 4, dom.count("<polyline")
        assert dom.count("<tr") == 1 + 4

        # The table sorts by any column, here the objective, descending.
        _, dom = rendered(page, "#sort=-val_loss")
        rows = re.findall(r"<tr[^>]*><td>(\d+)</td><td>complete</td><td>([^<]+)</td>", dom)
        assert len(rows) == 4, dom[-3000:]
        by_value = sorted(trials, key=lambda t: -t["value"])
        assert [int(number) for number, _ in rows] == [t["number"] for t in by_value], rows
        _, dom = rendered(page, "#sort=width")
        widths = [int(w) for w in re.findall(r"<td>(?:complete)</td>(?:<td>[^<]*</td>){3}<td>[^<]*</td><td>(\d+)</td>", dom)]
        assert widths == sorted(widths) and len(widths) == 4, widths

        screenshot = os.path.join(work, "report.png")
        shot = chromium("--window-size=1200,2000", "--screenshot=" + screenshot, "file://" + page)
        assert os.path.exists(screenshot), shot.stderr
        image = Image.open(screenshot).convert("RGB")
        saturated = sum(1 for r, g, b in image.getdata() if max(r, g, b) - min(r, g, b) > 80)
        print(f"plot pixels in the screenshot: {saturated}")
        assert saturated > 2000, saturated

        # The detector itself: a script error after the plots leaves no marker and names the error.
        broken = os.path.join(work, "broken.html")
        with open(broken, "w", encoding="utf-8") as out:
            out.write(html.replace("drawTable();\n", "drawTable();\nnoSuchFunction();\n"))
        body, _ = rendered(broken)
        assert "data-rendered" not in body and "noSuchFunction" in body, body
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    test_html_report_renders_in_chromium()

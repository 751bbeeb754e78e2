// --export html: one self-contained page (no external resources) that draws the study with inline
// SVG from the study's JSON: a sortable trials table, the optimisation history, each parameter
// against the objective, parallel coordinates, the best flags and, for trials that cross-validated
// (`train --folds`), each fold's AUC, balanced accuracy and F1 with their mean and spread. When it has drawn everything
// the page sets data-rendered="ok" on <body>; a script error sets data-error instead (the test
// reads both from a headless browser's DOM).
#include <string>

#include "common/html.h"
#include "sweep/report.h"

namespace tessera::sweep {

namespace {

const char* page_title = R"html(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>tessera sweep</title>
<style>)html";

const char* page_head = R"html(
th { cursor: pointer; user-select: none; }
th.sorted-up::after { content: " \25B2"; } th.sorted-down::after { content: " \25BC"; }
tr.best td { background: #fff4d6; }
svg { background: #fafafa; margin: 4px; }
.panels { display: flex; flex-wrap: wrap; }
</style></head>
<body>
<h1 id="title">tessera sweep</h1>
<p id="summary"></p>
<h2>Best trial</h2><pre id="best">no complete trial yet</pre>
<div id="cross-validation"></div>
<h2>Optimisation history</h2><div id="history"></div>
<h2>Each parameter against the objective</h2><div id="params" class="panels"></div>
<h2>Parallel coordinates</h2><div id="parallel"></div>
<h2>Trials</h2><p>Click a column to sort (or open the page with #sort=COLUMN, #sort=-COLUMN).</p><table id="trials"><thead></thead><tbody></tbody></table>
<script>
window.onerror = function (message, source, line) {
  document.body.setAttribute("data-error", message + " (line " + line + ")");
};
const study = )html";

const char* page_script = R"html(;
const NS = "http://www.w3.org/2000/svg";
function el(name, attributes, parent) {
  const node = document.createElementNS(NS, name);
  for (const key in attributes) node.setAttribute(key, attributes[key]);
  if (parent) parent.appendChild(node);
  return node;
}
function text(parent, x, y, content, anchor, size) {
  const node = el("text", {x: x, y: y, "text-anchor": anchor || "middle", "font-size": size || 11}, parent);
  node.textContent = content;
  return node;
}
function fmt(v) {
  if (v === null || v === undefined) return "-";
  if (typeof v !== "number") return String(v);
  return Math.abs(v) >= 1e4 || (v !== 0 && Math.abs(v) < 1e-3) ? v.toExponential(3) : String(+v.toPrecision(5));
}
// A linear or logarithmic axis from values to pixels, padded, with round ticks.
function axis(values, log, from, to) {
  const t = log ? (v => Math.log10(v)) : (v => v);
  let low = Math.min(...values.map(t)), high = Math.max(...values.map(t));
  const pad = high > low ? 0.05 * (high - low) : (Math.abs(low) * 0.1 || 1);
  low -= pad; high += pad;
  const map = v => from + (t(v) - low) / (high - low) * (to - from);
  const ticks = [];
  if (log) {
    for (let p = Math.ceil(low); p <= Math.floor(high); p++) ticks.push(Math.pow(10, p));
  } else {
    const raw = (high - low) / 5, mag = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = mag * (raw / mag < 2 ? 2 : raw / mag < 5 ? 5 : 10);
    for (let v = Math.ceil(low / step) * step; v <= high; v += step) ticks.push(Math.abs(v) < step * 1e-9 ? 0 : v);
  }
  return {map: map, ticks: ticks};
}
function frame(svg, x, y, box, title, xTitle, xLabels) {
  el("rect", {x: box.left, y: box.top, width: box.right - box.left, height: box.bottom - box.top, fill: "white", stroke: "#888"}, svg);
  text(svg, (box.left + box.right) / 2, box.top - 8, title, "middle", 13);
  text(svg, (box.left + box.right) / 2, box.bottom + 32, xTitle);
  if (xLabels) xLabels.forEach((label, i) => text(svg, x.map(i), box.bottom + 16, label));
  else x.ticks.forEach(t => { el("line", {x1: x.map(t), x2: x.map(t), y1: box.bottom, y2: box.bottom + 4, stroke: "#888"}, svg);
                              text(svg, x.map(t), box.bottom + 16, fmt(t)); });
  y.ticks.forEach(t => { el("line", {x1: box.left - 4, x2: box.right, y1: y.map(t), y2: y.map(t), stroke: "#eee"}, svg);
                         text(svg, box.left - 6, y.map(t) + 4, fmt(t), "end"); });
}
function dot(svg, x, y, colour, title) {
  const c = el("circle", {cx: x, cy: y, r: 4, fill: colour}, svg);
  el("title", {}, c).textContent = title;
}
const minimize = study.direction === "minimize";
const better = (a, b) => minimize ? a < b : a > b;
const scored = study.trials.filter(t => t.state === "complete" && typeof t.value === "number");
const objective = study.objective;
const isLog = p => p.distribution === "loguniform" || p.distribution === "logint";
// Choices sit at their index on the axis.
const position = (p, v) => p.distribution === "choice" ? p.choices.indexOf(v) : v;

function drawSummary() {
  document.getElementById("title").textContent = "tessera sweep: " + study.study;
  const counts = {};
  study.trials.forEach(t => counts[t.state] = (counts[t.state] || 0) + 1);
  document.getElementById("summary").textContent = study.trials.length + " trials (" +
      Object.keys(counts).map(k => counts[k] + " " + k).join(", ") + "); objective " + objective + ", " +
      study.direction + "d; sampler " + study.sampler + ", pruner " + study.pruner + ".";
  if (study.best) {
    let lines = "trial " + study.best.number + ": " + objective + " " + fmt(study.best.value) + "\n" +
                "flags: " + study.best.flags;
    if (study.best.checkpoint) lines += "\ncheckpoint: " + study.best.checkpoint;
    document.getElementById("best").textContent = lines;
  }
}

function drawHistory() {
  const holder = document.getElementById("history");
  if (!scored.length) { holder.textContent = "no complete trial yet"; return; }
  const svg = el("svg", {width: 900, height: 320}, holder);
  const box = {left: 80, right: 870, top: 30, bottom: 270};
  const x = axis([0, Math.max(1, study.trials.length - 1)], false, box.left, box.right);
  x.ticks = x.ticks.filter(Number.isInteger);  // trial numbers
  const y = axis(scored.map(t => t.value), false, box.bottom, box.top);
  frame(svg, x, y, box, objective + " by trial (" + study.direction + ")", "trial");
  let best = null, points = [];
  scored.forEach(t => {
    dot(svg, x.map(t.number), y.map(t.value), "#3b6ea8", "trial " + t.number + ": " + fmt(t.value));
    if (best === null || better(t.value, best)) {
      if (best !== null) points.push([x.map(t.number), y.map(best)]);
      best = t.value;
      points.push([x.map(t.number), y.map(best)]);
    }
  });
  points.push([box.right, y.map(best)]);
  el("polyline", {points: points.map(p => p.join(",")).join(" "), fill: "none", stroke: "#d0452f", "stroke-width": 2}, svg);
  text(svg, box.right - 4, box.top + 14, "best so far", "end");
}

function drawParams() {
  const holder = document.getElementById("params");
  if (!scored.length) { holder.textContent = "no complete trial yet"; return; }
  study.space.forEach(p => {
    const svg = el("svg", {width: 440, height: 300}, holder);
    const box = {left: 70, right: 420, top: 30, bottom: 250};
    const choice = p.distribution === "choice";
    const xs = scored.map(t => position(p, t.params[p.name]));
    const x = choice ? axis([0, p.choices.length - 1], false, box.left, box.right) : axis(xs, isLog(p), box.left, box.right);
    const y = axis(scored.map(t => t.value), false, box.bottom, box.top);
    frame(svg, x, y, box, p.name + " against " + objective, p.name + (isLog(p) ? " (log)" : ""),
          choice ? p.choices.map(String) : null);
    scored.forEach((t, i) => dot(svg, x.map(xs[i]), y.map(t.value), "#3b6ea8", "trial " + t.number + ": " + fmt(t.value)));
  });
}

// Blue for the best values, red for the worst.
function colour(fraction) {
  const f = Math.max(0, Math.min(1, fraction));
  return "rgb(" + Math.round(40 + 200 * f) + "," + Math.round(90 + 40 * (1 - Math.abs(2 * f - 1))) + "," + Math.round(220 - 190 * f) + ")";
}

function drawParallel() {
  const holder = document.getElementById("parallel");
  if (!scored.length) { holder.textContent = "no complete trial yet"; return; }
  const columns = study.space.concat([{name: objective, objective: true}]);
  const width = Math.max(500, 150 * columns.length), svg = el("svg", {width: width, height: 340}, holder);
  const top = 40, bottom = 300, left = 60, step = (width - 2 * left) / Math.max(1, columns.length - 1);
  const axes = columns.map((p, i) => {
    const values = scored.map(t => p.objective ? t.value : position(p, t.params[p.name]));
    const a = p.distribution === "choice" ? axis([0, p.choices.length - 1], false, bottom, top) : axis(values, !p.objective && isLog(p), bottom, top);
    const x = left + i * step;
    el("line", {x1: x, x2: x, y1: top, y2: bottom, stroke: "#555"}, svg);
    text(svg, x, top - 14, p.name, "middle", 12);
    if (p.distribution === "choice") p.choices.forEach((c, k) => text(svg, x - 4, a.map(k) + 4, String(c), "end", 10));
    else a.ticks.forEach(t => text(svg, x - 4, a.map(t) + 4, fmt(t), "end", 10));
    return {x: x, map: a.map, values: values};
  });
  const values = scored.map(t => t.value), lo = Math.min(...values), hi = Math.max(...values);
  scored.forEach((t, row) => {
    const rank = hi > lo ? (t.value - lo) / (hi - lo) : 0;
    const line = el("polyline", {points: axes.map(a => a.x + "," + a.map(a.values[row])).join(" "), fill: "none",
                                 stroke: colour(minimize ? rank : 1 - rank), "stroke-width": 2, "stroke-opacity": 0.8}, svg);
    el("title", {}, line).textContent = "trial " + t.number + ": " + fmt(t.value);
  });
}

// Trials that ran `train --folds`: their final report's cv_* metrics (each run's value, the mean
// and the sample standard deviation), as a table and as each run's value beside mean +- std.
const cvNames = [["auc", "AUC"], ["balanced_accuracy", "balanced accuracy"], ["f1", "F1"]];
function cvOf(t) {
  const a = t.attempts.length ? t.attempts[t.attempts.length - 1] : null;
  return a && a.metrics && typeof a.metrics.cv_auc_mean === "number" && Array.isArray(a.metrics.cv_auc_folds) ? a.metrics : null;
}
function drawCrossValidation() {
  const trials = study.trials.filter(cvOf);
  if (!trials.length) return;
  const holder = document.getElementById("cross-validation");
  holder.appendChild(document.createElement("h2")).textContent = "Cross-validation";
  const runs = cvOf(trials[0]).cv_auc_folds.length;
  holder.appendChild(document.createElement("p")).textContent = "Each trial's " + runs +
      " held-out folds (folds x seeds): the mean and, in brackets, the sample standard deviation.";
  const table = holder.appendChild(document.createElement("table"));
  table.id = "cv-table";
  const header = table.createTHead().insertRow();
  ["trial"].concat(study.space.map(p => p.name), cvNames.map(n => n[1] + " mean (std)"), ["AUC of each fold"])
      .forEach(name => header.appendChild(document.createElement("th")).textContent = name);
  const body = table.createTBody();
  trials.forEach(t => {
    const m = cvOf(t), row = body.insertRow();
    row.setAttribute("data-trial", t.number);
    row.insertCell().textContent = t.number;
    study.space.forEach(p => row.insertCell().textContent = fmt(t.params[p.name]));
    cvNames.forEach(([name]) => {
      row.setAttribute("data-" + name + "-mean", String(m["cv_" + name + "_mean"]));
      row.setAttribute("data-" + name + "-std", String(m["cv_" + name + "_std"]));
      row.insertCell().textContent = fmt(m["cv_" + name + "_mean"]) + " (" + fmt(m["cv_" + name + "_std"]) + ")";
    });
    row.insertCell().textContent = m.cv_auc_folds.map(fmt).join(", ");
  });
  cvNames.forEach(([name, title]) => {
    const width = Math.max(360, 80 + 60 * trials.length), svg = el("svg", {width: width, height: 280}, holder);
    const box = {left: 60, right: width - 20, top: 30, bottom: 230};
    const x = axis([-0.5, trials.length - 0.5], false, box.left, box.right);
    x.map = i => box.left + (i + 0.5) / trials.length * (box.right - box.left);
    const isNumber = v => typeof v === "number";  // a fold with one class has no AUC (null)
    const all = [].concat(...trials.map(t => cvOf(t)["cv_" + name + "_folds"])).filter(isNumber);
    const y = axis(all.concat([0, 1]), false, box.bottom, box.top);
    frame(svg, x, y, box, title + " of each fold, mean +- std", "trial", trials.map(t => String(t.number)));
    trials.forEach((t, i) => {
      const m = cvOf(t), mean = m["cv_" + name + "_mean"], std = m["cv_" + name + "_std"], cx = x.map(i);
      if (!isNumber(mean) || !isNumber(std)) return;
      el("line", {x1: cx, x2: cx, y1: y.map(mean - std), y2: y.map(mean + std), stroke: "#d0452f", "stroke-width": 2}, svg);
      el("line", {x1: cx - 12, x2: cx + 12, y1: y.map(mean), y2: y.map(mean), stroke: "#d0452f", "stroke-width": 2}, svg);
      m["cv_" + name + "_folds"].forEach((v, k) => isNumber(v) && dot(svg, cx - 8 + 16 * k / Math.max(1, runs - 1), y.map(v), "#3b6ea8",
                                                      "trial " + t.number + ", run " + (k + 1) + ": " + fmt(v)));
    });
  });
}

function drawTable() {
  const table = document.getElementById("trials"), head = table.tHead, body = table.tBodies[0];
  const columns = [["trial", t => t.number], ["state", t => t.state], [objective, t => t.value],
                   ["attempts", t => t.attempts.length], ["seconds", t => t.seconds]];
  study.space.forEach(p => columns.push([p.name, t => t.params[p.name]]));
  columns.push(["worker", t => t.attempts.length ? t.attempts[t.attempts.length - 1].worker : ""]);
  const rows = study.trials.map(t => columns.map(c => c[1](t)));
  const header = head.insertRow();
  let sortedBy = 0, up = true;
  function fill() {
    rows.sort((a, b) => {
      const x = a[sortedBy], y = b[sortedBy];
      if (x === y) return 0;
      if (x === null || x === undefined || x === "") return 1;
      if (y === null || y === undefined || y === "") return -1;
      const order = typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y));
      return up ? order : -order;
    });
    body.textContent = "";
    rows.forEach(r => {
      const tr = body.insertRow();
      if (study.best && r[0] === study.best.number) tr.className = "best";
      r.forEach(v => { tr.insertCell().textContent = fmt(v); });
    });
    Array.from(header.cells).forEach((cell, i) => cell.className = i === sortedBy ? (up ? "sorted-up" : "sorted-down") : "");
  }
  // report.html#sort=COLUMN (or #sort=-COLUMN, descending) opens sorted.
  const wanted = decodeURIComponent(location.hash).match(/^#sort=(-?)(.+)$/);
  if (wanted) {
    const index = columns.findIndex(c => c[0] === wanted[2]);
    if (index >= 0) { sortedBy = index; up = wanted[1] !== "-"; }
  }
  columns.forEach((c, i) => {
    const th = document.createElement("th");
    th.textContent = c[0];
    th.addEventListener("click", () => { up = sortedBy === i ? !up : true; sortedBy = i; fill(); });
    header.appendChild(th);
  });
  fill();
}

drawSummary();
drawCrossValidation();
drawHistory();
drawParams();
drawParallel();
drawTable();
document.body.setAttribute("data-rendered", "ok");
</script>
</body></html>
)html";

}  // namespace

std::string export_html(const std::vector<Trial>& trials, const StudyConfig& config, const std::string& study_name) {
  auto data = study_json(trials, config);
  data["study"] = study_name;
  for (size_t i = 0; i < trials.size(); ++i) data["trials"][i]["seconds"] = trial_seconds(trials[i]);
  if (auto* best = best_trial(trials, config.direction)) {
    data["best"]["flags"] = best_flags(*best, config);
    if (auto checkpoint = best_checkpoint(*best)) data["best"]["checkpoint"] = *checkpoint;
  }
  // "</" would end the script element early.
  std::string json = data.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), safe;
  for (size_t i = 0; i < json.size(); ++i) {
    if (json[i] == '<' && i + 1 < json.size() && json[i + 1] == '/') safe += "<\\";
    else safe += json[i];
  }
  return page_title + std::string(html_base_style) + page_head + safe + page_script;
}

}  // namespace tessera::sweep

// The collector's page: a query bar, the selection's time series (uPlot), and its merged
// profile as a flame graph, a top table, a diff of two ranges or a sandwich of one function.
// The whole state lives in the URL, so a link reproduces the view. It talks to the JSON API
// (/api/labels, /api/series, /api/tree) and downloads from /query.
"use strict";

const $ = (id) => document.getElementById(id);
const DEFAULTS = {
  kind: "cpu", value: "", selector: "", range: "3600", from: "", to: "", group_by: "",
  view: "flame", search: "", focus: "", fn: "", base_from: "", base_to: "", base_selector: "", pick: "range",
};
const FOCUS_SEPARATOR = "\u203a"; // "›" joins the names of the zoomed path in the URL

let state = readState();
let tree = null;
let labels = { labels: {}, truncated: [] };
let chart = null;
let loaded = 0; // bumps with each load, so that a slow answer never overwrites a newer one
const flame = new FlameGraph($("flame"), $("tooltip"), (node) => {
  state.focus = focusPath(node);
  writeState();
  showFocus();
});

function readState() {
  const params = new URLSearchParams(location.search);
  const s = { ...DEFAULTS };
  for (const key of Object.keys(DEFAULTS)) if (params.has(key)) s[key] = params.get(key);
  return s;
}

function writeState() {
  const params = new URLSearchParams();
  for (const [key, value] of Object.entries(state)) if (value !== DEFAULTS[key] && value !== "") params.set(key, value);
  history.replaceState(null, "", params.toString() ? "?" + params : location.pathname);
}

// [from, to] in unix seconds: absolute if given, else the last `range` seconds.
function timeRange() {
  if (state.from && state.to) return [Number(state.from), Number(state.to)];
  const to = Math.floor(Date.now() / 1000) + 1;
  return [to - Number(state.range || 3600), to];
}

// The base of a diff: as given, else the period of the same length just before the range.
function baseRange() {
  const [from, to] = timeRange();
  if (state.base_from && state.base_to) return [Number(state.base_from), Number(state.base_to)];
  return [from - (to - from), from];
}

function token() {
  return localStorage.getItem("ember-token") || "";
}

async function api(path, params) {
  const headers = token() ? { Authorization: "Bearer " + token() } : {};
  const response = await fetch(path + "?" + new URLSearchParams(params), { headers });
  if (response.status === 401) {
    $("auth").hidden = false;
    throw new Error("the collector wants a bearer token: enter it above");
  }
  if (!response.ok) throw new Error((await response.text()).trim() || response.statusText);
  return response;
}

function selection() {
  const [from, to] = timeRange();
  const p = { kind: state.kind, selector: state.selector, from, to };
  if (state.value !== "") p.value = state.value;
  return p;
}

// Loads what the state asks for and draws it.
async function load() {
  const mine = ++loaded;
  document.body.dataset.state = "loading";
  showError("");
  $("status").textContent = "loading…";
  const started = performance.now();
  try {
    const p = selection();
    const treeParams = { ...p };
    let chartRange = [p.from, p.to];
    if (state.view === "diff") {
      const [baseFrom, baseTo] = baseRange();
      Object.assign(treeParams, { base_from: baseFrom, base_to: baseTo });
      if (state.base_selector) treeParams.base_selector = state.base_selector;
      chartRange = [Math.min(p.from, baseFrom), Math.max(p.to, baseTo)];
    }
    const seriesParams = { ...p, from: chartRange[0], to: chartRange[1], group_by: state.group_by };
    const [treeAnswer, series] = await Promise.all([
      api("/api/tree", treeParams).then((r) => r.json()),
      api("/api/series", seriesParams).then((r) => r.json()),
    ]);
    if (mine !== loaded) return;
    tree = treeAnswer;
    showValueTypes();
    drawChart(series);
    flame.setTree(tree, formatter());
    showFocus();
    const ms = Math.round(performance.now() - started);
    const cut = tree.cut_nodes ? ` (${tree.cut_nodes} lightest left out)` : "";
    const base = state.view === "diff" ? ` against ${tree.base_profiles} base profiles` : "";
    $("status").textContent = `${tree.profiles} profiles${base} · ${tree.nodes.name.length} nodes${cut} · ${ms} ms`;
    document.body.dataset.state = "ready";
    performance.mark("ember-ready");
  } catch (error) {
    if (mine !== loaded) return;
    showError(error.message);
    $("status").textContent = "";
    document.body.dataset.state = "error";
  }
}

async function loadLabels() {
  const [from, to] = timeRange();
  try {
    labels = await (await api("/api/labels", { kind: state.kind, from, to })).json();
  } catch (error) {
    showError(error.message);
    return;
  }
  const group = $("group-by");
  group.replaceChildren(new Option("no grouping", ""), ...Object.keys(labels.labels).map((name) => new Option("by " + name, name)));
  group.value = state.group_by;
  completeSelector();
}

// Offers the last term of the selector completed: label names, then a name's values.
function completeSelector() {
  const text = $("selector").value;
  const cut = text.lastIndexOf(",") + 1;
  const head = text.slice(0, cut);
  const term = text.slice(cut).trimStart();
  const eq = term.indexOf("=");
  let options;
  if (eq < 0) {
    options = Object.keys(labels.labels).map((name) => head + name + "=");
  } else {
    const name = term.slice(0, eq);
    options = [...(labels.labels[name] || [])].map((value) => head + name + "=" + value);
  }
  $("selector-completions").replaceChildren(...options.slice(0, 200).map((o) => new Option(o)));
}

function showError(message) {
  $("error").textContent = message;
  $("error").hidden = !message;
}

function showValueTypes() {
  const select = $("value");
  const types = tree.sample_types.map(([type, unit], i) => new Option(`${type} (${unit})`, String(i)));
  select.replaceChildren(...types);
  select.value = String(tree.value);
}

function unit() {
  const type = tree && tree.sample_types[tree.value];
  return type ? type[1] : "";
}

// Text of a value in the tree's unit.
function formatter() {
  const u = unit();
  const scaled = (v, steps) => {
    for (const [size, name] of steps) if (Math.abs(v) >= size) return (v / size).toFixed(v % size === 0 ? 0 : 2) + " " + name;
    return v + " " + steps[steps.length - 1][1];
  };
  if (u === "nanoseconds")
    return (v) => scaled(v, [[60e9, "min"], [1e9, "s"], [1e6, "ms"], [1e3, "µs"], [1, "ns"]]);
  if (u === "bytes")
    return (v) => scaled(v, [[2 ** 30, "GiB"], [2 ** 20, "MiB"], [2 ** 10, "KiB"], [1, "B"]]);
  return (v) => v.toLocaleString("en-US") + (u && u !== "count" ? " " + u : "");
}

const LINE_COLORS = ["#d9480f", "#1971c2", "#2f9e44", "#ae3ec9", "#f08c00", "#0c8599", "#e64980", "#5c940d", "#7048e8", "#868e96"];

function drawChart(series) {
  const times = series.lines.length ? series.lines[0].values.map((_, i) => series.from + i * series.step) : [series.from];
  const data = [times, ...series.lines.map((l) => l.values)];
  const format = formatter();
  const options = {
    width: $("chart").clientWidth,
    height: 160,
    cursor: { drag: { x: true, y: false, setScale: false } },
    legend: { show: series.lines.length > 1 },
    axes: [{}, { size: 80, values: (_, ticks) => ticks.map(format) }],
    series: [{}, ...series.lines.map((l, i) => ({
      label: l.name, stroke: LINE_COLORS[i % LINE_COLORS.length], width: 1.5,
      fill: series.lines.length === 1 ? "rgba(217, 72, 15, 0.12)" : undefined, value: (_, v) => (v == null ? "" : format(v)),
    }))],
    hooks: { setSelect: [picked], drawClear: [shadeRanges] },
  };
  if (chart) chart.destroy();
  chart = new uPlot(options, data, $("chart"));
}

// In a diff, the base range is shaded blue and the compared range red.
function shadeRanges(u) {
  if (state.view !== "diff") return;
  const ctx = u.ctx;
  const band = ([from, to], color) => {
    const left = u.valToPos(from, "x", true);
    const right = u.valToPos(to, "x", true);
    ctx.fillStyle = color;
    ctx.fillRect(left, u.bbox.top, right - left, u.bbox.height);
  };
  band(baseRange(), "rgba(60, 90, 240, 0.12)");
  band(timeRange(), "rgba(240, 60, 60, 0.12)");
}

// A drag across the chart: the new range (or, in a diff picking the base, the base range).
function picked(u) {
  if (u.select.width < 2) return;
  const from = Math.floor(u.posToVal(u.select.left, "x"));
  const to = Math.ceil(u.posToVal(u.select.left + u.select.width, "x"));
  u.setSelect({ left: 0, width: 0 }, false);
  if (state.view === "diff" && state.pick === "base") {
    Object.assign(state, { base_from: String(from), base_to: String(to) });
  } else {
    Object.assign(state, { from: String(from), to: String(to), focus: "" });
  }
  writeState();
  showControls();
  load();
}

// The URL form of a node: the names on its path from the root.
function focusPath(node) {
  const names = [];
  for (let p = node; p > 0; p = flame.layout.parent[p]) names.unshift(tree.names[tree.nodes.name[p]]);
  return names.join(FOCUS_SEPARATOR);
}

// The node of the URL's focus path, as deep as it still exists.
function focusNode() {
  if (!state.focus) return 0;
  let node = 0;
  for (const name of state.focus.split(FOCUS_SEPARATOR)) {
    const depth = tree.nodes.depth[node] + 1;
    let found = -1;
    for (let i = node + 1; i < tree.nodes.name.length && tree.nodes.depth[i] >= depth; i++) {
      if (tree.nodes.depth[i] === depth && tree.names[tree.nodes.name[i]] === name) { found = i; break; }
    }
    if (found < 0) break;
    node = found;
  }
  return node;
}

// Applies the zoom and search of the state to the flame graph and the table.
function showFocus() {
  if (!tree) return;
  flame.zoom(focusNode());
  $("reset-zoom").disabled = !state.focus;
  runSearch();
  if (state.view === "top") drawTop();
  if (state.view === "sandwich") drawSandwich();
}

function searchPattern() {
  if (!state.search) return null;
  try {
    return new RegExp(state.search, "i");
  } catch {
    return new RegExp(state.search.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"), "i");
  }
}

function runSearch() {
  const found = flame.search(searchPattern());
  $("search-result").textContent = found ? `matches ${(found.share * 100).toFixed(1)}% (${flame.format(found.total)})` : "";
}

// Self and total per function within the zoomed subtree; a recursive function's total counts
// each stack once.
function functionTotals() {
  const n = tree.nodes;
  const start = focusNode();
  const byName = new Map();
  const path = [];
  const onPath = new Map();
  for (let i = start; i < n.name.length && (i === start || n.depth[i] > n.depth[start]); i++) {
    while (path.length && n.depth[path[path.length - 1]] >= n.depth[i]) {
      const left = n.name[path.pop()];
      onPath.set(left, onPath.get(left) - 1);
    }
    const name = n.name[i];
    if (n.kind[i] !== 0) {
      const row = byName.get(name) || { name: tree.names[name], kind: tree.kinds[n.kind[i]], self: 0, total: 0 };
      row.self += n.self[i];
      if (!onPath.get(name)) row.total += n.total[i];
      byName.set(name, row);
    }
    path.push(i);
    onPath.set(name, (onPath.get(name) || 0) + 1);
  }
  return [...byName.values()];
}

let sortBy = "self";
const TOP_ROWS = 500;

function drawTop() {
  const rows = functionTotals();
  const pattern = searchPattern();
  const shown = rows.filter((r) => !pattern || pattern.test(r.name)).sort((a, b) => b[sortBy] - a[sortBy] || a.name.localeCompare(b.name));
  const root = tree.nodes.total[focusNode()] || 1;
  const format = flame.format;
  const body = $("top").tBodies[0];
  body.replaceChildren(...shown.slice(0, TOP_ROWS).map((r) => {
    const tr = document.createElement("tr");
    tr.dataset.name = r.name;
    const cells = [r.name, r.kind, format(r.self), pct(r.self / root), format(r.total), pct(r.total / root)];
    cells.forEach((text, i) => {
      const td = tr.insertCell();
      td.textContent = text;
      if (i === 2) td.dataset.value = r.self;
      if (i === 4) td.dataset.value = r.total;
    });
    return tr;
  }));
  $("top-more").textContent = shown.length > TOP_ROWS ? `${shown.length - TOP_ROWS} more functions not shown` : "";
}

// A columnar tree (the /api/tree form) from a trie of {name, kind, total, self, children}.
function columns(trie, names, kinds) {
  const index = new Map(names.map((n, i) => [n, i]));
  const nodes = { name: [], kind: [], inlined: [], depth: [], total: [], self: [], file: [], line: [] };
  const visit = (t, depth) => {
    if (!index.has(t.name)) { index.set(t.name, names.length); names.push(t.name); }
    nodes.name.push(index.get(t.name));
    nodes.kind.push(t.kind);
    nodes.inlined.push(0);
    nodes.depth.push(depth);
    nodes.total.push(t.total);
    nodes.self.push(t.self);
    nodes.file.push(4294967295);
    nodes.line.push(0);
    [...t.children.values()].sort((a, b) => b.total - a.total).forEach((c) => visit(c, depth + 1));
  };
  visit(trie, 0);
  return { names, kinds, diff: false, nodes, sample_types: tree.sample_types, value: tree.value };
}

// The sandwich of state.fn: its callers above it (inverted), its callees below.
function drawSandwich() {
  const n = tree.nodes;
  const target = tree.names.indexOf(state.fn);
  $("sandwich-name").textContent = state.fn ? state.fn : "pick a function in the top table";
  const trie = (name, kind) => ({ name, kind, total: 0, self: 0, children: new Map() });
  const callers = trie(state.fn, 2);
  const callees = trie(state.fn, 2);
  const parent = flame.layout.parent;
  const child = (t, i) => {
    const key = n.name[i] + ":" + n.kind[i];
    if (!t.children.has(key)) t.children.set(key, trie(tree.names[n.name[i]], n.kind[i]));
    return t.children.get(key);
  };
  for (let i = 0; target >= 0 && i < n.name.length; i++) {
    if (n.name[i] !== target) continue;
    let nested = false;
    for (let p = parent[i]; p >= 0; p = parent[p]) if (n.name[p] === target) { nested = true; break; }
    if (nested) continue;
    callers.kind = callees.kind = n.kind[i];
    callers.total += n.total[i];
    callees.total += n.total[i];
    callers.self += n.self[i];
    callees.self += n.self[i];
    let t = callers;
    for (let p = parent[i]; p > 0; p = parent[p]) {
      t = child(t, p);
      t.total += n.total[i];
    }
    // Callees: the node's subtree merged under the function.
    const stack = [[i, callees]];
    for (let j = i + 1; j < n.name.length && n.depth[j] > n.depth[i]; j++) {
      while (n.depth[stack[stack.length - 1][0]] >= n.depth[j]) stack.pop();
      const c = child(stack[stack.length - 1][1], j);
      c.total += n.total[j];
      c.self += n.self[j];
      stack.push([j, c]);
    }
  }
  callersGraph.setTree(columns(callers, [], tree.kinds), flame.format);
  calleesGraph.setTree(columns(callees, [], tree.kinds), flame.format);
}

const callersGraph = new FlameGraph($("callers"), $("callers-tooltip"), () => {}, true);
const calleesGraph = new FlameGraph($("callees"), $("callees-tooltip"), () => {});

// Dates in the range inputs, in local time.
function toInput(seconds) {
  const d = new Date(seconds * 1000 - new Date().getTimezoneOffset() * 60000);
  return d.toISOString().slice(0, 19);
}

function fromInput(text) {
  return String(Math.floor(new Date(text).getTime() / 1000));
}

function showControls() {
  $("kind").value = state.kind;
  $("selector").value = state.selector;
  $("search").value = state.search;
  const [from, to] = timeRange();
  $("from").value = toInput(from);
  $("to").value = toInput(to);
  const [baseFrom, baseTo] = baseRange();
  $("base-from").value = toInput(baseFrom);
  $("base-to").value = toInput(baseTo);
  $("base-selector").value = state.base_selector;
  for (const radio of document.getElementsByName("pick")) radio.checked = radio.value === state.pick;
  for (const button of document.querySelectorAll("[data-range]")) button.classList.toggle("on", !state.from && state.range === button.dataset.range);
  for (const tab of document.querySelectorAll("[data-view]")) tab.classList.toggle("on", tab.dataset.view === state.view);
  $("diff-form").hidden = state.view !== "diff";
  $("legend").hidden = state.view !== "diff";
  $("flame-wrap").hidden = state.view === "top" || state.view === "sandwich";
  $("top-wrap").hidden = state.view !== "top";
  $("sandwich").hidden = state.view !== "sandwich";
}

// Downloads the current selection from /query (with the token, so not as a plain link).
async function download(format) {
  const p = selection();
  try {
    const blob = await (await api("/query", { kind: p.kind, selector: p.selector, from: p.from, to: p.to, format })).blob();
    const a = document.createElement("a");
    a.href = URL.createObjectURL(blob);
    a.download = `ember-${p.kind}-${p.from}-${p.to}.${{ pprof: "pb.gz", folded: "folded", svg: "svg" }[format]}`;
    a.click();
    setTimeout(() => URL.revokeObjectURL(a.href), 10000);
  } catch (error) {
    showError(error.message);
  }
}

function change(update, reload = true) {
  Object.assign(state, update);
  writeState();
  showControls();
  if (reload) load();
}

$("query").addEventListener("submit", (e) => {
  e.preventDefault();
  const kindChanged = $("kind").value !== state.kind;
  // A range typed in the inputs becomes absolute; otherwise a preset stays relative to now.
  const typed = $("from").dataset.typed || $("to").dataset.typed;
  const range = typed ? { from: fromInput($("from").value), to: fromInput($("to").value) } : {};
  delete $("from").dataset.typed;
  delete $("to").dataset.typed;
  change({ kind: $("kind").value, selector: $("selector").value.trim(), value: kindChanged ? "" : $("value").value, focus: "", ...range });
  if (kindChanged) loadLabels();
});
$("kind").addEventListener("change", () => $("query").requestSubmit());
$("value").addEventListener("change", () => change({ value: $("value").value }));
$("group-by").addEventListener("change", () => change({ group_by: $("group-by").value }));
$("selector").addEventListener("input", completeSelector);
for (const input of [$("from"), $("to")]) input.addEventListener("input", () => (input.dataset.typed = "1"));
for (const button of document.querySelectorAll("[data-range]"))
  button.addEventListener("click", () => {
    change({ range: button.dataset.range, from: "", to: "", focus: "" });
    loadLabels();
  });
for (const tab of document.querySelectorAll("[data-view]"))
  tab.addEventListener("click", () => {
    const reload = (tab.dataset.view === "diff") !== (state.view === "diff");
    change({ view: tab.dataset.view }, reload);
    if (!reload) showFocus();
  });
$("search").addEventListener("input", () => {
  change({ search: $("search").value }, false);
  runSearch();
  if (state.view === "top") drawTop();
});
$("reset-zoom").addEventListener("click", () => {
  change({ focus: "" }, false);
  showFocus();
});
$("diff-form").addEventListener("submit", (e) => {
  e.preventDefault();
  change({ base_from: fromInput($("base-from").value), base_to: fromInput($("base-to").value), base_selector: $("base-selector").value.trim() });
});
for (const radio of document.getElementsByName("pick")) radio.addEventListener("change", () => change({ pick: radio.value }, false));
for (const th of $("top").tHead.rows[0].cells)
  if (th.dataset.sort) th.addEventListener("click", () => { sortBy = th.dataset.sort; drawTop(); });
$("top").tBodies[0].addEventListener("click", (e) => {
  const row = e.target.closest("tr");
  if (!row) return;
  change({ fn: row.dataset.name, view: "sandwich" }, false);
  showFocus();
});
for (const link of document.querySelectorAll("[data-download]")) link.addEventListener("click", () => download(link.dataset.download));
$("auth").addEventListener("submit", (e) => {
  e.preventDefault();
  localStorage.setItem("ember-token", $("token").value);
  $("auth").hidden = true;
  load();
  loadLabels();
});
window.addEventListener("resize", () => chart && chart.setSize({ width: $("chart").clientWidth, height: 160 }));

showControls();
load();
loadLabels();

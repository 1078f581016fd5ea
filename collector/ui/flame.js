// An icicle graph on a canvas: the root on top, callees below, each frame as wide as its
// share of its parent. It draws the columnar tree of /api/tree (nodes depth first, parents
// before children) and redraws only on a change of data, size, zoom or search: hovering
// moves a tooltip, not pixels, so it stays cheap at 50,000 nodes.
"use strict";

const ROW = 18;
const FONT = "12px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace";
const CHAR = 7.2; // width of one character of FONT, near enough to cut labels without measuring
// Hue and lightness ranges per frame kind (label, kernel, binary, library, jit).
const PALETTE = [
  [210, 8, 78],
  [25, 85, 62],
  [5, 70, 62],
  [45, 85, 58],
  [130, 50, 55],
];

function hash(text) {
  let h = 2166136261;
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i);
    h = Math.imul(h, 16777619);
  }
  return (h >>> 0) / 4294967296;
}

// The layout of a columnar tree: each node's parent, its offset (in value units) from the
// root's left edge, and how many rows the tree takes.
function layout(tree) {
  const n = tree.nodes.name.length;
  const parent = new Int32Array(n);
  const x = new Float64Array(n);
  const cursor = new Float64Array(n);
  const lastAt = [];
  for (let i = 0; i < n; i++) {
    const d = tree.nodes.depth[i];
    const p = d === 0 ? -1 : lastAt[d - 1];
    parent[i] = p;
    if (p >= 0) {
      x[i] = cursor[p];
      cursor[p] += tree.nodes.total[i];
    }
    cursor[i] = x[i];
    lastAt[d] = i;
  }
  return { parent, x, rows: lastAt.length };
}

class FlameGraph {
  // canvas: where to draw; tooltip: an element positioned over it; onZoom(node): a click;
  // inverted: the root at the bottom (a sandwich's callers).
  constructor(canvas, tooltip, onZoom, inverted = false) {
    this.canvas = canvas;
    this.inverted = inverted;
    this.tooltip = tooltip;
    this.onZoom = onZoom;
    this.tree = null;
    this.focus = 0;
    this.matches = null;
    this.drawn = [];
    canvas.addEventListener("mousemove", (e) => this.hover(e));
    canvas.addEventListener("mouseleave", () => (this.tooltip.hidden = true));
    canvas.addEventListener("click", (e) => {
      const node = this.nodeAt(e);
      if (node !== null) this.onZoom(node);
    });
    new ResizeObserver(() => this.draw()).observe(canvas.parentElement);
  }

  // tree: an /api/tree answer; format(value): text of a value in the tree's unit.
  setTree(tree, format) {
    this.tree = tree;
    this.format = format;
    this.layout = layout(tree);
    this.focus = 0;
    this.matches = null;
    this.draw();
  }

  // Zooms to `node` (0: the whole tree): it fills the width, its ancestors stay above it.
  zoom(node) {
    this.focus = node;
    this.draw();
  }

  // Highlights the frames whose name matches `pattern` (a RegExp, or null for none). Returns
  // their total (nested matches counted once) and its share of the root.
  search(pattern) {
    const t = this.tree;
    if (!t) return null;
    if (!pattern) {
      this.matches = null;
      this.draw();
      return null;
    }
    const names = t.names.map((name) => pattern.test(name));
    const n = t.nodes.name.length;
    this.matches = new Uint8Array(n);
    let total = 0;
    const { parent } = this.layout;
    for (let i = 0; i < n; i++) {
      if (!names[t.nodes.name[i]]) continue;
      this.matches[i] = 1;
      let counted = false;
      for (let p = parent[i]; p >= 0; p = parent[p]) if (this.matches[p]) { counted = true; break; }
      if (!counted) total += t.nodes.total[i];
    }
    this.draw();
    return { total, share: t.nodes.total[0] ? total / t.nodes.total[0] : 0 };
  }

  // Whether `node` is the focus or lies on its path to the root.
  isAncestorOfFocus(node) {
    for (let p = this.focus; p >= 0; p = this.layout.parent[p]) if (p === node) return true;
    return false;
  }

  draw() {
    const t = this.tree;
    const canvas = this.canvas;
    const width = canvas.parentElement.clientWidth;
    const ratio = window.devicePixelRatio || 1;
    const depth = t ? this.layout.rows : 1;
    const height = depth * ROW;
    canvas.style.width = width + "px";
    canvas.style.height = height + "px";
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(height * ratio);
    const ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, height);
    this.drawn = [];
    if (!t || !t.nodes.total[0]) return;
    const nodes = t.nodes;
    const { x, parent } = this.layout;
    const left = x[this.focus];
    const scale = width / nodes.total[this.focus];
    const focusDepth = nodes.depth[this.focus];
    ctx.font = FONT;
    ctx.textBaseline = "middle";
    for (let i = 0; i < nodes.name.length; i++) {
      const d = nodes.depth[i];
      let px, w;
      if (d <= focusDepth) {
        if (!this.isAncestorOfFocus(i)) continue;
        px = 0;
        w = width;
      } else {
        px = (x[i] - left) * scale;
        w = nodes.total[i] * scale;
        if (px + w <= 0 || px >= width || w < 0.5) continue;
        // Below the focus only its own subtree is drawn.
        if (this.focus !== 0) {
          let p = parent[i];
          while (nodes.depth[p] > focusDepth) p = parent[p];
          if (p !== this.focus) continue;
        }
      }
      const y = (this.inverted ? depth - 1 - d : d) * ROW;
      ctx.fillStyle = this.color(i);
      ctx.fillRect(px, y, Math.max(w - 0.5, 0.5), ROW - 1);
      this.drawn.push({ node: i, x: px, y, w });
      if (w > 3 * CHAR) {
        const name = t.names[nodes.name[i]];
        const fits = Math.floor((w - 6) / CHAR);
        ctx.fillStyle = "#111";
        ctx.fillText(name.length > fits ? name.slice(0, fits - 1) + "…" : name, px + 3, y + ROW / 2);
      }
    }
  }

  color(i) {
    const t = this.tree;
    const nodes = t.nodes;
    if (t.diff) return diffColor(this.change(i));
    const name = t.names[nodes.name[i]];
    if (this.matches && !this.matches[i]) return "#e4e4e4";
    if (this.matches) return "#e040d0";
    const [hue, sat, light] = PALETTE[nodes.kind[i]] || PALETTE[2];
    const v = hash(name);
    return `hsl(${hue + v * 20 - 10}, ${sat}%, ${light + v * 12 - 6}%)`;
  }

  // A diff node's change in share of its root: the compared range's share minus the base's.
  change(i) {
    const n = this.tree.nodes;
    const share = n.total[0] ? n.total[i] / n.total[0] : 0;
    const base = n.base_total[0] ? n.base_total[i] / n.base_total[0] : 0;
    return share - base;
  }

  // The node under a mouse event, or null.
  nodeAt(e) {
    const rect = this.canvas.getBoundingClientRect();
    const px = e.clientX - rect.left;
    const row = Math.floor((e.clientY - rect.top) / ROW);
    for (const box of this.drawn) if (box.y === row * ROW && px >= box.x && px < box.x + box.w) return box.node;
    return null;
  }

  hover(e) {
    const node = this.nodeAt(e);
    if (node === null) {
      this.tooltip.hidden = true;
      return;
    }
    const t = this.tree;
    const n = t.nodes;
    const root = n.total[0] || 1;
    const parent = this.layout.parent[node];
    const lines = [
      t.names[n.name[node]] + (n.inlined[node] ? " (inlined)" : ""),
      `${t.kinds[n.kind[node]]}${n.file[node] !== 4294967295 ? " · " + t.names[n.file[node]] + (n.line[node] ? ":" + n.line[node] : "") : ""}`,
      `total ${this.format(n.total[node])} (${pct(n.total[node] / root)} of all${parent >= 0 ? ", " + pct(n.total[node] / n.total[parent]) + " of its caller" : ""})`,
      `self ${this.format(n.self[node])} (${pct(n.self[node] / root)})`,
    ];
    if (t.diff) lines.push(`change in share: ${(this.change(node) * 100).toFixed(2)} points (base ${this.format(n.base_total[node])})`);
    this.tooltip.textContent = lines.join("\n");
    this.tooltip.hidden = false;
    const wrap = this.canvas.parentElement.getBoundingClientRect();
    const left = Math.min(e.clientX - wrap.left + 12, wrap.width - this.tooltip.offsetWidth - 4);
    this.tooltip.style.left = Math.max(left, 0) + "px";
    this.tooltip.style.top = e.clientY - wrap.top + 16 + "px";
  }
}

// A share as a percentage, with more digits for the tiny ones (the page's tables use it too).
function pct(share) {
  return (share * 100).toFixed(share < 0.001 ? 3 : 1) + "%";
}

// Red for a frame that grew in share, blue for one that shrank, white for no change; full
// colour at 5 points of change.
function diffColor(change) {
  const strength = Math.min(Math.abs(change) / 0.05, 1);
  const fade = Math.round(235 - strength * 175);
  return change > 0 ? `rgb(240, ${fade}, ${fade})` : change < 0 ? `rgb(${fade}, ${fade}, 240)` : "rgb(235, 235, 235)";
}

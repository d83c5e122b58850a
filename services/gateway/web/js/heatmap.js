// Cluster → node → GPU heat map on one <canvas>. 512 nodes × 8 GPUs are 4,096 rectangles: drawing them is a few
// milliseconds, where 4,096 DOM elements would cost far more to create, style and update. Layout is recomputed
// only when the set of nodes or the width changes; an update only repaints. Hover and click are hit-tested on the
// layout, so there is one element, one listener and no per-cell objects in the DOM.

const RAMP = [[234, 240, 248], [190, 213, 240], [120, 167, 226], [56, 112, 200], [27, 58, 130]];
const HEAT = [[255, 244, 214], [253, 204, 120], [244, 140, 60], [214, 72, 47], [150, 30, 40]];
export const COLORS = {
  healthy: "#36b37e", degraded: "#f2a93b", failed: "#e5484d", lost: "#a3acba", idle: "#e8590c",
  selected: "#111827", tile: "#f3f5f9", tileLost: "#fde8e8", tileCordoned: "#e7ecfb", text: "#334155",
  muted: "#64748b",
};

function ramp(stops, t) {
  const x = Math.min(1, Math.max(0, t)) * (stops.length - 1);
  const i = Math.min(stops.length - 2, Math.floor(x));
  const f = x - i;
  const [a, b] = [stops[i], stops[i + 1]];
  return `rgb(${Math.round(a[0] + (b[0] - a[0]) * f)},${Math.round(a[1] + (b[1] - a[1]) * f)},${Math.round(a[2] + (b[2] - a[2]) * f)})`;
}

export function cellColor(gpu, metric) {
  if (metric === "health") return gpu.lost ? COLORS.lost : (COLORS[gpu.health] || COLORS.degraded);
  if (gpu.lost) return COLORS.lost;
  if (metric === "memory") return gpu.memPct === null ? COLORS.tile : ramp(RAMP, gpu.memPct / 100);
  if (metric === "temperature") return gpu.temp === null ? COLORS.tile : ramp(HEAT, (gpu.temp - 25) / 65);
  return gpu.util === null ? COLORS.tile : ramp(RAMP, gpu.util / 100);
}

export function legendStops(metric) {
  if (metric === "health") return null;
  const stops = metric === "temperature" ? HEAT : RAMP;
  return stops.map((_, i) => ramp(stops, i / (stops.length - 1)));
}

export class HeatMap {
  constructor(canvas, { onHover, onSelect }) {
    this.canvas = canvas;
    this.ctx = canvas.getContext("2d", { alpha: false });
    this.onHover = onHover;
    this.onSelect = onSelect;
    this.clusters = [];
    this.metric = "util";
    this.selected = null;
    this.layout = null;
    this.layoutKey = "";
    this.renders = 0;
    this.lastRenderMs = 0;
    canvas.addEventListener("mousemove", (e) => this.onHover(this.hit(e), e));
    canvas.addEventListener("mouseleave", () => this.onHover(null));
    canvas.addEventListener("click", (e) => {
      const hit = this.hit(e);
      if (hit) this.onSelect(hit.node, hit.gpu);
    });
  }

  /** Replace the data and repaint; returns the milliseconds spent (layout when needed, then drawing). */
  update(clusters, { metric = this.metric, selected = this.selected } = {}) {
    const t0 = performance.now();
    this.clusters = clusters;
    this.metric = metric;
    this.selected = selected;
    const width = Math.max(320, Math.floor(this.canvas.parentElement.clientWidth));
    const key = `${width}|${clusters.map((c) => `${c.name}:${c.nodes.map((n) => `${n.key}/${n.gpus.length}`).join(",")}`).join(";")}`;
    if (key !== this.layoutKey) {
      this.layout = this.computeLayout(width);
      this.layoutKey = key;
      this.resize(width, this.layout.height);
    } else {
      // Same nodes in the same order: keep the geometry, point it at the new data.
      let i = 0;
      clusters.forEach((cluster, j) => {
        this.layout.headers[j].cluster = cluster;
        for (const node of cluster.nodes) this.layout.tiles[i++].node = node;
      });
    }
    this.draw();
    this.renders += 1;
    this.lastRenderMs = performance.now() - t0;
    this.canvas.dataset.renders = String(this.renders);
    return this.lastRenderMs;
  }

  relayout() {
    this.layoutKey = "";
    if (this.clusters.length) this.update(this.clusters);
  }

  computeLayout(width) {
    const nodeCount = this.clusters.reduce((s, c) => s + c.nodes.length, 0);
    const base = nodeCount <= 40 ? 22 : nodeCount <= 128 ? 17 : nodeCount <= 300 ? 12 : 9;
    const gap = base >= 12 ? 2 : 1;
    const pad = base >= 12 ? 4 : 2;
    const label = base >= 12 ? 13 : 0;
    const header = 26;
    const spacing = base >= 12 ? 8 : 4;
    // Stretch the cells so that whole 8-GPU tiles fill the width (no ragged empty margin on the right).
    const perRow = Math.max(1, Math.floor((width + spacing) / (2 * pad + 8 * base + 7 * gap + spacing)));
    const cell = Math.max(base, Math.floor(((width + spacing) / perRow - spacing - 2 * pad - 7 * gap) / 8));
    const tiles = [];
    const headers = [];
    let y = 0;
    for (const cluster of this.clusters) {
      headers.push({ cluster, y });
      y += header;
      let x = 0;
      let rowHeight = 0;
      for (const node of cluster.nodes) {
        const cols = Math.min(8, Math.max(1, node.gpus.length));
        const rows = Math.max(1, Math.ceil(node.gpus.length / 8));
        const w = pad * 2 + cols * cell + (cols - 1) * gap;
        const hgt = label + pad * 2 + rows * cell + (rows - 1) * gap;
        if (x > 0 && x + w > width) { x = 0; y += rowHeight + spacing; rowHeight = 0; }
        tiles.push({ node, x, y, w, h: hgt, cols });
        x += w + spacing;
        rowHeight = Math.max(rowHeight, hgt);
      }
      y += rowHeight + spacing + 6;
    }
    return { width, height: Math.max(40, y), tiles, headers, cell, gap, pad, label, header };
  }

  resize(width, height) {
    const dpr = window.devicePixelRatio || 1;
    this.canvas.width = Math.round(width * dpr);
    this.canvas.height = Math.round(height * dpr);
    this.canvas.style.width = `${width}px`;
    this.canvas.style.height = `${height}px`;
    this.ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  }

  draw() {
    const { ctx } = this;
    const { width, height, tiles, headers, cell, gap, pad, label } = this.layout;
    ctx.fillStyle = "#ffffff";
    ctx.fillRect(0, 0, width, height);
    ctx.textBaseline = "middle";
    for (const { cluster, y } of headers) {
      ctx.font = "600 13px system-ui, sans-serif";
      ctx.fillStyle = COLORS.text;
      ctx.fillText(cluster.name, 0, y + 11);
      const w = ctx.measureText(cluster.name).width;
      ctx.font = "12px system-ui, sans-serif";
      ctx.fillStyle = COLORS.muted;
      ctx.fillText(`  ${cluster.nodes.length} nodes · ${cluster.gpuCount} GPUs`, w, y + 11);
    }
    const metric = this.metric;
    for (const tile of tiles) {
      const { node } = tile;
      ctx.globalAlpha = node.dim ? 0.35 : 1;
      ctx.fillStyle = node.state === "lost" ? COLORS.tileLost : node.cordoned ? COLORS.tileCordoned : COLORS.tile;
      ctx.fillRect(tile.x, tile.y, tile.w, tile.h);
      if (label) {
        ctx.font = "10px system-ui, sans-serif";
        ctx.fillStyle = node.state === "lost" ? COLORS.failed : COLORS.muted;
        const text = node.state === "lost" ? `${node.name} (lost)` : node.cordoned ? `${node.name} (${node.cordoned})` : node.name;
        ctx.fillText(text.length * 5.6 > tile.w - 4 ? `${text.slice(0, Math.floor((tile.w - 8) / 5.6))}…` : text,
          tile.x + pad, tile.y + 7);
      }
      for (let i = 0; i < node.gpus.length; i += 1) {
        const gpu = node.gpus[i];
        const cx = tile.x + pad + (i % tile.cols) * (cell + gap);
        const cy = tile.y + label + pad + Math.floor(i / tile.cols) * (cell + gap);
        ctx.globalAlpha = node.dim || gpu.dim ? 0.18 : 1;
        ctx.fillStyle = cellColor(gpu, metric);
        ctx.fillRect(cx, cy, cell, cell);
        if (gpu.dim || node.dim) continue;
        if (metric !== "health" && !gpu.lost && gpu.health !== "healthy") {
          this.outline(cx, cy, cell, gpu.health === "failed" ? COLORS.failed : COLORS.degraded, cell >= 12 ? 2 : 1.5);
          if (gpu.health === "failed") this.cross(cx, cy, cell);
        } else if (gpu.idle) {
          this.outline(cx, cy, cell, COLORS.idle, cell >= 12 ? 2.5 : 1.5);
        }
        if (gpu.allocated && cell >= 12) {
          ctx.fillStyle = gpu.util >= 50 ? "#ffffff" : "#1e293b";
          ctx.fillRect(cx + cell - 5, cy + 2, 3, 3);
        }
      }
      ctx.globalAlpha = 1;
      if (this.selected && this.selected === node.key) {
        ctx.strokeStyle = COLORS.selected;
        ctx.lineWidth = 2;
        ctx.strokeRect(tile.x + 1, tile.y + 1, tile.w - 2, tile.h - 2);
      }
    }
  }

  outline(x, y, size, color, width) {
    const { ctx } = this;
    ctx.strokeStyle = color;
    ctx.lineWidth = width;
    ctx.strokeRect(x + width / 2, y + width / 2, size - width, size - width);
  }

  cross(x, y, size) {
    const { ctx } = this;
    ctx.strokeStyle = COLORS.failed;
    ctx.lineWidth = 1.5;
    ctx.beginPath();
    ctx.moveTo(x + 3, y + 3); ctx.lineTo(x + size - 3, y + size - 3);
    ctx.moveTo(x + size - 3, y + 3); ctx.lineTo(x + 3, y + size - 3);
    ctx.stroke();
  }

  hit(event) {
    if (!this.layout) return null;
    const rect = this.canvas.getBoundingClientRect();
    const x = event.clientX - rect.left;
    const y = event.clientY - rect.top;
    const { cell, gap, pad, label } = this.layout;
    for (const tile of this.layout.tiles) {
      if (x < tile.x || x >= tile.x + tile.w || y < tile.y || y >= tile.y + tile.h) continue;
      const col = Math.floor((x - tile.x - pad) / (cell + gap));
      const row = Math.floor((y - tile.y - label - pad) / (cell + gap));
      const index = row * tile.cols + col;
      const gpu = col >= 0 && col < tile.cols && row >= 0 ? tile.node.gpus[index] || null : null;
      return { node: tile.node, gpu, x, y };
    }
    return null;
  }

  /** Centre of one GPU cell in CSS pixels relative to the canvas (used to click a node from tests and the keyboard). */
  cellCenter(nodeKey, index = 0) {
    const tile = this.layout?.tiles.find((t) => t.node.key === nodeKey);
    if (!tile) return null;
    const { cell, gap, pad, label } = this.layout;
    return {
      x: tile.x + pad + (index % tile.cols) * (cell + gap) + cell / 2,
      y: tile.y + label + pad + Math.floor(index / tile.cols) * (cell + gap) + cell / 2,
    };
  }
}

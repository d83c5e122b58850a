// Two small SVG charts (horizontal bars, grouped or stacked; and time lines), enough for the reports. SVG scales
// with the page, prints, and its text is selectable; the few hundred elements a report has are no burden.
import { fmt, h, svg } from "./dom.js";

export const PALETTE = ["#3b6fd4", "#f08c00", "#2f9e6e", "#c2255c", "#7048e8", "#0c8599", "#a61e4d", "#5c940d",
  "#e8590c", "#495057"];

export function niceTicks(max, count = 5) {
  if (!(max > 0)) return [0, 1];
  const raw = max / count;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw);
  const ticks = [];
  for (let v = 0; v <= max + step * 0.001; v += step) ticks.push(v);
  if (ticks[ticks.length - 1] < max) ticks.push(ticks[ticks.length - 1] + step);
  return ticks;
}

function legend(series) {
  return h("div", { class: "legend" }, series.map((s) => h("span", {},
    h("i", { class: s.dashed ? "dash" : "", style: { background: s.dashed ? "none" : s.color, borderColor: s.color } }),
    s.name)));
}

/** rows: [{label, values: {key: number}}]; series: [{key, name, color}]. */
export function barChart({ rows, series, stacked = false, unit = "", title = "", width = 760 }) {
  const labelW = Math.min(220, Math.max(80, 7 * Math.max(...rows.map((r) => String(r.label).length), 4)));
  const barH = stacked || series.length === 1 ? 18 : 11;
  const groupH = stacked ? barH : barH * series.length;
  const rowH = groupH + 12;
  const top = 8;
  const axisH = 24;
  const height = top + rows.length * rowH + axisH;
  const totals = rows.map((r) => (stacked ? series.reduce((s, x) => s + (r.values[x.key] || 0), 0)
    : Math.max(0, ...series.map((x) => r.values[x.key] || 0))));
  const ticks = niceTicks(Math.max(0, ...totals));
  const maxV = ticks[ticks.length - 1] || 1;
  const plotW = width - labelW - 56;
  const xs = (v) => labelW + (plotW * v) / maxV;
  const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, class: "chart", role: "img", "aria-label": title });
  for (const t of ticks) {
    root.append(svg("line", { x1: xs(t), x2: xs(t), y1: top - 4, y2: height - axisH, class: "gridline" }));
    root.append(svg("text", { x: xs(t), y: height - 8, class: "tick", "text-anchor": "middle" }, fmt.num(t, 2)));
  }
  rows.forEach((r, i) => {
    const y = top + i * rowH + 6;
    root.append(svg("text", { x: labelW - 8, y: y + groupH / 2 + 4, class: "cat", "text-anchor": "end" }, r.label));
    let x = labelW;
    series.forEach((s, j) => {
      const v = r.values[s.key] || 0;
      const w = (plotW * v) / maxV;
      const by = stacked ? y : y + j * barH;
      const bx = stacked ? x : labelW;
      const rect = svg("rect", { x: bx, y: by, width: Math.max(v > 0 ? 1 : 0, w), height: barH - 2, rx: 2,
        fill: s.color, class: "bar", "data-series": s.key, "data-label": r.label, "data-value": v });
      rect.append(svg("title", {}, `${r.label} · ${s.name}: ${fmt.num(v, 2)}${unit ? ` ${unit}` : ""}`));
      root.append(rect);
      if (stacked) x += w;
      else if (v >= 0.05 || (v > 0 && maxV < 1)) {
        root.append(svg("text", { x: bx + w + 4, y: by + barH / 2 + 3, class: "val" }, fmt.num(v, 1)));
      }
    });
    if (stacked) root.append(svg("text", { x: x + 4, y: y + barH / 2 + 3, class: "val" }, fmt.num(totals[i], 1)));
  });
  return h("figure", { class: "figure" }, title ? h("figcaption", {}, title) : null, root, legend(series));
}

/** series: [{name, color, dashed, points: [{x: Date|number, y: number}]}]. */
export function lineChart({ series, unit = "", title = "", compact = false }) {
  const width = compact ? 520 : 760;
  const height = compact ? 190 : 260;
  const m = { l: 52, r: 16, t: 12, b: 28 };
  const all = series.flatMap((s) => s.points);
  if (!all.length) return h("p", { class: "empty" }, "No points in this range.");
  const xv = (p) => (p.x instanceof Date ? p.x.getTime() : Number(p.x));
  const x0 = Math.min(...all.map(xv));
  const x1 = Math.max(...all.map(xv), x0 + 1);
  const ticks = niceTicks(Math.max(0, ...all.map((p) => p.y)));
  const maxY = ticks[ticks.length - 1] || 1;
  const X = (v) => m.l + ((width - m.l - m.r) * (v - x0)) / (x1 - x0);
  const Y = (v) => height - m.b - ((height - m.t - m.b) * v) / maxY;
  const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, class: "chart", role: "img", "aria-label": title });
  for (const t of ticks) {
    root.append(svg("line", { x1: m.l, x2: width - m.r, y1: Y(t), y2: Y(t), class: "gridline" }));
    root.append(svg("text", { x: m.l - 6, y: Y(t) + 4, class: "tick", "text-anchor": "end" }, fmt.num(t, 2)));
  }
  const isTime = all[0].x instanceof Date;
  const n = compact ? 2 : 4;
  const short = x1 - x0 < 36 * 3600e3;
  for (let i = 0; i <= n; i += 1) {
    const v = x0 + ((x1 - x0) * i) / n;
    const text = !isTime ? fmt.num(v) : new Date(v).toLocaleString("en-GB", short ? { hour: "2-digit", minute: "2-digit" }
      : { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" });
    root.append(svg("text", { x: X(v), y: height - 8, class: "tick", "text-anchor": i === 0 ? "start" : i === n ? "end" : "middle" }, text));
  }
  for (const s of series) {
    const pts = [...s.points].sort((a, b) => xv(a) - xv(b));
    const d = pts.map((p, i) => `${i ? "L" : "M"}${X(xv(p)).toFixed(1)},${Y(p.y).toFixed(1)}`).join("");
    root.append(svg("path", { d, fill: "none", stroke: s.color, "stroke-width": 2.2, "stroke-dasharray": s.dashed ? "6 4" : null, class: "line", "data-series": s.name }));
    if (pts.length <= 60) {
      for (const p of pts) {
        const dot = svg("circle", { cx: X(xv(p)), cy: Y(p.y), r: 2.6, fill: s.color });
        dot.append(svg("title", {}, `${s.name}: ${fmt.num(p.y, 2)}${unit ? ` ${unit}` : ""}`));
        root.append(dot);
      }
    }
  }
  return h("figure", { class: "figure" }, title ? h("figcaption", {}, title) : null, root, legend(series));
}

/** A single horizontal meter: guarantee marker, used fill, borrowed part beyond the guarantee. */
export function quotaBar({ guaranteed, used, borrowed, limit, scale }) {
  const width = 260;
  const height = 18;
  const S = (v) => Math.min(width, (width * v) / (scale || 1));
  const within = Math.min(used, guaranteed);
  const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, class: "meter", width, height });
  root.append(svg("rect", { x: 0, y: 3, width, height: 12, rx: 3, class: "meter-bg" }));
  if (guaranteed > 0) root.append(svg("rect", { x: 0, y: 3, width: S(guaranteed), height: 12, rx: 3, class: "meter-guar" }));
  root.append(svg("rect", { x: 0, y: 3, width: S(within), height: 12, rx: 3, class: "meter-used" }));
  if (borrowed > 0) root.append(svg("rect", { x: S(guaranteed), y: 3, width: Math.max(1, S(guaranteed + borrowed) - S(guaranteed)), height: 12, class: "meter-borrowed" }));
  if (limit !== null && limit !== undefined) {
    root.append(svg("line", { x1: S(guaranteed + limit), x2: S(guaranteed + limit), y1: 0, y2: 18, class: "meter-limit" }));
  }
  if (guaranteed > 0) root.append(svg("line", { x1: S(guaranteed), x2: S(guaranteed), y1: 0, y2: 18, class: "meter-mark" }));
  return root;
}

/** A utilization history (GET /v1/jobs/{id}/utilization or /v1/teams/{team}/utilization): per bucket the mean
 * utilization of the GPUs held and the busiest GPU's minute, and with `gpus` also how many GPUs were measured.
 * Buckets with nothing measured are left out of the lines. `data-points` says how many buckets had data. */
export function utilizationChart(history, { id, title = "", gpus = false }) {
  const measured = (history.points || []).filter((p) => p.utilization_pct !== null && p.utilization_pct !== undefined);
  const at = (p) => new Date(p.start);
  const step = history.step_s >= 3600 ? `${fmt.num(history.step_s / 3600, 1)} h` : `${Math.round(history.step_s / 60)} min`;
  const body = measured.length ? [
    lineChart({ title, unit: "%", compact: true, series: [
      { name: "mean utilization %", color: PALETTE[0], points: measured.map((p) => ({ x: at(p), y: p.utilization_pct })) },
      { name: "busiest GPU %", color: PALETTE[1], dashed: true, points: measured.map((p) => ({ x: at(p), y: p.max_utilization_pct })) },
    ] }),
    gpus ? lineChart({ title: "GPUs held (measured)", unit: "GPUs", compact: true, series: [
      { name: "GPUs", color: PALETTE[2], points: (history.points || []).map((p) => ({ x: at(p), y: p.gpus })) },
    ] }) : null,
  ] : [h("p", { class: "empty" }, "No utilization measured in this range yet (telemetry arrives in one-minute rollups).")];
  return h("div", { class: "utilization", id, "data-points": String(measured.length) }, ...body,
    h("p", { class: "small muted utilization-summary" },
      `mean ${fmt.pct(history.avg_utilization_pct)} · busiest minute ${fmt.pct(history.max_utilization_pct)} · `
      + `idle ${fmt.pct(history.idle_pct)} · ${fmt.num(history.measured_gpu_hours, 3)} GPU-hours measured · `
      + `${step} buckets since ${new Date(history.start).toLocaleString("en-GB")}`));
}

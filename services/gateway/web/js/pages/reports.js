// Reports: usage (GPU-hours and cost), efficiency, capacity and waste over a chosen range, as charts and tables,
// with the gateway's own CSV for download. Which reports exist comes from the gateway's OpenAPI document: one the
// gateway does not serve is shown as not available instead of failing.
import { PALETTE, barChart, lineChart } from "../charts.js";
import { badge, download, fmt, h, notAvailable, put, table, toCsv } from "../dom.js";
import { reportRows, reportShape } from "../model.js";
import { errorBox, pageHeader, refresher, select, stat } from "./common.js";

const KINDS = [
  { id: "usage", label: "Usage & cost", blurb: "GPU-hours and cost by team, project, user, kind or model" },
  { id: "efficiency", label: "Efficiency", blurb: "used vs allocated GPU-hours and idle GPU-hours" },
  { id: "capacity", label: "Capacity", blurb: "demand against supply per GPU model, trend and forecast" },
  { id: "waste", label: "Waste", blurb: "idle GPU-hours, the idle allocations and orphaned processes" },
];
// Range presets, and the capacity trend bucket that gives each a readable number of points.
const RANGES = [
  { value: "900", label: "last 15 minutes", bucket: 60 }, { value: "3600", label: "last hour", bucket: 120 }, { value: "86400", label: "last 24 hours", bucket: 3600 },
  { value: "604800", label: "last 7 days", bucket: 21600 }, { value: "2592000", label: "last 30 days", bucket: 86400 },
  { value: "7776000", label: "last 90 days", bucket: 86400 },
];
const DIMENSIONS = ["team", "project", "user", "kind", "gpu_model", "sharing"];
const label = (s) => String(s).replace(/_/g, " ");

export function mount(ctx, root, params = []) {
  const { api } = ctx;
  const st = { kind: pick(params[0]), range: "86400", group: "team", doc: null, query: null, error: null, names: new Map() };
  const tabs = h("nav", { class: "subtabs", id: "report-tabs" });
  const controls = h("div", { class: "toolbar", id: "report-controls" });
  const body = h("div", { id: "report-body" });
  root.append(pageHeader("Reports", h("p", { class: "subtitle" }, "GPU-hours, cost, efficiency, capacity and waste over a range")),
    tabs, h("section", { class: "card" }, controls, body));

  function pick(kind) { return KINDS.some((k) => k.id === kind) ? kind : "usage"; }
  const served = (kind) => api.has("GET", `/v1/reports/${kind}`);

  function query() {
    const to = new Date();
    const preset = RANGES.find((r) => r.value === st.range);
    const q = { from: new Date(to.getTime() - Number(st.range) * 1000).toISOString(), to: to.toISOString() };
    if (st.kind === "usage" || st.kind === "efficiency") q.group_by = st.group;
    if (st.kind === "capacity") q.bucket_s = preset.bucket;
    return q;
  }

  function renderTabs() {
    put(tabs, KINDS.map((k) => h("a", { href: `#/reports/${k.id}`, class: k.id === st.kind ? "active" : "", "data-report": k.id, title: k.blurb },
      k.label, served(k.id) ? null : h("span", { class: "na-dot", title: "not available on this gateway" }))));
  }

  function renderControls() {
    const again = () => refresh(["reports"], { now: true });
    put(controls,
      h("label", {}, "Range ", select(RANGES, st.range, (v) => { st.range = v; again(); }, { id: "r-range" })),
      st.kind === "usage" || st.kind === "efficiency"
        ? h("label", {}, "Group by ", select(DIMENSIONS.map((d) => ({ value: d, label: label(d) })), st.group, (v) => { st.group = v; again(); }, { id: "r-group" }))
        : null,
      h("span", { class: "spacer" }),
      h("button", { type: "button", id: "csv", onclick: csv, disabled: !st.doc }, "Download CSV"),
    );
  }

  async function load() {
    view.ready = false;
    renderTabs();
    st.doc = null;
    st.error = null;
    if (served(st.kind)) {
      st.query = query();
      try {
        st.doc = await api.get(`/v1/reports/${st.kind}`, st.query);
        if (st.kind === "waste") await jobNames(st.doc.idle_allocations || []);
      } catch (err) {
        st.error = err;
      }
    }
    renderControls();
    render();
    view.ready = true;
  }

  /** The waste report carries job ids only: fetch each job's name once (a job the caller may not read keeps its id). */
  async function jobNames(rows) {
    const ids = [...new Set(rows.map((r) => r.job_id))].filter((id) => id && !st.names.has(id));
    await Promise.all(ids.map((id) => api.get(`/v1/jobs/${encodeURIComponent(id)}`)
      .then((j) => st.names.set(id, j.name || null)).catch(() => st.names.set(id, null))));
  }

  function render() {
    const kind = KINDS.find((k) => k.id === st.kind);
    if (!served(st.kind)) {
      put(body, notAvailable(`report-${st.kind}`, `this gateway does not serve GET /v1/reports/${st.kind} (${kind.blurb}).`));
      return;
    }
    if (st.error) { put(body, errorBox(st.error)); return; }
    const doc = st.doc;
    const frame = h("p", { class: "small muted", id: "report-frame" }, `${fmt.time(doc.start)} → ${fmt.time(doc.as_of || doc.end)}`,
      doc.currency ? ` · prices in ${doc.currency}` : "", doc.truncated ? " · only the largest groups are shown" : "");
    const views = { usage: usageView, efficiency: efficiencyView, capacity: capacityView, waste: wasteView };
    put(body, frame, (views[st.kind] || genericView)(doc));
  }

  function usageView(doc) {
    const t = doc.total || {};
    const rows = doc.rows || [];
    const dims = doc.group_by || [st.group];
    const labelOf = (r) => dims.map((d) => r[d] ?? "—").join(" · ");
    const costly = rows.some((r) => r.cost > 0);
    return [
      h("div", { class: "stats" },
        stat("GPU-hours", fmt.num(t.gpu_hours, 2), { id: "gpu_hours" }),
        stat("Cost", t.cost ? `${fmt.num(t.cost, 2)} ${doc.currency}` : "—", { id: "cost", note: t.unpriced_gpu_seconds ? `${fmt.num(t.unpriced_gpu_seconds / 3600, 2)} GPU-h unpriced` : "" }),
        stat("Average utilization", fmt.pct(t.avg_utilization_pct), { id: "avg_util", note: "from one-minute rollups" }),
        stat("Groups", rows.length, { id: "groups" })),
      rows.length ? h("div", { class: costly ? "two charts" : "charts", id: "report-chart" },
        barChart({ title: `GPU-hours by ${dims.map(label).join(", ")}`, unit: "GPU-h", width: costly ? 560 : 760,
          rows: rows.slice(0, 25).map((r) => ({ label: labelOf(r), values: { gpu_hours: r.gpu_hours } })),
          series: [{ key: "gpu_hours", name: "GPU-hours", color: PALETTE[0] }] }),
        costly ? barChart({ title: `Cost (${doc.currency}) by ${dims.map(label).join(", ")}`, unit: doc.currency, width: 560,
          rows: rows.slice(0, 25).map((r) => ({ label: labelOf(r), values: { cost: r.cost } })),
          series: [{ key: "cost", name: `cost (${doc.currency})`, color: PALETTE[1] }] }) : null)
        : h("p", { class: "empty", id: "report-empty" }, "No GPU time in this range."),
      rowsTable(rows, [...dims, "gpu_hours", "cost", "unpriced_gpu_seconds", "avg_utilization_pct", "allocations", "jobs"]),
    ];
  }

  function efficiencyView(doc) {
    const t = doc.total || {};
    const rows = doc.rows || [];
    const dims = doc.group_by || [st.group];
    return [
      h("div", { class: "stats" },
        stat("Efficiency", fmt.pct(t.efficiency_pct), { id: "efficiency", kind: t.efficiency_pct !== null && t.efficiency_pct < 50 ? "warn" : "ok", note: "used ÷ measured GPU-hours" }),
        stat("Allocated GPU-hours", fmt.num(t.allocated_gpu_hours, 2), { id: "allocated" }),
        stat("Used GPU-hours", fmt.num(t.used_gpu_hours, 2), { id: "used" }),
        stat("Idle GPU-hours", fmt.num(t.idle_gpu_hours, 2), { id: "idle", kind: t.idle_gpu_hours ? "warn" : "", note: t.idle_pct !== null ? `${fmt.pct(t.idle_pct)} of measured` : "" }),
        stat("Telemetry coverage", fmt.pct(t.telemetry_coverage_pct), { id: "coverage" })),
      rows.length ? h("div", { class: "charts", id: "report-chart" }, barChart({
        title: `Allocated, used and idle GPU-hours by ${dims.map(label).join(", ")}`, unit: "GPU-h",
        rows: rows.slice(0, 25).map((r) => ({ label: dims.map((d) => r[d] ?? "—").join(" · "), values: r })),
        series: [{ key: "allocated_gpu_hours", name: "allocated", color: "#9db6e8" }, { key: "used_gpu_hours", name: "used", color: PALETTE[2] },
          { key: "idle_gpu_hours", name: "idle", color: PALETTE[1] }] })) : h("p", { class: "empty", id: "report-empty" }, "No GPU time in this range."),
      rowsTable(rows, [...dims, "allocated_gpu_hours", "measured_gpu_hours", "used_gpu_hours", "idle_gpu_hours", "efficiency_pct", "idle_pct", "telemetry_coverage_pct", "jobs"]),
    ];
  }

  // The forecast's peak demand over the next `days` with its 80% band, "—" without enough data.
  function peakAhead(forecast, days) {
    const ahead = (forecast.next || []).find((n) => n.days === days);
    if (!ahead || ahead.peak_gpus === null) return "—";
    return `${fmt.num(ahead.peak_gpus)} (${fmt.num(ahead.peak_low_gpus)}–${fmt.num(ahead.peak_high_gpus)})`;
  }

  function capacityView(doc) {
    const models = doc.models || [];
    if (!models.length) return h("p", { class: "empty", id: "report-empty" }, "No GPU model has supply or demand in this range.");
    // The badge names the status; the text adds what it means, except where it would only say the badge again.
    const forecast = (f) => {
      const texts = { exceeds: "demand exceeds supply", will_exceed: `will exceed supply ${f.exceeds_supply_at ? `around ${fmt.time(f.exceeds_supply_at)}` : ""}`,
        ok: "within supply", insufficient_data: null };
      const text = f.status in texts ? texts[f.status] : f.status;
      const why = f.status === "insufficient_data" ? `${f.points ?? 0} bucket peak(s) in this range: too few to fit a trend` : null;
      return h("span", { title: why }, badge(label(f.status), { exceeds: "failed", will_exceed: "degraded", ok: "healthy" }[f.status] || "pending"),
        text ? [" ", h("span", { class: "small muted" }, text)] : null);
    };
    return [
      h("div", { class: "capacity-grid", id: "report-chart" }, models.map((m) => h("div", { class: "capacity-model", "data-model": m.gpu_model },
        h("div", { class: "cap-head" }, h("strong", { class: "nowrap" }, m.gpu_model === "any" ? "any model" : m.gpu_model), forecast(m.forecast)),
        lineChart({ title: "", unit: "GPUs", compact: true, series: [
          { name: "peak demand", color: PALETTE[0], points: m.trend.map((b) => ({ x: new Date(b.start), y: b.peak_demand_gpus })) },
          { name: "peak allocated", color: PALETTE[2], points: m.trend.map((b) => ({ x: new Date(b.start), y: b.peak_allocated_gpus })) },
          { name: "supply", color: "#94a3b8", dashed: true, points: m.trend.map((b) => ({ x: new Date(b.start), y: b.supply_gpus })) },
        ] })))),
      table([
        { label: "model", value: (m) => h("strong", {}, m.gpu_model) },
        { label: "supply", num: true, value: (m) => fmt.int(m.supply_gpus) },
        { label: "peak demand", num: true, value: (m) => fmt.num(m.demand.peak_demand_gpus) },
        { label: "pending now", num: true, value: (m) => fmt.num(m.demand.pending_gpus) },
        { label: "queued GPU-h", num: true, value: (m) => fmt.num(m.demand.queued_gpu_hours, 3) },
        { label: "wait p50 / p90 / p99", num: true, value: (m) => [m.demand.wait_p50_s, m.demand.wait_p90_s, m.demand.wait_p99_s].map((s) => (s === null ? "—" : fmt.duration(s))).join(" / ") },
        { label: "allocated of supply", num: true, value: (m) => fmt.pct(m.allocated_pct_of_supply) },
        { label: "trend", num: true, value: (m) => (m.forecast.slope_gpus_per_day === null ? "—" : `${fmt.num(m.forecast.slope_gpus_per_day, 2)} GPUs/day`) },
        ...[7, 30].map((days) => ({ label: `${days}-day peak (80%)`, num: true, class: `peak-${days}d`,
          value: (m) => peakAhead(m.forecast, days) })),
      ], models),
    ];
  }

  function wasteView(doc) {
    const teams = doc.by_team || [];
    const idle = doc.idle_allocations || [];
    const orphans = doc.orphans || [];
    return [
      h("div", { class: "stats" },
        stat("Idle GPU-hours", fmt.num(doc.idle_gpu_hours, 2), { id: "idle", kind: doc.idle_gpu_hours ? "warn" : "" }),
        stat("Idle allocations", idle.length, { id: "idle_allocations", kind: idle.length ? "warn" : "", note: `idle ≥ ${fmt.pct(100 * doc.min_idle_fraction)} of the time` }),
        stat("Orphans", orphans.length, { id: "orphans", kind: orphans.length ? "bad" : "" })),
      teams.length ? h("div", { class: "charts", id: "report-chart" }, barChart({ title: "Idle vs used GPU-hours by team", unit: "GPU-h",
        rows: teams.map((r) => ({ label: r.team, values: r })),
        series: [{ key: "used_gpu_hours", name: "used", color: PALETTE[2] }, { key: "idle_gpu_hours", name: "idle", color: PALETTE[1] }], stacked: true })) : null,
      h("h3", {}, "Idle allocations"),
      table([
        { label: "job", value: (a) => h("a", { href: `#/jobs/${encodeURIComponent(a.job_id)}`, title: a.job_id }, st.names.get(a.job_id) || fmt.short(a.job_id)) },
        { label: "team", value: (a) => a.team },
        { label: "user", value: (a) => a.user || "—" },
        { label: "kind", value: (a) => a.kind },
        { label: "where", value: (a) => `${a.cluster}/${a.node}` },
        { label: "GPUs", num: true, value: (a) => `${a.gpus} × ${a.gpu_model}` },
        { label: "GPU-h", num: true, value: (a) => fmt.num(a.gpu_hours, 3) },
        { label: "idle GPU-h", num: true, value: (a) => h("span", { class: "warn" }, fmt.num(a.idle_gpu_hours, 3)) },
        { label: "idle", num: true, value: (a) => fmt.pct(100 * a.idle_fraction) },
        { label: "avg util", num: true, value: (a) => fmt.pct(a.avg_utilization_pct) },
        { label: "", value: (a) => (a.running ? badge("running", "running") : badge(a.release_reason || "released", "cancelled")) },
      ], idle, { empty: "No allocation was idle that long in this range (idle time is measured from one-minute rollups)." }),
      h("h3", {}, "Orphans"),
      table([
        { label: "kind", value: (o) => label(o.orphan) },
        { label: "where", value: (o) => `${o.cluster}/${o.node}` },
        { label: "GPU", value: (o) => fmt.short(o.gpu_uuid) },
        { label: "team", value: (o) => o.team || "—" },
        { label: "pids", value: (o) => o.pids.join(", ") || "—" },
        { label: "since", value: (o) => fmt.time(o.since) },
        { label: "reports", num: true, value: (o) => o.reports },
      ], orphans, { empty: "No orphan seen." }),
    ];
  }

  /** Any other report document: its rows as a bar chart of the first measure and a table. */
  function genericView(doc) {
    const rows = reportRows(doc);
    if (!rows.length) return h("p", { class: "empty" }, "No rows.");
    const shape = reportShape(rows);
    const m = shape.measures[0];
    return [m ? barChart({ title: label(m), rows: rows.slice(0, 25).map((r) => ({ label: shape.labels.map((l) => r[l]).join(" · ") || "—", values: { [m]: r[m] } })),
      series: [{ key: m, name: label(m), color: PALETTE[0] }] }) : null, rowsTable(rows, Object.keys(rows[0]))];
  }

  function rowsTable(rows, cols) {
    const present = cols.filter((c) => rows.some((r) => r[c] !== undefined));
    return h("div", { class: "table-scroll" }, table(present.map((c) => ({
      label: label(c), num: rows.some((r) => typeof r[c] === "number"),
      value: (r) => (typeof r[c] === "number" ? fmt.num(r[c], c.endsWith("_pct") ? 1 : 3) : r[c] ?? "—"),
    })), rows.slice(0, 500), { empty: "" }));
  }

  /** The gateway's own CSV (format=csv); the rows shown, as CSV, only if it cannot give one. */
  async function csv() {
    const name = `gpupool-${st.kind}-${new Date().toISOString().slice(0, 19).replace(/[:T]/g, "")}.csv`;
    try {
      const res = await api.request("GET", `/v1/reports/${st.kind}`, { query: { ...st.query, format: "csv" }, accept: "text/csv" });
      if (res && typeof res.text === "string") { download(name, res.text); return; }
    } catch (err) {
      ctx.toast(`The gateway's CSV failed (${err.message}); downloading the rows shown`, "error");
    }
    download(name, toCsv(reportRows(st.doc)));
  }

  const refresh = refresher(load, { topics: ["reports"], gapMs: 15000 });
  const view = {
    ready: false,
    refresh,
    navigate(p) { st.kind = pick(p[0]); view.ready = false; refresh(["reports"], { now: true }); },
    unmount() { refresh.cancel(); },
  };
  refresh(["reports"], { now: true });
  return view;
}

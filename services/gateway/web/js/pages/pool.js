// Pool: every cluster → node → GPU as a heat map, filters, per-model counts, and a node drill-down.
// Telemetry is not on the event stream (too much of it), so node data is polled; allocation and health events
// trigger an immediate reload on top of that.
import { COLORS, HeatMap, legendStops } from "../heatmap.js";
import { badge, card, clear, fmt, h, notAvailable, put, table, throttle } from "../dom.js";
import { poolModel, summarize } from "../model.js";
import { activityList, errorBox, pageHeader, refresher, select, stat } from "./common.js";

const POLL_MS = 5000;
const HEALTH_TYPES = ["gpu.", "node.", "reclaim."];

export function mount(ctx, root, params = []) {
  const { api, session, events, perf } = ctx;
  const st = {
    nodes: [], allocations: [], pool: null, tracked: [], teams: [], loadedAt: null, error: null,
    filters: { cluster: "", model: "", team: "", idleOnly: false }, metric: "util", selected: params.length ? params.join("/") : null,
    jobs: new Map(),
  };
  const subtitle = h("p", { class: "subtitle", id: "pool-subtitle" }, "Loading…");
  const stats = h("div", { class: "stats", id: "pool-stats" });
  const toolbar = h("div", { class: "toolbar", id: "pool-toolbar" });
  const canvas = h("canvas", { id: "heatmap", class: "heatmap", "aria-label": "GPU heat map; click a node for details" });
  const tip = h("div", { class: "tooltip", id: "heatmap-tip", hidden: true });
  const legend = h("div", { class: "hm-legend", id: "hm-legend" });
  const mapBox = h("div", { class: "heatmap-box" }, canvas, tip);
  const detail = h("div", { id: "node-detail" });
  const models = h("div", { id: "pool-models" });
  const idleBox = h("div", { id: "pool-idle" });
  const activity = h("div", { id: "pool-activity" });
  const errorSlot = h("div");
  root.append(
    pageHeader("Pool", subtitle),
    errorSlot, stats,
    h("div", { class: "pool-layout" },
      h("div", { class: "pool-main" },
        h("section", { class: "card" }, toolbar, legend, mapBox)),
      h("aside", { class: "pool-side" },
        card("By GPU model", models),
        card("Allocated but idle", idleBox),
        card("Live activity", activity))),
    detail,
  );

  const heatmap = new HeatMap(canvas, {
    onHover: (hit, e) => showTip(hit, e),
    onSelect: (node) => { st.selected = node.key; history.replaceState(null, "", `#/pool/${encodeURIComponent(node.key)}`); render(); renderDetail(true); },
  });

  function showTip(hit) {
    if (!hit) { tip.hidden = true; return; }
    const { node, gpu } = hit;
    clear(tip);
    tip.append(h("strong", {}, node.name), h("span", { class: "muted" }, ` · ${node.cluster}${node.lost ? " · lost" : ""}`));
    if (gpu) {
      tip.append(
        h("div", {}, `GPU ${gpu.index} · ${gpu.model}`),
        h("div", {}, `util ${fmt.pct(gpu.util)} · mem ${fmt.gib(gpu.memUsed)} / ${fmt.gib(gpu.memTotal)}`),
        h("div", {}, `${gpu.temp === null ? "—" : `${Math.round(gpu.temp)} °C`} · ${gpu.power === null ? "—" : `${Math.round(gpu.power)} W`} · ${gpu.health}`),
        gpu.allocated ? h("div", { class: gpu.idle ? "warn" : "" }, `${gpu.team} · job ${fmt.short(gpu.jobId)}${gpu.idle ? " · allocated but idle" : ""}`)
          : h("div", { class: "muted" }, "free"),
      );
    }
    tip.hidden = false;
    const x = Math.min(hit.x + 14, canvas.clientWidth - 230);
    tip.style.left = `${Math.max(0, x)}px`;
    tip.style.top = `${hit.y + 14}px`;
  }

  async function load() {
    const t0 = performance.now();
    try {
      const [nodes, allocs, pool, tracked, teams, running] = await Promise.all([
        api.all("/v1/nodes"),
        api.all("/v1/allocations", { active: true }),
        api.get("/v1/pool").catch(() => null),
        api.get("/v1/reclamation/tracked").catch(() => ({ items: [] })),
        st.teams.length ? Promise.resolve({ items: st.teams }) : api.get("/v1/teams").catch(() => ({ items: [] })),
        session.can("job.read") ? api.get("/v1/jobs", { state: "running", limit: 1000 }).catch(() => ({ items: [] })) : { items: [] },
      ]);
      for (const j of running.items || []) st.jobs.set(j.job_id, j);
      const t1 = performance.now();
      st.nodes = nodes.items;
      st.allocations = allocs.items;
      st.pool = pool;
      st.tracked = tracked.items || [];
      st.teams = teams.items || [];
      st.loadedAt = new Date();
      st.error = null;
      const renderMs = render();
      perf.push({ kind: "pool", nodes: st.nodes.length, fetchMs: t1 - t0, renderMs, totalMs: performance.now() - t0, at: performance.now() });
      if (perf.length > 500) perf.splice(0, perf.length - 500);
      view.ready = true;
      if (st.selected && !detail.contains(document.activeElement)) renderDetail(false);
    } catch (err) {
      st.error = err;
      put(errorSlot, errorBox(err));
    }
  }

  function render() {
    const t0 = performance.now();
    clear(errorSlot);
    const inUsePct = st.pool?.in_use_util_pct ?? 5;
    const clusters = poolModel(st.nodes, st.allocations, { inUsePct, filters: st.filters, tracked: st.tracked });
    const s = summarize(clusters);
    heatmap.update(clusters, { metric: st.metric, selected: st.selected });
    const drawMs = performance.now() - t0;
    canvas.dataset.nodes = String(s.nodes);
    canvas.dataset.gpus = String(s.gpus);
    canvas.dataset.idle = String(s.idle);
    canvas.dataset.drawMs = drawMs.toFixed(2);
    renderChrome(clusters, s);
    return drawMs;
  }

  function renderChrome(clusters, s) {
    const clusterNames = [...new Set(st.nodes.map((n) => n.cluster))].sort();
    subtitle.textContent = `${clusterNames.length} cluster${clusterNames.length === 1 ? "" : "s"} · ${st.nodes.length} nodes · `
      + `${st.nodes.reduce((n, x) => n + (x.gpus?.length || 0), 0)} GPUs · updated ${st.loadedAt ? st.loadedAt.toLocaleTimeString("en-GB") : "—"}`;
    const pctOf = (n) => (s.gpus ? `${Math.round((100 * n) / s.gpus)}% of shown` : "");
    put(stats, 
      stat("GPUs shown", fmt.int(s.gpus), { id: "gpus", note: `${s.nodes} nodes` }),
      stat("Allocated", fmt.int(s.allocated), { id: "allocated", note: pctOf(s.allocated) }),
      stat("In use", fmt.int(s.inUse), { id: "in_use", kind: "ok", note: pctOf(s.inUse) }),
      stat("Allocated, idle", fmt.int(s.idle), { id: "allocated_idle", kind: s.idle ? "warn" : "", note: `below ${st.pool?.in_use_util_pct ?? 5}% util` }),
      stat("Free", fmt.int(s.free), { id: "free", note: pctOf(s.free) }),
      stat("Unhealthy", fmt.int(s.unhealthy), { id: "unhealthy", kind: s.unhealthy ? "bad" : "", note: s.lostNodes ? `${s.lostNodes} node(s) lost` : "" }),
    );
    renderToolbar(clusterNames);
    renderLegend();
    renderModels();
    renderIdle(clusters);
    renderActivity();
  }

  function renderActivity() {
    put(activity, activityList(events, { limit: 10, empty: "Waiting for events (allocations, health changes, nodes)…" }));
  }

  function renderIdle(clusters) {
    const byAlloc = new Map();
    for (const c of clusters) {
      for (const n of c.nodes) {
        for (const g of n.gpus) {
          if (!g.idle) continue;
          const e = byAlloc.get(g.allocationId) || { allocationId: g.allocationId, jobId: g.jobId, team: g.team, node: n.name, key: n.key, gpus: 0, idleS: g.idleS };
          e.gpus += 1;
          byAlloc.set(g.allocationId, e);
        }
      }
    }
    const rows = [...byAlloc.values()].sort((a, b) => (b.idleS ?? 0) - (a.idleS ?? 0) || b.gpus - a.gpus);
    put(idleBox, table([
      { label: "job · team", value: (e) => h("span", {}, h("a", { href: `#/jobs/${encodeURIComponent(e.jobId)}` }, st.jobs.get(e.jobId)?.name || fmt.short(e.jobId)),
        h("span", { class: "muted" }, ` · ${e.team}`)) },
      { label: "node", class: "nowrap", value: (e) => h("a", { href: `#/pool/${encodeURIComponent(e.key)}` }, e.node) },
      { label: "GPUs", num: true, value: (e) => e.gpus },
      { label: "idle", num: true, value: (e) => (e.idleS ? h("span", { class: "warn" }, fmt.duration(e.idleS)) : "—") },
    ], rows.slice(0, 10), { empty: "Every allocated GPU is busy." }),
    rows.length > 10 ? h("p", { class: "small muted" }, `and ${rows.length - 10} more`) : null);
  }

  function renderToolbar(clusterNames) {
    const modelsAll = [...new Set(st.nodes.flatMap((n) => (n.gpus || []).map((g) => g.model)))].sort();
    const teamNames = [...new Set([...st.teams.map((t) => t.team), ...st.allocations.map((a) => a.team)])].sort();
    const set = (key) => (v) => { st.filters[key] = v; render(); };
    put(toolbar, 
      h("label", {}, "Cluster ", select([{ value: "", label: "all clusters" }, ...clusterNames], st.filters.cluster, set("cluster"), { id: "f-cluster" })),
      h("label", {}, "Model ", select([{ value: "", label: "all models" }, ...modelsAll], st.filters.model, set("model"), { id: "f-model" })),
      h("label", {}, "Team ", select([{ value: "", label: "all teams" }, ...teamNames], st.filters.team, set("team"), { id: "f-team" })),
      h("label", {}, "Color by ", select([{ value: "util", label: "utilization" }, { value: "memory", label: "memory used" },
        { value: "temperature", label: "temperature" }, { value: "health", label: "health" }], st.metric, (v) => { st.metric = v; render(); }, { id: "f-metric" })),
      h("label", { class: "check" }, h("input", { type: "checkbox", id: "f-idle", checked: st.filters.idleOnly,
        onchange: (e) => { st.filters.idleOnly = e.target.checked; render(); } }), " only nodes with idle allocations"),
    );
  }

  function renderLegend() {
    const stops = legendStops(st.metric);
    const swatch = (color, text, cls = "") => h("span", { class: "lg" }, h("i", { class: cls, style: { background: color } }), text);
    clear(legend);
    if (stops) {
      const label = { util: "GPU utilization", memory: "memory used", temperature: "temperature" }[st.metric];
      const range = st.metric === "temperature" ? ["25 °C", "90 °C"] : ["0%", "100%"];
      legend.append(h("span", { class: "lg" }, `${label} ${range[0]}`,
        h("span", { class: "ramp" }, stops.map((c) => h("i", { style: { background: c } }))), range[1]));
    } else {
      legend.append(swatch(COLORS.healthy, "healthy"), swatch(COLORS.degraded, "degraded"), swatch(COLORS.failed, "failed"), swatch(COLORS.lost, "node lost"));
    }
    legend.append(swatch("transparent", "allocated but idle", "idle-swatch"), swatch("transparent", "unhealthy", "bad-swatch"),
      h("span", { class: "lg" }, h("i", { class: "alloc-swatch" }), "allocated"));
  }

  function renderModels() {
    const scope = st.filters.cluster ? st.pool?.clusters.find((c) => c.cluster === st.filters.cluster) : st.pool?.all;
    if (!scope) { put(models, h("p", { class: "empty" }, "—")); return; }
    const bar = (m) => h("div", { class: "mbar", title: `${m.allocated} allocated (${m.allocated_idle} idle), ${m.unhealthy} unhealthy of ${m.total}` },
      h("span", { class: "mbar-used", style: { width: `${(100 * (m.allocated - m.allocated_idle)) / Math.max(1, m.total)}%` } }),
      h("span", { class: "mbar-idle", style: { width: `${(100 * m.allocated_idle) / Math.max(1, m.total)}%` } }),
      h("span", { class: "mbar-bad", style: { width: `${(100 * m.unhealthy) / Math.max(1, m.total)}%` } }));
    put(models, table([
      { label: "model", class: "model-cell", value: (m) => h("div", {}, h("span", { class: "nowrap" }, m.model), bar(m)) },
      { label: "total", num: true, value: (m) => fmt.int(m.total) },
      { label: "alloc", num: true, value: (m) => fmt.int(m.allocated) },
      { label: "idle", num: true, value: (m) => (m.allocated_idle ? h("span", { class: "warn" }, fmt.int(m.allocated_idle)) : "0") },
      { label: "free", num: true, value: (m) => fmt.int(m.free) },
      { label: "bad", num: true, value: (m) => (m.unhealthy ? h("span", { class: "bad" }, fmt.int(m.unhealthy)) : "0") },
    ], scope.models, { empty: "No GPUs." }));
  }

  async function renderDetail(scroll) {
    const node = st.nodes.find((n) => `${n.cluster}/${n.node}` === st.selected);
    if (!node) { clear(detail); return; }
    const inUsePct = st.pool?.in_use_util_pct ?? 5;
    const [model] = poolModel([node], st.allocations, { inUsePct, tracked: st.tracked });
    const gpus = model ? model.nodes[0].gpus : [];
    const allocs = st.allocations.filter((a) => a.cluster === node.cluster && a.node === node.node);
    await Promise.all(allocs.filter((a) => !st.jobs.has(a.job_id) && session.can("job.read", a.team)).map((a) => api.get(`/v1/jobs/${encodeURIComponent(a.job_id)}`)
      .then((j) => st.jobs.set(a.job_id, j)).catch(() => st.jobs.set(a.job_id, { job_id: a.job_id }))));
    const jobOf = (id) => st.jobs.get(id) || { job_id: id };
    const trackedOf = new Map(st.tracked.map((t) => [t.allocation_id, t]));
    const facts = [["cluster", node.cluster], ["hostname", node.hostname], ["CPUs", node.cpu_count], ["memory", fmt.gib(node.memory_mib)],
      ["driver", node.driver_version], ["agent", node.agent_version], ["registered", fmt.time(node.registered_at)], ["last seen", `${fmt.ago(node.last_seen_at)} ago`]];
    const health = (g) => h("span", { class: "nowrap", title: g.healthReasons.join(", ") || null },
      badge(g.lost ? "lost" : g.state || g.health, g.lost ? "lost" : g.health),
      g.stateReason || g.healthReasons.length ? h("span", { class: "muted small" }, ` ${g.stateReason || g.healthReasons[0]}`) : null);
    // The fill's percentage needs a track of definite width: in the shrink-to-fit bar it resolved to nothing.
    const utilCell = (v) => h("span", { class: "ubar" },
      h("span", { class: "ubar-track" }, h("i", { style: { width: `${Math.min(100, Math.max(0, v ?? 0))}%` } })), h("b", {}, fmt.pct(v)));
    const nodeEvents = (doc) => HEALTH_TYPES.some((p) => String(doc.type).includes(`.${p}`)) && doc.data?.node === node.node
      && (!doc.data?.cluster || doc.data.cluster === node.cluster);
    const box = h("section", { class: "card node-detail", "data-node": node.node },
      h("div", { class: "card-head" },
        h("h2", {}, `Node ${node.node} `, badge(node.state, node.state), node.cordoned ? badge(node.drained ? "drained" : "cordoned", "cordoned") : null),
        h("div", { class: "actions" }, ...nodeActions(node),
          h("button", { type: "button", class: "ghost", onclick: () => { st.selected = null; history.replaceState(null, "", "#/pool"); clear(detail); render(); } }, "Close"))),
      h("dl", { class: "facts" }, facts.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v ?? "—")])),
      h("h3", {}, "GPUs"),
      h("div", { class: "table-scroll" }, table([
        { label: "#", value: (g) => g.index },
        { label: "model", class: "nowrap", value: (g) => g.model },
        { label: "utilization", value: (g) => utilCell(g.util) },
        { label: "memory", class: "nowrap", value: (g) => `${fmt.gib(g.memUsed)} / ${fmt.gib(g.memTotal)}` },
        { label: "temp", num: true, value: (g) => (g.temp === null ? "—" : `${Math.round(g.temp)} °C`) },
        { label: "power", num: true, value: (g) => (g.power === null ? "—" : `${Math.round(g.power)} W`) },
        { label: "processes", num: true, value: (g) => (g.processes === null ? "—" : g.processes) },
        { label: "health", value: health },
        { label: "held by", class: "nowrap", value: (g) => (g.allocated ? h("span", {}, h("a", { href: `#/jobs/${encodeURIComponent(g.jobId)}` }, jobOf(g.jobId).name || fmt.short(g.jobId)), ` · ${g.team}`,
          g.idle ? h("span", { class: "warn" }, " · idle") : null) : h("span", { class: "muted" }, "free")) },
        session.canManageNodes() ? { label: "sharing / health", value: (g) => gpuActions(node, g) || g.sharing || "—" }
          : { label: "sharing", value: (g) => g.sharing || "—" },
      ], gpus, { rowAttrs: (g) => ({ class: g.idle ? "row-idle" : g.health !== "healthy" ? "row-bad" : "" }) })),
      h("h3", {}, `Allocations on this node (${allocs.length})`),
      table([
        { label: "job", value: (a) => h("a", { href: `#/jobs/${encodeURIComponent(a.job_id)}` }, jobOf(a.job_id).name || fmt.short(a.job_id)) },
        { label: "team", value: (a) => a.team },
        { label: "kind", value: (a) => jobOf(a.job_id).kind || trackedOf.get(a.allocation_id)?.kind || "—" },
        { label: "GPUs", value: (a) => a.gpus.map((g) => g.index).join(", ") },
        { label: "granted", value: (a) => `${fmt.ago(a.granted_at)} ago` },
        { label: "mean util", num: true, value: (a) => fmt.pct(trackedOf.get(a.allocation_id)?.mean_util_pct) },
        { label: "idle for", num: true, value: (a) => { const t = trackedOf.get(a.allocation_id); return t && t.idle_s > 0 ? h("span", { class: "warn" }, fmt.duration(t.idle_s)) : "—"; } },
      ], allocs, { empty: "No allocation holds GPUs here." }),
      h("h3", {}, "Recent health and node events"),
      activityList(events, { filter: nodeEvents, limit: 15, empty: "None since this page opened (current health reasons are shown per GPU above)." }),
    );
    put(detail, box);
    if (scroll) box.scrollIntoView({ behavior: "instant", block: "nearest" });
  }

  /** Cordon / drain / uncordon, when this gateway serves them and the caller manages nodes. */
  function nodeActions(node) {
    if (!session.canManageNodes()) return [];
    const act = (verb, label, cls = "") => {
      const template = `/v1/nodes/{node}/${verb}`;
      if (!api.has("POST", template)) return null;
      return h("button", { type: "button", class: cls, "data-action": verb, onclick: async (e) => {
        e.target.disabled = true;
        try {
          await api.request("POST", `/v1/nodes/${encodeURIComponent(node.node)}/${verb}`, { query: { cluster: node.cluster },
            body: verb === "uncordon" ? undefined : { reason: `from the dashboard by ${session.subject}` } });
          ctx.toast(`${label}: ${node.node}`);
          await refresh(["pool"], { now: true });
        } catch (err) { ctx.toast(`${label} failed: ${err.message}`, "error"); e.target.disabled = false; }
      } }, label);
    };
    const buttons = node.cordoned ? [act("uncordon", "Uncordon")] : [act("cordon", "Cordon"), act("drain", "Drain", "danger")];
    if (!buttons.some(Boolean)) return [notAvailable("node-actions", "this gateway serves no cordon/drain endpoint")];
    return buttons.filter(Boolean);
  }

  /** Per GPU: sharing mode and an operator's word on health, when served and allowed. */
  function gpuActions(node, gpu) {
    if (!session.canManageNodes()) return null;
    const base = `/v1/nodes/${encodeURIComponent(node.node)}/gpus/${gpu.index}`;
    const out = [];
    const run = async (what, method, path, body) => {
      try {
        await api.request(method, path, { query: { cluster: node.cluster }, body });
        ctx.toast(`${node.node} GPU ${gpu.index}: ${what}`);
        await refresh(["pool"], { now: true });
      } catch (err) { ctx.toast(`${what} failed: ${err.message}`, "error"); }
    };
    if (api.has("PUT", "/v1/nodes/{node}/gpus/{index}/sharing")) {
      out.push(select(["exclusive", "fractional", "mig"], gpu.sharing || "exclusive",
        (mode) => run(`sharing ${mode}`, "PUT", `${base}/sharing`, { mode }), { class: "small", "aria-label": `sharing of GPU ${gpu.index}`, "data-action": "sharing" }));
    }
    if (api.has("POST", "/v1/nodes/{node}/gpus/{index}/health")) {
      const quarantined = gpu.state === "quarantined" || gpu.health === "failed";
      out.push(h("button", { type: "button", class: `small ${quarantined ? "" : "danger"}`, "data-action": quarantined ? "clear" : "quarantine",
        onclick: () => run(quarantined ? "cleared" : "quarantined", "POST", `${base}/health`,
          { action: quarantined ? "clear" : "quarantine", reason: `from the dashboard by ${session.subject}` }) },
      quarantined ? "Clear" : "Quarantine"));
    }
    return out.length ? h("span", { class: "row-actions" }, out) : null;
  }

  const refresh = refresher(load, { topics: ["pool"], gapMs: 1000 });
  const timer = setInterval(() => { if (!document.hidden) refresh(["pool"]); }, POLL_MS);
  const onResize = () => heatmap.relayout();
  window.addEventListener("resize", onResize);

  const view = {
    ready: false,
    heatmap,
    refresh,
    navigate(p) { st.selected = p.length ? p.join("/") : null; render(); renderDetail(true); },
    onEvent: throttle(renderActivity, 300),
    unmount() { clearInterval(timer); refresh.cancel(); window.removeEventListener("resize", onResize); },
  };
  refresh(["pool"], { now: true });
  return view;
}

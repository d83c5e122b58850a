// What every page shares: a refresher that coalesces bursts of events into one reload, and small view pieces.
import { badge, fmt, h } from "../dom.js";

/** Runs `load` for the given topics at most once per `gapMs` (a burst of 50 events is one reload), never two at
 * once; `now` skips the wait. Returns refresh(topics, {now}). */
export function refresher(load, { topics, gapMs = 800 }) {
  let timer = null;
  let running = null;
  let again = false;
  let last = 0;
  const run = async () => {
    timer = null;
    if (running) { again = true; return running; }
    last = performance.now();
    running = (async () => {
      try { await load(); } finally { running = null; }
    })();
    await running;
    if (again) { again = false; schedule(false); }
  };
  const schedule = (now) => {
    if (now) { clearTimeout(timer); return run(); }
    if (timer) return null;
    timer = setTimeout(run, Math.max(0, last + gapMs - performance.now()));
    return null;
  };
  const refresh = (wanted = topics, { now = false } = {}) => {
    if (!wanted.some((t) => topics.includes(t))) return null;
    return schedule(now);
  };
  refresh.cancel = () => clearTimeout(timer);
  return refresh;
}

export function pageHeader(title, subtitle, ...actions) {
  return h("div", { class: "page-head" }, h("div", {}, h("h1", {}, title), subtitle),
    h("div", { class: "page-actions" }, ...actions));
}

export function stat(label, value, { kind = "", note = "", id } = {}) {
  return h("div", { class: `stat ${kind}`, "data-stat": id || label },
    h("span", { class: "stat-label" }, label), h("span", { class: "stat-value" }, value),
    note ? h("span", { class: "stat-note" }, note) : null);
}

export function stateBadge(state) {
  return badge(String(state).replace(/_/g, " "), state);
}

export function jobLink(job) {
  return h("a", { href: `#/jobs/${encodeURIComponent(job.job_id)}`, class: "job-link", title: job.job_id },
    job.name || fmt.short(job.job_id));
}

export function errorBox(err) {
  return h("div", { class: "error-box", role: "alert" }, h("strong", {}, err.reason || "Error"), ` — ${err.message}`);
}

/** A <select> of options [{value, label}] (strings allowed) with the current value selected. */
export function select(options, value, onchange, attrs = {}) {
  return h("select", { ...attrs, onchange: (e) => onchange(e.target.value) },
    options.map((o) => {
      const opt = typeof o === "string" ? { value: o, label: o } : o;
      return h("option", { value: opt.value, selected: opt.value === value }, opt.label);
    }));
}

export function eventLabel(doc) {
  const parts = String(doc.type || "").split(".");
  return parts.slice(2, 4).join(" ").replace(/_/g, " ");
}

export function eventSummary(doc) {
  const d = doc.data || {};
  switch (String(doc.type).split(".").slice(2, 4).join(".")) {
    case "gpu.health_changed": return `${d.node} GPU ${d.gpu_index}: ${d.previous} → ${d.current}${d.reasons?.length ? ` (${d.reasons.join(", ")})` : ""}`;
    case "node.lost": return `${d.node} lost`;
    case "node.recovered": return `${d.node} recovered`;
    case "node.registered": return `${d.node} registered`;
    case "gpu.orphan_detected": return `${d.node}: ${String(d.orphan).replace(/_/g, " ")}${d.pids?.length ? ` (pids ${d.pids.join(", ")})` : ""}`;
    case "allocation.granted": return `${d.team}: ${d.gpus?.length ?? "?"} GPU(s) on ${d.node}`;
    case "allocation.released": return `${d.team}: released on ${d.node}${d.reason ? ` (${d.reason})` : ""}`;
    case "allocation.preempting": return `${d.team}: preempting on ${d.node}`;
    case "job.submitted": return `${d.team}/${d.name ?? fmt.short(d.job_id)} submitted`;
    case "job.started": return `${d.team ?? ""} job ${fmt.short(d.job_id)} started`;
    case "job.completed": return `job ${fmt.short(d.job_id)} completed`;
    case "job.cancelled": return `job ${fmt.short(d.job_id)} cancelled`;
    case "reclaim.warned": return `idle warning: ${d.team ?? ""} ${fmt.short(d.job_id)} on ${d.node ?? "?"}`;
    case "reclaim.decided": return `${d.team ?? ""} ${fmt.short(d.job_id)} on ${d.node ?? "?"}${d.reason ? ` (${d.reason})` : ""}`;
    case "node.cordoned": return `${d.node} ${d.drain ? "drained" : "cordoned"}${d.by ? ` by ${d.by}` : ""}`;
    case "node.uncordoned": return `${d.node} uncordoned${d.by ? ` by ${d.by}` : ""}`;
    case "job.state_changed": return `${d.team} ${fmt.short(d.job_id)}: ${d.previous ? `${d.previous.replace(/_/g, " ")} → ` : ""}${String(d.current).replace(/_/g, " ")}${d.reason ? ` (${d.reason})` : ""}`;
    case "job.scaled": return `${d.team} ${fmt.short(d.job_id)}: ${d.previous} → ${d.replicas} replicas`;
    case "quota.approval_requested": return `${d.team}/${d.job_name} asks for ${d.gpus} GPUs (${(d.reasons || []).join(", ")})`;
    case "quota.approval_withdrawn": return `${d.team} ${fmt.short(d.job_id)}: request withdrawn`;
    case "quota.approval_decided": return `${d.team ?? ""} ${fmt.short(d.job_id)}: ${d.approved ? "approved" : "denied"}${d.decided_by ? ` by ${d.decided_by}` : ""}`;
    default: return d.team ? `${d.team}` : doc.subject || "";
  }
}

const QUIET = ["decision", "usage", "telemetry"]; // machine chatter, not what people watch

export function activityList(events, { filter = () => true, limit = 12, empty = "No events yet." } = {}) {
  const rows = events.filter((doc) => !QUIET.includes(String(doc.type).split(".")[2]) && filter(doc)).slice(0, limit);
  if (!rows.length) return h("p", { class: "empty" }, empty);
  return h("ul", { class: "activity" }, rows.map((doc) => h("li", {},
    h("time", {}, fmt.clock(doc.time)), h("span", { class: `ev ev-${String(doc.type).split(".")[2]}` }, eventLabel(doc)),
    h("span", { class: "ev-text" }, eventSummary(doc)))));
}

// Queues and jobs: pending jobs in order with placement's reason, running jobs with their GPUs, finished jobs, a
// job's full history, and submit / cancel / scale for those allowed to (the API decides; the page hides the rest).
import { utilizationChart } from "../charts.js";
import { badge, card, clear, fmt, h, put, table } from "../dom.js";
import { queueOrder, traceUrl } from "../model.js";
import { errorBox, jobLink, pageHeader, refresher, select, stat, stateBadge } from "./common.js";

const LIVE_STATES = ["awaiting_approval", "pending", "launching", "running", "preempting"];
const DONE_STATES = ["completed", "failed", "cancelled"];
const EXPLAIN_MAX = 40;
const HISTORY_ROWS = 40;

// the dashboard's configuration (the trace link template), read once per page load
let uiConfig = null;
const config = () => (uiConfig ??= fetch("config.json").then((r) => (r.ok ? r.json() : {})).catch(() => ({})));

function traceFact(job, cfg) {
  if (!job.trace_id) return "—";
  const url = traceUrl(cfg.trace_url_template, job.trace_id);
  return url ? h("a", { href: url, target: "_blank", rel: "noopener", id: "job-trace" }, job.trace_id)
    : h("code", { id: "job-trace" }, job.trace_id);
}

export function mount(ctx, root, params = []) {
  const { api, session, toast } = ctx;
  const st = { byState: {}, explain: new Map(), allocations: [], tracked: [], teams: [], classes: [], models: [], detail: params[0] || null, showForm: false, truncated: false,
    team: "", search: "", showAll: false };
  const subtitle = h("p", { class: "subtitle" }, "Loading…");
  const stats = h("div", { class: "stats", id: "job-stats" });
  const formSlot = h("div", { id: "submit-slot" });
  const detailSlot = h("div", { id: "job-detail" });
  const errorSlot = h("div");
  const sections = {
    pending: h("div", { id: "jobs-pending" }), approval: h("div", { id: "jobs-approval" }),
    running: h("div", { id: "jobs-running" }), history: h("div", { id: "jobs-history" }),
  };
  const canSubmit = session.can("job.submit");
  const newButton = canSubmit ? h("button", { type: "button", class: "primary", id: "new-job", onclick: () => { st.showForm = !st.showForm; renderForm(); } }, "Submit a job") : null;
  const filters = h("div", { class: "toolbar", id: "job-filters" });
  root.append(pageHeader("Queues & jobs", subtitle, newButton), errorSlot, detailSlot, formSlot, stats, filters,
    card("Pending, in queue order", sections.pending),
    card("Running", sections.running),
    h("div", { class: "two" }, card("Awaiting approval", sections.approval), card("Recently finished", sections.history)));

  async function load() {
    try {
      const lists = await Promise.all([...LIVE_STATES, ...DONE_STATES].map((s) => api.all("/v1/jobs", { state: s }, { maxPages: 5 })));
      const [allocs, tracked] = await Promise.all([
        api.all("/v1/allocations", { active: true }),
        api.get("/v1/reclamation/tracked").catch(() => ({ items: [] })),
      ]);
      st.byState = Object.fromEntries([...LIVE_STATES, ...DONE_STATES].map((s, i) => [s, lists[i].items]));
      st.truncated = lists.some((l) => !l.complete);
      st.allocations = allocs.items;
      st.tracked = tracked.items || [];
      const pending = queueOrder(st.byState.pending).slice(0, EXPLAIN_MAX);
      const explained = await Promise.all(pending.map((j) => api.get(`/v1/jobs/${encodeURIComponent(j.job_id)}/explain`).catch(() => null)));
      st.explain = new Map(pending.map((j, i) => [j.job_id, explained[i]]));
      clear(errorSlot);
      render();
      view.ready = true;
      if (st.detail) await renderDetail();
    } catch (err) {
      put(errorSlot, errorBox(err));
    }
  }

  function gpusOf(job) {
    if (job.gang_nodes) return `${job.gang_nodes}×${job.gpus_per_node}`;
    const frac = job.gpu_fraction_milli ? `${job.gpu_fraction_milli / 1000}` : job.mig_profile || job.gpus;
    return job.replicas > 1 ? `${job.replicas}×${frac}` : `${frac}`;
  }

  function render() {
    const b = st.byState;
    const count = (s) => (b[s] || []).length;
    subtitle.textContent = `${count("pending")} pending · ${count("running") + count("preempting")} running · ${count("awaiting_approval")} awaiting approval`
      + (session.team && session.role !== "platform-admin" && session.role !== "operator" ? ` · team ${session.team}` : "");
    put(stats, 
      stat("Awaiting approval", count("awaiting_approval"), { id: "awaiting_approval", kind: count("awaiting_approval") ? "warn" : "" }),
      stat("Pending", count("pending"), { id: "pending" }),
      stat("Running", count("running"), { id: "running", kind: "ok" }),
      stat("Preempting", count("preempting"), { id: "preempting" }),
      stat("Completed", count("completed"), { id: "completed" }),
      stat("Failed / cancelled", count("failed") + count("cancelled"), { id: "failed" }),
    );
    renderFilters();
    renderPending();
    renderRunning();
    renderApproval();
    renderHistory();
  }

  function shown(jobs) {
    const q = st.search.trim().toLowerCase();
    return jobs.filter((j) => (!st.team || j.team === st.team) && (!q || j.name.toLowerCase().includes(q) || j.job_id.includes(q)));
  }

  function renderFilters() {
    const teams = [...new Set(Object.values(st.byState).flat().map((j) => j.team))].sort();
    const search = h("input", { type: "search", placeholder: "name or id", value: st.search, id: "job-search", "aria-label": "search jobs",
      oninput: (e) => { st.search = e.target.value; renderPending(); renderRunning(); renderApproval(); renderHistory(); } });
    put(filters,
      h("label", {}, "Team ", select([{ value: "", label: "all teams" }, ...teams], st.team, (v) => { st.team = v; render(); }, { id: "job-team-filter" })),
      h("label", {}, "Find ", search));
    if (document.activeElement?.id === "job-search") search.focus();
  }

  function renderPending() {
    const rows = shown(queueOrder(st.byState.pending || []));
    const pos = (j) => st.explain.get(j.job_id)?.placement?.position ?? st.explain.get(j.job_id)?.placement?.queue_position;
    rows.sort((a, b) => (pos(a) ?? 1e9) - (pos(b) ?? 1e9));
    put(sections.pending, table([
      { label: "#", num: true, value: (j) => { const p = pos(j); return p === undefined || p === null ? rows.indexOf(j) + 1 : p; } },
      { label: "job", value: jobLink },
      { label: "team", value: (j) => j.team },
      { label: "GPUs", num: true, value: gpusOf },
      { label: "model", class: "nowrap", value: (j) => (j.gpu_models?.length ? j.gpu_models.join(" | ") : "any") },
      { label: "class", value: (j) => j.priority_class },
      { label: "waiting", num: true, value: (j) => fmt.ago(j.submitted_at) },
      { label: "why it waits (explain)", class: "why", value: (j) => explainCell(st.explain.get(j.job_id), j) },
      { label: "", value: (j) => actions(j) },
    ], rows, { empty: "No job is waiting.", rowAttrs: (j) => ({ "data-job": j.job_id }) }));
  }

  function explainCell(ex, job) {
    if (!ex) return h("span", { class: "muted" }, job.message || "—");
    const p = ex.placement || {};
    return h("span", {}, badge(p.reason || p.state || "unknown", "reason"), " ", h("span", { class: "small" }, p.message || ex.message || ""));
  }

  // A pending reason's facts (explain's placement.facts), as the message's numbers, one line per kind.
  function factsList(f) {
    const words = (d) => Object.entries(d || {}).map(([k, n]) => `${n} ${k.replace(/_/g, " ")}`).join(", ");
    const lines = [];
    if (f.nodes_evaluated) {
      lines.push(`Nodes: ${f.nodes_evaluated} evaluated` + (f.filtered ? `; filtered out: ${words(f.filtered)}` : "")
        + (f.short ? `; no room: ${words(f.short)}` : "") + (f.exhausted ? `; exhausted: ${f.exhausted.replace(/_/g, " ")}` : ""));
    }
    if (f.quota) {
      const q = f.quota;
      lines.push(`Quota: ${q.path} (${q.gpu_model === "*" ? "any model" : q.gpu_model}, ${q.rule.replace(/_/g, " ")}): `
        + `used ${q.used_gpus} + asked ${q.asked_gpus}, limit ${q.limit_gpus}`);
    }
    if (f.domain_kind) lines.push(`Waits for: ${f.domain ? `${f.domain_kind} ${f.domain}` : `no ${f.domain_kind} yet`}, `
      + `${f.domain_nodes || 0} node(s) able of ${f.nodes_needed || 0}`);
    if (f.victims_considered || f.victims) {
      lines.push(`Victims: ${f.victims_considered || 0} considered`
        + (f.victims ? `; waiting for ${f.victims.map((v) => `${v.job_id} (${v.reason})`).join(", ")}` : ""));
    }
    if (f.wait) lines.push(`Not preempting: ${f.wait.would_preempt.join(", ")} would lose ${fmt.num(f.wait.lost_gpu_hours, 3)} GPU-hours`);
    if (f.reservation_nodes) {
      lines.push(`Held nodes: ${f.reservation_nodes.join(", ")}` + (f.soft_hold ? " (soft hold)" : ` from ${fmt.time(f.reservation_start)}`));
    }
    return lines.length ? h("ul", { class: "explain-facts small" }, lines.map((l) => h("li", {}, l))) : null;
  }

  function renderRunning() {
    const all = shown([...(st.byState.running || []), ...(st.byState.preempting || [])]);
    const rows = st.showAll ? all : all.slice(0, 15);
    const allocsOf = (j) => st.allocations.filter((a) => a.job_id === j.job_id);
    const chips = (j) => {
      const allocs = allocsOf(j);
      const chip = (a) => h("span", { class: "gpu-chip", title: a.gpus.map((g) => `${g.model} #${g.index}`).join(", ") }, `${a.node}: ${a.gpus.map((g) => g.index).join(",")}`);
      if (allocs.length <= 3) return allocs.map(chip);
      const gpus = allocs.reduce((n, a) => n + a.gpus.length, 0);
      const nodes = new Set(allocs.map((a) => a.node)).size;
      return [chip(allocs[0]), chip(allocs[1]), h("span", { class: "gpu-chip more", title: allocs.map((a) => `${a.node}: ${a.gpus.map((g) => g.index).join(",")}`).join("\n") },
        `+${allocs.length - 2} more · ${gpus} GPUs on ${nodes} nodes`)];
    };
    const trackedOf = new Map(st.tracked.map((t) => [t.allocation_id, t]));
    put(sections.running, table([
      { label: "job", value: jobLink },
      { label: "team", value: (j) => j.team },
      { label: "kind", value: (j) => j.kind },
      { label: "state", value: (j) => stateBadge(j.state) },
      { label: "GPUs", value: (j) => h("span", { class: "gpus" }, chips(j)) },
      { label: "model", class: "nowrap", value: (j) => [...new Set(allocsOf(j).flatMap((a) => a.gpus.map((g) => g.model)))].join(", ") || "—" },
      { label: "running for", num: true, value: (j) => fmt.ago(j.started_at) },
      { label: "mean util", num: true, value: (j) => {
        const t = allocsOf(j).map((a) => trackedOf.get(a.allocation_id)).filter(Boolean);
        if (!t.length) return "—";
        const idle = Math.max(...t.map((x) => x.idle_s || 0));
        const util = t.reduce((s, x) => s + (x.mean_util_pct || 0), 0) / t.length;
        return h("span", { class: idle > 0 ? "warn" : "" }, fmt.pct(util), idle > 0 ? ` · idle ${fmt.duration(idle)}` : "");
      } },
      { label: "", value: (j) => actions(j) },
    ], rows, { empty: "Nothing is running.", rowAttrs: (j) => ({ "data-job": j.job_id }) }),
    all.length > 15 ? h("button", { type: "button", class: "ghost more-rows", id: "running-more", onclick: () => { st.showAll = !st.showAll; renderRunning(); } },
      st.showAll ? "Show fewer" : `Show all ${all.length} running jobs`) : null);
  }

  function renderApproval() {
    const rows = shown(st.byState.awaiting_approval || []);
    put(sections.approval, table([
      { label: "job", value: jobLink },
      { label: "team", value: (j) => j.team },
      { label: "GPUs", num: true, value: gpusOf },
      { label: "why", value: (j) => (j.approval_reasons?.join(", ") || j.message || "—") },
      { label: "", value: () => h("a", { href: "#/teams", class: "small" }, "decide →") },
    ], rows, { empty: "No job is waiting for approval." }));
  }

  function renderHistory() {
    const rows = shown(DONE_STATES.flatMap((s) => st.byState[s] || []))
      .sort((a, b) => String(b.finished_at || b.submitted_at).localeCompare(String(a.finished_at || a.submitted_at))).slice(0, HISTORY_ROWS);
    put(sections.history, table([
      { label: "job", value: jobLink },
      { label: "team", value: (j) => j.team },
      { label: "state", value: (j) => stateBadge(j.state) },
      { label: "GPUs", num: true, value: gpusOf },
      { label: "ran", num: true, value: (j) => (j.started_at && j.finished_at ? fmt.duration((new Date(j.finished_at) - new Date(j.started_at)) / 1000) : "—") },
      { label: "finished", value: (j) => fmt.clock(j.finished_at) },
    ], rows, { empty: "No finished job yet." }),
    st.truncated ? h("p", { class: "small muted" }, "Lists are long: only the first pages of each state were read.") : null);
  }

  function actions(job) {
    const out = [];
    if (["pending", "running", "awaiting_approval", "preempting"].includes(job.state) && session.can("job.cancel", job.team)) {
      out.push(confirmButton("Cancel", "Confirm cancel", async () => {
        await api.post(`/v1/jobs/${encodeURIComponent(job.job_id)}/cancel`, { reason: `cancelled from the dashboard by ${session.subject}` });
        toast(`Cancelled ${job.name}`);
      }, { "data-action": "cancel", "data-job": job.job_id }));
    }
    if (job.state === "running" && !job.gang_nodes && (job.replicas > 1 || job.kind === "inference") && session.can("job.submit", job.team)) {
      const input = h("input", { type: "number", min: 1, max: 256, value: job.replicas, class: "replicas", "aria-label": "replicas" });
      out.push(h("span", { class: "scale" }, input, h("button", { type: "button", "data-action": "scale", onclick: async () => {
        try {
          await api.patch(`/v1/jobs/${encodeURIComponent(job.job_id)}`, { replicas: Number(input.value) });
          toast(`Scaling ${job.name} to ${input.value}`);
          refresh(["jobs"], { now: true });
        } catch (err) { toast(`Scale failed: ${err.message}`, "error"); }
      } }, "Scale")));
    }
    return h("span", { class: "row-actions" }, out);
  }

  function confirmButton(label, confirmLabel, action, attrs = {}) {
    let armed = false;
    let timer = null;
    const btn = h("button", { type: "button", class: "danger small", ...attrs, onclick: async () => {
      if (!armed) {
        armed = true;
        btn.textContent = confirmLabel;
        btn.classList.add("armed");
        timer = setTimeout(() => { armed = false; btn.textContent = label; btn.classList.remove("armed"); }, 4000);
        return;
      }
      clearTimeout(timer);
      btn.disabled = true;
      try { await action(); refresh(["jobs"], { now: true }); } catch (err) { toast(`${label} failed: ${err.message}`, "error"); btn.disabled = false; }
    } }, label);
    return btn;
  }

  async function renderForm() {
    if (!st.showForm) { clear(formSlot); return; }
    if (!st.teams.length) {
      const [teams, classes, pool] = await Promise.all([
        api.get("/v1/teams").catch(() => ({ items: [] })), api.get("/v1/priority-classes").catch(() => ({ items: [] })),
        api.get("/v1/pool").catch(() => null)]);
      st.teams = teams.items.map((t) => t.team);
      st.classes = classes.items.map((c) => c.name);
      st.models = pool ? pool.all.models.map((m) => m.model) : [];
    }
    const teams = session.team && session.role !== "platform-admin" && session.role !== "operator" ? [session.team] : st.teams;
    const f = {
      name: h("input", { name: "name", required: true, pattern: "[a-z0-9]([a-z0-9\\-]{0,61}[a-z0-9])?", placeholder: "llama-finetune", id: "job-name" }),
      team: select(teams, teams[0], () => {}, { name: "team", id: "job-team" }),
      gpus: h("input", { name: "gpus", type: "number", min: 1, max: 1024, value: 1, required: true, id: "job-gpus" }),
      replicas: h("input", { name: "replicas", type: "number", min: 1, max: 256, value: 1, id: "job-replicas" }),
      model: select([{ value: "", label: "any model" }, ...st.models], "", () => {}, { name: "model", id: "job-model" }),
      kind: select(["training", "inference", "dev", "batch"], "training", () => {}, { name: "kind", id: "job-kind" }),
      priority: select(st.classes.length ? st.classes : ["normal"], "normal", () => {}, { name: "priority_class", id: "job-priority" }),
    };
    const error = h("p", { class: "form-error", role: "alert" });
    const form = h("form", { class: "submit-form", id: "submit-form", onsubmit: async (e) => {
      e.preventDefault();
      error.textContent = "";
      const body = { name: f.name.value.trim(), team: f.team.value, gpus: Number(f.gpus.value), kind: f.kind.value, priority_class: f.priority.value };
      if (Number(f.replicas.value) > 1) body.replicas = Number(f.replicas.value);
      if (f.model.value) body.gpu_models = [f.model.value];
      const submit = form.querySelector("button[type=submit]");
      submit.disabled = true;
      try {
        const job = await api.request("POST", "/v1/jobs", { body });
        toast(`Submitted ${job.name}: ${job.state.replace(/_/g, " ")}`);
        st.showForm = false;
        clear(formSlot);
        refresh(["jobs"], { now: true });
      } catch (err) {
        error.textContent = `${err.reason}: ${err.message}`;
      } finally { submit.disabled = false; }
    } },
    h("div", { class: "form-grid" },
      h("label", {}, "Name", f.name), h("label", {}, "Team", f.team), h("label", {}, "GPUs", f.gpus),
      h("label", {}, "Replicas", f.replicas), h("label", {}, "GPU model", f.model), h("label", {}, "Kind", f.kind),
      h("label", {}, "Priority class", f.priority)),
    h("div", { class: "form-actions" }, h("button", { type: "submit", class: "primary" }, "Submit"),
      h("button", { type: "button", class: "ghost", onclick: () => { st.showForm = false; clear(formSlot); } }, "Close")), error);
    put(formSlot, card("Submit a job", form));
    f.name.focus();
  }

  // The job's work output, followed live (GET /v1/jobs/{id}/logs?follow=true): one stream per job shown, kept
  // across the detail's re-renders and ended when another job is shown or the page goes.
  let logs = { job: null, pre: null, abort: null };
  function stopLogs() { logs.abort?.abort(); logs = { job: null, pre: null, abort: null }; }
  function logsFor(job) {
    if (!job.work) return null;
    if (logs.job !== job.job_id) {
      stopLogs();
      const abort = new AbortController();
      logs = { job: job.job_id, pre: h("pre", { class: "logs", id: "job-logs" }, ""), abort };
      streamLogs(job.job_id, logs.pre, abort.signal);
    }
    return logs.pre;
  }
  async function streamLogs(jobId, pre, signal) {
    const url = new URL(`${api.base}/v1/jobs/${encodeURIComponent(jobId)}/logs`, location.origin);
    url.search = new URLSearchParams({ follow: "true", stream: "both", tail: "500" }).toString();
    try {
      const response = await fetch(url, { headers: api.headers({ Accept: "text/plain" }), signal });
      if (!response.ok) {
        let problem = null;
        try { problem = await response.json(); } catch { /* not JSON */ }
        pre.textContent = `(no logs: ${problem?.detail || response.status})`;
        return;
      }
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        pre.textContent += decoder.decode(value, { stream: true });
        if (pre.textContent.length > 200000) pre.textContent = pre.textContent.slice(-150000); // bounded in the page
        pre.scrollTop = pre.scrollHeight;
      }
    } catch (err) {
      if (err.name !== "AbortError") pre.textContent += `\n(log stream ended: ${err.message})`;
    }
  }

  // The job's GPU utilization over its life (GET /v1/jobs/{id}/utilization), or why there is none.
  function utilizationOf(util) {
    if (util === null) return h("p", { class: "muted", id: "job-utilization", "data-points": "0" }, "Not available on this gateway.");
    if (util.error) return h("div", { id: "job-utilization", "data-points": "0" }, errorBox(util.error));
    return utilizationChart(util, { id: "job-utilization" });
  }

  async function renderDetail() {
    if (!st.detail) { stopLogs(); clear(detailSlot); return; }
    const id = encodeURIComponent(st.detail);
    try {
      const utilServed = api.has("GET", "/v1/jobs/{job_id}/utilization");
      const [job, explain, allocs, usage, cfg, util] = await Promise.all([
        api.get(`/v1/jobs/${id}`), api.get(`/v1/jobs/${id}/explain`).catch(() => null),
        api.all("/v1/allocations", { job_id: st.detail }, { maxPages: 2 }).catch(() => ({ items: [] })),
        api.all("/v1/usage", { job_id: st.detail }, { maxPages: 2 }).catch(() => ({ items: [] })), config(),
        utilServed ? api.get(`/v1/jobs/${id}/utilization`).catch((err) => ({ error: err })) : null,
      ]);
      const facts = [["team", job.team], ["project", job.project], ["kind", job.kind], ["priority class", `${job.priority_class} (${job.priority})`],
        ["GPUs", gpusOf(job)], ["models", job.gpu_models?.join(", ") || "any"], ["submitted", fmt.time(job.submitted_at)],
        ["started", fmt.time(job.started_at)], ["finished", fmt.time(job.finished_at)], ["attempts", job.attempts],
        ["max runtime", job.max_runtime_s ? fmt.duration(job.max_runtime_s) : "—"], ["id", job.job_id], ["trace", traceFact(job, cfg)],
        ...(job.work ? [["command", job.work.command.join(" ")], ["isolation", job.work.isolation],
          ["exit code", job.exit_code ?? "—"], ["reason", job.reason || "—"]] : [])];
      const p = explain?.placement || {};
      const gpuSeconds = usage.items.reduce((s, u) => s + (u.gpu_seconds || 0), 0);
      put(detailSlot, h("section", { class: "card job-detail", "data-job": job.job_id },
        h("div", { class: "card-head" }, h("h2", {}, `Job ${job.name} `, stateBadge(job.state)),
          h("div", { class: "actions" }, actions(job), h("a", { href: "#/jobs", class: "button ghost" }, "Close"))),
        h("dl", { class: "facts" }, facts.map(([k, v]) => [h("dt", {}, k), h("dd", {}, v ?? "—")])),
        explain ? h("p", { class: "explain" }, h("strong", {}, "Explain: "), badge(p.reason || p.state || "unknown", "reason"), " ", p.message || explain.message || "",
          p.position !== undefined ? ` (position ${p.position})` : "") : null,
        explain ? factsList(p.facts || {}) : null,
        h("div", { class: "two" },
          h("div", {}, h("h3", {}, "History"), h("ol", { class: "timeline", id: "job-history" }, (job.history || []).map((e) => h("li", {},
            h("time", {}, fmt.time(e.at)), " ", e.from ? `${e.from.replace(/_/g, " ")} → ` : "", h("strong", {}, e.to.replace(/_/g, " ")),
            e.reason ? h("span", { class: "muted" }, ` · ${e.reason}`) : null)))),
          h("div", {}, h("h3", {}, "Allocations"), table([
            { label: "node", value: (a) => a.node },
            { label: "GPUs", value: (a) => a.gpus.map((g) => `${g.model} #${g.index}`).join(", ") },
            { label: "granted", value: (a) => fmt.clock(a.granted_at) },
            { label: "released", value: (a) => (a.released_at ? `${fmt.clock(a.released_at)} · ${a.release_reason || ""}` : badge("held", "running")) },
          ], allocs.items, { empty: "No GPUs held yet." }),
          h("p", { class: "small muted" }, `Usage recorded: ${fmt.num(gpuSeconds / 3600, 3)} GPU-hours in ${usage.items.length} ledger line(s).`))),
        h("div", {}, h("h3", {}, "GPU utilization"), utilizationOf(util)),
        job.work ? h("div", {}, h("h3", {}, "Logs"), logsFor(job)) : null));
    } catch (err) {
      put(detailSlot, errorBox(err));
    }
  }

  const refresh = refresher(load, { topics: ["jobs"], gapMs: 1200 });
  const view = {
    ready: false,
    refresh,
    async navigate(p) {
      st.detail = p[0] || null;
      await renderDetail();
      if (st.detail) window.scrollTo({ top: 0 }); // the detail is the first thing on the page
    },
    unmount() { refresh.cancel(); stopLogs(); },
  };
  refresh(["jobs"], { now: true });
  return view;
}

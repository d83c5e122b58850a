// Teams and quotas: guarantee vs used vs borrowed per team and GPU model, a team's GPU utilization over time,
// approvals to decide, priority classes and reclaim policies. `#/teams/<team>` picks the team of the history.
import { quotaBar, utilizationChart } from "../charts.js";
import { badge, card, clear, fmt, h, put, table } from "../dom.js";
import { teamUsage } from "../model.js";
import { errorBox, pageHeader, refresher, select, stat } from "./common.js";

const WINDOWS = [{ value: "3600", label: "last hour" }, { value: "21600", label: "last 6 hours" },
  { value: "86400", label: "last day" }, { value: "604800", label: "last 7 days" }];

export function mount(ctx, root, params = []) {
  const { api, session, toast } = ctx;
  const subtitle = h("p", { class: "subtitle" }, "Loading…");
  const stats = h("div", { class: "stats", id: "team-stats" });
  const approvals = h("div", { id: "approvals" });
  const quotas = h("div", { id: "quotas" });
  const classes = h("div", { id: "priority-classes" });
  const policies = h("div", { id: "reclaim-policies" });
  const history = h("div", { id: "team-history" });
  const util = { team: params[0] || session.team || null, window: "3600", teams: [] };
  const errorSlot = h("div");
  root.append(pageHeader("Teams & quotas", subtitle), errorSlot, stats,
    card("Approvals waiting", approvals),
    card("Guarantee, use and borrowing per team and GPU model", quotas),
    card("GPU utilization over time", history),
    h("div", { class: "two" }, card("Priority classes", classes), card("Reclaim policies", policies)));

  async function load() {
    try {
      const [teams, qs, allocs, pending, pend, decided, pcs, rps] = await Promise.all([
        api.get("/v1/teams"), api.get("/v1/quotas"), api.all("/v1/allocations", { active: true }),
        api.all("/v1/jobs", { state: "pending" }, { maxPages: 5 }),
        api.get("/v1/approvals", { state: "pending", limit: 200 }),
        api.get("/v1/approvals", { limit: 20 }),
        api.get("/v1/priority-classes").catch(() => ({ items: [] })),
        api.get("/v1/reclaim-policies").catch(() => ({ items: [] })),
      ]);
      const rows = teamUsage(teams.items, qs.items, allocs.items, pending.items);
      const used = rows.reduce((s, r) => s + r.used, 0);
      const borrowed = rows.reduce((s, r) => s + r.borrowed, 0);
      const guaranteed = rows.reduce((s, r) => s + r.guaranteed, 0);
      subtitle.textContent = `${teams.items.length} teams · ${qs.items.length} quota entries · ${pend.items.length} approval(s) waiting`;
      put(stats, 
        stat("Teams", teams.items.length, { id: "teams" }),
        stat("Guaranteed GPUs", fmt.num(guaranteed), { id: "guaranteed" }),
        stat("GPUs in use", fmt.num(used), { id: "used", kind: "ok" }),
        stat("Borrowed", fmt.num(borrowed), { id: "borrowed", kind: borrowed ? "warn" : "", note: "beyond guarantees" }),
        stat("Approvals waiting", pend.items.length, { id: "approvals", kind: pend.items.length ? "warn" : "" }),
      );
      renderApprovals(pend, decided.items.filter((a) => a.state !== "pending"));
      renderQuotas(rows, qs.items);
      renderClasses(pcs.items || []);
      renderPolicies(rps.items || rps.policies || []);
      util.teams = teams.items.map((t) => t.team);
      if (!util.team) util.team = util.teams.find((t) => session.can("usage.read", t)) || null;
      await renderHistory();
      clear(errorSlot);
      view.ready = true;
    } catch (err) {
      put(errorSlot, errorBox(err));
    }
  }

  function renderApprovals(pend, decided) {
    const rules = (pend.rules || []).filter((r) => r.enabled);
    const decide = (a, approve, comment) => async (e) => {
      e.target.disabled = true;
      try {
        await api.post(`/v1/approvals/${encodeURIComponent(a.approval_id)}/${approve ? "approve" : "deny"}`, { comment: comment.value });
        toast(`${approve ? "Approved" : "Denied"} ${a.job_name} (${a.team})`);
        refresh(["teams"], { now: true });
      } catch (err) {
        toast(`Decision failed: ${err.message}`, "error");
        e.target.disabled = false;
      }
    };
    put(approvals, 
      h("p", { class: "small muted" }, rules.length ? `Rules: ${rules.map((r) => `${r.rule.replace(/_/g, " ")} ${r.value}`).join(" · ")}` : "No approval rule is enabled."),
      table([
        { label: "job", value: (a) => h("a", { href: `#/jobs/${encodeURIComponent(a.job_id)}` }, a.job_name) },
        { label: "team", value: (a) => `${a.team}/${a.project}` },
        { label: "GPUs", num: true, value: (a) => a.gpus },
        { label: "class", value: (a) => a.priority_class },
        { label: "why", value: (a) => a.reasons.join(", ") },
        { label: "requested by", value: (a) => a.requested_by },
        { label: "waiting", num: true, value: (a) => fmt.ago(a.created_at) },
        { label: "", value: (a) => {
          if (!session.can("approval.decide", a.team)) return h("span", { class: "muted small" }, "team admins decide");
          const comment = h("input", { type: "text", placeholder: "comment", maxlength: 1000, class: "comment", "aria-label": "comment" });
          return h("span", { class: "row-actions" }, comment,
            h("button", { type: "button", class: "primary small", "data-action": "approve", onclick: decide(a, true, comment) }, "Approve"),
            h("button", { type: "button", class: "danger small", "data-action": "deny", onclick: decide(a, false, comment) }, "Deny"));
        } },
      ], pend.items, { empty: "Nothing waits for a decision.", rowAttrs: (a) => ({ "data-approval": a.approval_id, "data-job": a.job_id }) }),
      decided.length ? h("details", { class: "decided" }, h("summary", {}, `Recently decided (${decided.length})`), table([
        { label: "job", value: (a) => a.job_name },
        { label: "team", value: (a) => a.team },
        { label: "GPUs", num: true, value: (a) => a.gpus },
        { label: "decision", value: (a) => badge(a.state, a.state) },
        { label: "by", value: (a) => a.decided_by || "—" },
        { label: "comment", value: (a) => a.comment || "—" },
        { label: "when", value: (a) => fmt.time(a.decided_at) },
      ], decided)) : null,
    );
  }

  function renderQuotas(rows, entries) {
    const scale = Math.max(1, ...rows.map((r) => Math.max(r.guaranteed + (r.borrowingLimit ?? 0), r.used)));
    let lastTeam = null;
    put(quotas, 
      h("div", { class: "legend" },
        h("span", {}, h("i", { class: "sw-used" }), "used within guarantee"), h("span", {}, h("i", { class: "sw-borrowed" }), "borrowed (beyond guarantee)"),
        h("span", {}, h("i", { class: "sw-guar" }), "guarantee"), h("span", {}, h("i", { class: "sw-limit" }), "borrowing limit")),
      table([
        { label: "team", value: (r) => { const show = r.team !== lastTeam; lastTeam = r.team; return show ? h("strong", {}, r.team) : ""; } },
        { label: "GPU model", value: (r) => (r.model === "*" ? "any" : r.model) },
        { label: "guaranteed", num: true, value: (r) => (r.quota ? fmt.num(r.guaranteed, 2) : h("span", { class: "muted" }, "—")) },
        { label: "used", num: true, value: (r) => fmt.num(r.used, 2) },
        { label: "borrowed", num: true, value: (r) => (r.borrowed ? h("span", { class: "warn" }, fmt.num(r.borrowed, 2)) : "0") },
        { label: "borrow limit", num: true, value: (r) => (r.borrowingLimit === null ? (r.quota ? "∞" : "—") : fmt.num(r.borrowingLimit, 2)) },
        { label: "pending demand", num: true, value: (r) => (r.pending ? fmt.num(r.pending) : "—") },
        { label: "", value: (r) => quotaBar({ guaranteed: r.guaranteed, used: r.used, borrowed: r.borrowed, limit: r.borrowingLimit, scale }) },
      ], rows, { empty: "No team yet.", rowAttrs: (r) => ({ "data-team": r.team, "data-model": r.model }) }),
      entries.some((q) => q.path.split("/").length !== 2) ? h("details", {}, h("summary", {}, "Org and project entries"), table([
        { label: "path", value: (q) => q.path }, { label: "model", value: (q) => q.gpu_model },
        { label: "guaranteed", num: true, value: (q) => fmt.num(q.guaranteed, 2) },
        { label: "borrow limit", num: true, value: (q) => (q.borrowing_limit === null ? "∞" : fmt.num(q.borrowing_limit, 2)) },
      ], entries.filter((q) => q.path.split("/").length !== 2))) : null,
    );
  }

  // One team's GPU utilization (GET /v1/teams/{team}/utilization): mean and busiest GPU, and GPUs held.
  async function renderHistory() {
    if (!api.has("GET", "/v1/teams/{team}/utilization")) { put(history, h("p", { class: "muted" }, "Not available on this gateway.")); return; }
    if (!util.team) { put(history, h("p", { class: "empty" }, "No team yet.")); return; }
    const readable = util.teams.filter((t) => session.can("usage.read", t));
    const names = readable.includes(util.team) ? readable : [util.team, ...readable];
    const again = () => renderHistory();
    const controls = h("div", { class: "toolbar" },
      h("label", {}, "Team ", select(names, util.team, (v) => { util.team = v; again(); }, { id: "u-team" })),
      h("label", {}, "Range ", select(WINDOWS, util.window, (v) => { util.window = v; again(); }, { id: "u-window" })));
    let body;
    try {
      const doc = await api.get(`/v1/teams/${encodeURIComponent(util.team)}/utilization`, { window_s: util.window });
      body = utilizationChart(doc, { id: "team-utilization", gpus: true });
      body.dataset.team = util.team;
    } catch (err) {
      body = errorBox(err);
    }
    put(history, controls, body);
  }

  function renderClasses(items) {
    put(classes, table([
      { label: "name", value: (c) => h("strong", {}, c.name) },
      { label: "value", num: true, value: (c) => c.value },
      { label: "preemptible", value: (c) => (c.preemptible ? "yes" : "no") },
      { label: "min runtime", num: true, value: (c) => (c.min_runtime_s ? fmt.duration(c.min_runtime_s) : "—") },
      { label: "description", value: (c) => c.description || "—" },
    ], items));
  }

  function renderPolicies(items) {
    put(policies, table([
      { label: "kind", value: (p) => h("strong", {}, p.kind) },
      { label: "idle after", num: true, value: (p) => (p.idle_after_s ? fmt.duration(p.idle_after_s) : "never") },
      { label: "idle below", num: true, value: (p) => fmt.pct(p.idle_util_pct) },
      { label: "grace", num: true, value: (p) => fmt.duration(p.grace_s) },
      { label: "max runtime", value: (p) => (p.enforce_max_runtime ? "enforced" : "not enforced") },
    ], items, { empty: "No reclaim policy." }));
  }

  const refresh = refresher(load, { topics: ["teams"], gapMs: 1200 });
  const view = {
    ready: false,
    refresh,
    async navigate(p) {
      if (p[0]) { util.team = p[0]; await renderHistory(); }
    },
    unmount() { refresh.cancel(); },
  };
  refresh(["teams"], { now: true });
  return view;
}

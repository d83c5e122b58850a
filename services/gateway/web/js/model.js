// Pure transformations of API documents into what the pages draw (no DOM, no fetch), so they are easy to test.

/** Index active allocations by GPU uuid: uuid → {allocation, team, job_id}. */
export function holders(allocations) {
  const byGpu = new Map();
  for (const a of allocations) {
    if (a.released_at) continue;
    for (const g of a.gpus || []) byGpu.set(g.uuid, a);
  }
  return byGpu;
}

/** Nodes (GET /v1/nodes items) + active allocations → clusters of nodes of GPU cells for the heat map.
 * `inUsePct` is the pool's in-use threshold: an allocated GPU below it is allocated-but-idle, as in /v1/pool. */
export function poolModel(nodes, allocations, { inUsePct = 5, filters = {}, tracked = [] } = {}) {
  const byGpu = holders(allocations);
  const idleFor = new Map(tracked.map((t) => [t.allocation_id, t]));
  const clusters = new Map();
  const { cluster, model, team, idleOnly } = filters;
  for (const node of nodes) {
    if (cluster && node.cluster !== cluster) continue;
    const lost = node.state === "lost";
    const gpus = (node.gpus || []).filter((g) => !model || g.model === model).map((g) => {
      const t = g.telemetry || null;
      const alloc = byGpu.get(g.uuid) || null;
      const util = t ? t.utilization_gpu_pct : null;
      const memTotal = t?.memory_total_mib || g.memory_mib || null;
      const memUsed = t ? t.memory_used_mib : null;
      const idle = Boolean(alloc) && !lost && (util === null || util < inUsePct);
      return {
        uuid: g.uuid, index: g.index, model: g.model, name: g.name, util, memUsed, memTotal,
        memPct: memUsed !== null && memTotal ? (100 * memUsed) / memTotal : null,
        temp: t?.temperature_c ?? null, power: t?.power_w ?? null, health: g.health || "healthy",
        healthReasons: g.health_reasons || [], lost, allocated: Boolean(alloc), idle,
        allocationId: alloc?.allocation_id || null, jobId: alloc?.job_id || null, team: alloc?.team || null,
        idleS: alloc ? idleFor.get(alloc.allocation_id)?.idle_s ?? null : null,
        processes: t?.process_count ?? null, sharing: g.sharing || null, state: g.state || null,
        stateReason: g.state_reason || "",
        dim: Boolean(team) && alloc?.team !== team,
      };
    });
    if (!gpus.length) continue;
    if (team && !gpus.some((g) => g.team === team)) continue;
    if (idleOnly && !gpus.some((g) => g.idle)) continue;
    const key = `${node.cluster}/${node.node}`;
    const entry = clusters.get(node.cluster) || { name: node.cluster, nodes: [], gpuCount: 0 };
    entry.nodes.push({
      key, name: node.node, cluster: node.cluster, state: node.state, lost, gpus,
      cordoned: node.drained ? "drained" : node.cordoned ? "cordoned" : null,
      raw: node,
    });
    entry.gpuCount += gpus.length;
    clusters.set(node.cluster, entry);
  }
  const sorted = [...clusters.values()].sort((a, b) => a.name.localeCompare(b.name));
  for (const c of sorted) c.nodes.sort((a, b) => naturalCompare(a.name, b.name));
  return sorted;
}

/** Counts over what the heat map shows (the tiles above it), in the same terms as /v1/pool. */
export function summarize(clusters) {
  const s = { nodes: 0, gpus: 0, allocated: 0, inUse: 0, idle: 0, free: 0, unhealthy: 0, lostNodes: 0 };
  for (const c of clusters) {
    for (const n of c.nodes) {
      s.nodes += 1;
      if (n.lost) s.lostNodes += 1;
      for (const g of n.gpus) {
        s.gpus += 1;
        if (g.allocated) s.allocated += 1;
        if (g.idle) s.idle += 1;
        if (g.allocated && !g.idle) s.inUse += 1;
        if (g.health !== "healthy" || g.lost) s.unhealthy += 1;
        else if (!g.allocated) s.free += 1;
      }
    }
  }
  return s;
}

export function naturalCompare(a, b) {
  return String(a).localeCompare(String(b), "en", { numeric: true });
}

/** Guarantee vs used vs borrowed per team and GPU model. Quotas are GET /v1/quotas items (path org/team[/project]);
 * used is counted from active allocations (each GPU, or its share when the allocation says so). */
export function teamUsage(teams, quotas, allocations, pendingJobs = []) {
  const rows = new Map();
  const row = (team, model) => {
    const k = `${team}|${model}`;
    if (!rows.has(k)) {
      rows.set(k, { team, model, guaranteed: 0, borrowingLimit: null, used: 0, borrowed: 0, pending: 0, quota: false });
    }
    return rows.get(k);
  };
  const orgOf = new Map(teams.map((t) => [t.team, t.org]));
  for (const q of quotas) {
    const parts = q.path.split("/");
    if (parts.length !== 2) continue; // org- and project-level entries are listed, not summed into teams
    const [org, team] = parts;
    if (orgOf.has(team) && orgOf.get(team) !== org) continue;
    const r = row(team, q.gpu_model);
    r.guaranteed += q.guaranteed;
    r.borrowingLimit = q.borrowing_limit;
    r.quota = true;
  }
  for (const a of allocations) {
    if (a.released_at) continue;
    for (const g of a.gpus || []) {
      const share = (g.share_milli ?? 1000) / 1000;
      const exact = rows.get(`${a.team}|${g.model}`);
      const any = rows.get(`${a.team}|*`);
      (exact || any || row(a.team, g.model)).used += share;
    }
  }
  for (const j of pendingJobs) {
    const model = j.gpu_models?.length === 1 ? j.gpu_models[0] : "*";
    const r = rows.get(`${j.team}|${model}`) || rows.get(`${j.team}|*`) || row(j.team, model);
    r.pending += j.gpus * (j.replicas || 1);
  }
  for (const r of rows.values()) r.borrowed = Math.max(0, r.used - r.guaranteed);
  for (const t of teams) if (![...rows.values()].some((r) => r.team === t.team)) row(t.team, "*");
  return [...rows.values()].sort((a, b) => a.team.localeCompare(b.team) || a.model.localeCompare(b.model));
}

/** The order placement would consider pending jobs in when it does not say: priority, then submit time. */
export function queueOrder(jobs) {
  return [...jobs].sort((a, b) => (b.priority ?? 0) - (a.priority ?? 0)
    || String(a.submitted_at).localeCompare(String(b.submitted_at)) || String(a.job_id).localeCompare(String(b.job_id)));
}

/** The rows of a report document, whatever its envelope: `items`, `rows`, `groups`, or its first array of objects. */
export function reportRows(doc) {
  if (Array.isArray(doc)) return doc;
  if (!doc || typeof doc !== "object") return [];
  for (const key of ["items", "rows", "groups", "series", "teams", "models"]) {
    if (Array.isArray(doc[key]) && doc[key].every((r) => r && typeof r === "object")) return doc[key];
  }
  const first = Object.values(doc).find((v) => Array.isArray(v) && v.length && v.every((r) => r && typeof r === "object"));
  return first || [];
}

const TIME_KEYS = ["bucket", "time", "at", "date", "day", "week", "month", "period", "window_start", "start"];

/** Which keys of report rows label a row (strings), which are time, and which are measures (numbers). */
export function reportShape(rows) {
  const keys = [...new Set(rows.flatMap((r) => Object.keys(r)))];
  const isNum = (k) => rows.some((r) => typeof r[k] === "number") && rows.every((r) => r[k] === null || r[k] === undefined || typeof r[k] === "number");
  const time = keys.find((k) => TIME_KEYS.includes(k) && rows.every((r) => !r[k] || !Number.isNaN(Date.parse(r[k]))));
  const measures = keys.filter((k) => k !== time && isNum(k));
  const labels = keys.filter((k) => k !== time && !measures.includes(k) && rows.some((r) => typeof r[k] === "string")
    && rows.every((r) => r[k] === null || r[k] === undefined || ["string", "boolean"].includes(typeof r[k])));
  return { time: time || null, measures, labels };
}

/** The link to a job's trace: the configured template (`GPUPOOL_GATEWAY_TRACE_URL_TEMPLATE`, served in
 * /ui/config.json) with `{trace_id}` filled in; null without a template, a trace id, or for anything but http(s). */
export function traceUrl(template, traceId) {
  if (!template || !traceId || !/^[0-9a-f]{32}$/.test(traceId) || !/^https?:\/\//i.test(template)) return null;
  return template.split("{trace_id}").join(traceId);
}

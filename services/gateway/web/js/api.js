// The /v1 client the pages share: bearer token, RFC 9457 problem bodies as errors, cursor pagination, and which
// optional endpoints this gateway serves (read from its OpenAPI document, so pages can say "not available").

const TOKEN_KEY = "gpupool.token";

export class ApiError extends Error {
  constructor(status, body) {
    super(body?.detail || body?.title || `HTTP ${status}`);
    this.status = status;
    this.reason = body?.reason || (status === 0 ? "NetworkError" : `Http${status}`);
    this.body = body;
  }
}

export class Api {
  constructor(base = "") {
    this.base = base;
    this.token = sessionStorage.getItem(TOKEN_KEY) || "";
    this.paths = null; // OpenAPI path templates → methods, loaded once
    this.onUnauthorized = () => {};
  }

  setToken(token) {
    this.token = token;
    if (token) sessionStorage.setItem(TOKEN_KEY, token);
    else sessionStorage.removeItem(TOKEN_KEY);
  }

  headers(extra = {}) {
    return { Authorization: `Bearer ${this.token}`, ...extra };
  }

  async request(method, path, { body, query, accept = "application/json", signal } = {}) {
    const url = new URL(this.base + path, location.origin);
    for (const [k, v] of Object.entries(query || {})) {
      if (v === undefined || v === null || v === "") continue;
      for (const item of Array.isArray(v) ? v : [v]) url.searchParams.append(k, String(item));
    }
    const init = { method, headers: this.headers({ Accept: accept }), signal };
    if (body !== undefined) {
      init.body = JSON.stringify(body);
      init.headers["Content-Type"] = "application/json";
    }
    let response;
    try {
      response = await fetch(url, init);
    } catch (err) {
      if (err.name === "AbortError") throw err;
      throw new ApiError(0, { detail: `the gateway did not answer (${err.message})` });
    }
    if (response.status === 401 && path !== "/v1/whoami") this.onUnauthorized();
    if (!response.ok) {
      let problem = null;
      try { problem = await response.json(); } catch { /* not JSON */ }
      throw new ApiError(response.status, problem);
    }
    if (response.status === 204) return null;
    const type = response.headers.get("content-type") || "";
    return type.includes("json") ? response.json() : { text: await response.text(), contentType: type };
  }

  get(path, query, opts = {}) { return this.request("GET", path, { ...opts, query }); }
  post(path, body) { return this.request("POST", path, { body }); }
  patch(path, body) { return this.request("PATCH", path, { body }); }
  put(path, body) { return this.request("PUT", path, { body }); }

  /** Every item of a cursor-paginated list, up to maxPages pages. */
  async all(path, query = {}, { limit = 1000, maxPages = 20 } = {}) {
    const items = [];
    let cursor = null;
    for (let i = 0; i < maxPages; i += 1) {
      const page = await this.get(path, { ...query, limit, cursor });
      items.push(...(page.items || []));
      cursor = page.next;
      if (!cursor) return { items, complete: true };
    }
    return { items, complete: false };
  }

  async loadPaths() {
    if (this.paths) return this.paths;
    try {
      const doc = await fetch(new URL(`${this.base}/openapi.json`, location.origin)).then((r) => r.json());
      this.paths = doc.paths || {};
    } catch {
      this.paths = {};
    }
    return this.paths;
  }

  /** The concrete path of an OpenAPI operation whose template matches `pattern` (a RegExp on the template), with
   * its {params} filled from `params`; null when this gateway does not serve it. */
  route(method, pattern, params = {}) {
    for (const [template, ops] of Object.entries(this.paths || {})) {
      if (!ops[method.toLowerCase()] || !pattern.test(template)) continue;
      const names = [...template.matchAll(/\{([^}]+)\}/g)].map((m) => m[1]);
      if (names.some((n) => params[n] === undefined)) continue;
      return template.replace(/\{([^}]+)\}/g, (_, n) => encodeURIComponent(params[n]));
    }
    return null;
  }

  has(method, template) {
    return Boolean(this.paths?.[template]?.[method.toLowerCase()]);
  }
}

/** What the signed-in caller may do, from GET /v1/whoami (the API enforces; this only hides what would fail). */
export class Session {
  constructor(whoami) {
    this.subject = whoami.subject;
    this.role = whoami.role;
    this.team = whoami.team;
    this.allowed = new Set(whoami.allowed || []);
  }

  /** Roles bound to a team act only on that team; admins and operators (and team-less services) on every team. */
  can(action, team = null) {
    if (!this.allowed.has(action)) return false;
    if (team === null || team === undefined || this.team === null) return true;
    if (this.role === "platform-admin" || this.role === "operator") return true;
    return team === this.team;
  }

  canManageNodes() {
    if ([...this.allowed].some((a) => a.startsWith("node."))) return true;
    return this.role === "platform-admin" || this.role === "operator";
  }
}

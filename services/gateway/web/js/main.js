// Entry point: sign-in with an API token, the hash router (#/pool, #/jobs, #/teams, #/reports), the header and the
// live event stream every page listens to.
import { Api, Session } from "./api.js";
import { clear, h, put, toast } from "./dom.js";
import { LiveEvents, topicsOf } from "./live.js";
import * as jobs from "./pages/jobs.js";
import * as pool from "./pages/pool.js";
import * as reports from "./pages/reports.js";
import * as teams from "./pages/teams.js";

const PAGES = { pool, jobs, teams, reports };
const EVENT_BUFFER = 300;

const api = new Api();
const main = document.getElementById("main");
const state = { session: null, page: null, pageName: null, live: null, events: [], perf: [] };

// A handle for people debugging in the console and for the browser tests (timings, a manual refresh).
window.gpupool = {
  perf: state.perf,
  refresh: () => state.page?.refresh(["pool", "jobs", "teams", "reports"], { now: true }),
  get page() { return state.pageName; },
  get ready() { return Boolean(state.page?.ready); },
  get heatmap() { return state.page?.heatmap || null; },
};

function showLogin(message = "") {
  state.live?.stop();
  state.page?.unmount?.();
  state.page = null;
  document.getElementById("topbar").hidden = true;
  const error = h("p", { class: "login-error", role: "alert", id: "login-error" }, message);
  const input = h("input", { type: "password", id: "token", name: "token", autocomplete: "off", required: true,
    placeholder: "gpt_…", spellcheck: "false", "aria-label": "API token" });
  const form = h("form", { class: "login", id: "login-form", onsubmit: async (e) => {
    e.preventDefault();
    error.textContent = "";
    const ok = await signIn(input.value.trim());
    if (!ok) { error.textContent = state.loginError; input.select(); }
  } },
  h("div", { class: "login-brand" }, h("img", { src: "favicon.svg", alt: "", width: 40, height: 40 }),
    h("div", {}, h("h1", {}, "gpupool"), h("p", {}, "One governed, shared GPU pool"))),
  h("label", { for: "token" }, "API token"), input,
  h("button", { type: "submit", class: "primary" }, "Sign in"), error,
  h("p", { class: "hint" }, "Use the admin token that ", h("code", {}, "gpupool up"), " printed (also in ",
    h("code", {}, ".gpupool/admin-token"), "), or one from ", h("code", {}, "gpupool token create"),
    ". It stays in this tab only."));
  put(main, h("div", { class: "login-wrap" }, form));
  if (message) error.textContent = message;
  input.focus();
}

async function signIn(token) {
  if (!token) { state.loginError = "Paste a token first."; return false; }
  api.setToken(token);
  try {
    const who = await api.get("/v1/whoami");
    state.session = new Session(who);
  } catch (err) {
    api.setToken("");
    state.loginError = err.status === 401 ? `Sign-in refused: ${err.message} (${err.reason}).`
      : `The gateway did not answer: ${err.message}`;
    return false;
  }
  await api.loadPaths();
  startApp();
  return true;
}

function startApp() {
  const s = state.session;
  document.getElementById("topbar").hidden = false;
  const who = document.getElementById("who");
  put(who, h("strong", {}, s.subject), h("span", { class: "role" }, s.role), s.team ? h("span", { class: "team" }, s.team) : null);
  who.dataset.role = s.role;
  api.onUnauthorized = () => { api.setToken(""); showLogin("Your token is no longer accepted; sign in again."); };
  state.live = new LiveEvents(api, {
    onEvent: (doc) => {
      state.events.unshift(doc);
      if (state.events.length > EVENT_BUFFER) state.events.length = EVENT_BUFFER;
      state.page?.onEvent?.(doc);
      const topics = topicsOf(doc.type);
      if (topics.length) state.page?.refresh(topics);
    },
    onState: (st) => {
      const el = document.getElementById("live");
      el.dataset.state = st;
      el.textContent = { live: "live", connecting: "connecting…", reconnecting: "reconnecting…", off: "offline",
        unavailable: "no live stream", denied: "no live stream" }[st] || st;
    },
  });
  state.live.start();
  route();
}

function route() {
  if (!state.session) return;
  const [name, ...rest] = (location.hash.replace(/^#\/?/, "") || "pool").split("/");
  const pageName = PAGES[name] ? name : "pool";
  const params = rest.map(decodeURIComponent);
  for (const a of document.querySelectorAll("#tabs a")) a.classList.toggle("active", a.dataset.page === pageName);
  if (state.pageName === pageName && state.page?.navigate) { state.page.navigate(params); return; }
  state.page?.unmount?.();
  const root = h("div", { class: `page page-${pageName}`, id: `page-${pageName}` });
  put(main, root);
  state.pageName = pageName;
  document.title = `gpupool · ${{ pool: "Pool", jobs: "Queues & jobs", teams: "Teams & quotas", reports: "Reports" }[pageName]}`;
  state.page = PAGES[pageName].mount({ api, session: state.session, events: state.events, perf: state.perf, toast }, root, params);
}

document.getElementById("signout").addEventListener("click", () => {
  api.setToken("");
  state.session = null;
  state.pageName = null;
  showLogin();
});
window.addEventListener("hashchange", route);

(async () => {
  if (api.token && await signIn(api.token)) return;
  showLogin();
})();

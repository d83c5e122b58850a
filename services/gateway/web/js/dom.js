// Small DOM and formatting helpers. Everything the API returns is set as text (never parsed as HTML).

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key === "style" && typeof value === "object") Object.assign(el.style, value);
    else if (key.startsWith("on") && typeof value === "function") el.addEventListener(key.slice(2), value);
    else if (value === true) el.setAttribute(key, "");
    else el.setAttribute(key, String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === undefined || child === null || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

export function svg(tag, attrs = {}, ...children) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value !== undefined && value !== null) el.setAttribute(key, String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function clear(el) {
  while (el.firstChild) el.firstChild.remove();
  return el;
}

/** Replace an element's children (null, false and undefined are skipped; arrays are flattened). */
export function put(el, ...children) {
  clear(el);
  append(el, children);
  return el;
}

/** A table from column specs {label, value(row) → Node|string, class, num}. */
export function table(columns, rows, { empty = "Nothing here.", rowAttrs } = {}) {
  if (!rows.length) return h("p", { class: "empty" }, empty);
  return h("table", { class: "grid" },
    h("thead", {}, h("tr", {}, columns.map((c) => h("th", { class: cellClass(c) }, c.label)))),
    h("tbody", {}, rows.map((row) => h("tr", rowAttrs ? rowAttrs(row) : {},
      columns.map((c) => h("td", { class: cellClass(c) }, c.value(row)))))));
}

function cellClass(c) {
  return [c.num ? "num" : "", c.class || ""].filter(Boolean).join(" ") || undefined;
}

export function badge(text, kind = text) {
  return h("span", { class: `badge b-${String(kind).replace(/[^a-z0-9_-]/gi, "")}` }, text);
}

export function card(title, ...body) {
  return h("section", { class: "card" }, title ? h("h2", {}, title) : null, ...body);
}

export function notAvailable(what, why) {
  return h("div", { class: "unavailable", "data-unavailable": what },
    h("strong", {}, "Not available"), h("span", {}, ` — ${why}`));
}

export function toast(message, kind = "info") {
  const box = document.getElementById("toasts");
  const el = h("div", { class: `toast t-${kind}`, role: kind === "error" ? "alert" : "status" }, message);
  box.append(el);
  setTimeout(() => el.remove(), kind === "error" ? 8000 : 4000);
}

export const fmt = {
  int: (n) => (n === null || n === undefined ? "—" : Math.round(n).toLocaleString("en-US")),
  num: (n, d = 1) => (n === null || n === undefined || Number.isNaN(n) ? "—"
    : Number(n).toLocaleString("en-US", { maximumFractionDigits: d, minimumFractionDigits: 0 })),
  pct: (n) => (n === null || n === undefined ? "—" : `${Math.round(n)}%`),
  gib: (mib) => (mib === null || mib === undefined ? "—" : `${(mib / 1024).toFixed(mib >= 10240 ? 0 : 1)} GiB`),
  time: (iso) => (iso ? new Date(iso).toLocaleString("en-GB", { dateStyle: "short", timeStyle: "medium" }) : "—"),
  clock: (iso) => (iso ? new Date(iso).toLocaleTimeString("en-GB") : "—"),
  ago(iso, now = Date.now()) {
    if (!iso) return "—";
    return fmt.duration((now - new Date(iso).getTime()) / 1000);
  },
  duration(s) {
    if (s === null || s === undefined || Number.isNaN(s)) return "—";
    s = Math.max(0, s);
    if (s < 60) return `${Math.round(s)}s`;
    const two = (big, bigU, small, smallU) => (small ? `${big}${bigU} ${small}${smallU}` : `${big}${bigU}`);
    if (s < 3600) return two(Math.floor(s / 60), "m", Math.floor(s % 60), "s");
    if (s < 86400) return two(Math.floor(s / 3600), "h", Math.floor((s % 3600) / 60), "m");
    return two(Math.floor(s / 86400), "d", Math.floor((s % 86400) / 3600), "h");
  },
  short: (id) => (id ? String(id).slice(-8) : "—"),
};

/** CSV text (RFC 4180) from rows of objects; the columns are the union of their keys in first-seen order. */
export function toCsv(rows, columns) {
  const cols = columns || [...new Set(rows.flatMap((r) => Object.keys(r)))];
  const cell = (v) => {
    if (v === null || v === undefined) return "";
    const s = typeof v === "object" ? JSON.stringify(v) : String(v);
    return /[",\r\n]/.test(s) ? `"${s.replace(/"/g, '""')}"` : s;
  };
  return [cols.map(cell).join(","), ...rows.map((r) => cols.map((c) => cell(r[c])).join(","))].join("\r\n") + "\r\n";
}

export function download(filename, text, type = "text/csv") {
  const url = URL.createObjectURL(new Blob([text], { type }));
  const a = h("a", { href: url, download: filename, hidden: true });
  document.body.append(a);
  a.click();
  setTimeout(() => { URL.revokeObjectURL(url); a.remove(); }, 1000);
}

/** Calls fn at most once per `ms`, always with the latest call's arguments (trailing edge). */
export function throttle(fn, ms) {
  let timer = null;
  let last = 0;
  return (...args) => {
    const wait = Math.max(0, last + ms - performance.now());
    clearTimeout(timer);
    timer = setTimeout(() => { last = performance.now(); fn(...args); }, wait);
  };
}

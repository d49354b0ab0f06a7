// sluice's status page: one live feed (server-sent events from /ui/events), drawn as worker
// cards, charts of the project's own SVG, and tables. No library, nothing fetched from elsewhere.
"use strict";

const SPAN_SECS = 180; // what the charts show
const W = 600, H = 180, PAD = { l: 40, r: 8, t: 8, b: 18 };
const SVG = "http://www.w3.org/2000/svg";
const COLORS = { admitted: "#4f6bed", completed: "#1f9d55", within_slo: "#0e7490", refused: "#c0262d",
  p50: "#4f6bed", p95: "#d97706", target: "#c0262d" };

let points = [];
let source = null;

const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const node = tag === "svg" || attrs?.svg ? document.createElementNS(SVG, tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "svg" || v === undefined || v === null) continue;
    // Through the CSSOM: the page's policy refuses style attributes.
    if (k === "style") node.style.cssText = v;
    else node.setAttribute(k, v);
  }
  for (const child of children) {
    if (child !== null && child !== undefined) node.append(child);
  }
  return node;
}
const svgEl = (tag, attrs) => el(tag, { ...attrs, svg: true });

function fmt(n, digits = 2) {
  if (n === null || n === undefined) return "–";
  if (n >= 100) return n.toFixed(0);
  return Number(n.toFixed(digits)).toString();
}
const ms = (n) => (n === null || n === undefined ? "none" : `${n} ms`);
const secs = (n) => (n === null || n === undefined ? "–" : n < 1 ? `${(n * 1000).toFixed(0)} ms` : `${n.toFixed(2)} s`);

// ---- worker cards ----

function card(w) {
  const kv = w.engine ? Math.round(w.engine.kv_usage * 100) : null;
  const rows = [
    ["health", `${w.health}, circuit ${w.circuit}`],
    ["engine", w.engine ? `${w.engine.waiting} waiting, ${w.engine.running} running` : "no report"],
    ["KV", kv === null ? "–" : el("span", null, el("span", { class: "bar" }, el("i", { style: `width:${kv}%` })), `${kv}%`)],
    ["requests", `${w.in_flight} in flight, ${w.pending} pending`],
  ];
  if (w.limit !== null && w.limit !== undefined) rows.push(["limit", `${w.limit} (adaptive)`]);
  const dl = el("dl");
  for (const [k, v] of rows) dl.append(el("dt", null, k), el("dd", null, v));
  const vetoes = el("ul", { class: "vetoes" });
  for (const v of w.vetoes) vetoes.append(el("li", { "data-kind": v.kind }, `${v.kind}: ${v.cause}`));
  return el("article", { class: "card", "data-state": w.state, "data-id": w.id },
    el("div", { class: "head" }, el("span", { class: "name" }, w.id), el("span", { class: "badge" }, w.state)),
    el("div", { class: "url", title: w.url }, w.url),
    el("div", { class: "models" }, `${w.role} · ${w.models.join(", ") || "models not yet known"}`),
    dl, w.vetoes.length ? vetoes : null);
}

function renderWorkers(workers) {
  $("workers").replaceChildren(...workers.map(card));
  const ready = workers.filter((w) => w.state === "ready").length;
  const vetoed = workers.filter((w) => w.state === "vetoed").length;
  const down = workers.length - ready - vetoed;
  return `${workers.length} workers: ${ready} ready, ${vetoed} vetoed, ${down} other`;
}

// ---- tables ----

function rows(tbody, data) {
  tbody.replaceChildren(...data.map((cells) => el("tr", null, ...cells.map((c) => el("td", null, c)))));
}

function renderTables(u) {
  const refused = Object.entries(u.point.refused).sort((a, b) => b[1] - a[1]);
  rows($("refused").tBodies[0], refused.length ? refused.map(([code, r]) => [code, fmt(r)]) : [["none", "0"]]);
  rows($("slos").tBodies[0], u.slos.map((s) => [s.tier, ms(s.ttft_ms), ms(s.tpot_ms)]));
  const tiers = u.queue ? u.queue.tiers : [];
  rows($("queue").tBodies[0], u.queue
    ? tiers.map((t) => [t.tier, String(t.depth), secs(t.oldest_wait_secs),
      Object.entries(t.tenants).map(([n, c]) => `${n}: ${c}`).join(", ") || "–"])
    : [["off", "–", "–", "no gateway queue (--queue-size 0)"]]);
  rows($("tenants").tBodies[0], u.tenants.map((t) => [t.name, t.tier, String(t.in_flight)]));
  const d = u.degradation;
  $("degradation").textContent = d ? `level ${d.level}` : "off (no ladder configured)";
  return d ? ` · degradation level ${d.level}` : "";
}

// ---- charts ----

function chart(id, legendId, series, targets = []) {
  const svg = $(id);
  const now = points.length ? points[points.length - 1].t : 0;
  const shown = points.filter((p) => p.t >= now - SPAN_SECS);
  let max = 0;
  for (const s of series) for (const p of shown) max = Math.max(max, s.value(p) ?? 0);
  for (const t of targets) max = Math.max(max, t.value);
  max = max > 0 ? max * 1.1 : 1;
  const x = (t) => PAD.l + ((t - (now - SPAN_SECS)) / SPAN_SECS) * (W - PAD.l - PAD.r);
  const y = (v) => H - PAD.b - (v / max) * (H - PAD.t - PAD.b);
  const parts = [];
  for (const frac of [0, 0.5, 1]) {
    const v = max * frac;
    parts.push(svgEl("line", { class: "axis", x1: PAD.l, x2: W - PAD.r, y1: y(v), y2: y(v) }));
    const label = svgEl("text", { x: 2, y: y(v) + 3 });
    label.textContent = fmt(v);
    parts.push(label);
  }
  const ago = svgEl("text", { x: PAD.l, y: H - 4 });
  ago.textContent = `${SPAN_SECS} s ago`;
  const nowLabel = svgEl("text", { x: W - PAD.r - 20, y: H - 4 });
  nowLabel.textContent = "now";
  parts.push(ago, nowLabel);
  for (const t of targets) {
    parts.push(svgEl("line", { class: "target", stroke: COLORS.target, x1: PAD.l, x2: W - PAD.r, y1: y(t.value), y2: y(t.value) }));
  }
  const legend = [];
  for (const s of series) {
    // A gap where a value is missing: nothing was observed then.
    let run = [];
    const flush = () => {
      if (run.length) parts.push(svgEl("polyline", { stroke: s.color, points: run.join(" "), "data-series": s.name }));
      run = [];
    };
    for (const p of shown) {
      const v = s.value(p);
      if (v === null || v === undefined) flush();
      else run.push(`${x(p.t).toFixed(1)},${y(v).toFixed(1)}`);
    }
    flush();
    const last = shown.length ? s.value(shown[shown.length - 1]) : null;
    legend.push(el("span", { style: `color:${s.color}` }, `${s.name} `, el("b", null, s.unit ? secs(last) : fmt(last)), " "));
  }
  svg.replaceChildren(...parts);
  svg.setAttribute("data-points", String(shown.length));
  $(legendId).replaceChildren(...legend);
}

function drawCharts(u) {
  const refused = (p) => Object.values(p.refused).reduce((a, b) => a + b, 0);
  chart("chart-rates", "legend-rates", [
    { name: "admitted", color: COLORS.admitted, value: (p) => p.admitted },
    { name: "completed", color: COLORS.completed, value: (p) => p.completed },
    { name: "within SLO", color: COLORS.within_slo, value: (p) => p.within_slo },
    { name: "refused", color: COLORS.refused, value: refused },
  ]);
  const ttftTarget = u?.slos?.[0]?.ttft_ms;
  chart("chart-ttft", "legend-ttft", [
    { name: "p50", color: COLORS.p50, value: (p) => p.ttft_p50, unit: "s" },
    { name: "p95", color: COLORS.p95, value: (p) => p.ttft_p95, unit: "s" },
  ], ttftTarget ? [{ value: ttftTarget / 1000 }] : []);
  const tpotTarget = u?.slos?.[0]?.tpot_ms;
  chart("chart-itl", "legend-itl", [
    { name: "p50", color: COLORS.p50, value: (p) => p.itl_p50, unit: "s" },
    { name: "p95", color: COLORS.p95, value: (p) => p.itl_p95, unit: "s" },
  ], tpotTarget ? [{ value: tpotTarget / 1000 }] : []);
}

// ---- the feed ----

let latest = null;

function onUpdate(u) {
  latest = u;
  points.push(u.point);
  const now = u.point.t;
  while (points.length && points[0].t < now - SPAN_SECS - 5) points.shift();
  const summary = renderWorkers(u.workers) + renderTables(u);
  $("summary").textContent = summary;
  drawCharts(u);
}

function connect() {
  $("login").hidden = true;
  $("main").hidden = false;
  source = new EventSource("/ui/events");
  source.addEventListener("history", (e) => {
    points = JSON.parse(e.data);
    drawCharts(latest);
  });
  source.addEventListener("update", (e) => onUpdate(JSON.parse(e.data)));
  source.addEventListener("open", () => {
    $("link").dataset.state = "live";
    $("link").textContent = "live";
  });
  source.addEventListener("error", async () => {
    $("link").dataset.state = "lost";
    $("link").textContent = "reconnecting";
    // A key that no longer holds: ask again rather than retry forever.
    const r = await fetch("/ui/session", { credentials: "same-origin" }).catch(() => null);
    if (r && r.status === 401) {
      source.close();
      showLogin();
    }
  });
}

function showLogin(message) {
  $("main").hidden = true;
  $("login").hidden = false;
  $("link").dataset.state = "lost";
  $("link").textContent = "locked";
  const err = $("login-error");
  err.hidden = !message;
  err.textContent = message || "";
  $("key").focus();
}

async function login(event) {
  event.preventDefault();
  const r = await fetch("/ui/login", {
    method: "POST",
    credentials: "same-origin",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ key: $("key").value }),
  }).catch(() => null);
  $("key").value = "";
  if (r && r.ok) {
    $("logout").hidden = false;
    connect();
  } else {
    showLogin(r ? "That key was refused." : "The gateway did not answer.");
  }
}

async function logout() {
  await fetch("/ui/logout", { method: "POST", credentials: "same-origin" }).catch(() => null);
  if (source) source.close();
  $("logout").hidden = true;
  showLogin();
}

async function start() {
  $("login").addEventListener("submit", login);
  $("logout").addEventListener("click", logout);
  const r = await fetch("/ui/session", { credentials: "same-origin" }).catch(() => null);
  if (r && r.status === 401) showLogin();
  else connect();
}

start();

// optirack live page: draws the rack, its jobs, their charts and the reconfigurations from
// /live/stream (server-sent events: a full picture first, then what changed). No library.
"use strict";

const NS = "http://www.w3.org/2000/svg";
const PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f"];
const FREE = "#d5d9de";
const WINDOW_S = 300; // the charts show at most the last five minutes, at least one
const MIN_WINDOW_S = 60;
const KEEP = {iterations: 3000, ports: 600, events: 50};
const state = {t: 0, rack: null, circuits: [], jobs: {}, order: [], iterations: {}, ports: {}, events: {}};

// --- small helpers -------------------------------------------------------------------------
function svgEl(parent, tag, attrs, text) {
  const e = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  parent.appendChild(e);
  return e;
}
function htmlEl(parent, tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  parent.appendChild(e);
  return e;
}
function clear(e) { while (e.firstChild) e.removeChild(e.firstChild); return e; }
function jobColor(id) {
  const n = parseInt(String(id).replace(/^\D+/, ""), 10);
  let h = 0;
  for (const c of String(id)) h = (h * 31 + c.charCodeAt(0)) >>> 0;
  return PALETTE[(Number.isNaN(n) ? h : n) % PALETTE.length];
}
function gpuColor(i) { return PALETTE[i % PALETTE.length]; }
function fmt(v, digits) { return v === null || v === undefined ? "–" : Number(v).toFixed(digits); }
function clock(t) { return new Date(t * 1000).toLocaleTimeString([], {hour12: false}); }
function append(store, key, points, keep) {
  const list = (store[key] = (store[key] || []).concat(points));
  if (list.length > keep) list.splice(0, list.length - keep);
}

// --- the stream ------------------------------------------------------------------------------
function apply(msg) {
  state.t = msg.t;
  if (msg.rack) state.rack = msg.rack;
  if (msg.circuits) state.circuits = msg.circuits;
  Object.assign(state.jobs, msg.jobs || {});
  state.order = msg.job_order || state.order;
  for (const [id, pts] of Object.entries(msg.iterations || {})) append(state.iterations, id, pts, KEEP.iterations);
  for (const [gpu, pts] of Object.entries(msg.ports || {})) append(state.ports, gpu, pts, KEEP.ports);
  for (const ev of msg.events || []) state.events[ev.id] = ev;
  const ids = Object.keys(state.events).map(Number).sort((a, b) => a - b);
  for (const id of ids.slice(0, Math.max(0, ids.length - KEEP.events))) delete state.events[id];
  render();
}

function connect() {
  const status = document.getElementById("status");
  const source = new EventSource("/live/stream");
  source.onopen = () => { status.textContent = "live"; status.className = "status on"; };
  source.onerror = () => { status.textContent = "reconnecting…"; status.className = "status off"; };
  source.onmessage = (e) => apply(JSON.parse(e.data));
}

function render() {
  if (!state.rack) return;
  document.getElementById("rack-name").textContent = state.rack.rack;
  document.getElementById("clock").textContent = clock(state.t);
  drawRack();
  drawJobs();
  drawIterations();
  drawPorts();
  drawEvents();
}

// --- the rack ----------------------------------------------------------------------------------
function layoutGpus(rack) {
  const SLOT = 66, GAP = 18, M = 24;
  const list = Object.entries(rack.servers);
  const used = list.reduce((acc, [, s]) => acc + SLOT * s.gpus.length + GAP, -GAP);
  const width = Math.max(used + 2 * M, 640);
  const gx = {}, servers = [];
  let x = (width - used) / 2;
  for (const [name, s] of list) {
    const x0 = x;
    for (const g of s.gpus) { gx[g] = x + SLOT / 2; x += SLOT; }
    servers.push({name, x0, x1: x});
    x += GAP;
  }
  return {gx, servers, width};
}

function layoutSwitches(rack, width, y) {
  const at = {};
  const place = (names, row) => names.forEach((n, i) => {
    const sw = rack.switches[n];
    const w = Math.max(96, 16 * sw.downlinks.length + 24);
    at[n] = {x: (width * (i + 0.5)) / names.length, y: row, w, h: 30};
  });
  const names = Object.keys(rack.switches);
  const core = names.filter((n) => rack.switches[n].role === "core");
  place(core, y);
  place(names.filter((n) => rack.switches[n].role !== "core"), core.length ? y + 80 : y);
  return at;
}

function layoutOcs(rack, gx, sw, width, y, h) {
  const ports = {}, boxes = {};
  const names = Object.keys(rack.ocs);
  const sides = {};
  for (const n of names) sides[n] = {top: [], bottom: []};
  for (const [g, info] of Object.entries(rack.gpus)) {
    const [o] = info.ocs_port.split(":");
    sides[o].bottom.push({ref: info.ocs_port, x: gx[g]});
  }
  for (const [name, s] of Object.entries(rack.switches)) {
    s.downlinks.forEach((d, i) => {
      const [o] = d.ocs_port.split(":");
      const a = sw[name];
      const n = s.downlinks.length;
      sides[o].top.push({ref: d.ocs_port, x: a.x - a.w / 2 + 12 + (n > 1 ? (i * (a.w - 24)) / (n - 1) : (a.w - 24) / 2)});
    });
  }
  // Best: each port right above (or below) what it is cabled to, if the OCS boxes then do not overlap.
  const spans = names.map((n) => {
    const xs = [...sides[n].top, ...sides[n].bottom].map((p) => p.x);
    return xs.length ? [Math.min(...xs) - 24, Math.max(...xs) + 24] : null;
  });
  const sorted = spans.filter(Boolean).sort((a, b) => a[0] - b[0]);
  if (spans.every(Boolean) && sorted.every((s, i) => i === 0 || s[0] > sorted[i - 1][1] + 8)) {
    names.forEach((n, i) => {
      boxes[n] = {x: spans[i][0], y, w: spans[i][1] - spans[i][0], h};
      for (const p of sides[n].top) ports[p.ref] = {x: p.x, y, from: p.x};
      for (const p of sides[n].bottom) ports[p.ref] = {x: p.x, y: y + h, from: p.x};
    });
    return {ports, boxes};
  }
  const total = names.reduce((acc, n) => acc + Math.max(sides[n].top.length, sides[n].bottom.length, 1), 0);
  let x = 24;
  for (const n of names) {
    const count = Math.max(sides[n].top.length, sides[n].bottom.length, 1);
    const w = ((width - 48) * count) / total - 16;
    boxes[n] = {x, y, w, h};
    for (const [side, py] of [["top", y], ["bottom", y + h]]) {
      const list = sides[n][side].sort((a, b) => a.x - b.x);
      list.forEach((p, i) => { ports[p.ref] = {x: x + ((i + 0.5) * w) / list.length, y: py, from: p.x}; });
    }
    x += w + 16;
  }
  return {ports, boxes};
}

function drawRack() {
  const rack = state.rack;
  const svg = clear(document.getElementById("rack"));
  const {gx, servers, width} = layoutGpus(rack);
  const hasCore = Object.values(rack.switches).some((s) => s.role === "core");
  const ySw = 46, yAgg = hasCore ? 126 : 46, yOcs = yAgg + 96, hOcs = 96, yGpu = yOcs + hOcs + 64;
  const height = yGpu + 74;
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  const sw = layoutSwitches(rack, width, ySw);
  const {ports, boxes} = layoutOcs(rack, gx, sw, width, yOcs, hOcs);
  const gpuAt = (g) => ({x: gx[g], y: yGpu});

  // fibres: GPU NIC -> OCS port, switch downlink -> OCS port
  for (const [g, info] of Object.entries(rack.gpus)) {
    const p = ports[info.ocs_port];
    if (p) svgEl(svg, "line", {class: "fibre", x1: gx[g], y1: yGpu, x2: p.x, y2: p.y});
  }
  for (const p of Object.values(ports)) {
    if (p.y === yOcs) svgEl(svg, "line", {class: "fibre", x1: p.from, y1: yAgg + 15, x2: p.x, y2: p.y});
  }
  // uplinks, each drawn once
  const seen = new Set();
  for (const [name, s] of Object.entries(rack.switches)) {
    for (const u of s.uplinks) {
      const [peer] = u.peer.split(":");
      const key = [`${name}:${u.port}`, u.peer].sort().join(" ");
      if (seen.has(key) || !sw[peer]) continue;
      seen.add(key);
      const a = sw[name], b = sw[peer];
      let d;
      if (a.y === b.y) {
        d = `M${a.x} ${a.y - 15} Q${(a.x + b.x) / 2} ${a.y - 60} ${b.x} ${b.y - 15}`;
      } else {
        const [lo, hi] = a.y > b.y ? [a, b] : [b, a];
        d = `M${lo.x} ${lo.y - 15} L${hi.x} ${hi.y + 15}`;
      }
      svgEl(svg, "path", {class: "uplink", d, "data-uplink": key});
      const mid = a.y === b.y ? {x: (a.x + b.x) / 2, y: a.y - 40} : {x: (a.x + b.x) / 2 + 6, y: (a.y + b.y) / 2};
      svgEl(svg, "text", {class: "small", x: mid.x, y: mid.y, "text-anchor": "middle"}, `${u.rate_gbps} Gb/s`);
    }
  }
  // OCS boxes and their circuits
  for (const [name, b] of Object.entries(boxes)) {
    const o = rack.ocs[name];
    svgEl(svg, "rect", {class: `device${o.connected ? "" : " down"}`, x: b.x, y: b.y, width: b.w, height: b.h, rx: 6});
    svgEl(svg, "text", {class: "label", x: b.x - 8, y: b.y + b.h / 2 - 2, "text-anchor": "end"}, `${name}`);
    svgEl(svg, "text", {class: "small", x: b.x - 8, y: b.y + b.h / 2 + 10, "text-anchor": "end"},
          `OCS · ${o.switching_time_ms} ms${o.connected ? "" : " (down)"}`);
  }
  const jobOfPort = {};
  for (const info of Object.values(rack.gpus)) jobOfPort[info.ocs_port] = info.job;
  for (const [a, b] of state.circuits) {
    const pa = ports[a], pb = ports[b];
    if (!pa || !pb) continue;
    const job = jobOfPort[a] || jobOfPort[b];
    const [lo, hi] = pa.y > pb.y ? [pa, pb] : [pb, pa];
    const my = (lo.y + hi.y) / 2;
    svgEl(svg, "path", {class: "circuit", "data-circuit": `${a} ${b}`, stroke: job ? jobColor(job) : "#718096",
                        d: `M${lo.x} ${lo.y} C${lo.x} ${my} ${hi.x} ${my} ${hi.x} ${hi.y}`});
  }
  for (const [ref, p] of Object.entries(ports)) {
    svgEl(svg, "circle", {cx: p.x, cy: p.y, r: 2.5, fill: "#4a5568"}).appendChild(titleOf(ref));
  }
  // switches
  for (const [name, a] of Object.entries(sw)) {
    const s = rack.switches[name];
    svgEl(svg, "rect", {class: `device${s.connected ? "" : " down"}`, x: a.x - a.w / 2, y: a.y - 15, width: a.w,
                        height: a.h, rx: 4, "data-switch": name});
    svgEl(svg, "text", {class: "label", x: a.x, y: a.y + 4, "text-anchor": "middle"},
          `${name}${s.connected ? "" : " (down)"}`);
  }
  // servers and GPUs
  for (const s of servers) {
    svgEl(svg, "rect", {class: "server", x: s.x0 + 2, y: yGpu - 8, width: s.x1 - s.x0 - 4, height: 60, rx: 5});
    svgEl(svg, "text", {class: "small", x: (s.x0 + s.x1) / 2, y: yGpu + 64, "text-anchor": "middle"}, s.name);
  }
  for (const [g, info] of Object.entries(rack.gpus)) {
    const p = gpuAt(g);
    const r = svgEl(svg, "rect", {class: "gpu", x: p.x - 27, y: p.y, width: 54, height: 40, rx: 4,
                                  fill: info.job ? jobColor(info.job) : FREE, "data-gpu": g, "data-job": info.job || ""});
    r.appendChild(titleOf(`${g} · ${info.model} · ${info.ip} · ${info.switch ? info.switch.name : "no switch"}` +
                          (info.job ? ` · ${info.job}` : "")));
    svgEl(svg, "text", {class: "label", x: p.x, y: p.y + 17, "text-anchor": "middle"}, g);
    svgEl(svg, "text", {class: info.job ? "small on-job" : "small", x: p.x, y: p.y + 31, "text-anchor": "middle"}, info.model);
  }
}

function titleOf(text) {
  const t = document.createElementNS(NS, "title");
  t.textContent = text;
  return t;
}

// --- jobs and the regroup button -----------------------------------------------------------------
function drawJobs() {
  const body = clear(document.querySelector("#jobs tbody"));
  for (const id of state.order) {
    const j = state.jobs[id];
    if (!j) continue;
    const tr = htmlEl(body, "tr", {"data-job": id, "data-state": j.state});
    const name = htmlEl(tr, "td");
    htmlEl(name, "span", {class: "swatch", style: `background:${jobColor(id)}`});
    const ext = j.request && j.request.external;  // a job Slurm scheduled: its id and user, no iterations here
    const label = ext ? `${id} (${ext.scheduler} job ${ext.job} of ${ext.user || "?"})` : j.name ? `${id} (${j.name})` : id;
    name.appendChild(document.createTextNode(label));
    const st = htmlEl(tr, "td");
    htmlEl(st, "span", {class: `state state-${j.state}`, title: j.reason || j.note || ""}, j.state);
    const gpus = htmlEl(tr, "td", {}, (j.gpus || []).join(", "));
    const lagging = Object.keys(j.lagging || {});  // stragglers: slow ranks, reported, not swapped
    if (lagging.length) {
      htmlEl(gpus, "span", {class: "lagging", title: Object.values(j.lagging).join("; ")}, ` (lagging: ${lagging.join(", ")})`);
    }
    htmlEl(tr, "td", {}, (j.switches || []).join(", "));
    const agg = j.aggregation;  // where a job that asked for aggregation sums its gradients, or why it runs as a ring
    htmlEl(tr, "td", {class: "collective", title: agg && agg.reason ? agg.reason : ""},
      !agg ? "ring" : agg.collective === "aggregate" ? `aggregate at ${agg.switch} (${agg.address})` : `ring: ${agg.reason}`);
    htmlEl(tr, "td", {}, ext ? `ranks run by ${ext.scheduler}; circuit events ${(j.events || []).join(", ") || "none"}`
      : `${j.iterations_done ?? 0} / ${j.iterations_total ?? "?"}`);
    htmlEl(tr, "td", {}, j.mean_iteration_s == null ? "–" : `${fmt(j.mean_iteration_s, 3)} s`);
    htmlEl(tr, "td", {}, j.mean_gpu_util == null ? "–" : `${fmt(100 * j.mean_gpu_util, 0)} %`);
  }
  const select = document.getElementById("regroup-target");
  const keep = select.value;
  const running = state.order.filter((id) => state.jobs[id] && state.jobs[id].state === "running");
  const wanted = ["", ...running];
  const have = Array.from(select.options).map((o) => o.value);
  if (wanted.join() !== have.join()) {
    clear(select);
    htmlEl(select, "option", {value: ""}, "the whole rack");
    for (const id of running) htmlEl(select, "option", {value: id}, id);
    select.value = wanted.includes(keep) ? keep : "";
  }
}

function askToken() {
  const dialog = document.getElementById("token-dialog");
  const input = document.getElementById("token");
  input.value = "";
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok" && input.value.trim() ? input.value.trim() : null),
                            {once: true});
    dialog.showModal();
  });
}

async function regroup() {
  const out = document.getElementById("regroup-result");
  const target = document.getElementById("regroup-target").value;
  let token = sessionStorage.getItem("optirack-token");
  if (!token) token = await askToken();
  if (!token) return;
  out.className = "";
  out.textContent = "regrouping…";
  const url = target ? `/api/v1/jobs/${encodeURIComponent(target)}/regroup` : "/api/v1/regroup";
  let resp, body;
  try {
    resp = await fetch(url, {method: "POST", headers: {Authorization: `Bearer ${token}`}});
    body = await resp.json().catch(() => ({}));
  } catch (e) {
    out.className = "error";
    out.textContent = `cannot reach the controller: ${e}`;
    return;
  }
  if (!resp.ok) {
    if (resp.status === 401) sessionStorage.removeItem("optirack-token");
    out.className = "error";
    out.textContent = `${resp.status}: ${(body.error && body.error.message) || resp.statusText}`;
    return;
  }
  sessionStorage.setItem("optirack-token", token);
  const results = body.results || [body];
  out.textContent = results.map((r) => {
    const id = r.job && r.job.id ? r.job.id : r.job;
    if (r.error) return `${id}: ${r.error}`;
    const ev = r.event;
    return ev ? `${id}: under ${(r.switches || (r.job && r.job.switches) || []).join(", ")}, dark ${fmt(1000 * ev.dark_window_s, 0)} ms`
              : `${id}: ${r.note || "unchanged"}`;
  }).join("; ") || "no running job";
}

// --- charts ------------------------------------------------------------------------------------------
function timeWindow() {
  // The last five minutes, or less while there is less to show, so a young rack fills the charts.
  let first = state.t;
  for (const pts of [...Object.values(state.ports), ...Object.values(state.iterations)]) {
    if (pts.length) first = Math.min(first, pts[0][0]);
  }
  for (const e of Object.values(state.events)) first = Math.min(first, e.requested_at);
  const span = Math.min(WINDOW_S, Math.max(MIN_WINDOW_S, state.t - first + 5));
  return [state.t - span, state.t];
}

function timeTicks(svg, xs, t0, t1, y) {
  const span = t1 - t0;
  const step = span <= 90 ? 15 : span <= 180 ? 30 : 60;
  for (let s = 0; s <= span; s += step) {
    const label = s === 0 ? "now" : s % 60 === 0 ? `−${s / 60} min` : `−${s} s`;
    svgEl(svg, "text", {class: "tick", x: xs(t1 - s), y, "text-anchor": "middle"}, label);
  }
}

function niceMax(v) {
  if (!(v > 0)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(v)));
  return [1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10].map((m) => m * p).find((m) => m >= v);
}

function chart(id, series, opts) {
  const svg = clear(document.getElementById(id));
  const W = 600, H = opts.height || 230, L = 46, R = 8, T = 22, B = 20;
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  const [t0, t1] = timeWindow();
  const xs = (t) => L + ((t - t0) / (t1 - t0)) * (W - L - R);
  let max = 0;
  for (const s of series) for (const [t, v] of s.pts) if (t >= t0 && v > max) max = v;
  max = niceMax(max * 1.05);
  const ys = (v) => H - B - (v / max) * (H - T - B);
  for (const [a, b] of opts.bands || []) {
    if (b < t0) continue;
    const x = xs(Math.max(a, t0));
    svgEl(svg, "rect", {x, y: T, width: Math.max(2, xs(b) - x), height: H - T - B, fill: "#2d3748", opacity: 0.25});
  }
  for (let i = 0; i <= 4; i++) {
    const v = (max * i) / 4, y = ys(v);
    svgEl(svg, "line", {class: "axis", x1: L, x2: W - R, y1: y, y2: y});
    svgEl(svg, "text", {class: "tick", x: L - 4, y: y + 3, "text-anchor": "end"}, opts.format(v));
  }
  timeTicks(svg, xs, t0, t1, H - 6);
  let lx = L;
  for (const s of series) {
    const pts = s.pts.filter(([t]) => t >= t0).map(([t, v]) => `${xs(t).toFixed(1)},${ys(v).toFixed(1)}`);
    svgEl(svg, "polyline", {fill: "none", stroke: s.color, "stroke-width": 1.6, points: pts.join(" "),
                            "data-series": s.key, "data-points": s.pts.length});
    svgEl(svg, "rect", {x: lx, y: 6, width: 10, height: 10, fill: s.color});
    svgEl(svg, "text", {class: "tick", x: lx + 13, y: 15}, s.label);
    lx += 18 + 6.5 * s.label.length;
  }
  if (!series.length) svgEl(svg, "text", {class: "tick", x: W / 2, y: H / 2, "text-anchor": "middle"}, opts.empty);
}

function darkWindows() {
  return Object.values(state.events).filter((e) => e.dark_start && e.dark_end).map((e) => [e.dark_start, e.dark_end]);
}

function drawIterations() {
  const series = state.order.filter((id) => (state.iterations[id] || []).length).map((id) => ({
    key: id, label: id, color: jobColor(id), pts: state.iterations[id].map(([t, s]) => [t, s])}));
  chart("chart-iterations", series, {format: (v) => `${v.toFixed(2)} s`, bands: darkWindows(),
                                     empty: "no job has reported an iteration yet"});
}

function drawPorts() {
  const gpus = Object.keys(state.rack.gpus);
  const series = gpus.filter((g) => (state.ports[g] || []).length).map((g) => ({
    key: g, label: g, color: gpuColor(gpus.indexOf(g)), pts: state.ports[g].map(([t, tx]) => [t, tx / 1e6])}));
  chart("chart-ports", series, {format: (v) => (v >= 10 ? v.toFixed(0) : String(+v.toFixed(2))), empty: "no port statistics yet"});
}

function drawEvents() {
  const svg = clear(document.getElementById("timeline"));
  const W = 600, H = 90, L = 46, R = 8;
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  const [t0, t1] = timeWindow();
  const xs = (t) => L + ((t - t0) / (t1 - t0)) * (W - L - R);
  svgEl(svg, "line", {class: "axis", x1: L, x2: W - R, y1: 60, y2: 60});
  timeTicks(svg, xs, t0, t1, 78);
  const events = Object.values(state.events).sort((a, b) => a.id - b.id);
  let lastLabel = -Infinity;
  for (const e of events) {
    const end = e.flows_confirmed_at || t1;
    if (end < t0) continue;
    const x = xs(Math.max(e.requested_at, t0));
    const g = svgEl(svg, "g", {"data-event": e.id});
    g.appendChild(titleOf(`#${e.id} ${e.kind} ${e.job || ""}: ${e.reason}`));
    svgEl(g, "rect", {x, y: 30, width: Math.max(3, xs(end) - x), height: 24, fill: e.status === "failed" ? "#e53e3e" : "#90cdf4"});
    if (e.dark_start && e.dark_end) {
      const dx = xs(e.dark_start);
      svgEl(g, "rect", {x: dx, y: 30, width: Math.max(2, xs(e.dark_end) - dx), height: 24, fill: "#1a202c"});
    }
    if (x - lastLabel > 22) {
      svgEl(g, "text", {class: "tick", x, y: 25}, `#${e.id}`);
      lastLabel = x;
    }
  }
  const body = clear(document.querySelector("#events tbody"));
  for (const e of events.slice(-8).reverse()) {
    const tr = htmlEl(body, "tr", {"data-event": e.id});
    htmlEl(tr, "td", {}, e.id);
    htmlEl(tr, "td", {}, clock(e.requested_at));
    htmlEl(tr, "td", {}, e.kind);
    htmlEl(tr, "td", {}, e.job || "");
    htmlEl(tr, "td", {}, `−${e.removed.length} +${e.added.length}`);
    htmlEl(tr, "td", {}, e.dark_window_s == null ? "–" : `${fmt(1000 * e.dark_window_s, 1)} ms`);
    htmlEl(tr, "td", {}, e.overhead_s == null ? "–" : `${fmt(1000 * e.overhead_s, 1)} ms`);
    htmlEl(tr, "td", {title: e.error || ""}, e.status);
  }
}

document.getElementById("regroup").addEventListener("click", regroup);
connect();

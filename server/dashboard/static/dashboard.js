// geofl live dashboard: plain JavaScript, hand-written SVG charts, nothing fetched but
// this server's own /api/events stream (server-sent events: a snapshot, then deltas).
"use strict";

(function () {
  const PHASES = ["select", "advertise", "share", "broadcast", "fit", "unmask",
    "aggregate", "evaluate", "commit"];
  const COLORS = ["#37c", "#d54", "#3a6", "#b70", "#839"];
  const state = { run: {}, runs: [], rounds: [], current: null, regions: {}, clients: {}, aborts: [] };
  const rows = new Map(); // node id -> <tr>
  // What tests and benchmarks read: first render and each update's cost.
  const probe = window.geoflDashboard = {
    firstRenderMs: null, firstFrameMs: null, seq: -1, updates: [], snapshots: 0 };

  const $ = (id) => document.getElementById(id);
  const fmtBytes = (n) => {
    if (n === null || n === undefined) return "–";
    const units = ["B", "kB", "MB", "GB", "TB"];
    let i = 0;
    while (n >= 1000 && i < units.length - 1) { n /= 1000; i += 1; }
    return (i ? n.toFixed(1) : String(n)) + " " + units[i];
  };
  const fmt = (v, digits) => (v === null || v === undefined ? "–" : Number(v).toFixed(digits));
  const mbps = (bps) => (bps === null || bps === undefined ? "–" : (bps / 1e6).toFixed(2));
  const esc = (s) => String(s === null || s === undefined ? "" : s)
    .replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");

  // ------------------------------------------------------------ header and runs

  function renderRun() {
    const run = state.run;
    $("run-name").textContent = run.name || "";
    const status = $("run-status");
    status.textContent = run.status || "";
    status.className = "badge " + (run.status || "");
    const planned = run.rounds_planned ? " / " + run.rounds_planned : "";
    $("run-progress").textContent = "committed " + (run.last_committed_round || 0) + planned
      + (run.simulated_clock ? " · virtual clock" : "");
    for (const other of state.runs) {
      if (other.id === run.id) Object.assign(other, run);
    }
    renderRuns();
  }

  function renderRuns() {
    $("runs").tBodies[0].innerHTML = state.runs.map((r) =>
      `<tr><td>${r.id}</td><td>${esc(r.name)}</td><td>${esc(r.status)}</td>` +
      `<td class="num">${r.last_committed_round}${r.rounds_planned ? " / " + r.rounds_planned : ""}</td></tr>`
    ).join("");
  }

  // ------------------------------------------------------------ current round

  function renderCurrent() {
    const current = state.current;
    const list = $("phases");
    if (!current) {
      list.innerHTML = "";
      $("current-number").textContent = "";
      $("progress-text").textContent = "waiting for a round";
      $("progress-bar").style.width = "0";
      renderSecagg();
      return;
    }
    $("current-number").textContent = current.number;
    // Secure aggregation's stages only where this round has them.
    const secure = ["advertise", "share", "unmask"];
    const shown = PHASES.filter((p) => !secure.includes(p) || p in current.phase_s ||
      p === current.phase || current.stages[p]);
    const at = shown.indexOf(current.phase);
    list.innerHTML = shown.map((p, i) => {
      const cls = current.phase === "failed" ? "" : i < at || (current.ended && i === at) ? "done" : i === at ? "now" : "";
      const secs = current.phase_s[p];
      return `<li class="${cls}">${p}${secs === undefined ? "" : " " + secs.toFixed(2) + "s"}</li>`;
    }).join("") + (current.phase === "failed" ? '<li class="now">failed</li>' : "");
    const target = Math.max(current.cohort_target, 1);
    const fraction = Math.min(current.settled / target, 1);
    $("progress-bar").style.width = (100 * fraction).toFixed(1) + "%";
    const counts = Object.entries(current.by_status).map(([k, v]) => `${k} ${v}`).join(", ");
    $("progress-text").textContent = `${current.settled} task(s) settled for a cohort of ` +
      `${current.cohort_target}` + (counts ? ` (${counts})` : "");
    renderSecagg();
  }

  function renderSecagg() {
    const current = state.current;
    const stages = current ? current.stages : {};
    const kinds = ["advertise", "share", "fit", "unmask"].filter((k) => stages[k]);
    let html = "";
    if (kinds.length) {
      html += "<table><thead><tr><th>stage</th><th>ok</th><th>dropouts</th></tr></thead><tbody>";
      for (const kind of kinds) {
        const counts = stages[kind];
        const ok = counts.ok || 0;
        const dropped = Object.entries(counts).filter(([k]) => k !== "ok").reduce((a, [, v]) => a + v, 0);
        html += `<tr><td>${kind}</td><td class="num">${ok}</td><td class="num">${dropped}</td></tr>`;
      }
      html += "</tbody></table>";
    } else {
      html += "<p>no secure-aggregation stage in the current round</p>";
    }
    html += `<p>aborted rounds: ${state.aborts.length}</p>`;
    if (state.aborts.length) {
      html += "<ul>" + state.aborts.slice(-5).map((a) =>
        `<li>round ${a.round}: ${esc(a.stage)}</li>`).join("") + "</ul>";
    }
    $("secagg").innerHTML = html;
  }

  // ------------------------------------------------------------ charts

  function lineChart(svg, series, options) {
    const width = svg.clientWidth || 360;
    const height = svg.clientHeight || 170;
    const left = 46, bottom = 18, top = 6, right = 8;
    let xmax = 1, ymin = Infinity, ymax = -Infinity;
    for (const s of series) {
      for (const [x, y] of s.points) {
        if (x > xmax) xmax = x;
        if (y < ymin) ymin = y;
        if (y > ymax) ymax = y;
      }
    }
    if (!isFinite(ymin)) { ymin = 0; ymax = 1; }
    if (options && options.zero) ymin = Math.min(0, ymin);
    if (ymax === ymin) ymax = ymin + 1;
    const sx = (x) => left + (x - 1) / Math.max(xmax - 1, 1) * (width - left - right);
    const sy = (y) => top + (1 - (y - ymin) / (ymax - ymin)) * (height - top - bottom);
    const label = options && options.bytes ? fmtBytes : (v) => Number(v).toPrecision(3);
    let html = `<line class="axis" x1="${left}" y1="${height - bottom}" x2="${width - right}" y2="${height - bottom}"/>` +
      `<line class="axis" x1="${left}" y1="${top}" x2="${left}" y2="${height - bottom}"/>` +
      `<text x="2" y="${top + 8}">${label(ymax)}</text><text x="2" y="${height - bottom}">${label(ymin)}</text>` +
      `<text x="${width - right - 40}" y="${height - 4}">round ${xmax}</text>`;
    let legendX = left + 6;  // legend entries side by side, each as wide as its name
    series.forEach((s, i) => {
      const pts = s.points.map(([x, y]) => sx(x).toFixed(1) + "," + sy(y).toFixed(1)).join(" ");
      html += `<polyline stroke="${COLORS[i % COLORS.length]}" points="${pts}"/>`;
      // A class, not a fill attribute: the stylesheet's text colour would win over it.
      html += `<text class="series${i % COLORS.length}" x="${legendX}" y="${top + 10}">${esc(s.name)}</text>`;
      legendX += 6 * s.name.length + 12;
    });
    svg.innerHTML = html;
  }

  function pointsOf(pick) {
    const out = [];
    for (const r of state.rounds) {
      const y = pick(r);
      if (y !== null && y !== undefined && isFinite(y)) out.push([r.number, y]);
    }
    return out;
  }

  function accuracyOf(source) {
    return (r) => (r.metrics && r.metrics[source] ? r.metrics[source].accuracy : undefined);
  }

  function renderCharts() {
    const accuracy = ["server_eval", "eval", "fit"]
      .map((s) => ({ name: s + " accuracy", points: pointsOf(accuracyOf(s)) }))
      .filter((s) => s.points.length);
    lineChart($("chart-accuracy"), accuracy, {});
    const losses = [["train", "train_loss"], ["eval", "eval_loss"], ["server eval", "server_eval_loss"]]
      .map(([name, key]) => ({ name, points: pointsOf((r) => r[key]) }))
      .filter((s) => s.points.length);
    lineChart($("chart-loss"), losses, {});
    lineChart($("chart-time"), [{ name: "seconds", points: pointsOf((r) => r.duration_s) }], { zero: true });
    lineChart($("chart-bytes"), [
      { name: "up", points: pointsOf((r) => r.bytes_up) },
      { name: "down", points: pointsOf((r) => r.bytes_down) },
    ], { zero: true, bytes: true });
  }

  // ------------------------------------------------------------ regions and relays

  function renderRegions() {
    const entries = Object.entries(state.regions).sort();
    let max = 1;
    for (const [, t] of entries) max = Math.max(max, t.bytes_up, t.bytes_down);
    $("regions").innerHTML = entries.length ? "<table>" + entries.map(([region, t]) =>
      `<tr><td>${esc(region)}</td><td><span class="bar" style="width:${(120 * t.bytes_up / max).toFixed(0)}px"></span> ` +
      `up ${fmtBytes(t.bytes_up)}<br><span class="bar down" style="width:${(120 * t.bytes_down / max).toFixed(0)}px"></span> ` +
      `down ${fmtBytes(t.bytes_down)}</td></tr>`).join("") + "</table>" : "<p>no traffic yet</p>";
  }

  function renderRelays() {
    const regions = new Map();
    for (const client of Object.values(state.clients)) {
      const region = client.region || "none";
      if (!regions.has(region)) regions.set(region, { relays: [], clients: 0, online: 0 });
      const entry = regions.get(region);
      if (client.relay) entry.relays.push(client);
      else { entry.clients += 1; if (client.online) entry.online += 1; }
    }
    let html = "<ul><li>coordinator<ul>";
    for (const [region, entry] of [...regions.entries()].sort()) {
      html += `<li>region ${esc(region)}<ul>`;
      for (const relay of entry.relays) {
        html += `<li>relay ${esc(relay.name)} · ${relay.online ? "online" : "offline"}` +
          (relay.status ? ` · last ${esc(relay.status)}` : "") + `</li>`;
      }
      if (entry.clients) html += `<li>${entry.online} / ${entry.clients} direct client(s) online</li>`;
      html += "</ul></li>";
    }
    $("relays").innerHTML = html + "</ul></li></ul>";
  }

  // ------------------------------------------------------------ clients

  function cells(c) {
    return [c.name, c.region || "–", c.online ? "yes" : "no",
      c.status ? c.kind + " " + c.status : "–", c.round === null ? "–" : c.round,
      c.tasks, c.failures, c.rtt_s === null ? "–" : fmt(c.rtt_s * 1000, 0),
      mbps(c.down_bps), mbps(c.up_bps), fmtBytes(c.bytes_up), fmtBytes(c.bytes_down)];
  }

  function rowHtml(id, c) {
    const cls = c.status ? "st-" + c.status : "";
    return `<tr data-node="${id}" class="${cls}">` + cells(c).map((v, i) =>
      `<td${i >= 4 ? ' class="num"' : ""}>${esc(v)}</td>`).join("") + "</tr>";
  }

  function renderClients() {
    const ids = Object.keys(state.clients).sort((a, b) => a - b);
    const body = $("clients").tBodies[0];
    body.innerHTML = ids.map((id) => rowHtml(id, state.clients[id])).join("");
    rows.clear();
    for (const tr of body.rows) rows.set(tr.dataset.node, tr);
    countClients();
  }

  function updateClient(id, c) {
    const tr = rows.get(id);
    if (!tr) { renderClients(); return; }
    const values = cells(c);
    for (let i = 0; i < values.length; i += 1) {
      const text = String(values[i]);
      if (tr.cells[i].textContent !== text) tr.cells[i].textContent = text;
    }
    tr.className = c.status ? "st-" + c.status : "";
  }

  function countClients() {
    const all = Object.values(state.clients);
    $("clients-count").textContent = `(${all.filter((c) => c.online).length} online of ${all.length})`;
  }

  // ------------------------------------------------------------ the stream

  function renderAll() {
    renderRun(); renderCurrent(); renderCharts(); renderRegions(); renderRelays(); renderClients();
  }

  // Clients travel as lists in the order of the snapshot's client_fields (smaller, faster).
  let fields = [];
  function toClient(row) {
    const client = {};
    for (let i = 0; i < fields.length; i += 1) client[fields[i]] = row[i];
    return client;
  }

  function applySnapshot(data) {
    fields = data.client_fields;
    const clients = {};
    for (const [id, row] of Object.entries(data.clients)) clients[id] = toClient(row);
    Object.assign(state, data, { clients });
    renderAll();
    probe.seq = data.seq;
    probe.snapshots += 1;
    if (probe.firstRenderMs === null) {
      probe.firstRenderMs = performance.now();
      requestAnimationFrame(() => { probe.firstFrameMs = performance.now(); });
    }
  }

  function applyDelta(delta) {
    const began = performance.now();
    if (delta.run) { state.run = delta.run; renderRun(); }
    if (delta.rounds) { state.rounds.push(...delta.rounds); renderCharts(); }
    if ("current" in delta) { state.current = delta.current; renderCurrent(); }
    if (delta.aborts) { state.aborts = delta.aborts; renderSecagg(); }
    if (delta.regions) { Object.assign(state.regions, delta.regions); renderRegions(); }
    if (delta.clients) {
      let added = false;
      const changed = Object.entries(delta.clients).map(([id, row]) => [id, toClient(row)]);
      for (const [id, c] of changed) {
        if (!(id in state.clients)) added = true;
        state.clients[id] = c;
      }
      if (added) renderClients();
      else for (const [id, c] of changed) updateClient(id, c);
      countClients();
      renderRelays();
    }
    probe.seq = delta.seq;
    const entry = { seq: delta.seq, applyMs: performance.now() - began, doneAt: Date.now(),
      lagMs: Date.now() - delta.sent_at * 1000, frameMs: null };
    requestAnimationFrame(() => { entry.frameMs = performance.now() - began; });
    probe.updates.push(entry);
    if (probe.updates.length > 1000) probe.updates.shift();
  }

  function connect() {
    const source = new EventSource("/api/events");
    source.addEventListener("snapshot", (e) => applySnapshot(JSON.parse(e.data)));
    source.addEventListener("delta", (e) => applyDelta(JSON.parse(e.data)));
    source.onopen = () => { $("link").textContent = "live"; $("link").className = "badge"; };
    source.onerror = () => { $("link").textContent = "offline"; $("link").className = "badge off"; };
  }

  connect();
})();

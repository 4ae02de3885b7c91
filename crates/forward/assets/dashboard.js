// longhaul's read-only dashboard: polls status.json once a second and
// draws what it says. Every string from the snapshot (peers, destinations
// a remote peer chose) goes in as text, never as HTML.
"use strict";
const HISTORY = 120;
const history = [];
let last = null;

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function bytes(n) {
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n.toFixed(0)) + " " + u[i];
}

function rate(bps) {
  if (bps >= 1e9) return (bps / 1e9).toFixed(2) + " Gbit/s";
  if (bps >= 1e6) return (bps / 1e6).toFixed(1) + " Mbit/s";
  if (bps >= 1e3) return (bps / 1e3).toFixed(1) + " kbit/s";
  return bps.toFixed(0) + " bit/s";
}

function span(s) {
  if (s < 60) return s.toFixed(0) + " s";
  if (s < 3600) return (s / 60).toFixed(0) + " min";
  return (s / 3600).toFixed(1) + " h";
}

function row(cells, cls) {
  const tr = el("tr", undefined, cls);
  for (const [text, num] of cells) tr.appendChild(el("td", text, num ? "n" : undefined));
  return tr;
}

function key(sessionPeer, id) { return sessionPeer + "\u0000" + id; }

function render(snap, now) {
  document.getElementById("role").textContent = snap.role;
  document.getElementById("pid").textContent = snap.pid;
  document.getElementById("uptime").textContent = span(snap.uptime_s);
  const prev = last;
  const dt = prev ? Math.max((now - prev.at) / 1000, 0.001) : 0;
  const rates = new Map();
  let sent = 0, received = 0;
  const sessions = document.querySelector("#sessions tbody");
  const streams = document.querySelector("#streams tbody");
  sessions.replaceChildren();
  streams.replaceChildren();
  let streamCount = 0;
  for (const s of snap.sessions) {
    sent += s.bytes_sent;
    received += s.bytes_received;
    const moved = s.bytes_sent + s.bytes_received;
    const before = prev && prev.sessions.get(s.peer);
    const r = before !== undefined && dt ? Math.max(0, (moved - before) * 8 / dt) : 0;
    rates.set(s.peer, moved);
    const d = s.datagrams || { sent: 0, received: 0, dropped: 0 };
    sessions.appendChild(row([
      [s.peer], [span(s.age_s)], [s.rtt_ms.toFixed(2) + " ms", 1], [s.lanes, 1], [s.resumes, 1],
      [s.detached ? "waiting for a resume" : (s.draining ? "draining" : "up")],
      [(s.streams_total !== undefined ? s.streams_total : s.streams.length), 1],
      [bytes(s.bytes_sent), 1], [bytes(s.bytes_received), 1], [rate(r), 1], [s.window_stalls, 1],
      [d.sent + " / " + d.received + " / " + d.dropped + " dropped", 1],
    ], s.detached ? "detached" : undefined));
    for (const t of s.streams) {
      streamCount++;
      const k = key(s.peer, t.id);
      const m = t.bytes_sent + t.bytes_received;
      const b = prev && prev.streams.get(k);
      const tr = b !== undefined && dt ? Math.max(0, (m - b) * 8 / dt) : 0;
      rates.set(k, m);
      streams.appendChild(row([
        [s.peer], [t.dest], [t.local || ""], [t.opened_here ? "here" : "the peer"], [span(t.age_s)],
        [bytes(t.bytes_sent), 1], [bytes(t.bytes_received), 1], [rate(tr), 1],
        [bytes(t.window), 1], [t.stalls, 1],
      ]));
    }
  }
  const total = snap.sessions_total !== undefined ? snap.sessions_total : snap.sessions.length;
  document.getElementById("session-count").textContent =
    total > snap.sessions.length ? snap.sessions.length + " of " + total : String(total);
  document.getElementById("stream-count").textContent = streamCount;
  const ts = document.getElementById("total-sent");
  const tr = document.getElementById("total-received");
  ts.textContent = bytes(sent); ts.dataset.bytes = String(sent);
  tr.textContent = bytes(received); tr.dataset.bytes = String(received);
  const sessionBytes = new Map(), streamBytes = new Map();
  for (const [k, v] of rates) (k.includes("\u0000") ? streamBytes : sessionBytes).set(k, v);
  if (prev && dt) {
    const rs = Math.max(0, (sent - prev.sent) * 8 / dt);
    const rr = Math.max(0, (received - prev.received) * 8 / dt);
    history.push([rs, rr]);
    if (history.length > HISTORY) history.shift();
    document.getElementById("rate-sent").textContent = rate(rs);
    document.getElementById("rate-received").textContent = rate(rr);
  }
  last = { at: now, sent, received, sessions: sessionBytes, streams: streamBytes };
  draw();
}

function draw() {
  const c = document.getElementById("chart");
  const g = c.getContext("2d");
  g.clearRect(0, 0, c.width, c.height);
  const top = Math.max(1, ...history.flat());
  g.fillStyle = "#999";
  g.font = "12px sans-serif";
  g.fillText(rate(top), 4, 12);
  for (const [i, color] of [[0, "#1565c0"], [1, "#2e7d32"]]) {
    g.strokeStyle = color;
    g.lineWidth = 2;
    g.beginPath();
    history.forEach((h, x) => {
      const px = (x + HISTORY - history.length) * c.width / (HISTORY - 1);
      const py = c.height - 4 - h[i] / top * (c.height - 20);
      x ? g.lineTo(px, py) : g.moveTo(px, py);
    });
    g.stroke();
  }
}

async function tick() {
  try {
    const r = await fetch("status.json", { cache: "no-store" });
    if (!r.ok) throw new Error(r.status + " " + r.statusText);
    // The process's own clock: rates stay right whatever the browser's
    // timers do (a background tab, a headless browser's virtual time).
    const snap = await r.json();
    render(snap, snap.uptime_s * 1000);
    document.getElementById("error").textContent = "";
  } catch (e) {
    document.getElementById("error").textContent = "(no answer: " + e.message + ")";
  }
}

tick();
setInterval(tick, 1000);

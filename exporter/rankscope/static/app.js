// The status page: reads the daemon's JSON API every 2 s and draws the cards, the boot
// phase waterfall, the holdings and the census. Plain DOM, no framework, no build step, no
// CDN. Every value from the API goes in through textContent, never as HTML: a process name
// is whatever the process chose to call itself.
"use strict";

const REFRESH_MS = 2000;
// The waterfall's spans other than start-up and group init, which have their own colours.
const SPAN_PALETTE = [
  "#3b6fd8", "#e9a03b", "#8e5cc9", "#d8503b", "#5a8f29", "#c4458f", "#4a6a8a", "#a07a2c",
];

// ---- small helpers ------------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "style") Object.assign(node.style, value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function isNum(v) {
  return typeof v === "number" && Number.isFinite(v);
}

const UNITS = ["B", "KiB", "MiB", "GiB", "TiB"];

// Binary units; null (unmeasured) shows as an em dash, never as 0.
function bytes(v, signed) {
  if (!isNum(v)) return "—";
  const sign = v < 0 ? "−" : signed && v > 0 ? "+" : "";
  let x = Math.abs(v);
  let i = 0;
  while (x >= 1024 && i < UNITS.length - 1) {
    x /= 1024;
    i += 1;
  }
  return sign + (i === 0 ? String(x) : x.toFixed(x >= 100 ? 0 : x >= 10 ? 1 : 2)) + " " + UNITS[i];
}

function seconds(v) {
  if (!isNum(v)) return "—";
  return v < 10 ? v.toFixed(2) + " s" : v.toFixed(1) + " s";
}

function rankLabel(p) {
  const parts = [];
  parts.push(p.rank === null || p.rank === undefined ? "rank ?" : "rank " + p.rank);
  const tp = isNum(p.tp_rank) ? "tp " + p.tp_rank : null;
  const pp = isNum(p.pp_rank) ? "pp " + p.pp_rank : null;
  if (tp || pp) parts.push("(" + [pp, tp].filter(Boolean).join(", ") + ")");
  return parts.join(" ");
}

async function getJSON(path) {
  const resp = await fetch(path, { headers: { Accept: "application/json" }, cache: "no-store" });
  if (!resp.ok) throw new Error(path + ": HTTP " + resp.status);
  return resp.json();
}

function replace(container, ...nodes) {
  container.replaceChildren(...nodes.flat().filter((n) => n));
}

// ---- cards --------------------------------------------------------------------------------

function segment(cls, value, total, title) {
  if (!isNum(value) || value <= 0 || !isNum(total) || total <= 0) return null;
  return el("div", {
    class: "seg " + cls,
    title: title + ": " + bytes(value),
    style: { width: ((100 * value) / total).toFixed(3) + "%" },
  });
}

function cardBar(card) {
  const total = card.total;
  const procs = card.processes || [];
  const bar = el("div", { class: "bar", "data-gpu": card.gpu });
  // One segment per rank process, so ranks sharing a card stay distinguishable.
  for (const p of procs.filter((q) => q.role === "rank")) {
    bar.append(segment("rank", p.bytes, total, rankLabel(p) + " pid " + p.pid) || "");
  }
  const rankSum = procs.filter((q) => q.role === "rank").reduce((s, q) => s + (q.bytes || 0), 0);
  const rankRest = isNum(card.rank_resident) ? card.rank_resident - rankSum : null;
  bar.append(segment("rank", rankRest, total, "rank-resident (other)") || "");
  bar.append(segment("foreign", card.foreign, total, "foreign") || "");
  bar.append(segment("unattributed", card.unattributed, total, "unattributed") || "");
  bar.append(segment("free", card.free, total, "free") || "");
  if (isNum(card.floor) && isNum(total) && total > 0) {
    // The floor is counted from the top of the card: free must stay right of this line.
    const pos = (100 * (total - card.floor)) / total;
    const breached = isNum(card.free) && card.free < card.floor;
    bar.append(
      el("div", {
        class: "floor-mark" + (breached ? " breached" : ""),
        title: "floor " + bytes(card.floor),
        style: { left: Math.max(0, Math.min(100, pos)).toFixed(3) + "%" },
      }),
    );
  }
  return bar;
}

function fact(name, value, negative) {
  return [el("dt", {}, name), el("dd", { class: negative ? "neg" : null }, value)];
}

function holdingsTable(card) {
  const procs = (card.processes || []).slice().sort((a, b) => (b.bytes || 0) - (a.bytes || 0));
  if (!procs.length) return el("p", { class: "empty" }, "no process holds memory on this card");
  return el(
    "table",
    { class: "holdings" },
    el(
      "thead",
      {},
      el("tr", {}, el("th", {}, "pid"), el("th", {}, "process"), el("th", {}, "role"),
        el("th", {}, "rank"), el("th", { class: "num" }, "bytes")),
    ),
    el(
      "tbody",
      {},
      procs.map((p) =>
        el(
          "tr",
          { class: p.role === "foreign" ? "foreign" : null },
          el("td", { class: "mono" }, p.pid),
          el("td", {}, p.comm || "—"),
          el("td", {}, p.role || "—"),
          el("td", { title: p.boot ? "boot " + p.boot : null }, p.role === "rank" ? rankLabel(p) : "—"),
          el("td", { class: "num" }, bytes(p.bytes)),
        ),
      ),
    ),
  );
}

// The card's latest OOM instant (GET /api/v1/cards: last_oom), with its holders right then.
function lastOom(card) {
  const oom = card.last_oom;
  if (!oom) return null;
  const when = new Date(oom.wall * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC";
  const what =
    oom.source === "probe"
      ? "rank " + (oom.rank ?? "?") + " pid " + (oom.host_pid ?? oom.pid) + " asked " +
        bytes(oom.requested) + ", " + bytes(oom.free) + " free" +
        (oom.phase ? " (" + oom.phase + (oom.capturing ? ", in graph capture" : "") + ")" : "")
      : "free memory fell to " + bytes(oom.free) + " (seen by the sampler; no allocator reported it)";
  return el(
    "div",
    { class: "oom" },
    el("h4", {}, "Last OOM " + when),
    el("p", {}, what),
    oom.holders ? holdingsTable({ processes: oom.holders }) : el("p", { class: "empty" },
      "holders unknown: " + (oom.why || []).join("; ")),
  );
}

function renderCard(card) {
  const breach = isNum(card.margin) && card.margin < 0;
  const simulated = card.source === "simulated";
  return el(
    "div",
    { class: "card" + (breach ? " breach" : ""), "data-gpu": card.gpu, "data-uuid": card.uuid },
    el(
      "h3",
      {},
      "GPU " + card.gpu + " ",
      el("span", { class: "model" }, card.model || ""),
      el("span", { class: "badge" + (simulated ? " simulated" : "") },
        simulated ? "simulated card" : card.source || "?"),
    ),
    el("div", { class: "uuid mono" }, card.uuid || ""),
    cardBar(card),
    el(
      "dl",
      { class: "facts" },
      fact("total", bytes(card.total)),
      fact("free now", bytes(card.free)),
      fact("worst free", bytes(card.free_min)),
      fact("floor", bytes(card.floor)),
      fact("margin", bytes(card.margin, true), breach),
      fact("breaches", isNum(card.breaches) ? String(card.breaches) : "—", card.breaches > 0),
      fact("below floor", seconds(card.breach_seconds), card.breach_seconds > 0),
      fact("rank-resident", bytes(card.rank_resident)),
      fact("foreign", bytes(card.foreign), card.foreign > 0),
      fact("unattributed", bytes(card.unattributed, true)),
    ),
    holdingsTable(card),
    lastOom(card),
  );
}

// Why there are no cards, said plainly: no GPU (NVML down), another source down, or not yet.
function noCards(why) {
  const down = /^device source (\S+) is down: ([\s\S]*)$/.exec(why || "");
  const headline = !down
    ? "No cards to show: " + (why || "none reported yet") + "."
    : down[1] === "nvml"
      ? "No GPU to show: NVML is down, so this daemon sees no GPU (none here, or no driver)."
      : "No cards to show: the device source " + down[1] + " is down.";
  return el(
    "div",
    { id: "no-cards" },
    el("p", { class: "headline" }, headline),
    down ? el("p", { class: "detail" }, "The error, retried with backoff: ", el("code", {}, down[2])) : null,
    el("p", { class: "detail" }, "The boot phases and the census below come from the flight directory; they need no GPU."),
  );
}

function renderCards(doc) {
  const cards = (doc && doc.cards) || [];
  const box = document.getElementById("cards");
  // The legend names only what some bar draws (no floor configured: no floor entry; no
  // cards: no legend at all).
  const legend = document.querySelector("#cards-section .legend");
  legend.hidden = !cards.length;
  if (!cards.length) {
    replace(box, noCards(doc && doc.why));
    return;
  }
  replace(box, cards.map(renderCard));
  for (const entry of legend.querySelectorAll("[data-drawn]")) {
    entry.hidden = !box.querySelector(".bar " + entry.dataset.drawn);
  }
}

// ---- phase waterfall ----------------------------------------------------------------------

// A bar is a span between two marks of one process, named by what it measures: "start-up"
// from the process's start to its first phase (the interpreter and its imports), "gloo init"
// or "nccl init" for a run of process-group creations back to back, else "from → to".
const INIT_MARKS = ["nccl_init_begin", "nccl_init_end"];
const START_UP = "start-up";
const START_UP_COLOUR = "#8a99ad";
const INIT_COLOUR = "#2a9d8f";

function spanName(from, to) {
  if (from.phase === "process_start" && to.phase !== "process_exit") return START_UP;
  if (INIT_MARKS.includes(from.phase) && INIT_MARKS.includes(to.phase)) return "init";
  return from.phase + " → " + to.phase;
}

function initBackend(marks) {
  const named = marks.map((m) => m.extra && m.extra.backend).find((b) => typeof b === "string");
  return (named || "group") + " init";
}

function processSpans(marks) {
  const spans = [];
  for (let i = 1; i < marks.length; i += 1) {
    const name = spanName(marks[i - 1], marks[i]);
    const prev = spans[spans.length - 1];
    if (name === "init" && prev && prev.init) {
      prev.to = marks[i];
      prev.marks.push(marks[i]);
    } else {
      spans.push({ name, init: name === "init", from: marks[i - 1], to: marks[i], marks: [marks[i - 1], marks[i]] });
    }
  }
  for (const span of spans.filter((sp) => sp.init)) {
    span.name = initBackend(span.marks);
    span.groups = span.marks
      .filter((m) => m.phase === "nccl_init_end" && m.extra && m.extra.member !== false)
      .map((m) => (m.extra && m.extra.group) || "?");
  }
  return spans;
}

function duration(s) {
  if (!isNum(s)) return "—";
  if (s < 0.0005) return "<1 ms";
  return s < 1 ? Math.round(s * 1000) + " ms" : seconds(s);
}

// Widths grow with a span's seconds on a compressed (log) scale with a floor, shared by every
// row, so 1 ms of weight loading stays a readable bar beside 2 s of start-up; each bar says
// its own seconds. A process starting late starts its row later on the same scale.
const SPAN_MIN_UNITS = 3;
const SPAN_UNIT_SECONDS = 0.01;

function units(secs, floor) {
  return floor + Math.log1p(Math.max(secs, 0) / SPAN_UNIT_SECONDS);
}

function processLabel(p) {
  return p.rank === null || p.rank === undefined ? "pid " + p.pid + " (no rank)" : rankLabel(p);
}

function spanBar(sp, t0, left, width, colour) {
  const secs = sp.to.wall - sp.from.wall;
  const groups = !sp.groups ? "" : " (" + sp.groups.length + " group" + (sp.groups.length === 1 ? "" : "s") +
    (sp.groups.length ? ": " + sp.groups.join(", ") : "") + ")";
  return el(
    "div",
    {
      class: "wf-seg",
      "data-span": sp.name,
      "data-from": sp.from.phase,
      "data-to": sp.to.phase,
      title: sp.name + groups + ": " + duration(secs) + ", +" + (sp.from.wall - t0).toFixed(2) + " s to +" +
        (sp.to.wall - t0).toFixed(2) + " s" + (sp.to.runner ? " [" + sp.to.runner + "]" : ""),
      style: { left: left.toFixed(3) + "%", width: width.toFixed(3) + "%", background: colour },
    },
    duration(secs) + " " + sp.name,
  );
}

function waterfallRow(row, t0, scale, colour) {
  const { p, marks, spans } = row;
  const track = el("div", { class: "wf-track" });
  let at = row.lead;
  for (const sp of spans) {
    const width = units(sp.to.wall - sp.from.wall, SPAN_MIN_UNITS);
    track.append(spanBar(sp, t0, (100 * at) / scale, (100 * width) / scale, colour(sp.name)));
    at += width;
  }
  const ranked = isNum(p.rank);
  const why = ranked ? "" : ": no launcher or framework gave it a rank (a launcher such as torchrun's, or a helper)";
  const last = marks[marks.length - 1];
  return el(
    "div",
    { class: "wf-row", "data-rank": p.rank, "data-pid": p.pid },
    el("div", { class: "wf-label" + (ranked ? "" : " no-rank"), title: "pid " + p.pid + " on " + p.host + why },
      processLabel(p)),
    track,
    el("div", { class: "wf-last", title: "latest mark, since the boot's first" }, last.phase + " +" + seconds(last.wall - t0)),
  );
}

function renderPhases(doc) {
  const box = document.getElementById("phases");
  const rows = ((doc && doc.processes) || [])
    .map((p) => ({ p, marks: (p.marks || []).filter((m) => isNum(m.wall)).sort((a, b) => a.wall - b.wall) }))
    .filter((row) => row.marks.length);
  if (!rows.length) {
    replace(box, el("p", { class: "empty" }, "no marks recorded for this boot yet"));
    return;
  }
  const t0 = Math.min(...rows.map((row) => row.marks[0].wall));
  const names = [];
  for (const row of rows) {
    row.spans = processSpans(row.marks);
    row.lead = units(row.marks[0].wall - t0, 0);
    row.total = row.spans.reduce((sum, sp) => sum + units(sp.to.wall - sp.from.wall, SPAN_MIN_UNITS), row.lead);
    for (const sp of row.spans) if (!names.includes(sp.name)) names.push(sp.name);
  }
  const scale = Math.max(...rows.map((row) => row.total), 1e-9);
  const generic = names.filter((n) => n !== START_UP && !n.endsWith(" init"));
  const colour = (name) =>
    name === START_UP ? START_UP_COLOUR
      : name.endsWith(" init") ? INIT_COLOUR
        : SPAN_PALETTE[generic.indexOf(name) % SPAN_PALETTE.length];
  const legend = el(
    "div",
    { class: "wf-legend" },
    names.map((name) => el("span", {}, el("i", { style: { background: colour(name) } }), name)),
  );
  const note = el(
    "p",
    { class: "wf-note" },
    "Each bar is the time between two marks, named by what it measures and labelled with its " +
      "duration; widths grow with duration on a compressed scale, so short phases stay readable. " +
      "Right: each process's latest mark, seconds after the boot's first.",
  );
  replace(box, el("div", { class: "waterfall" }, rows.map((row) => waterfallRow(row, t0, scale, colour)), legend, note));
}

// ---- census -------------------------------------------------------------------------------

// The census document is `rankscope census --json`: each rank's state (running, stalled in a
// collective, exited, dead: `ranks[].state`, `ranks[].blocked_in`), per group instance the
// counts of its member ranks compared at the latest round every member snapshotted
// (`entries`) and, once no member moves, at their latest counts (`latest`), and earlier
// divergences (`history`). The page shows those comparisons; it never compares anything itself.
function blockedText(r) {
  const b = r.blocked_in;
  if (!b || !b.group) return r.state;
  return r.state + (r.state === "dead" ? " (was in " : " in ") + b.group + " " + b.op + " #" + b.seq + (r.state === "dead" ? ")" : "");
}

function censusVerdict(doc, rows, ranks) {
  const stuck = ranks.filter((r) => r.state === "stalled" || r.state === "dead");
  const diverged = rows.filter((e) => e.divergent);
  const first = doc.first_divergent_round;
  const parts = [];
  if (diverged.length) {
    parts.push(
      "diverged: " +
        diverged
          .map((e) => e.group + " " + e.op + (isNum(e.round) ? " at round " + e.round : " at the latest counts") + " (lagging: rank " + (e.lagging || []).join(", rank ") + ")")
          .join("; ") +
        (isNum(first) ? "; first seen at round " + first : ""),
    );
  }
  if (stuck.length) parts.push("standing still: " + stuck.map((r) => "rank " + r.rank + " " + blockedText(r)).join("; "));
  if (parts.length) return el("p", { class: "neg", id: "census-verdict" }, parts.join(" — "));
  return el(
    "p",
    { id: "census-verdict" },
    "all ranks agree at each group's latest common round" +
      ((doc.history || []).length ? " (earlier divergences: " + doc.history.length + ", resolved)" : "") +
      ((doc.skews || []).length ? " (skews made up: " + doc.skews.length + ")" : ""),
  );
}

function renderCensus(doc) {
  const box = document.getElementById("census");
  const ranks = ((doc && doc.ranks) || []).slice().sort((a, b) => a.rank - b.rank);
  const byOp = (a, b) => (a.group + " " + a.op).localeCompare(b.group + " " + b.op);
  const rows = ((doc && doc.entries) || []).slice().sort(byOp);
  rows.push(...((doc && doc.latest) || []).slice().sort(byOp).map((e) => Object.assign({ latest: true }, e)));
  if (!ranks.length) {
    replace(box, el("p", { class: "empty" }, "no census records for this boot yet"));
    return;
  }
  const head = el(
    "tr",
    {},
    el("th", {}, "group"),
    el("th", {}, "op"),
    el("th", { class: "num" }, "round"),
    ranks.map((r) => el("th", { class: "num" }, "rank " + r.rank)),
  );
  const states = el(
    "tr",
    { class: "states" },
    el("td", { class: "key" }, "state"),
    el("td", {}, ""),
    el("td", {}, ""),
    ranks.map((r) => el("td", { class: "num state-" + r.state, "data-rank": r.rank }, blockedText(r))),
  );
  const lastRounds = el(
    "tr",
    { class: "rounds" },
    el("td", { class: "key" }, "latest snapshot"),
    el("td", {}, ""),
    el("td", {}, ""),
    ranks.map((r) => el("td", { class: "num" }, isNum(r.last_round) ? "round " + r.last_round : "—")),
  );
  const body = rows.map((e) => {
    const lagging = new Set((e.lagging || []).map(String));
    return el(
      "tr",
      { class: e.divergent ? "diverged" : null, "data-group": e.group, "data-op": e.op, "data-at": e.latest ? "latest" : "round" },
      el("td", { class: "key mono" }, e.group),
      el("td", { class: "key" }, e.op),
      el("td", { class: "num" }, e.latest ? "latest" : isNum(e.round) ? e.round : "—"),
      ranks.map((r) => {
        const n = (e.counts || {})[String(r.rank)];
        return el("td", { class: "num" + (lagging.has(String(r.rank)) ? " diverged" : "") }, n === undefined ? "" : n);
      }),
    );
  });
  const caption = el("caption", {}, "collective calls each rank counted, per group and op, at the round shown (latest: once no rank of the group moves)");
  replace(
    box,
    censusVerdict(doc, rows, ranks),
    el("table", { class: "census" }, caption, el("thead", {}, head), el("tbody", {}, states, lastRounds, body)),
  );
}

// ---- refresh ------------------------------------------------------------------------------

let chosenBoot = new URLSearchParams(location.search).get("boot") || "";

function renderBoots(doc) {
  const select = document.getElementById("boot-select");
  const boots = (doc && doc.boots) || [];
  const options = [el("option", { value: "" }, "latest")].concat(
    boots.map((b) => el("option", { value: b.boot }, b.boot + (b.latest ? " (latest)" : ""))),
  );
  replace(select, options);
  select.value = boots.some((b) => b.boot === chosenBoot) ? chosenBoot : "";
  const shown = boots.find((b) => (chosenBoot ? b.boot === chosenBoot : b.latest));
  const info = document.getElementById("boot-info");
  info.textContent = shown
    ? shown.boot + " · " + (shown.ranks || []).length + " ranks · " + shown.processes + " processes"
    : "no boot recorded yet";
}

async function refresh() {
  const status = document.getElementById("status");
  const q = chosenBoot ? "?boot=" + encodeURIComponent(chosenBoot) : "";
  document.getElementById("phases-link").setAttribute("href", "api/v1/phases" + q);
  document.getElementById("census-link").setAttribute("href", "api/v1/census" + q);
  const parts = [
    ["boots", "api/v1/boots", renderBoots],
    ["cards", "api/v1/cards", renderCards],
    ["phases", "api/v1/phases" + q, renderPhases],
    ["census", "api/v1/census" + q, renderCensus],
  ];
  const results = await Promise.allSettled(parts.map(([, path]) => getJSON(path)));
  const failed = [];
  results.forEach((res, i) => {
    const [name, , render] = parts[i];
    if (res.status !== "fulfilled") {
      failed.push(name + " (" + res.reason.message + ")");
      return;
    }
    try {
      render(res.value);
    } catch (err) {
      // A document this page cannot draw is reported on the page, not only in the console.
      failed.push(name + " (unexpected document: " + err.message + ")");
    }
  });
  const now = new Date().toLocaleTimeString();
  status.className = "status " + (failed.length ? "error" : "ok");
  status.textContent = failed.length ? "could not read " + failed.join(", ") + " at " + now : "live · " + now;
  document.body.dataset.refreshed = String(Number(document.body.dataset.refreshed || 0) + 1);
}

document.getElementById("boot-select").addEventListener("change", (ev) => {
  chosenBoot = ev.target.value;
  const url = new URL(location.href);
  if (chosenBoot) url.searchParams.set("boot", chosenBoot);
  else url.searchParams.delete("boot");
  history.replaceState(null, "", url);
  refresh();
});

async function loop() {
  try {
    await refresh();
  } finally {
    setTimeout(loop, REFRESH_MS);
  }
}

loop();

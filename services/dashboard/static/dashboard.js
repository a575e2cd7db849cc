// rlrun dashboard: plain JavaScript and SVG, no build step and no external resources.
// Everything it shows comes from the JSON API of rlrun.dashboard.app; model output is written
// as text (textContent), never as markup.
"use strict";

const POLL_MS = 2000;
const COLORS = ["#2563eb", "#f97316", "#16a34a", "#dc2626", "#9333ea", "#0891b2", "#ca8a04", "#db2777"];
const SVG_NS = "http://www.w3.org/2000/svg";

const state = {
  runs: [],
  runId: null,
  tab: "curves",
  rows: [],
  detail: null,
  traceSteps: [],
  traceKey: null, // "rl:12"
  groups: [],
  groupIndex: 0,
  branch: {}, // trace id -> branch index
  pinned: null,
  lastPoll: 0,
  polling: false,
};

// -- small DOM helpers ----------------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  setAttrs(node, attrs);
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  setAttrs(node, attrs);
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// replaceChildren writes null as the text "null": drop what is not there.
function fill(node, ...children) {
  node.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined && c !== false));
}

function setAttrs(node, attrs) {
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.setAttribute("class", value);
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
}

function fmt(value, digits = 3) {
  if (value === null || value === undefined || Number.isNaN(value)) return "–";
  if (typeof value !== "number") return String(value);
  const abs = Math.abs(value);
  if (abs >= 10000) return Math.round(value).toLocaleString("en-US");
  if (abs >= 100) return value.toFixed(1);
  if (abs >= 1 || abs === 0) return value.toFixed(digits === 3 ? 2 : digits);
  return value.toPrecision(digits);
}

function ago(seconds) {
  if (!seconds) return "never";
  const s = Math.max(0, Date.now() / 1000 - seconds);
  if (s < 60) return `${Math.round(s)} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return new Date(seconds * 1000).toLocaleString();
}

async function api(path) {
  const reply = await fetch(path, { credentials: "same-origin", cache: "no-store" });
  if (reply.status === 401) {
    location.href = "/login";
    throw new Error("not signed in");
  }
  const body = await reply.json();
  if (!reply.ok) throw new Error(body.error || reply.statusText);
  return body;
}

// -- the address: #run=<id>&tab=<tab>&step=<phase>:<n>&group=<i> ---------------------------------

function readHash() {
  const params = new URLSearchParams(location.hash.slice(1));
  return {
    run: params.get("run"),
    tab: params.get("tab") || "curves",
    step: params.get("step"),
    group: params.has("group") ? Number(params.get("group")) : null,
  };
}

function writeHash() {
  const params = new URLSearchParams();
  if (state.runId) params.set("run", state.runId);
  if (state.tab !== "curves") params.set("tab", state.tab);
  if (state.tab === "traces" && state.traceKey) {
    params.set("step", state.traceKey);
    params.set("group", String(state.groupIndex));
  }
  history.replaceState(null, "", "#" + params.toString());
}

// -- runs ---------------------------------------------------------------------------------------

async function refreshRuns() {
  state.runs = (await api("/api/runs")).runs;
  if (!state.runId && state.runs.length) state.runId = state.runs[0].id;
  renderRuns();
}

function renderRuns() {
  const list = document.getElementById("run-list");
  list.replaceChildren(
    ...state.runs.map((run) =>
      el(
        "li",
        {
          class: run.id === state.runId ? "selected" : "",
          "data-run": run.id,
          title: run.path,
          onclick: () => selectRun(run.id),
        },
        el("div", { class: "name" }, el("span", {}, run.name), el("span", { class: `badge ${run.phase}` }, run.phase)),
        el("div", { class: "meta folder" }, run.path.split("/").filter(Boolean).slice(-2).join("/")),
        el(
          "div",
          { class: "meta" },
          `step ${run.step}${run.max_steps ? "/" + run.max_steps : ""}`,
          run.train_reward !== null ? ` · reward ${fmt(run.train_reward)}` : "",
          ` · ${ago(run.updated)}`,
        ),
      ),
    ),
  );
  document.getElementById("run-hint").textContent = state.runs.length
    ? ""
    : "No runs yet. `rlrun local CONFIG` registers its run here; `rlrun dashboard DIR` serves other folders.";
}

async function selectRun(id) {
  if (id === state.runId && state.detail) return;
  state.runId = id;
  state.rows = [];
  state.detail = null;
  state.traceSteps = [];
  state.traceKey = null;
  state.groups = [];
  state.groupIndex = 0;
  state.pinned = null;
  renderRuns();
  writeHash();
  await poll(true);
}

// -- polling ------------------------------------------------------------------------------------

async function poll(force = false) {
  if (!state.runId || (state.polling && !force)) return;
  state.polling = true;
  try {
    const id = state.runId;
    const last = state.rows.length ? state.rows[state.rows.length - 1].time : null;
    const query = state.rows.length ? `?after=${state.rows.length}&last=${encodeURIComponent(last)}` : "";
    const [metrics, detail, traces] = await Promise.all([
      api(`/api/runs/${id}/metrics${query}`),
      api(`/api/runs/${id}`),
      api(`/api/runs/${id}/traces`),
    ]);
    if (id !== state.runId) return;
    const grew = metrics.reset || metrics.rows.length > 0 || !state.detail;
    state.rows = metrics.reset ? metrics.rows : state.rows.concat(metrics.rows);
    const eventsChanged = !state.detail || state.detail.events.length !== detail.events.length;
    state.detail = detail;
    renderHeader();
    if (grew || eventsChanged) renderCharts();
    if (state.tab === "config") renderConfig();
    await updateTraceSteps(traces.steps);
    state.lastPoll = Date.now();
    renderStatusLine();
  } catch (error) {
    renderStatusLine(error.message);
  } finally {
    state.polling = false;
  }
}

function renderStatusLine(error) {
  const line = document.getElementById("status-line");
  const live = state.detail && state.detail.info.live;
  fill(
    line,
    el("span", { class: "dot" + (live ? "" : " off") }),
    error ? `error: ${error}` : live ? "live: updates every 2 s" : "not running",
  );
}

// -- header -------------------------------------------------------------------------------------

function renderHeader() {
  const { info, summary, error, events } = state.detail;
  const fact = (k, v, field) => el("div", { class: "fact", "data-fact": field }, el("div", { class: "k" }, k), el("div", { class: "v" }, v));
  const header = document.getElementById("run-header");
  const marks = events.filter((e) => e.event !== "start");
  fill(
    header,
    el("h1", {}, info.name, el("span", { class: `badge ${info.phase}`, "data-field": "phase" }, info.phase)),
    el("div", { class: "path" }, info.path),
    el(
      "div",
      { class: "facts" },
      fact("RL step", `${info.step}${info.max_steps ? " / " + info.max_steps : ""}`, "step"),
      fact("warm-start steps", info.warmup_steps, "warmup"),
      fact("policy version", info.policy_version ?? "–", "version"),
      fact("train reward", fmt(info.train_reward), "train-reward"),
      fact("eval reward", fmt(info.eval_reward), "eval-reward"),
      summary ? fact("tokens / s", fmt(summary.tokens_per_s), "tokens") : null,
      fact("updated", ago(info.updated), "updated"),
    ),
    error ? el("div", { class: "error-box" }, error) : null,
    marks.length
      ? el(
          "div",
          { class: "events" },
          "Events: ",
          marks.map((e) => el("span", {}, `${new Date(e.time * 1000).toLocaleTimeString()} ${eventLabel(e)}`)),
        )
      : null,
  );
}

function eventLabel(event) {
  if (event.event === "restart") return `${event.service} restarted (${event.exit})`;
  if (event.event === "resume") return `resumed at trainer step ${event.trainer_step}`;
  return event.event;
}

// -- curves -------------------------------------------------------------------------------------

function points(rows, key) {
  return rows.filter((r) => typeof r[key] === "number").map((r) => [r.step, r[key]]);
}

function chartSpecs() {
  const rows = state.rows;
  const rl = rows.filter((r) => r.phase === "rl");
  const evals = rows.filter((r) => r.phase === "eval");
  const warm = rows.filter((r) => r.phase === "warmup");
  const dev = rows.filter((r) => r.phase === "dev");
  const keys = new Set(rows.flatMap((r) => Object.keys(r)));
  const envs = [...keys].filter((k) => /^env\/.+\/(reward_mean|eval_reward)$/.test(k));
  const dropped = [...keys].filter((k) => k.startsWith("groups_dropped/"));
  const filters = [...keys].filter((k) => k.startsWith("filter/"));
  const k = evals.length ? evals[evals.length - 1].k : null;
  return [
    {
      id: "reward",
      title: "Reward",
      always: true,
      series: [
        { name: "train reward (mean over rollouts)", points: points(rl, "reward_mean") },
        { name: "eval reward (held-out)", points: points(evals, "eval_reward"), dots: true },
      ],
    },
    {
      id: "env-reward",
      title: "Reward per env",
      series: envs.map((key) => {
        const [, env, what] = key.match(/^env\/(.+)\/(reward_mean|eval_reward)$/);
        return what === "reward_mean"
          ? { name: `${env} (train)`, points: points(rl, key) }
          : { name: `${env} (eval)`, points: points(evals, key), dots: true };
      }),
      skipIfSingle: true,
    },
    { id: "pass-at-k", title: `pass@${k ?? "k"} (eval)`, series: [{ name: `pass@${k ?? "k"}`, points: points(evals, "pass_at_k"), dots: true }] },
    {
      id: "staleness",
      title: "Staleness",
      series: [
        { name: "off-policy lag (versions)", points: points(rl, "off_policy_lag") },
        { name: "stale groups dropped (so far)", points: points(rl, "groups_dropped_stale") },
      ],
    },
    { id: "throughput", title: "Tokens / s", series: [{ name: "generated tokens / s", points: points(rl, "tokens_per_s") }] },
    {
      id: "step-time",
      title: "Step time split (s)",
      series: [
        { name: "step", points: points(rl, "step_seconds") },
        { name: "generate", points: points(rl, "gen_seconds") },
        { name: "train", points: points(rl, "train_seconds") },
        { name: "broadcast", points: points(rl, "trainer/broadcast_seconds") },
      ],
    },
    {
      id: "dropped",
      title: "Groups dropped per step, by reason",
      // A step's line names only the reasons it dropped groups for: the others were 0.
      series: dropped.map((key) => ({
        name: key.slice("groups_dropped/".length),
        points: rl.map((r) => [r.step, r[key] ?? 0]),
      })),
    },
    {
      id: "filtered",
      title: "Filtered rollouts (fraction)",
      series: [
        { name: "filtered (never trained)", points: points(rl, "filtered_ratio") },
        ...filters.map((key) => ({ name: key.slice(7).replace(/_ratio$/, "") + " flagged", points: points(rl, key) })),
      ],
    },
    {
      id: "trainer",
      title: "Trainer",
      series: [
        { name: "loss", points: points(rl, "trainer/loss") },
        { name: "entropy", points: points(rl, "trainer/entropy") },
        { name: "grad norm", points: points(rl, "trainer/grad_norm") },
      ],
    },
    {
      id: "warm-start",
      title: "Warm start (x: warm-start step)",
      markers: false,
      series: [
        { name: "dev reward", points: points(dev, "dev_reward"), dots: true },
        { name: "supervised loss", points: points(warm, "trainer/loss") },
      ],
    },
  ];
}

function eventMarkers() {
  if (!state.detail) return [];
  return state.detail.events
    .filter((e) => e.event === "restart" || e.event === "resume")
    .map((e) => ({ x: e.step ?? 0, label: e.event === "restart" ? `${e.service} restarted` : "resumed" }));
}

function renderCharts() {
  const box = document.getElementById("charts");
  const markers = eventMarkers();
  const charts = [];
  for (const spec of chartSpecs()) {
    const series = spec.series.filter((s) => s.points.length);
    if (!series.length && !spec.always) continue;
    if (spec.skipIfSingle && new Set(series.map((s) => s.name.replace(/ \((train|eval)\)$/, ""))).size < 2) continue;
    charts.push(lineChart(spec, series, spec.markers === false ? [] : markers));
  }
  box.replaceChildren(...charts);
}

// Labels with as many decimals as the tick step has: 0.25 -> "0.25", 500 -> "500".
function tickFormat(ticks) {
  const step = ticks.length > 1 ? ticks[1] - ticks[0] : 1;
  const decimals = (String(Number(step.toPrecision(6))).split(".")[1] || "").length;
  return (v) => (Math.abs(v) >= 10000 ? Math.round(v).toLocaleString("en-US") : v.toFixed(decimals));
}

function niceTicks(lo, hi, count, integer = false) {
  if (!(hi > lo)) {
    if (lo === 0) hi = 1;
    else {
      const pad = Math.abs(lo) * 0.1;
      lo -= pad;
      hi += pad;
    }
  }
  const raw = (hi - lo) / count;
  const mag = Math.pow(10, Math.floor(Math.log10(raw)));
  let step = [1, 2, 2.5, 5, 10].map((m) => m * mag).find((s) => s >= raw);
  if (integer) step = Math.max(1, Math.round(step));
  const start = Math.floor(lo / step) * step;
  const ticks = [];
  for (let v = start; v <= hi + step * 1e-9; v += step) ticks.push(Number(v.toPrecision(12)));
  if (ticks[ticks.length - 1] < hi) ticks.push(Number((ticks[ticks.length - 1] + step).toPrecision(12)));
  return ticks;
}

function lineChart(spec, series, markers) {
  const W = 560, H = 230, m = { l: 50, r: 14, t: 14, b: 30 };
  const card = el("div", { class: "chart", "data-chart": spec.id }, el("h3", {}, spec.title));
  if (!series.length) {
    card.append(el("div", { class: "empty" }, "no data yet"));
    return card;
  }
  series.forEach((s, i) => (s.color = COLORS[i % COLORS.length]));
  card.append(
    el(
      "div",
      { class: "legend" },
      series.map((s) => {
        const swatch = el("i");
        swatch.style.background = s.color;
        return el("span", {}, swatch, s.name);
      }),
    ),
  );
  const all = series.flatMap((s) => s.points);
  const xs = all.map((p) => p[0]).concat(markers.map((mk) => mk.x));
  const ys = all.map((p) => p[1]);
  const xTicks = niceTicks(Math.min(...xs), Math.max(...xs), 6, true);
  const yLo = Math.min(...ys), yHi = Math.max(...ys);
  const yTicks = niceTicks(yLo >= 0 && yLo < (yHi - yLo) * 0.6 ? 0 : yLo, yHi, 4);
  const x0 = xTicks[0], x1 = xTicks[xTicks.length - 1], y0 = yTicks[0], y1 = yTicks[yTicks.length - 1];
  const sx = (x) => m.l + ((x - x0) / (x1 - x0 || 1)) * (W - m.l - m.r);
  const sy = (y) => H - m.b - ((y - y0) / (y1 - y0 || 1)) * (H - m.t - m.b);
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": spec.title });
  const grid = svg("g", { class: "grid" });
  const axis = svg("g", { class: "axis" });
  const yLabel = tickFormat(yTicks), xLabel = tickFormat(xTicks);
  for (const t of yTicks) {
    grid.append(svg("line", { x1: m.l, x2: W - m.r, y1: sy(t), y2: sy(t) }));
    axis.append(svg("text", { x: m.l - 6, y: sy(t) + 4, "text-anchor": "end" }, yLabel(t)));
  }
  for (const t of xTicks) {
    axis.append(svg("line", { x1: sx(t), x2: sx(t), y1: H - m.b, y2: H - m.b + 4 }));
    axis.append(svg("text", { x: sx(t), y: H - m.b + 16, "text-anchor": "middle" }, xLabel(t)));
  }
  axis.append(svg("line", { x1: m.l, x2: W - m.r, y1: H - m.b, y2: H - m.b }));
  axis.append(svg("text", { x: W - m.r, y: H - 2, "text-anchor": "end" }, "step"));
  root.append(grid, axis);
  for (const mk of markers) {
    root.append(
      svg(
        "g",
        { class: "marker", "data-marker": mk.label },
        svg("line", { x1: sx(mk.x), x2: sx(mk.x), y1: m.t, y2: H - m.b }),
        svg("text", { x: sx(mk.x) + 3, y: m.t + 9 }, mk.label),
      ),
    );
  }
  for (const s of series) {
    const d = s.points.map((p, i) => `${i ? "L" : "M"}${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join("");
    root.append(
      svg("path", {
        class: "series",
        d,
        stroke: s.color,
        "data-name": s.name,
        "data-points": s.points.map((p) => `${p[0]}:${p[1]}`).join(" "),
      }),
    );
    if (s.dots || s.points.length === 1) {
      for (const p of s.points) root.append(svg("circle", { cx: sx(p[0]), cy: sy(p[1]), r: 3, fill: s.color }));
    }
  }
  const guide = svg("line", { class: "guide", y1: m.t, y2: H - m.b, visibility: "hidden" });
  root.append(guide);
  const steps = [...new Set(all.map((p) => p[0]))].sort((a, b) => a - b);
  root.addEventListener("mousemove", (event) => {
    const box = root.getBoundingClientRect();
    const x = x0 + (((event.clientX - box.left) / box.width) * W - m.l) / (W - m.l - m.r) * (x1 - x0);
    const step = steps.reduce((best, s) => (Math.abs(s - x) < Math.abs(best - x) ? s : best), steps[0]);
    guide.setAttribute("x1", sx(step));
    guide.setAttribute("x2", sx(step));
    guide.setAttribute("visibility", "visible");
    showTooltip(event, step, series);
  });
  root.addEventListener("mouseleave", () => {
    guide.setAttribute("visibility", "hidden");
    document.getElementById("tooltip").hidden = true;
  });
  card.append(root);
  return card;
}

function showTooltip(event, step, series) {
  const tip = document.getElementById("tooltip");
  const rows = series
    .map((s) => [s, s.points.find((p) => p[0] === step)])
    .filter(([, p]) => p)
    .map(([s, p]) => {
      const sw = el("i");
      sw.style.background = s.color;
      return el("div", { class: "row" }, sw, `${s.name}: `, el("b", {}, fmt(p[1], 4)));
    });
  tip.replaceChildren(el("div", {}, el("b", {}, `step ${step}`)), ...rows);
  tip.hidden = false;
  tip.style.left = `${Math.min(event.clientX + 14, window.innerWidth - 350)}px`;
  tip.style.top = `${event.clientY + 12}px`;
}

// -- traces -------------------------------------------------------------------------------------

const keyOf = (s) => `${s.phase}:${s.step}`;

async function updateTraceSteps(steps) {
  const known = state.traceSteps.map(keyOf).join(",");
  state.traceSteps = steps;
  if (steps.map(keyOf).join(",") === known && state.traceKey) return;
  const select = document.getElementById("trace-step");
  const newest = steps.length ? keyOf(steps[steps.length - 1]) : null;
  const follow = document.getElementById("trace-follow").checked;
  select.replaceChildren(
    ...[...steps].reverse().map((s) =>
      el("option", { value: keyOf(s) }, `${s.phase === "rl" ? "RL" : "warm-start"} step ${s.step}`),
    ),
  );
  const wanted = state.traceKey && steps.some((s) => keyOf(s) === state.traceKey) && !follow ? state.traceKey : newest;
  if (wanted && wanted !== state.traceKey) await loadTraceStep(wanted, 0);
  if (state.traceKey) select.value = state.traceKey;
  if (!steps.length) renderGroups();
}

async function loadTraceStep(key, groupIndex) {
  const [phase, step] = key.split(":");
  const reply = await api(`/api/runs/${state.runId}/traces/${phase}/${step}`);
  state.traceKey = key;
  state.groups = reply.groups;
  state.groupIndex = Math.min(groupIndex, Math.max(0, reply.groups.length - 1));
  state.pinned = null;
  document.getElementById("trace-step").value = key;
  renderEnvFilter();
  renderGroups();
  writeHash();
}

function renderEnvFilter() {
  const select = document.getElementById("trace-env");
  const current = select.value;
  const envs = [...new Set(state.groups.map((g) => g.env))];
  select.replaceChildren(el("option", { value: "" }, "all"), ...envs.map((e) => el("option", { value: e }, e)));
  select.value = envs.includes(current) ? current : "";
}

function shownGroups() {
  const env = document.getElementById("trace-env").value;
  const filter = document.getElementById("trace-filter").value;
  return state.groups
    .map((g, i) => [g, i])
    .filter(([g]) => !env || g.env === env)
    .filter(([g]) => {
      if (filter === "trained") return !g.dropped;
      if (filter === "dropped") return !!g.dropped;
      if (filter === "filtered") return g.traces.some((t) => t.isFiltered || (t.filters || []).length);
      return true;
    });
}

const mean = (values) => (values.length ? values.reduce((a, b) => a + b, 0) / values.length : null);

function renderGroups() {
  const list = document.getElementById("groups");
  const shown = shownGroups();
  if (!state.traceSteps.length) {
    list.replaceChildren(el("div", { class: "empty-state" }, "No trace files yet (orchestrator.traces writes them once a step trained)."));
    document.getElementById("group-view").replaceChildren();
    return;
  }
  list.replaceChildren(
    ...shown.map(([g, i]) => {
      const filtered = g.traces.filter((t) => t.isFiltered).length;
      return el(
        "div",
        {
          class: "group-card" + (i === state.groupIndex ? " selected" : ""),
          "data-group": i,
          onclick: () => {
            state.groupIndex = i;
            state.pinned = null;
            renderGroups();
            writeHash();
          },
        },
        el(
          "div",
          { class: "line" },
          el("b", {}, g.env),
          g.dropped
            ? el("span", { class: "badge dropped", title: g.dropped.detail }, `dropped: ${g.dropped.reason}`)
            : el("span", { class: "reward" }, `reward ${fmt(mean(g.traces.map((t) => t.reward || 0)))}`),
        ),
        el("div", { class: "gid" }, g.group_id),
        el(
          "div",
          { class: "line meta" },
          el("span", {}, `${g.traces.length} trace${g.traces.length === 1 ? "" : "s"} · task ${g.task.idx}`),
          filtered ? el("span", { class: "badge filtered" }, `${filtered} filtered`) : null,
        ),
      );
    }),
  );
  renderGroup();
}

function renderGroup() {
  const view = document.getElementById("group-view");
  const group = state.groups[state.groupIndex];
  if (!group) {
    view.replaceChildren(el("div", { class: "empty-state" }, "No group in this step."));
    return;
  }
  const first = group.traces[0];
  const head = el(
    "div",
    { class: "panel" },
    el(
      "h3",
      {},
      `Group ${group.group_id}`,
      group.dropped ? el("span", { class: "badge dropped" }, `dropped: ${group.dropped.reason}`) : null,
    ),
    el(
      "div",
      { class: "kv" },
      el("span", {}, "env ", el("b", {}, group.env)),
      el("span", {}, `${group.phase === "rl" ? "RL" : "warm-start"} step `, el("b", {}, group.step)),
      el("span", {}, "trained at version ", el("b", {}, group.policy_version)),
      el("span", {}, "task ", el("b", {}, `${group.task.split} #${group.task.idx}`)),
      first && first.task.exampleId !== undefined ? el("span", {}, "example ", el("b", {}, first.task.exampleId)) : null,
    ),
    group.dropped ? el("p", { class: "trace-errors" }, `Why: ${group.dropped.detail}`) : null,
    first && first.task.data ? el("div", { class: "task-data" }, `task data: ${first.task.data}`) : null,
    group.traces.length ? tokenLegend() : null,
  );
  const members = [...new Set(group.traces.map((t) => t.memberId || "policy"))];
  const cards = group.traces.map((trace, i) => renderTrace(group, trace, i, members.length > 1));
  fill(view, head, cards.length ? cards : el("div", { class: "empty-state" }, "The group was dropped before its rollouts finished: no traces."));
}

function branchTokens(trace, index, texts) {
  const nodes = new Map((trace.nodes || []).map((n) => [n.id, n]));
  const branch = (trace.branches || [])[index];
  if (!branch) return [];
  const tokens = [];
  for (const id of branch.nodeIds) {
    const node = nodes.get(id);
    const sampledMask = node.sampledMask || [];
    const logprobs = node.logprobs || [];
    let k = 0;
    (node.tokenIds || []).forEach((tok, j) => {
      const sampled = !!sampledMask[j];
      tokens.push({
        id: tok,
        text: texts[String(tok)],
        sampled,
        logprob: sampled ? logprobs[k++] ?? 0 : null,
        node: id,
        role: (node.role || "").replace("ROLE_", "").toLowerCase(),
        observation: !!node.isObservation,
      });
    });
  }
  const mask = branch.mask || [];
  tokens.forEach((t, i) => {
    t.index = i;
    t.trained = !!mask[i];
    t.rl = null;
    t.ce = null;
    for (const channel of branch.channels || []) {
      const value = (channel.values || [])[i] ?? 0;
      if (channel.loss === "LOSS_TYPE_CE") t.ce = (t.ce ?? 0) + value;
      else t.rl = (t.rl ?? 0) + value;
    }
  });
  return tokens;
}

function tokenKind(t) {
  if (t.trained && t.ce !== null && t.ce !== 0 && !(t.rl !== null && t.rl !== 0)) return "ce";
  if (t.trained) return "rl";
  if (t.sampled) return "masked";
  return t.observation ? "observation" : "prompt";
}

function renderTrace(group, trace, traceIndex, multiAgent) {
  const branches = trace.branches || [];
  const chosen = Math.min(state.branch[trace.id] || 0, Math.max(0, branches.length - 1));
  const tokens = branchTokens(trace, chosen, group.tokens || {});
  const span = trace.policySpan || {};
  const spanText = `${span.start ?? 0}${Number(span.end ?? 0) !== Number(span.start ?? 0) ? "–" + span.end : ""}`;
  const parts = Object.entries(trace.rewards || {}).map(([name, c]) => `${name} ${fmt(c.score || 0, 4)} × ${fmt(c.weight ?? 1, 3)}`);
  const card = el(
    "div",
    { class: "trace-card" + (trace.isFiltered ? " off" : ""), "data-trace": trace.id },
    el(
      "h4",
      {},
      el("span", {}, `#${traceIndex}`),
      multiAgent || (trace.memberId && trace.memberId !== "policy") ? el("span", { class: "badge member" }, trace.memberId || "policy") : null,
      el("span", { class: "reward" }, "reward ", el("b", { "data-field": "reward" }, fmt(trace.reward || 0, 4))),
      trace.isFiltered ? el("span", { class: "badge filtered" }, "filtered: never trained") : null,
      ...(trace.filters || []).map((f) => el("span", { class: "badge filtered" }, `flagged: ${f}`)),
    ),
    el(
      "div",
      { class: "kv" },
      parts.length ? el("span", {}, "score parts ", el("b", {}, parts.join(", "))) : null,
      el("span", {}, "stop ", el("b", {}, (trace.stopCondition || "unspecified").replace("STOP_CONDITION_", "").toLowerCase())),
      trace.isTruncated ? el("span", {}, el("b", {}, "truncated")) : null,
      el("span", {}, "sampled by version ", el("b", {}, spanText)),
      el("span", {}, "trace ", el("b", {}, trace.id)),
    ),
    (trace.errors || []).length ? el("div", { class: "trace-errors" }, trace.errors.map((e) => `${e.type}: ${e.message}`).join("\n")) : null,
  );
  card.append(renderGraph(trace, chosen));
  if (branches.length > 1) {
    card.append(
      el(
        "div",
        { class: "branches" },
        branches.map((b, i) =>
          el("button", {
            type: "button",
            class: i === chosen ? "active" : "",
            onclick: () => {
              state.branch[trace.id] = i;
              renderGroup();
            },
            text: `branch ${i + 1}`,
          }),
        ),
      ),
    );
  }
  const detail = el("dl", { class: "token-detail" }, el("div", { class: "none" }, "Point at a token to see its logprob, advantage and policy version; click to pin it."));
  const maxAbs = Math.max(1e-9, ...tokens.filter((t) => t.trained && t.rl !== null).map((t) => Math.abs(t.rl)));
  const line = el("div", { class: "tokens" });
  for (const t of tokens) {
    const kind = tokenKind(t);
    const text = t.text === undefined ? `#${t.id}` : t.text;
    const special = /^<\|.*\|>$/.test(text) || t.text === undefined;
    const span = el("span", {
      class: `tok ${kind}${special ? " special" : ""}`,
      "data-index": t.index,
      "data-kind": kind,
      title: `${kind} token ${t.id}`,
    });
    span.textContent = text.replace(/\n/g, "⏎\n");
    if (kind === "rl") {
      const a = Math.min(1, Math.abs(t.rl) / maxAbs);
      span.style.background = t.rl >= 0 ? `rgba(22, 163, 74, ${0.12 + 0.5 * a})` : `rgba(220, 38, 38, ${0.12 + 0.5 * a})`;
    }
    const show = () => showTokenDetail(detail, t, trace, group);
    span.addEventListener("mouseenter", () => {
      if (!state.pinned || state.pinned.trace !== trace.id) show();
    });
    span.addEventListener("click", () => {
      line.querySelectorAll(".tok.pinned").forEach((n) => n.classList.remove("pinned"));
      span.classList.add("pinned");
      state.pinned = { trace: trace.id, index: t.index };
      show();
    });
    line.append(span);
    if (text.endsWith("\n")) line.append(el("br"));
  }
  card.append(line, detail);
  return card;
}

function tokenLegend() {
  const item = (cls, label) => {
    const sw = el("span", { class: `sw ${cls}` });
    if (cls === "pos") sw.style.background = "rgba(22, 163, 74, .5)";
    if (cls === "neg") sw.style.background = "rgba(220, 38, 38, .5)";
    if (cls === "ce") sw.style.background = "#dbeafe";
    if (cls === "masked") {
      sw.style.borderBottom = "2px dashed #c2410c";
      sw.style.background = "#fff7ed";
    }
    if (cls === "prompt") sw.style.background = "#eef1f5";
    return el("span", {}, sw, label);
  };
  return el(
    "div",
    { class: "tok-legend" },
    item("pos", "RL, advantage > 0"),
    item("neg", "RL, advantage < 0"),
    item("ce", "CE (supervised)"),
    item("masked", "sampled, masked (not trained)"),
    item("prompt", "prompt / observation (not sampled)"),
  );
}

function showTokenDetail(box, t, trace, group) {
  const span = trace.policySpan || {};
  const field = (label, name, value, raw) =>
    el("div", {}, el("dt", {}, label), el("dd", { "data-field": name, "data-value": raw ?? "" }, value));
  const version =
    Number(span.start) === Number(span.end)
      ? `${span.start ?? 0}`
      : `${span.start}–${span.end} (the trace's span; tokens carry no version of their own)`;
  box.replaceChildren(
    field("token", "token", `#${t.index} · id ${t.id} · ${JSON.stringify(t.text ?? null)}`),
    field("node", "node", `${t.node} (${t.role})`),
    field("trained by", "kind", { rl: "RL channel", ce: "CE channel", masked: "nothing (masked)", prompt: "nothing (prompt)", observation: "nothing (observation)" }[tokenKind(t)]),
    field("logprob", "logprob", t.logprob === null ? "–" : `${t.logprob.toFixed(4)} (p ${Math.exp(t.logprob).toFixed(3)})`, t.logprob),
    field("advantage", "advantage", t.rl === null ? "–" : t.rl.toFixed(4), t.rl),
    field("CE weight", "ce", t.ce === null ? "–" : t.ce.toFixed(4), t.ce),
    field("sampled by version", "version", t.sampled ? version : "–"),
    field("batch trained at", "trained-version", `${group.policy_version}`),
  );
}

function renderGraph(trace, chosen) {
  const nodes = trace.nodes || [];
  const wrap = el("div", { class: "graph" });
  if (!nodes.length) return wrap;
  const children = new Map();
  for (const n of nodes) {
    const key = n.parent || "";
    if (!children.has(key)) children.set(key, []);
    children.get(key).push(n);
  }
  const pos = new Map();
  let row = 0;
  const place = (node, depth) => {
    const kids = children.get(node.id) || [];
    const start = row;
    kids.forEach((kid) => place(kid, depth + 1));
    if (!kids.length) row += 1;
    pos.set(node.id, { x: depth, y: kids.length ? start : row - 1 });
  };
  (children.get("") || []).forEach((root) => place(root, 0));
  const on = new Set(((trace.branches || [])[chosen] || { nodeIds: [] }).nodeIds);
  const BW = 150, BH = 40, GX = 34, GY = 12;
  const cols = Math.max(...[...pos.values()].map((p) => p.x)) + 1;
  const W = cols * BW + (cols - 1) * GX + 4, H = row * BH + (row - 1) * GY + 4;
  const root = svg("svg", { width: W, height: H, viewBox: `0 0 ${W} ${H}` });
  const at = (id) => {
    const p = pos.get(id);
    return { x: 2 + p.x * (BW + GX), y: 2 + p.y * (BH + GY) };
  };
  for (const n of nodes) {
    if (!n.parent || !pos.has(n.parent)) continue;
    const a = at(n.parent), b = at(n.id);
    root.append(
      svg("path", {
        class: "edge",
        d: `M${a.x + BW},${a.y + BH / 2} C${a.x + BW + GX / 2},${a.y + BH / 2} ${b.x - GX / 2},${b.y + BH / 2} ${b.x},${b.y + BH / 2}`,
      }),
    );
  }
  for (const n of nodes) {
    if (!pos.has(n.id)) continue;
    const p = at(n.id);
    const role = (n.role || "").replace("ROLE_", "").toLowerCase();
    const content = (n.content || "").replace(/\s+/g, " ");
    const branch = (trace.branches || []).findIndex((b) => b.nodeIds.includes(n.id));
    root.append(
      svg(
        "g",
        {
          class: "node" + (on.has(n.id) ? " on" : ""),
          "data-node": n.id,
          transform: `translate(${p.x},${p.y})`,
          onclick: () => {
            if (branch >= 0) {
              state.branch[trace.id] = branch;
              renderGroup();
            }
          },
        },
        svg("title", {}, `${n.id} (${role}${n.isObservation ? ", observation" : ""}): ${n.content || ""}`),
        svg("rect", { width: BW, height: BH, rx: 6 }),
        svg("text", { class: "role", x: 8, y: 14 }, `${role}${n.isObservation ? " · obs" : ""} · ${n.id}`),
        svg("text", { x: 8, y: 30 }, content.length > 22 ? content.slice(0, 21) + "…" : content || "(empty)"),
      ),
    );
  }
  wrap.append(root);
  return wrap;
}

// -- config -------------------------------------------------------------------------------------

function renderConfig() {
  const view = document.getElementById("config-view");
  if (!state.detail) return;
  const { config, summary } = state.detail;
  fill(
    view,
    summary ? el("div", { class: "panel" }, el("h3", {}, "Summary"), el("pre", {}, JSON.stringify(summary, null, 2))) : null,
    el(
      "div",
      { class: "panel" },
      el("h3", {}, "Resolved config"),
      config ? el("pre", { class: "config" }, JSON.stringify(config, null, 2)) : el("p", { class: "empty-state" }, "This run folder has no resolved_config.json."),
    ),
  );
}

// -- tabs and start -----------------------------------------------------------------------------

function showTab(tab) {
  state.tab = tab;
  for (const button of document.querySelectorAll("#tabs button")) button.classList.toggle("active", button.dataset.tab === tab);
  for (const name of ["curves", "traces", "config"]) document.getElementById(`tab-${name}`).hidden = name !== tab;
  if (tab === "config") renderConfig();
  if (tab === "curves") renderCharts();
  writeHash();
}

async function start() {
  const wanted = readHash();
  for (const button of document.querySelectorAll("#tabs button")) button.addEventListener("click", () => showTab(button.dataset.tab));
  document.getElementById("trace-step").addEventListener("change", (e) => {
    document.getElementById("trace-follow").checked = false;
    loadTraceStep(e.target.value, 0);
  });
  document.getElementById("trace-env").addEventListener("change", () => renderGroups());
  document.getElementById("trace-filter").addEventListener("change", () => renderGroups());
  state.runId = wanted.run;
  await refreshRuns();
  if (state.runId && !state.runs.some((r) => r.id === state.runId)) state.runId = state.runs.length ? state.runs[0].id : null;
  renderRuns();
  if (wanted.step) {
    document.getElementById("trace-follow").checked = false;
    state.traceKey = null;
  }
  await poll(true);
  if (wanted.step && state.traceSteps.some((s) => keyOf(s) === wanted.step)) await loadTraceStep(wanted.step, wanted.group || 0);
  showTab(wanted.tab);
  setInterval(() => poll(), POLL_MS);
  setInterval(() => refreshRuns().catch(() => {}), 5 * POLL_MS);
}

start();

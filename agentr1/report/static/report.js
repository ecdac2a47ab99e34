/* agentr1 run report: curves, evaluation tables and the token-level trajectory viewer.
 *
 * Reads the JSON in #report-data (agentr1/report/data.py says what it holds) and builds
 * the page with DOM text nodes only: nothing of a run is ever parsed as HTML. Served by
 * `agentr1 report --serve`, the page polls version.json and data.json on its own origin;
 * opened from disk it makes no request at all. Plain ES2017, no libraries. */
"use strict";
(function () {
  const SVGNS = "http://www.w3.org/2000/svg";
  const PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
    "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
  const DASHES = ["", "6 3", "2 2", "9 3 2 3"];
  const MASK_ON = "rgba(46, 160, 67, 0.35)";
  const MASK_OFF = "rgba(140, 140, 140, 0.15)";
  const LAYERS = {
    mask: "loss mask",
    advantage: "advantage",
    logprob: "sampled log-prob",
    ratio: "PPO ratio (after / before the update)",
    kl: "KL to the reference",
  };
  const MAX_LISTED = 500;

  let DATA = JSON.parse(document.getElementById("report-data").textContent);
  const hidden = new Set(); // "panel|run|key" of series toggled off
  const state = { run: 0, step: "all", stepChosen: false, split: "all", stop: "all",
    errors: "any", rmin: "", rmax: "", layer: "mask", episode: null, anyKey: null };

  // ------------------------------------------------------------------ helpers
  function el(tag, attrs, ...kids) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null) continue;
      if (k === "text") node.textContent = String(v);
      else if (k === "class") node.className = v;
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else if (k === "style") Object.assign(node.style, v);
      else node.setAttribute(k, String(v));
    }
    for (const kid of kids) {
      if (kid === null || kid === undefined) continue;
      node.appendChild(typeof kid === "string" ? document.createTextNode(kid) : kid);
    }
    return node;
  }
  function svg(tag, attrs) {
    const node = document.createElementNS(SVGNS, tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "text") node.textContent = String(v);
      else node.setAttribute(k, String(v));
    }
    return node;
  }
  function fmt(v, digits) {
    if (v === null || v === undefined || Number.isNaN(v)) return "—";
    if (typeof v !== "number") return String(v);
    const a = Math.abs(v);
    if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(2);
    return String(Number(v.toPrecision(digits || 4)));
  }
  function options(select, items, value) {
    select.textContent = "";
    for (const [v, label] of items) select.appendChild(el("option", { value: v, text: label }));
    select.value = items.some(([v]) => v === value) ? value : (items[0] ? items[0][0] : "");
    return select.value;
  }
  function labelled(text, control) {
    return el("span", {}, el("label", { text: text + " " }), control);
  }

  // ------------------------------------------------------------------ header
  function renderHeader() {
    const lines = DATA.runs.map((r) => {
      const cfg = r.config || {};
      const algo = (cfg.algo || {}).estimator;
      const s = r.summary || {};
      const steps = r.rl.step.length;
      const bits = [r.name + ":", r.task ? "task " + r.task : null, algo ? algo : null,
        steps + " RL steps logged", s.minutes !== undefined ? fmt(s.minutes, 3) + " minutes" : "running or stopped",
        r.shown.rl ? r.shown.rl_shown + " of " + r.shown.rl + " logged steps' episodes in the viewer" : null];
      return bits.filter(Boolean).join("  ");
    });
    lines.push("generated " + DATA.generated + (DATA.live ? " (live: refreshes as the run writes)" : ""));
    document.getElementById("meta").textContent = lines.join("\n");
    const box = document.getElementById("skipped");
    box.textContent = "";
    const all = [];
    for (const r of DATA.runs) for (const s of r.skipped) all.push(s);
    box.hidden = all.length === 0;
    if (all.length) {
      box.appendChild(el("strong", { text: all.length + " unreadable line(s) or file(s) left out (a run killed mid-write?):" }));
      const ul = el("ul");
      for (const s of all) ul.appendChild(el("li", { text: s }));
      box.appendChild(ul);
    }
  }

  // ------------------------------------------------------------------ curves
  const PANELS = [
    { id: "reward", title: "reward per episode", keys: ["reward", "outcome_reward", "process_reward"] },
    { id: "metrics", title: "task metrics (training episodes)", keys: (r) => r.metric_names },
    { id: "kl", title: "KL to the reference", keys: ["kl", "kl_reward", "approx_kl"] },
    { id: "entropy", title: "entropy", keys: ["entropy"] },
    { id: "clip", title: "clip fractions", keys: ["clipfrac", "dual_clip_frac", "kl_tail_frac"] },
    { id: "tools", title: "tool calls, errors and turns per episode", keys: ["tool_calls", "tool_errors", "turns", "parse_errors"] },
    { id: "stops", title: "stop reasons (share of episodes)", prefix: "stop/" },
    { id: "lengths", title: "tokens per episode", keys: ["response_len", "episode_len"] },
    { id: "times", title: "seconds per phase", prefix: "time/" },
    { id: "optim", title: "optimization", keys: ["policy_loss", "grad_norm", "value_loss", "logprob_mismatch", "skipped_updates"] },
    { id: "eval", title: "evaluations: greedy, all questions", evals: true },
    { id: "any", title: "any metric", any: true },
  ];

  function rlSeries(run, ri, key) {
    const ys = run.rl[key];
    if (!ys || !ys.some((y) => y !== null)) return null;
    return { run: ri, key: key, xs: run.rl.step, ys: ys };
  }
  function panelSeries(p) {
    const out = [];
    DATA.runs.forEach((run, ri) => {
      let keys = [];
      if (p.prefix) keys = Object.keys(run.rl).filter((k) => k.startsWith(p.prefix));
      else if (typeof p.keys === "function") keys = p.keys(run);
      else if (p.keys) keys = p.keys;
      else if (p.any && state.anyKey) keys = [state.anyKey];
      for (const k of keys) {
        const s = rlSeries(run, ri, k);
        if (s) out.push(s);
      }
      if (p.evals) {
        const head = run.metric_names[0];
        const splits = {};
        for (const e of run.evals) {
          for (const [split, groups] of Object.entries((e.record.greedy || {}))) {
            const v = groups && groups.all ? groups.all[head] : undefined;
            if (v === undefined || e.step === null) continue;
            (splits[split] = splits[split] || []).push([e.step, v]);
          }
        }
        for (const [split, pts] of Object.entries(splits)) {
          pts.sort((a, b) => a[0] - b[0]);
          out.push({ run: ri, key: split + " " + head, xs: pts.map((q) => q[0]), ys: pts.map((q) => q[1]) });
        }
      }
    });
    return out;
  }
  function niceTicks(lo, hi, n) {
    const span = hi - lo;
    const step0 = span / Math.max(1, n);
    const mag = Math.pow(10, Math.floor(Math.log10(step0)));
    const norm = step0 / mag;
    const step = (norm < 1.5 ? 1 : norm < 3 ? 2 : norm < 7 ? 5 : 10) * mag;
    const ticks = [];
    for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) ticks.push(Number(t.toPrecision(12)));
    return ticks;
  }

  function drawChart(p, series, box) {
    const W = 440, H = 210, L = 46, R = 10, T = 8, B = 24;
    const chart = svg("svg", { class: "chart", viewBox: `0 0 ${W} ${H}`, "data-panel": p.id });
    const live = series.filter((s) => !hidden.has(p.id + "|" + s.run + "|" + s.key));
    let xs = [], ys = [];
    for (const s of live) {
      s.xs.forEach((x, i) => { if (s.ys[i] !== null && x !== null) { xs.push(x); ys.push(s.ys[i]); } });
    }
    if (!xs.length) { xs = [0, 1]; ys = [0, 1]; }
    let x0 = Math.min(...xs), x1 = Math.max(...xs), y0 = Math.min(...ys), y1 = Math.max(...ys);
    if (x0 === x1) { x0 -= 1; x1 += 1; }
    if (y0 === y1) { const d = Math.abs(y0) * 0.1 || 1; y0 -= d; y1 += d; }
    const pad = (y1 - y0) * 0.05; y0 -= pad; y1 += pad;
    const X = (x) => L + (x - x0) / (x1 - x0) * (W - L - R);
    const Y = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
    const yticks = niceTicks(y0, y1, 4);
    const tstep = yticks.length > 1 ? yticks[1] - yticks[0] : 1;
    const decimals = Math.max(0, Math.min(8, -Math.floor(Math.log10(tstep))));
    for (const t of yticks) {
      const label = Math.abs(t) >= 1e5 || (t !== 0 && Math.abs(t) < 1e-3) ? t.toExponential(1) : t.toFixed(decimals);
      chart.appendChild(svg("line", { class: "grid", x1: L, x2: W - R, y1: Y(t), y2: Y(t) }));
      chart.appendChild(svg("text", { x: L - 4, y: Y(t) + 3, "text-anchor": "end", text: label }));
    }
    for (const t of niceTicks(x0, x1, 6)) {
      if (Math.abs(t - Math.round(t)) > 1e-9) continue; // steps are whole
      chart.appendChild(svg("text", { x: X(t), y: H - B + 13, "text-anchor": "middle", text: fmt(t) }));
    }
    chart.appendChild(svg("line", { class: "axis", x1: L, x2: L, y1: T, y2: H - B }));
    chart.appendChild(svg("line", { class: "axis", x1: L, x2: W - R, y1: H - B, y2: H - B }));
    chart.appendChild(svg("text", { x: W - R, y: H - 2, "text-anchor": "end", text: "RL step" }));
    series.forEach((s, si) => {
      if (hidden.has(p.id + "|" + s.run + "|" + s.key)) return;
      const colour = PALETTE[si % PALETTE.length];
      let d = "", pen = "M", n = 0;
      const dots = [];
      s.xs.forEach((x, i) => {
        const y = s.ys[i];
        if (y === null || x === null) { pen = "M"; return; }
        d += `${pen}${X(x).toFixed(1)},${Y(y).toFixed(1)} `;
        pen = "L"; n += 1;
        dots.push([X(x), Y(y)]);
      });
      chart.appendChild(svg("path", { class: "series", d: d.trim(), stroke: colour,
        "stroke-dasharray": DASHES[s.run % DASHES.length], "data-run": s.run, "data-key": s.key, "data-n": n }));
      if (n <= 200) {
        for (const [cx, cy] of dots) chart.appendChild(svg("circle", { class: "pt", cx: cx, cy: cy, r: 2, fill: colour, "data-key": s.key, "data-run": s.run }));
      }
    });
    const cross = svg("line", { class: "cross", y1: T, y2: H - B, visibility: "hidden" });
    chart.appendChild(cross);
    const hit = svg("rect", { x: L, y: T, width: W - L - R, height: H - T - B, fill: "transparent" });
    chart.appendChild(hit);
    const steps = Array.from(new Set(xs)).sort((a, b) => a - b);
    hit.addEventListener("mousemove", (ev) => {
      const r = chart.getBoundingClientRect();
      const px = (ev.clientX - r.left) / r.width * W;
      const x = x0 + (px - L) / (W - L - R) * (x1 - x0);
      let best = steps[0];
      for (const s of steps) if (Math.abs(s - x) < Math.abs(best - x)) best = s;
      cross.setAttribute("x1", X(best)); cross.setAttribute("x2", X(best));
      cross.setAttribute("visibility", "visible");
      const lines = ["step " + fmt(best)];
      for (const s of live) {
        const i = s.xs.indexOf(best);
        if (i >= 0) lines.push(seriesName(s) + "  " + fmt(s.ys[i]));
      }
      showTip(lines.join("\n"), ev);
    });
    hit.addEventListener("mouseleave", () => { cross.setAttribute("visibility", "hidden"); hideTip(); });
    box.appendChild(chart);
    const legend = el("div", { class: "legend" });
    series.forEach((s, si) => {
      const id = p.id + "|" + s.run + "|" + s.key;
      const key = el("span", { class: "key" + (hidden.has(id) ? " off" : ""), "data-key": s.key, "data-run": s.run, title: "click: show / hide",
        onclick: () => { if (hidden.has(id)) hidden.delete(id); else hidden.add(id); renderPanel(p); } },
      el("span", { class: "sw", style: { background: PALETTE[si % PALETTE.length] } }), seriesName(s));
      legend.appendChild(key);
    });
    box.appendChild(legend);
  }
  function seriesName(s) {
    return DATA.runs.length > 1 ? DATA.runs[s.run].name + ": " + s.key : s.key;
  }
  function anyKeys() {
    const keys = new Set();
    for (const r of DATA.runs) for (const k of Object.keys(r.rl)) if (k !== "step") keys.add(k);
    return Array.from(keys).sort();
  }
  function renderPanel(p) {
    const box = document.querySelector(`.panel[data-panel="${p.id}"]`);
    box.textContent = "";
    const head = el("h3", { text: p.title });
    if (p.any) {
      const keys = anyKeys();
      if (!state.anyKey || !keys.includes(state.anyKey)) state.anyKey = keys.includes("gen_tokens_per_s") ? "gen_tokens_per_s" : keys[0] || null;
      const sel = el("select", { onchange: (ev) => { state.anyKey = ev.target.value; renderPanel(p); } });
      options(sel, keys.map((k) => [k, k]), state.anyKey);
      head.appendChild(sel);
    }
    box.appendChild(head);
    const series = panelSeries(p);
    if (!series.length) { box.appendChild(el("p", { class: "empty", text: "not logged by this run" })); return; }
    drawChart(p, series, box);
  }
  function renderCurves() {
    const root = document.getElementById("panels");
    root.textContent = "";
    for (const p of PANELS) {
      root.appendChild(el("div", { class: "panel", "data-panel": p.id }));
      renderPanel(p);
    }
  }

  // ------------------------------------------------------------------ evaluation tables
  function runEvals(run) {
    if (run.evals.length) return run.evals;
    const s = run.summary || {};
    const out = [];
    if (s.eval_before) out.push({ label: "before", step: 0, record: s.eval_before });
    if (s.eval_after) out.push({ label: "after", step: s.steps, record: s.eval_after });
    return out;
  }
  function renderEvals() {
    const root = document.getElementById("eval-tables");
    root.textContent = "";
    DATA.runs.forEach((run, ri) => {
      const evals = runEvals(run);
      const box = el("div", { class: "evalrun", "data-run": ri });
      root.appendChild(box);
      if (DATA.runs.length > 1) box.appendChild(el("h3", { text: run.name }));
      if (!evals.length) { box.appendChild(el("p", { class: "empty", text: "no evaluation logged yet" })); return; }
      const metrics = run.metric_names.concat(["turns", "tool_calls"]);
      const modes = Array.from(new Set(evals.flatMap((e) => Object.keys(e.record))));
      const msel = el("select", { class: "eval-metric" });
      const modesel = el("select", { class: "eval-mode" });
      options(msel, metrics.map((m) => [m, m]), metrics[0]);
      options(modesel, modes.map((m) => [m, m]), "greedy");
      const tables = el("div");
      const draw = () => drawEvalTables(tables, evals, msel.value, modesel.value);
      msel.addEventListener("change", draw); modesel.addEventListener("change", draw);
      box.appendChild(el("div", { class: "controls" }, labelled("metric", msel), labelled("mode", modesel)));
      box.appendChild(tables);
      draw();
    });
  }
  function drawEvalTables(root, evals, metric, mode) {
    root.textContent = "";
    const splits = Array.from(new Set(evals.flatMap((e) => Object.keys(e.record[mode] || {}))));
    for (const split of splits) {
      const cols = evals.filter((e) => (e.record[mode] || {})[split]);
      const groups = Array.from(new Set(cols.flatMap((e) => Object.keys(e.record[mode][split]))));
      const table = el("table", { class: "evals", "data-split": split });
      const head = el("tr", {}, el("th", { text: split }));
      for (const e of cols) head.appendChild(el("th", { text: e.label }));
      if (cols.length > 1) head.appendChild(el("th", { text: "Δ " + cols[cols.length - 1].label + " − " + cols[0].label }));
      table.appendChild(head);
      for (const g of groups) {
        const tr = el("tr", {}, el("td", { text: g }));
        const vals = cols.map((e) => (e.record[mode][split][g] || {}));
        for (const v of vals) tr.appendChild(el("td", { text: v[metric] === undefined ? "" : Number(v[metric]).toFixed(3), title: v.n !== undefined ? "n = " + v.n : null }));
        if (cols.length > 1) {
          const a = vals[0][metric], b = vals[vals.length - 1][metric];
          const d = (a === undefined || b === undefined) ? null : b - a;
          tr.appendChild(el("td", { class: "delta" + (d > 0 ? " up" : d < 0 ? " down" : ""), text: d === null ? "" : (d > 0 ? "+" : "") + d.toFixed(3) }));
        }
        table.appendChild(tr);
      }
      root.appendChild(table);
    }
  }

  // ------------------------------------------------------------------ trajectory viewer
  function epKey(e) { return [e.label, e.step, e.split, e.group, e.sample].join("|"); }
  function where(e) { return e.label === "rl" ? "step " + fmt(e.step) : "eval " + e.label; }
  function stepValue(e) { return e.label === "rl" ? "rl|" + e.step : "eval|" + e.label; }
  function filtered(run) {
    const lo = state.rmin === "" ? -Infinity : Number(state.rmin);
    const hi = state.rmax === "" ? Infinity : Number(state.rmax);
    return run.episodes.filter((e) => (state.step === "all" || stepValue(e) === state.step)
      && (state.split === "all" || e.split === state.split)
      && (state.stop === "all" || String(e.stop_reason) === state.stop)
      && (state.errors === "any" || (state.errors === "with") === (e.tool_errors > 0))
      && e.reward >= lo && e.reward <= hi);
  }
  function renderViewer() {
    const root = document.getElementById("viewer-body");
    root.textContent = "";
    if (state.run >= DATA.runs.length) state.run = 0;
    const run = DATA.runs[state.run];
    const controls = el("div", { class: "controls" });
    root.appendChild(controls);
    if (DATA.runs.length > 1) {
      const rs = el("select", { id: "f-run", onchange: (ev) => { state.run = Number(ev.target.value); state.episode = null; renderViewer(); } });
      options(rs, DATA.runs.map((r, i) => [String(i), r.name]), String(state.run));
      controls.appendChild(labelled("run", rs));
    }
    const eps = run.episodes;
    const stepItems = [["all", "all"]];
    const seen = new Set();
    for (const e of eps) {
      const v = stepValue(e);
      if (!seen.has(v)) { seen.add(v); stepItems.push([v, where(e)]); }
    }
    const pick = (id, text, items, key) => {
      const sel = el("select", { id: id, onchange: (ev) => {
        state[key] = ev.target.value;
        if (key === "step") state.stepChosen = true;
        drawList();
      } });
      state[key] = options(sel, items, state[key]);
      controls.appendChild(labelled(text, sel));
    };
    if (!state.stepChosen) { // at first the newest RL step: what the policy does now
      const rl = stepItems.filter(([v]) => v.startsWith("rl|"));
      state.step = rl.length ? rl[rl.length - 1][0] : "all";
    }
    pick("f-step", "step", stepItems, "step");
    pick("f-split", "split", [["all", "all"]].concat(Array.from(new Set(eps.map((e) => e.split))).map((s) => [s, s])), "split");
    pick("f-stop", "stop reason", [["all", "all"]].concat(Array.from(new Set(eps.map((e) => String(e.stop_reason)))).sort().map((s) => [s, s])), "stop");
    pick("f-errors", "tool errors", [["any", "any"], ["with", "with errors"], ["without", "without"]], "errors");
    for (const [id, key, text] of [["f-rmin", "rmin", "reward ≥"], ["f-rmax", "rmax", "reward ≤"]]) {
      const inp = el("input", { id: id, type: "number", step: "any", value: state[key],
        oninput: (ev) => { state[key] = ev.target.value; drawList(); } });
      controls.appendChild(labelled(text, inp));
    }
    const layers = new Set(["mask"]);
    for (const e of eps) for (const k of Object.keys(e.layers)) if (LAYERS[k]) layers.add(k);
    const lsel = el("select", { id: "layer", onchange: (ev) => { state.layer = ev.target.value; drawEpisode(); } });
    state.layer = options(lsel, Object.keys(LAYERS).filter((k) => layers.has(k)).map((k) => [k, LAYERS[k]]), state.layer);
    controls.appendChild(labelled("colour tokens by", lsel));
    if (run.shown.rl > run.shown.rl_shown) {
      root.appendChild(el("p", { class: "facts", text: `episodes of ${run.shown.rl_shown} of the ${run.shown.rl} logged RL steps are in this page, evenly spread (agentr1 report --max-steps N)` }));
    }
    const count = el("p", { id: "episode-count", class: "facts" });
    const list = el("div", { class: "listbox" });
    root.appendChild(count);
    root.appendChild(list);
    root.appendChild(el("div", { id: "episode" }));
    root.appendChild(el("h3", { text: "its group (the GRPO group: every sample of the same task at the same step)" }));
    root.appendChild(el("div", { id: "group" }));

    function drawList() {
      const shown = filtered(run);
      count.textContent = `${shown.length} of ${eps.length} episodes` + (shown.length > MAX_LISTED ? ` (the first ${MAX_LISTED} listed)` : "");
      list.textContent = "";
      const table = el("table", { class: "episodes", id: "episode-list" });
      table.appendChild(el("tr", {}, ...["where", "split", "group", "sample", "reward", "stop reason", "tool calls", "errors", "answer"].map((h) => el("th", { text: h }))));
      for (const e of shown.slice(0, MAX_LISTED)) {
        const tr = el("tr", { class: "ep" + (state.episode === epKey(e) ? " sel" : ""), "data-key": epKey(e),
          onclick: () => { state.episode = epKey(e); drawList(); drawEpisode(); } },
        el("td", { text: where(e) }), el("td", { text: e.split }), el("td", { text: e.group }), el("td", { text: e.sample }),
        el("td", { text: fmt(e.reward) }), el("td", { text: String(e.stop_reason) }), el("td", { text: e.tool_log.length }),
        el("td", { text: e.tool_errors }), el("td", { class: "ans", text: e.answer === null ? "—" : e.answer }));
        table.appendChild(tr);
      }
      list.appendChild(table);
      if (!shown.some((e) => epKey(e) === state.episode)) {
        state.episode = shown.length ? epKey(shown[0]) : null;
        const first = table.querySelector("tr.ep");
        if (first) first.classList.add("sel");
        drawEpisode();
      }
    }
    drawList();
  }

  function layerValues(e, layer) {
    return layer === "mask" ? e.loss_mask : (e.layers[layer] || e.token_ids.map(() => null));
  }
  function layerScale(episodes, layer) {
    let m = 0;
    for (const e of episodes) {
      for (const v of layerValues(e, layer)) {
        if (v === null) continue;
        const a = layer === "ratio" ? Math.abs(Math.log(Math.max(v, 1e-12))) : Math.abs(v);
        if (a > m) m = a;
      }
    }
    return m || 1;
  }
  function clipRange() {
    const algo = ((DATA.runs[state.run].config || {}).algo) || {};
    return [1 - (algo.clip_low === undefined ? 0.2 : algo.clip_low), 1 + (algo.clip_high === undefined ? 0.2 : algo.clip_high)];
  }
  function colour(layer, v, scale) {
    if (layer === "mask") return v ? MASK_ON : MASK_OFF;
    if (v === null || v === undefined) return "transparent";
    if (layer === "advantage") {
      const a = Math.min(1, Math.abs(v) / scale) * 0.75;
      return v >= 0 ? `rgba(46, 160, 67, ${a.toFixed(3)})` : `rgba(214, 39, 40, ${a.toFixed(3)})`;
    }
    if (layer === "logprob") return `rgba(255, 127, 14, ${(0.08 + 0.72 * (1 - Math.exp(v))).toFixed(3)})`;
    if (layer === "ratio") {
      const d = Math.log(Math.max(v, 1e-12));
      const a = Math.min(1, Math.abs(d) / scale) * 0.8;
      return d >= 0 ? `rgba(31, 119, 180, ${a.toFixed(3)})` : `rgba(214, 39, 40, ${a.toFixed(3)})`;
    }
    return `rgba(148, 103, 189, ${(Math.min(1, Math.abs(v) / scale) * 0.85).toFixed(3)})`;
  }
  function tokenSpan(e, i, layer, scale, clip) {
    const v = layerValues(e, layer)[i];
    const text = String(e.pieces[i]).replace(/\n/g, "\u21b5\n"); // a visible line break
    const span = el("span", { class: "tok", "data-i": i, "data-mask": e.loss_mask[i], text: text });
    span.style.backgroundColor = colour(layer, v, scale);
    if (layer === "ratio" && v !== null && (v < clip[0] || v > clip[1])) span.classList.add("clipped");
    span._ep = e;
    return span;
  }
  function tokens(e, lo, hi, layer, scale, clip) {
    const box = el("div", { class: "toks" });
    for (let i = lo; i < hi; i++) box.appendChild(tokenSpan(e, i, layer, scale, clip));
    return box;
  }
  function groupOf(e) {
    return DATA.runs[state.run].episodes.filter((o) => o.label === e.label && o.step === e.step
      && o.split === e.split && o.group === e.group).sort((a, b) => a.sample - b.sample);
  }
  function scaleBar(layer, scale) {
    if (layer === "mask") {
      return el("span", { class: "scale" }, el("span", { class: "bar", style: { background: MASK_ON, width: "20px" } }), "trained (loss mask 1)",
        el("span", { class: "bar", style: { background: MASK_OFF, width: "20px" } }), "not trained (prompt, tool responses, template)");
    }
    const lo = layer === "ratio" ? fmt(Math.exp(-scale)) : layer === "advantage" ? fmt(-scale) : layer === "logprob" ? "p=1" : "0";
    const hi = layer === "ratio" ? fmt(Math.exp(scale)) : layer === "logprob" ? "p→0" : fmt(scale);
    const stops = [-1, -0.5, 0, 0.5, 1].map((t) => {
      if (layer === "ratio") return colour(layer, Math.exp(t * scale), scale);
      if (layer === "advantage") return colour(layer, t * scale, scale);
      if (layer === "logprob") return colour(layer, Math.log(Math.max(1e-6, 1 - (t + 1) / 2)), scale);
      return colour(layer, (t + 1) / 2 * scale, scale);
    });
    const extra = layer === "ratio" ? " (outlined: outside PPO's clip range " + clipRange().map((c) => fmt(c)).join("–") + ")" : "";
    return el("span", { class: "scale" }, lo, el("span", { class: "bar", style: { background: `linear-gradient(to right, ${stops.join(", ")})` } }), hi + extra + "; uncoloured: not trained");
  }
  function drawEpisode() {
    const box = document.getElementById("episode");
    const gbox = document.getElementById("group");
    if (!box || !gbox) return;
    box.textContent = ""; gbox.textContent = "";
    const run = DATA.runs[state.run];
    const e = run.episodes.find((o) => epKey(o) === state.episode);
    if (!e) { box.appendChild(el("p", { class: "empty", text: "no episode matches the filters" })); return; }
    const layer = state.layer;
    const group = groupOf(e);
    const scale = layerScale(group, layer);
    const clip = clipRange();
    const facts = [where(e), "split " + e.split, "task " + e.task_id, "sample " + e.sample,
      "reward " + fmt(e.reward), e.advantage !== undefined ? "mean advantage " + fmt(e.advantage) : null,
      "stop: " + e.stop_reason, "answer: " + (e.answer === null ? "—" : e.answer),
      e.gold ? "gold: " + e.gold.join(" | ") : null, e.token_ids.length + " tokens, " + e.loss_mask.reduce((a, b) => a + b, 0) + " trained"];
    box.appendChild(el("h3", { text: e.question || e.task_id }));
    box.appendChild(el("p", { class: "facts", text: facts.filter(Boolean).join(" · ") }));
    box.appendChild(el("p", {}, scaleBar(layer, scale)));
    const n = e.token_ids.length;
    const conv = el("div", { id: "conversation" });
    const first = e.turns.length ? Math.min(e.turns[0].start, n) : n;
    const seg = (cls, label, lo, hi) => {
      if (hi <= lo) return;
      conv.appendChild(el("div", { class: "segment " + cls }, el("div", { class: "seglabel", text: label }), tokens(e, lo, hi, layer, scale, clip)));
    };
    seg("prompt", "prompt", 0, first);
    let pos = first;
    e.turns.forEach((t, ti) => {
      const start = Math.max(pos, Math.min(t.start, n)), end = Math.max(start, Math.min(t.end, n));
      const obsEnd = Math.max(end, Math.min(t.obs_end, n));
      seg("tool", "inserted", pos, start);
      seg("agent", `agent turn ${ti + 1}` + (t.finish ? ` (${t.finish})` : "") + (t.reward ? `, process reward ${fmt(t.reward)}` : ""), start, end);
      for (const c of e.tool_log.filter((x) => x.turn === ti)) {
        conv.appendChild(el("div", { class: "toolcall" + (c.ok === false ? " err" : "") },
          `→ ${c.name}(${JSON.stringify(c.arguments)})` + (c.ok === false ? `  ✗ ${c.error || "error"}` : "  ✓") + "\n" + c.content));
      }
      seg("tool", "tool response and template", end, obsEnd);
      pos = obsEnd;
    });
    seg("tool", "after the last turn", pos, n);
    box.appendChild(conv);
    for (const o of group) {
      const m = el("div", { class: "member" + (o === e ? " sel" : ""), "data-key": epKey(o),
        onclick: () => { state.episode = epKey(o); renderViewerSelection(); } },
      el("div", { class: "facts", text: `sample ${o.sample} · reward ${fmt(o.reward)}` + (o.advantage !== undefined ? ` · adv ${fmt(o.advantage)}` : "") + ` · ${o.stop_reason} · ${o.answer === null ? "—" : o.answer}` }),
      tokens(o, Math.min(o.prompt_len, o.token_ids.length), o.token_ids.length, layer, scale, clip));
      gbox.appendChild(m);
    }
  }
  function renderViewerSelection() {
    for (const tr of document.querySelectorAll("#episode-list tr.ep")) tr.classList.toggle("sel", tr.dataset.key === state.episode);
    drawEpisode();
  }

  // ------------------------------------------------------------------ tooltip
  const tip = document.getElementById("tip");
  function showTip(text, ev) {
    tip.textContent = text;
    tip.hidden = false;
    const x = Math.min(ev.clientX + 14, window.innerWidth - tip.offsetWidth - 8);
    const y = ev.clientY + 16 + tip.offsetHeight > window.innerHeight ? ev.clientY - tip.offsetHeight - 8 : ev.clientY + 16;
    tip.style.left = Math.max(0, x) + "px";
    tip.style.top = Math.max(0, y) + "px";
  }
  function hideTip() { tip.hidden = true; }
  document.addEventListener("mouseover", (ev) => {
    const t = ev.target;
    if (!(t instanceof HTMLElement) || !t.classList.contains("tok") || !t._ep) return;
    const e = t._ep, i = Number(t.dataset.i);
    const lines = [`token ${i}  id ${e.token_ids[i]}  ${JSON.stringify(e.pieces[i])}`, `loss mask ${e.loss_mask[i]}`];
    for (const [k, name] of Object.entries(LAYERS)) {
      if (k === "mask" || !e.layers[k]) continue;
      const v = e.layers[k][i];
      lines.push(`${name}: ${v === null ? "— (not trained)" : fmt(v)}` + (k === "logprob" && v !== null ? `  (p ${fmt(Math.exp(v), 3)})` : ""));
    }
    showTip(lines.join("\n"), ev);
  });
  document.addEventListener("mouseout", (ev) => {
    if (ev.target instanceof HTMLElement && ev.target.classList.contains("tok")) hideTip();
  });

  // ------------------------------------------------------------------ all, and live refresh
  function renderAll() {
    renderHeader();
    renderCurves();
    renderEvals();
    renderViewer();
    document.body.dataset.ready = "1";
  }
  renderAll();
  if (DATA.live) {
    let version = DATA.data_version;
    const poll = async () => {
      try {
        const v = await (await fetch("version.json", { cache: "no-store" })).json();
        if (v.version !== version) {
          DATA = await (await fetch("data.json", { cache: "no-store" })).json();
          version = DATA.data_version;
          renderAll();
        }
      } catch (err) {
        document.getElementById("meta").dataset.stale = "1"; // the server is gone: keep the page
      }
    };
    poll();
    setInterval(poll, 3000);
  }
})();

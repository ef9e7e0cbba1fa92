// A batch's page: its state, cluster, nodes and timeline, its place and
// start estimate while queued, and its Cancel button.

import { h, svg, enc, duration, when, clock, stateBadge, number, sleep } from "./dom.js";
import { api, mayWrite } from "./session.js";
import { show } from "./page.js";

export async function batchPage(main, r, ctx) {
  const [project, region, id] = r.parts;
  const base = `v1/projects/${enc(project)}/locations/${enc(region)}/batches/${enc(id)}`;
  let batch = await api(base);
  let deleted = null;
  const body = h("div", { id: "batch" });
  const output = h("pre", { class: "output", id: "output" });
  const outputNote = h("p", { class: "muted", id: "output-note" }, "No driver output yet.");
  let offset = "0";
  let outputDone = false;
  let reading = null;
  let again = false;
  // A requeued batch runs again from its first byte of output.
  const attemptOf = (b) => (b.flexq && b.flexq.attempt) || 1;
  let attempt = attemptOf(batch);
  const restartOutput = () => {
    output.replaceChildren();
    offset = "0";
    outputDone = false;
  };

  // Reads the driver's output from where it stopped until none is left;
  // a call while a read is on its way reads once more after it.
  const pull = () => {
    if (reading) {
      again = true;
      return reading;
    }
    reading = (async () => {
      try {
        do {
          again = false;
          while (!outputDone && ctx.alive()) {
            const o = await api(`${base}/output?offset=${offset}`);
            if (Number(o.totalBytes) < Number(offset)) {
              restartOutput();
              continue;
            }
            if (o.data) {
              output.append(o.data);
              output.scrollTop = output.scrollHeight;
            }
            outputNote.textContent =
              Number(o.totalBytes) === 0
                ? o.done
                  ? "The driver wrote nothing."
                  : "No driver output yet."
                : `${number(o.totalBytes)} bytes${o.truncated ? " (the rest was not kept: a batch's stored output is bounded)" : ""}${o.done ? ", complete" : ""}`;
            outputDone = o.done;
            if (o.nextOffset === offset) break;
            offset = o.nextOffset;
          }
        } while (again && !outputDone && ctx.alive());
      } finally {
        reading = null;
      }
    })();
    return reading;
  };
  // A newer batch than a read in flight: events count, and a read's answer
  // is shown only if no event came while it was on its way.
  let events = 0;
  const take = (b) => {
    if (attemptOf(b) !== attempt) {
      attempt = attemptOf(b);
      restartOutput();
    }
    batch = b;
  };

  // One Cancel control for the page's life: repaints move it, so a first
  // click's confirmation survives the events that arrive meanwhile.
  const cancel = cancelControl(project, () => batch);
  let chart = null;
  let executors = null;
  const paint = () => {
    cancel.update();
    body.replaceChildren(...batchView(batch, deleted, project, region, cancel.el, chart, executors));
  };
  paint();
  show(
    ctx,
    main,
    body,
    h("h2", null, "Driver output"),
    outputNote,
    output,
  );
  await pull().catch(() => {});
  // GPU points arrive with no event of their own (they change no state):
  // while the batch runs, its page asks for them every few seconds.
  const refreshGpus = async () => {
    if (!batch.runtimeInfo || !batch.runtimeInfo.gpuUtilization) return;
    const c = await api(`${base}/gpuUtilization`);
    if (!ctx.alive()) return;
    chart = c;
    paint();
  };
  refreshGpus().catch(() => {});
  // An elastic batch's executors change with each grant and release (each
  // a line of its history, so an event) and are asked for again then.
  const refreshExecutors = async () => {
    if (!isElastic(batch)) return;
    const c = await api(`${base}/executors`);
    if (!ctx.alive()) return;
    executors = c;
    paint();
  };
  refreshExecutors().catch(() => {});
  (async () => {
    while (ctx.alive()) {
      await sleep(GPU_POLL_MS);
      if (!ctx.alive() || !["RUNNING", "CANCELLING"].includes(batch.state)) continue;
      try {
        const seen = events;
        const b = await api(base);
        if (!ctx.alive()) return;
        // An event that came meanwhile is newer than this answer.
        if (seen === events) take(b);
        await refreshGpus();
        await refreshExecutors();
      } catch {
        // Tried again at the next turn.
      }
    }
  })();
  const stream = `v1/projects/${enc(project)}/locations/${enc(region)}/batches:watch?batchId=${enc(id)}`;
  ctx.watch(stream, (event, data) => {
    if (event === "batch") {
      events += 1;
      take(data.batch);
      paint();
      if (data.changes.includes("output") || batch.state !== "PENDING") pull().catch(() => {});
      refreshExecutors().catch(() => {});
    } else if (event === "position" && batch.flexq) {
      batch.flexq.queuePosition = data.queuePosition;
      batch.flexq.estimatedStartTime = data.estimatedStartTime;
      paint();
    } else if (event === "deleted") {
      deleted = data.deleteTime;
      paint();
    } else if (event === "ready") {
      const seen = events;
      api(base)
        .then((b) => {
          if (seen !== events || !ctx.alive()) return;
          take(b);
          paint();
        })
        .catch(() => {});
      pull().catch(() => {});
    }
  });
}

/** How often a running batch's page asks for its GPU points. */
const GPU_POLL_MS = 5000;

export function batchView(b, deleted, project, region, cancel, chart, executors) {
  const f = b.flexq ?? {};
  const id = b.name.split("/").pop();
  const out = [];
  if (deleted) out.push(h("p", { class: "banner", id: "deleted" }, `This batch was deleted at ${when(deleted)}.`));
  out.push(
    h(
      "h1",
      null,
      `Batch ${id} `,
      stateBadge(b.state, "batch-state"),
      " ",
      // Why it ended, from its typed reason (never from the message).
      f.endReason ? h("span", { class: `badge reason-${f.endReason}`, id: "end-reason", title: "Why it ended" }, f.endReason.replaceAll("_", " ")) : "",
      f.endReason ? " " : "",
      cancel,
    ),
  );
  if (b.stateMessage) out.push(h("p", { id: "state-message" }, b.stateMessage));
  const facts = [
    ["Project", project],
    ["Region", region],
    ["Created", when(b.createTime)],
    ["Creator", b.creator],
    ["Provisioning", f.provisioningState ? `${f.provisioningState} (${f.provisioningMode} mode)` : ""],
    ["Placement", placementView(f)],
    ["Alternatives", f.alternatives && f.alternatives.length ? ladderView(f.alternatives, f.placement) : ""],
    ["Zone", f.zone],
    ["Allocated", f.allocateTime ? when(f.allocateTime) : ""],
    ["Allocation deadline", f.allocationDeadline && f.provisioningState === "QUEUED" ? clock(f.allocationDeadline, "until") : ""],
    ["Queue position", f.queuePosition ? h("span", { id: "queue-position" }, number(f.queuePosition)) : ""],
    ["Estimated start", f.estimatedStartTime ? when(f.estimatedStartTime) : ""],
    ["Attempt", f.attempt],
    [
      "Preemptions",
      f.preemptions || f.preempting
        ? h(
            "span",
            { id: "preemptions", class: f.preempting ? "badge warn" : null },
            f.preempting ? "stopping: preempted" : number(f.preemptions),
          )
        : "",
    ],
    ["Operation", b.operation],
  ].filter(([, v]) => v !== undefined && v !== null && v !== "");
  const left = [
    h("h2", null, "Facts"),
    h("dl", { class: "facts" }, facts.map(([k, v]) => [h("dt", null, k), h("dd", null, v)])),
  ];
  if (f.notAdmittedReasons && f.notAdmittedReasons.length) {
    left.push(
      h("h2", null, "Why it waits"),
      h("ul", { class: "reasons", id: "reasons" }, f.notAdmittedReasons.map((x) => h("li", null, x))),
    );
  }
  left.push(
    h("h2", null, f.provisioningState === "RELEASED" ? "Nodes (released)" : "Nodes"),
    nodesView(f.nodes ?? []),
  );
  if (isElastic(b)) left.push(h("h2", null, "Executors"), elasticView(f.elastic, executors));
  const gpus = gpuView(b.runtimeInfo ?? {}, chart);
  if (gpus) left.push(h("h2", null, "GPUs"), gpus);
  out.push(h("div", { class: "cols" }, h("div", null, left), h("div", null, h("h2", null, "History"), timeline(b))));
  return out;
}

/** Whether Spark's dynamic allocation is on for the batch: its executors
 * beyond the core gang come and go (docs/rules.md#elastic-batches). */
export function isElastic(b) {
  const on = ((b.runtimeConfig ?? {}).properties ?? {})["spark.dynamicAllocation.enabled"];
  return Boolean((b.flexq ?? {}).elastic) || String(on).trim().toLowerCase() === "true";
}

/** An elastic batch's executors: what it holds and wants now, and the
 * chart of its executors over time. */
export function elasticView(e, chart) {
  const parts = [];
  if (e) {
    const x = e.extras;
    parts.push(
      h(
        "p",
        { id: "elastic-summary" },
        `${number(e.core)} in the core gang, ${number(x.running)} extra${x.running === 1 ? "" : "s"} of at most ${number(x.max)}; Spark wants ${number(x.wanted)}`,
        x.blockedBy ? h("span", { class: "badge warn", id: "extras-blocked", title: "What stops more extras" }, ` ${x.blockedBy.replaceAll("_", " ")}`) : null,
      ),
    );
  }
  if (chart && chart.points.length) parts.push(executorChart(chart, Date.now()));
  else if (!e) parts.push(h("p", { class: "muted" }, "No executors held."));
  return h("div", { id: "elastic" }, parts);
}

/** The executors over time as steps: all of them (the line) and, beneath,
 * the extras (the band), from the first change to `now`, or to the last
 * change once none is held. */
export function executorChart(chart, now) {
  const W = 600;
  const H = 120;
  const pts = chart.points;
  const t0 = Date.parse(pts[0].time);
  const last = pts[pts.length - 1];
  const t1 = Math.max(last.executors ? now : Date.parse(last.time), t0 + 1);
  const top = Math.max(...pts.map((p) => p.executors), 1);
  const x = (t) => ((Math.min(t, t1) - t0) / (t1 - t0)) * W;
  const y = (n) => H - (n / top) * (H - 4);
  const steps = (key) => {
    let d = `M0 ${y(0).toFixed(1)}`;
    pts.forEach((p, i) => {
      const end = i + 1 < pts.length ? Date.parse(pts[i + 1].time) : t1;
      d += `L${x(Date.parse(p.time)).toFixed(1)} ${y(p[key]).toFixed(1)}H${x(end).toFixed(1)}`;
    });
    return d;
  };
  const peak = pts.reduce((a, p) => (p.executors > a.executors ? p : a), pts[0]);
  return h(
    "figure",
    { class: "executor-chart" },
    svg(
      "svg",
      { id: "executor-chart", viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", role: "img", "aria-label": "Executors over time" },
      svg("path", { class: "extras", d: `${steps("extras")}V${H}H0Z` }),
      svg("path", { class: "executors", d: steps("executors") }),
    ),
    h(
      "figcaption",
      { class: "muted", id: "executor-caption" },
      `${when(pts[0].time)} to ${when(new Date(t1).toISOString())}: executors (line), of them extras (band); at most ${number(peak.executors)} (${number(peak.extras)} extra${peak.extras === 1 ? "" : "s"}), ${number(pts.length)} change${pts.length === 1 ? "" : "s"}`,
    ),
  );
}

/** What the batch's GPUs did: its summary, the chart of its utilization
 * over time, and what the RAPIDS Accelerator could not run on them. Null
 * while nothing was sampled or reported. */
export function gpuView(run, chart) {
  const g = run.gpuUtilization;
  const f = run.cpuFallback;
  if (!g && !f) return null;
  const parts = [];
  if (g) {
    parts.push(
      h(
        "p",
        { id: "gpu-summary" },
        `mean ${number(g.meanPercent, 1)} %, p95 ${number(g.p95Percent)} %, peak memory ${number(g.peakMemoryMb / 1024, 1)} GiB, idle ${duration(g.idleSeconds)}`,
        g.lastSampleTime ? h("span", { class: "muted" }, ` · last sample ${when(g.lastSampleTime)}`) : null,
      ),
    );
    if (chart && chart.points.length) parts.push(gpuChart(chart));
  }
  if (f) {
    const said = f.withoutRapids
      ? "It ran without the RAPIDS Accelerator: on the CPU only."
      : f.operators
        ? `${number(f.operators)} operator${f.operators === 1 ? "" : "s"} could not run on the GPU.`
        : "Every operator ran on the GPU.";
    parts.push(
      h("p", { id: "cpu-fallback", class: f.withoutRapids || f.operators ? "banner" : null }, said),
      f.reasons && f.reasons.length ? h("ul", { class: "reasons" }, f.reasons.map((r) => h("li", null, r))) : null,
    );
  }
  return h("div", { id: "gpus" }, parts);
}

/** The batch's utilization over time: its mean (the line) and its busiest
 * GPU (the band's top), slot by slot, 0 to 100 %; a slot with no point
 * breaks the line. */
export function gpuChart(chart) {
  const W = 600;
  const H = 120;
  const step = chart.stepSeconds * 1000;
  const t0 = Date.parse(chart.points[0].time);
  const t1 = Date.parse(chart.points[chart.points.length - 1].time) + step;
  const x = (t) => ((t - t0) / Math.max(t1 - t0, 1)) * W;
  const y = (percent) => H - (percent / 100) * H;
  const line = (key) => {
    let d = "";
    let end = null;
    for (const p of chart.points) {
      const start = Date.parse(p.time);
      d += `${start === end ? "L" : "M"}${x(start).toFixed(1)} ${y(p[key]).toFixed(1)}H${x(start + step).toFixed(1)}`;
      end = start + step;
    }
    return d;
  };
  const first = chart.points[0];
  const last = chart.points[chart.points.length - 1];
  return h(
    "figure",
    { class: "gpu-chart" },
    svg(
      "svg",
      { id: "gpu-chart", viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none", role: "img", "aria-label": "GPU utilization over time" },
      svg("line", { class: "grid", x1: 0, x2: W, y1: y(50), y2: y(50) }),
      svg("path", { class: "max", d: line("maxPercent") }),
      svg("path", { class: "mean", d: line("meanPercent") }),
    ),
    h(
      "figcaption",
      { class: "muted" },
      `${when(first.time)} to ${when(new Date(Date.parse(last.time) + step).toISOString())}, ${duration(chart.stepSeconds)} a step: mean (dark), busiest GPU (light), 0 to 100 %`,
    ),
  );
}

/** Where the batch runs: on one of its placement alternatives (which, the
 * GPU type, region and shape it was rewritten to, and whose capacity when
 * it is a loan), or its own placement
 * once allocated with a ladder it did not need. Empty otherwise. */
export function placementView(f) {
  const p = f.placement;
  if (p) {
    return h(
      "span",
      { id: "placement" },
      h("span", { class: "badge placement", id: "placement-badge", title: "Allocated on a placement alternative" }, `on alternative ${p.alternative}: ${p.accelerator}`),
      ` in ${p.region}`,
      h("div", { class: "muted", id: "placement-shape" }, p.shape),
      p.loan ? h("div", { class: "muted", id: "placement-loan", title: "docs/rules.md#loans-and-reclaim" }, `on loan of ${p.lender}: its owners may take it back`) : "",
    );
  }
  const allocated = ["PROVISIONED", "RELEASED"].includes(f.provisioningState);
  if (allocated && f.alternatives && f.alternatives.length) return h("span", { id: "placement" }, "its own, as asked");
  return "";
}

/** The batch's ladder, in order (numbered as "alternative N"), the rung it
 * runs on marked. */
export function ladderView(alternatives, placement) {
  return h(
    "ol",
    { class: "ladder", id: "alternatives" },
    alternatives.map((a, i) => {
      const taken = placement && placement.alternative === i + 1;
      return h("li", { class: taken ? "taken" : null }, a, taken ? h("span", { class: "muted" }, " (runs here)") : null);
    }),
  );
}

export function nodesView(parts) {
  if (!parts.length) return h("p", { class: "muted", id: "nodes-none" }, "No nodes: the cluster is not allocated.");
  return h(
    "table",
    { id: "nodes" },
    h("thead", null, h("tr", null, h("th", null, "Part"), h("th", null, "Node"), h("th", null, "GPUs"), h("th", { class: "num" }, "Cores"), h("th", { class: "num" }, "Memory"), h("th", { class: "num" }, "Local SSD"))),
    h(
      "tbody",
      null,
      parts.map((p) =>
        h(
          "tr",
          null,
          h("td", null, p.index == null ? p.role : `${p.role} ${p.index}`),
          h("td", null, p.node, p.isVirtual ? h("span", { class: "muted" }, " (virtual)") : null),
          h("td", { class: "gpus" }, p.gpus.join(", ")),
          h("td", { class: "num" }, p.cores),
          h("td", { class: "num" }, `${number(p.memoryMb / 1024, 1)} GiB`),
          h("td", { class: "num" }, `${p.localSsdGb} GB`),
        ),
      ),
    ),
  );
}

export function timeline(b) {
  const steps = (b.stateHistory ?? []).map((s) => ({ state: s.state, message: s.stateMessage, at: s.stateStartTime }));
  // flexq's history already ends with the state now (with its message)
  // when that state was entered with a message, or with a later line of
  // the same state (an extra granted or given back, a warning); then the
  // last step is now.
  const last = steps[steps.length - 1];
  const noNewer = last && Date.parse(b.stateTime) <= Date.parse(last.at);
  if (last && last.state === b.state && (last.message === b.stateMessage || noNewer)) last.now = true;
  else steps.push({ state: b.state, message: b.stateMessage, at: b.stateTime, now: true });
  return h(
    "ol",
    { class: "timeline", id: "timeline" },
    steps.map((s, i) => {
      const nextAt = steps[i + 1] ? steps[i + 1].at : null;
      const terminal = ["SUCCEEDED", "FAILED", "CANCELLED"].includes(s.state);
      return h(
        "li",
        { class: s.now ? "now" : null, "data-state": s.state },
        stateBadge(s.state),
        " ",
        h("span", { class: "when" }, when(s.at)),
        nextAt ? h("span", { class: "when" }, ` · ${duration((Date.parse(nextAt) - Date.parse(s.at)) / 1000)}`) : null,
        s.now && !terminal ? h("span", { class: "when" }, " · for ", clock(s.at, "since")) : null,
        s.message ? h("div", null, s.message) : null,
      );
    }),
  );
}

/** The Cancel button of a batch's page: shown while the batch may be
 * cancelled by this caller; a second click within 5 s confirms. */
export function cancelControl(project, current) {
  const el = h("span", { class: "cancel" });
  const button = h("button", { class: "danger", id: "cancel" }, "Cancel batch");
  let armed = null;
  let sent = false;
  const disarm = () => {
    clearTimeout(armed);
    armed = null;
    button.classList.remove("armed");
    button.textContent = "Cancel batch";
  };
  button.addEventListener("click", async () => {
    if (!armed) {
      button.classList.add("armed");
      button.textContent = "Click again to cancel";
      armed = setTimeout(disarm, 5000);
      return;
    }
    clearTimeout(armed);
    sent = true;
    button.disabled = true;
    button.textContent = "Cancelling…";
    try {
      await api(`v1/${current().operation}:cancel`, { method: "POST", body: {} });
    } catch (e) {
      el.replaceChildren(h("span", { class: "error", id: "cancel-error" }, e.message));
    }
  });
  const update = () => {
    const b = current();
    const offered = mayWrite(project) && ["PENDING", "RUNNING"].includes(b.state) && b.operation;
    if (!offered) {
      disarm();
      el.replaceChildren();
    } else if (!el.contains(button) && !sent) {
      el.replaceChildren(button);
    }
  };
  return { el, update };
}

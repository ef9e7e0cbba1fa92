// The usage page: GPU hours, batches and waits per project over a window.

import { h, enc, latest, duration, number } from "./dom.js";
import { api, scopes } from "./session.js";
import { show, picker, regionOf } from "./page.js";

export const WINDOWS = [
  ["1", "the last 24 hours"],
  ["7", "the last 7 days"],
  ["30", "the last 30 days"],
];

export async function usagePage(main, r, ctx) {
  const { all, region } = await regionOf(r);
  const days = WINDOWS.some(([d]) => d === r.params.get("days")) ? r.params.get("days") : "7";
  const table = h("div", { id: "usage" });
  const load = latest(async (fresh) => {
    const end = new Date();
    const start = new Date(end.getTime() - Number(days) * 86400000);
    const q = `startTime=${enc(start.toISOString())}&endTime=${enc(end.toISOString())}`;
    const reports = await Promise.all(
      scopes().map((p) => api(`v1/projects/${enc(p)}/regions/${enc(region)}/usage?${q}`)),
    );
    if (fresh() && ctx.alive()) table.replaceChildren(usageTable(reports.flatMap((x) => x.rows)));
  });
  show(
    ctx,
    main,
    h("h1", null, `Usage in ${region}`),
    h(
      "div",
      { class: "toolbar" },
      picker("Region", "region", all.map((x) => [x, x]), region, "region"),
      picker("Window", "days", WINDOWS, days, "days"),
    ),
    h("p", { class: "muted" }, "GPU-hours and local-SSD GB-hours held by each project's clusters in the window, and how its batches waited."),
    table,
  );
  await load();
  const again = ctx.throttled(load, 5000);
  const [scope, ...more] = scopes();
  if (scope && !more.length) ctx.watch(`v1/projects/${enc(scope)}/locations/${enc(region)}/batches:watch`, again);
  // Running clusters add GPU-hours without an event.
  ctx.every(30000, again);
}

export function usageTable(rows) {
  if (!rows.length) return h("p", { class: "muted" }, "No batch in this window.");
  const total = rows.reduce((a, x) => a + x.gpuHours, 0);
  const secs = (s) => (s == null ? "" : duration(s));
  return h(
    "table",
    null,
    h(
      "thead",
      null,
      h(
        "tr",
        null,
        ["Project", "GPU", "GPU-hours", "Share", "Weighted", "Lost", "Extra", "SSD GB-hours", "Batches", "Allocated", "Expired", "Wait p50", "Wait p95"].map((c, i) =>
          h("th", { class: i >= 2 && i !== 3 ? "num" : null }, c),
        ),
      ),
    ),
    h(
      "tbody",
      null,
      rows.map((x) =>
        h(
          "tr",
          { "data-project": x.project },
          h("td", null, x.project),
          h("td", null, x.acceleratorType),
          h("td", { class: "num" }, number(x.gpuHours, 2)),
          h(
            "td",
            { class: "share" },
            h("div", { class: "bar" }, h("div", { style: { width: `${total ? Math.round((100 * x.gpuHours) / total) : 0}%` } })),
            h("span", { class: "muted" }, `${number(total ? (100 * x.gpuHours) / total : 0, 1)} %`),
          ),
          h("td", { class: "num weighted" }, number(x.weightedGpuHours, 2)),
          h("td", { class: "num lost", title: "GPU-hours held by clusters that were then preempted" }, number(x.lostGpuHours, 2)),
          h("td", { class: "num extra", title: "GPU-hours held by elastic batches' extra executors, beyond their core gangs" }, number(x.extraGpuHours ?? 0, 2)),
          h("td", { class: "num" }, number(x.localSsdGbHours, 1)),
          h("td", { class: "num" }, number(x.batches)),
          h("td", { class: "num" }, number(x.allocated)),
          h("td", { class: "num" }, `${number(x.expired)} (${number(x.expiredPercent, 1)} %)`),
          h("td", { class: "num" }, secs(x.waitP50Seconds)),
          h("td", { class: "num" }, secs(x.waitP95Seconds)),
        ),
      ),
    ),
  );
}

// The quotas page: every project's quota limits and usage in a region.

import { h, enc, latest, number } from "./dom.js";
import { api, me, isAdmin, scopes } from "./session.js";
import { show, picker, regionOf } from "./page.js";

export async function quotasPage(main, r, ctx) {
  const { all, region } = await regionOf(r);
  const table = h("div", { id: "quotas" });
  const load = latest(async (fresh) => {
    let rows;
    if (isAdmin()) {
      rows = (await api(`v1/projects/-/regions/${enc(region)}/quotas`)).projects;
    } else {
      rows = await Promise.all(
        me.projects.map(async (p) => ({
          project: p,
          quotas: (await api(`v1/projects/${enc(p)}/regions/${enc(region)}/quotas`)).quotas,
        })),
      );
    }
    if (fresh() && ctx.alive()) table.replaceChildren(quotaTable(rows));
  });
  show(
    ctx,
    main,
    h("h1", null, `Quotas in ${region}`),
    h("div", { class: "toolbar" }, picker("Region", "region", all.map((x) => [x, x]), region, "region")),
    h("p", { class: "muted" }, "Per project: what its running clusters hold of each limit. Metrics with neither a limit nor usage are left out."),
    table,
  );
  await load();
  const again = ctx.throttled(load, 2000);
  const [scope, ...more] = scopes();
  // One stream a page (a browser holds six HTTP/1.1 connections to a
  // server); a submitter of several projects polls instead.
  if (scope && !more.length) ctx.watch(`v1/projects/${enc(scope)}/locations/${enc(region)}/batches:watch`, again);
  else ctx.every(5000, again);
}

export function quotaTable(projects) {
  const rows = [];
  for (const p of projects) {
    for (const q of p.quotas) {
      const limit = Number(q.limit);
      const usage = Number(q.usage);
      if (!limit && !usage) continue;
      const share = limit ? Math.min(1, usage / limit) : 1;
      rows.push(
        h(
          "tr",
          { "data-project": p.project, "data-metric": q.metric },
          h("td", null, p.project),
          h("td", null, q.metric),
          h("td", { class: "num" }, `${number(usage)} / ${number(limit)}`),
          h("td", null, h("div", { class: usage > limit ? "bar over" : "bar" }, h("div", { style: { width: `${Math.round(share * 100)}%` } }))),
        ),
      );
    }
  }
  if (!rows.length) return h("p", { class: "muted" }, "No project has a quota here yet.");
  return h(
    "table",
    null,
    h("thead", null, h("tr", null, h("th", null, "Project"), h("th", null, "Metric"), h("th", { class: "num" }, "Usage / limit"), h("th", null, ""))),
    h("tbody", null, rows),
  );
}

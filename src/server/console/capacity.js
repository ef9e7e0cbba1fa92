// The capacity page: every zone's nodes and GPUs, allocated, free or
// cordoned, kept live by the event stream.

import { h, latest } from "./dom.js";
import { api, isAdmin } from "./session.js";
import { show } from "./page.js";

export async function capacityPage(main, r, ctx) {
  const draw = latest(async (fresh) => {
    const [cap, nodes] = await Promise.all([
      api("v1/regions"),
      isAdmin() ? api("v1/nodes") : Promise.resolve(null),
    ]);
    if (fresh()) show(ctx, main, capacityView(cap.capacity, nodes && nodes.nodes));
  });
  await draw();
  const again = ctx.throttled(draw, 1000);
  if (isAdmin()) {
    // One stream for every region and project: a browser holds only six
    // HTTP/1.1 connections to a server.
    ctx.watch("v1/projects/-/locations/-/batches:watch", again);
    // Nodes join, leave and are cordoned without a batch event.
    ctx.every(10000, again);
  } else {
    // A submitter's stream would show only its own projects' batches,
    // not the others' that take and free GPUs too.
    ctx.every(5000, again);
  }
}

export function cells(allocated, free, cordoned) {
  const out = [];
  for (let i = 0; i < allocated; i++) out.push(h("span", { class: "gpu allocated", title: "allocated" }));
  for (let i = 0; i < free; i++) out.push(h("span", { class: "gpu free", title: "free" }));
  for (let i = 0; i < cordoned; i++) {
    out.push(h("span", { class: "gpu cordoned", title: "free, not offered (cordoned or retired)" }));
  }
  return h("div", { class: "cells" }, out);
}

export function capacityView(rows, nodes) {
  const byRegion = new Map();
  for (const row of rows) {
    if (!byRegion.has(row.region)) byRegion.set(row.region, new Map());
    const zones = byRegion.get(row.region);
    if (!zones.has(row.zone)) zones.set(row.zone, []);
    zones.get(row.zone).push(row);
  }
  const sum = (list, k) => list.reduce((a, x) => a + Number(x[k] ?? 0), 0);
  const out = [
    h("h1", null, "Capacity"),
    h(
      "div",
      { class: "legend" },
      h("span", null, h("span", { class: "gpu allocated" }), "allocated"),
      h("span", null, h("span", { class: "gpu free" }), "free"),
      h("span", null, h("span", { class: "gpu cordoned" }), "cordoned or retired"),
    ),
  ];
  if (!rows.length) out.push(h("p", { class: "muted" }, "No GPU nodes are declared or registered."));
  for (const [region, zones] of byRegion) {
    const all = [...zones.values()].flat();
    out.push(
      h(
        "section",
        { class: "region", "data-region": region },
        h(
          "h2",
          null,
          `${region} `,
          h(
            "span",
            { class: "muted" },
            `${sum(all, "allocatedGpus")} of ${sum(all, "totalGpus")} GPUs allocated · ${sum(all, "freeGpus")} free · ${sum(all, "cordonedGpus")} cordoned`,
          ),
        ),
        h(
          "div",
          { class: "zones" },
          [...zones].map(([zone, zrows]) => zoneView(region, zone, zrows, nodes)),
        ),
      ),
    );
  }
  return h("div", { id: "capacity" }, out);
}

export function zoneView(region, zone, rows, nodes) {
  const body = [];
  if (nodes) {
    const mine = nodes.filter((n) => n.region === region && n.zone === zone);
    const pools = new Map();
    for (const n of mine) {
      if (!pools.has(n.pool)) pools.set(n.pool, []);
      pools.get(n.pool).push(n);
    }
    for (const [pool, list] of [...pools].sort()) {
      body.push(
        h("h4", null, `pool ${pool} · ${list[0].accelerator}`),
        h(
          "div",
          { class: "nodes" },
          list
            .sort((a, b) => a.id.localeCompare(b.id))
            .map((n) => {
              // An idle node of a provisioned pool takes work until it is
              // suspended.
              const offered = n.state === "SCHEDULABLE" || n.state === "IDLE";
              const allocated = n.gpus - n.freeGpus;
              return h(
                "div",
                { class: "node", "data-node": n.id, title: `${n.id}: ${n.state}, ${n.runningParts} running parts` },
                h("div", { class: "name" }, n.id),
                n.virtual ? h("span", { class: "tag" }, "virtual ") : null,
                n.state === "SCHEDULABLE" ? null : h("span", { class: "tag" }, n.state),
                cells(allocated, offered ? n.freeGpus : 0, offered ? 0 : n.freeGpus),
              );
            }),
        ),
      );
    }
  } else {
    for (const row of rows) {
      body.push(
        h("h4", null, `${row.accelerator} · ${row.nodes} nodes`),
        cells(row.allocatedGpus, row.freeGpus, row.cordonedGpus),
      );
    }
  }
  const total = rows.reduce((a, x) => a + x.totalGpus, 0);
  const free = rows.reduce((a, x) => a + x.freeGpus, 0);
  return h(
    "div",
    { class: "zone", "data-zone": zone },
    h("h3", null, zone),
    h("div", { class: "sum" }, `${free} of ${total} GPUs free`),
    body,
  );
}

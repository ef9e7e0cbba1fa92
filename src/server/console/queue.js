// The queue page: a region's queued batches in order, page by page,
// kept live by the event stream.

import { h, enc, latest, when, clock, number } from "./dom.js";
import { api } from "./session.js";
import { show, picker, regionOf, projectOptions } from "./page.js";

export const QUEUE_PAGE = 50;

export async function queuePage(main, r, ctx) {
  const { all, region } = await regionOf(r);
  const options = await projectOptions(region, r.params.get("project"));
  const project = r.params.get("project") || (options[0] && options[0][0]);
  if (!project) {
    show(ctx, main, h("h1", null, "Queue"), h("p", { class: "muted" }, "You may see no project's batches."));
    return;
  }
  // Page tokens of the pages before this one, to go back.
  const tokens = [""];
  let at = 0;
  const title = h("h1", null, `Queue of ${region}`);
  const status = h("p", { class: "muted", id: "queue-status" });
  const table = h("div", { id: "queue-table" });
  const prev = h("button", { id: "queue-prev", onclick: () => go(at - 1) }, "← Previous");
  const next = h("button", { id: "queue-next", onclick: () => go(at + 1) }, "Next →");
  const range = h("span", { class: "muted", id: "queue-range" });
  let nextToken = "";

  // Only the latest read is shown: a refresh from the stream and a click
  // on Next may be in flight at once.
  const load = latest(async (fresh) => {
    const page = at;
    const token = tokens[page];
    prev.disabled = true;
    next.disabled = true;
    const base = `v1/projects/${enc(project)}/regions/${enc(region)}`;
    try {
      const [entries, queue] = await Promise.all([
        api(`${base}/queue/entries?pageSize=${QUEUE_PAGE}&pageToken=${enc(token)}`),
        api(`${base}/queue`),
      ]);
      if (!fresh() || !ctx.alive()) return;
      nextToken = entries.nextPageToken;
      const first = page * QUEUE_PAGE;
      range.textContent = entries.entries.length
        ? `${number(first + 1)}–${number(first + entries.entries.length)} of ${number(entries.totalSize)}`
        : `${number(entries.totalSize)} queued`;
      status.replaceChildren(
        queue.held
          ? h(
              "span",
              { class: "banner" },
              `Held by ${queue.heldBy} since ${when(queue.heldSince)}${queue.regionWide ? " (the whole region)" : ""}: nothing here is allocated until an admin resumes it.`,
            )
          : `${number(entries.totalSize)} batches wait, in the order they will be allocated.`,
      );
      table.replaceChildren(queueTable(entries.entries, region));
    } catch (e) {
      if (fresh() && ctx.alive()) status.replaceChildren(h("span", { class: "error" }, e.message));
    } finally {
      if (fresh()) {
        prev.disabled = at === 0;
        next.disabled = !nextToken;
      }
    }
  });
  const go = (n) => {
    if (n > at) tokens[n] = nextToken;
    at = n;
    return load();
  };

  show(
    ctx,
    main,
    title,
    h(
      "div",
      { class: "toolbar" },
      picker("Region", "region", all.map((x) => [x, x]), region, "region"),
      picker("Project", "project", options, project, "project"),
    ),
    status,
    table,
    h("div", { class: "pager" }, prev, next, range),
  );
  await load();
  const again = ctx.throttled(load, 1000);
  ctx.watch(`v1/projects/${enc(project)}/locations/${enc(region)}/batches:watch`, again);
}

export function queueTable(entries, region) {
  if (!entries.length) return h("p", { class: "muted", id: "queue-empty" }, "Nothing waits.");
  return h(
    "table",
    { id: "queue" },
    h(
      "thead",
      null,
      h(
        "tr",
        null,
        h("th", { class: "num" }, "#"),
        h("th", null, "Batch"),
        h("th", null, "Project"),
        h("th", null, "Shape"),
        h("th", { class: "num" }, "GPUs"),
        h("th", null, "Waiting"),
        h("th", null, "Deadline"),
        h("th", null, "Estimated start"),
        h("th", null, "Why pending"),
      ),
    ),
    h(
      "tbody",
      null,
      entries.map((e) => {
        const id = e.name.split("/").pop();
        return h(
          "tr",
          { "data-batch": id },
          h("td", { class: "num" }, number(e.queuePosition)),
          h(
            "td",
            null,
            h("a", { href: `#/batch/${enc(e.project)}/${enc(region)}/${enc(id)}` }, id),
            // Preempted before: it waits again at its place.
            e.preemptions
              ? [" ", h("span", { class: "badge warn preempted", title: "Times its cluster was preempted" }, `preempted ×${e.preemptions}`)]
              : null,
          ),
          h("td", null, e.project),
          h(
            "td",
            null,
            e.shape,
            // Where else it may run once it has waited each delay.
            e.alternatives && e.alternatives.length
              ? h(
                  "div",
                  { class: "alternatives", title: "Placement alternatives: each tried once the batch has waited its delay" },
                  e.alternatives.map((a) => h("span", null, `→ ${a}`)),
                )
              : null,
          ),
          h("td", { class: "num" }, `${e.gpus} ${e.accelerator}`),
          h("td", null, clock(e.queueTime, "since")),
          h("td", null, e.allocationDeadline ? clock(e.allocationDeadline, "until") : "none"),
          h("td", null, e.estimatedStartTime ? when(e.estimatedStartTime) : h("span", { class: "muted" }, "no estimate")),
          h(
            "td",
            null,
            h(
              "ul",
              { class: "reasons" },
              e.notAdmittedReasons.map((x) => h("li", null, x)),
            ),
          ),
        );
      }),
    ),
  );
}

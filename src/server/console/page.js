// What the console's pages share: the route (`#/page/part?param=value`),
// showing a view while its page is still shown, and the toolbar's
// pickers of region and project.

import { h, enc } from "./dom.js";
import { api, me, isAdmin } from "./session.js";

export function route() {
  const raw = location.hash.replace(/^#\/?/, "");
  const q = raw.indexOf("?");
  const path = q < 0 ? raw : raw.slice(0, q);
  const params = new URLSearchParams(q < 0 ? "" : raw.slice(q + 1));
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  return { page: parts[0] || "capacity", parts: parts.slice(1), params };
}


/** Shows `view` in `main` if the page is still the one shown. */
export function show(ctx, main, ...view) {
  if (ctx.alive()) main.replaceChildren(...view);
}

/** The configured regions, for the region pickers: those with nodes
 * first, so a page without a region shows one with capacity. */
export let regionsCache = null;

export async function regions() {
  if (!regionsCache) {
    const cap = await api("v1/regions");
    const busy = new Set(cap.capacity.map((r) => r.region));
    regionsCache = [...cap.regions].sort((a, b) => busy.has(b) - busy.has(a) || a.localeCompare(b));
  }
  return regionsCache;
}

/** A toolbar select that changes one query parameter of the page. */
export function picker(label, id, options, value, param) {
  const select = h(
    "select",
    {
      id,
      onchange: () => {
        const r = route();
        r.params.set(param, select.value);
        location.hash = `#/${[r.page, ...r.parts].map(enc).join("/")}?${r.params}`;
      },
    },
    options.map(([v, text]) => h("option", { value: v, selected: v === value }, text)),
  );
  return h("label", null, label, select);
}

export async function regionOf(r) {
  const all = await regions();
  return { all, region: r.params.get("region") || all[0] || "" };
}

/** The projects a page may be narrowed to: an admin's "every project"
 * and those with quota or queued batches in `region`; a submitter's own. */
export async function projectOptions(region, current) {
  if (!isAdmin()) return me.projects.map((p) => [p, p]);
  const known = (await api(`v1/projects/-/regions/${enc(region)}/quotas`)).projects.map((p) => p.project);
  if (current && current !== "-" && !known.includes(current)) known.push(current);
  return [["-", "every project"], ...known.sort().map((p) => [p, p])];
}

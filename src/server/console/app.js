// The flexq web console: capacity, the queue, a batch, quotas and usage,
// kept live by the event stream (docs/console.md).
//
// It reads and acts only through flexq's REST API, with the caller's own
// bearer token (kept for the browser session in sessionStorage), so it can
// do exactly what its user could do with curl. Every address is relative
// to the page, so flexq may be served under a path prefix. No framework:
// elements are built with `h` below, and text always goes in as text.

// The API's root: the folder above /console/, wherever flexq is served.
const API = new URL("../", location.href);
const TOKEN_KEY = "flexq.token";
const QUEUE_PAGE = 50;

// ---------------------------------------------------------------- helpers

/** An element: h("td", {class: "num"}, "3"). Children are text or nodes. */
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs ?? {})) {
    if (v == null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    // Through the CSSOM: the page's Content-Security-Policy allows no
    // inline style attribute.
    else if (k === "style") Object.assign(el.style, v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c == null || c === false) continue;
    el.append(c instanceof Node ? c : String(c));
  }
  return el;
}

const enc = encodeURIComponent;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Calls `fn` (which may return a promise) at once, then, while calls
 * keep coming, once more at most every `ms` after the last run ended. */
function throttle(fn, ms) {
  let busy = false;
  let again = false;
  let stopped = false;
  let timer = null;
  const run = async () => {
    busy = true;
    try {
      await fn();
    } catch {
      // The page shows its own errors; a refresh that failed is retried
      // at the next call.
    }
    timer = setTimeout(() => {
      timer = null;
      busy = false;
      if (again && !stopped) {
        again = false;
        run();
      }
    }, ms);
  };
  const call = () => {
    if (stopped) return;
    if (busy) again = true;
    else run();
  };
  call.cancel = () => {
    stopped = true;
    clearTimeout(timer);
  };
  return call;
}

/** Wraps an async `load(fresh)` so that only the latest call's answer is
 * shown: `fresh()` tells a call whether a later one has started since. */
function latest(load) {
  let seq = 0;
  return (...args) => {
    const mine = ++seq;
    return load(() => mine === seq, ...args);
  };
}

/** "1h 02m", "3m 05s", "42s". */
function duration(seconds) {
  if (seconds == null || !isFinite(seconds)) return "";
  const s = Math.max(0, Math.round(seconds));
  const d = Math.floor(s / 86400);
  const hh = Math.floor((s % 86400) / 3600);
  const mm = Math.floor((s % 3600) / 60);
  const ss = s % 60;
  const two = (n) => String(n).padStart(2, "0");
  if (d) return `${d}d ${two(hh)}h`;
  if (hh) return `${hh}h ${two(mm)}m`;
  if (mm) return `${mm}m ${two(ss)}s`;
  return `${ss}s`;
}

const secondsSince = (t) => (Date.now() - Date.parse(t)) / 1000;

function when(t) {
  if (!t) return "";
  const d = new Date(t);
  return d.toLocaleString(undefined, { hour12: false });
}

/** A span whose text the page's ticker keeps current: "3m 05s" since, or
 * "in 12m" / "passed" until, `t`. */
function clock(t, mode) {
  const el = h("span", { class: "clock", "data-t": t, "data-mode": mode, title: when(t) });
  tickOne(el);
  return el;
}

function tickOne(el) {
  const t = el.getAttribute("data-t");
  const s = secondsSince(t);
  if (el.getAttribute("data-mode") === "since") el.textContent = duration(s);
  else el.textContent = s >= 0 ? "passed" : `in ${duration(-s)}`;
}

setInterval(() => document.querySelectorAll("span.clock").forEach(tickOne), 1000);

function stateBadge(state, id) {
  return h("span", { class: `badge state-${state}`, id }, state ?? "");
}

function number(n, digits = 0) {
  return Number(n ?? 0).toLocaleString(undefined, {
    minimumFractionDigits: digits,
    maximumFractionDigits: digits,
  });
}

// ---------------------------------------------------------------- the API

class ApiError extends Error {
  constructor(status, body, text) {
    const e = body && body.error;
    super(e ? `${e.status ?? status}: ${e.message}` : `HTTP ${status}: ${text || "no answer"}`);
    this.status = status;
    this.code = e && e.status;
  }
}

function authHeaders(extra) {
  const headers = { Accept: "application/json", ...extra };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = `Bearer ${token}`;
  return headers;
}

/** A call of the REST API; throws ApiError with the server's message. */
async function api(path, { method = "GET", body } = {}) {
  const init = { method, headers: authHeaders(), cache: "no-store" };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const res = await fetch(new URL(path, API), init);
  const text = await res.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null;
  }
  if (!res.ok) {
    const err = new ApiError(res.status, data, text);
    if (res.status === 401) {
      sessionStorage.removeItem(TOKEN_KEY);
      signedOut(err.message);
    }
    throw err;
  }
  return data;
}

/** One watch of the event stream (`batches:watch`), read with fetch so it
 * can carry the bearer token. Reconnects on its own with the last event's
 * id, so nothing is lost across a drop or a failover. */
class Watch {
  constructor(path, onEvent) {
    this.path = path;
    this.onEvent = onEvent;
    this.last = null;
    this.stopped = false;
    this.connected = false;
    this.run();
  }

  async run() {
    let delay = 500;
    while (!this.stopped) {
      this.abort = new AbortController();
      try {
        const headers = authHeaders({ Accept: "text/event-stream" });
        if (this.last) headers["Last-Event-ID"] = this.last;
        const res = await fetch(new URL(this.path, API), {
          headers,
          signal: this.abort.signal,
          cache: "no-store",
        });
        if (!res.ok) {
          const body = await res.json().catch(() => null);
          throw new ApiError(res.status, body, "");
        }
        this.setConnected(true);
        delay = 500;
        const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
        let buffer = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          // Line ends may be CRLF, CR or LF; a CR at the end of a chunk
          // waits for the next one (it may be half of a CRLF).
          buffer += value;
          const held = buffer.endsWith("\r") ? "\r" : "";
          buffer = buffer.slice(0, buffer.length - held.length).replace(/\r\n?/g, "\n") + held;
          let end;
          while ((end = buffer.indexOf("\n\n")) >= 0) {
            this.dispatch(buffer.slice(0, end));
            buffer = buffer.slice(end + 2);
          }
        }
      } catch (e) {
        if (this.stopped) return;
        if (e instanceof ApiError && e.status === 401) {
          sessionStorage.removeItem(TOKEN_KEY);
          signedOut(e.message);
          return;
        }
        // An id the server no longer knows: start afresh (a `ready` event
        // tells the page to read everything again).
        if (e instanceof ApiError && e.status === 400) this.last = null;
      }
      this.setConnected(false);
      await sleep(delay);
      delay = Math.min(delay * 2, 10000);
    }
  }

  dispatch(block) {
    let event = "message";
    let id = null;
    const data = [];
    for (const line of block.split("\n")) {
      if (line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? "" : line.slice(colon + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (field === "event") event = value;
      else if (field === "data") data.push(value);
      else if (field === "id") id = value;
    }
    if (id !== null) this.last = id;
    if (!data.length) return;
    let payload;
    try {
      payload = JSON.parse(data.join("\n"));
    } catch {
      return;
    }
    this.onEvent(event, payload);
  }

  setConnected(on) {
    this.connected = on;
    updateLive();
  }

  close() {
    this.stopped = true;
    this.abort?.abort();
    this.connected = false;
    watches.delete(this);
    updateLive();
  }
}

const watches = new Set();

function updateLive() {
  const el = document.getElementById("live");
  const all = [...watches];
  const on = all.length > 0 && all.every((w) => w.connected);
  el.classList.toggle("on", on);
  el.title = on ? `Event stream: connected (${all.length})` : "Event stream: not connected";
}

// ---------------------------------------------------------------- session

/** Who is signed in: GET /v1/principal. */
let me = null;

const isAdmin = () => me && (me.anonymous || me.role === "admin");
const mayWrite = (project) => isAdmin() || (me && me.projects.includes(project));
/** The projects whose batches the caller sees: `-` stands for all. */
const scopes = () => (isAdmin() ? ["-"] : me.projects);

let signInShown = false;

function signedOut(why) {
  if (signInShown) return;
  signInShown = true;
  leave();
  me = null;
  document.getElementById("who").replaceChildren();
  const input = h("input", {
    id: "signin-token",
    type: "password",
    // Not a login the browser should offer to remember.
    autocomplete: "new-password",
    placeholder: "Bearer token",
  });
  const message = h("p", { class: "muted", id: "signin-why" }, why ?? "");
  const submit = async () => {
    const token = input.value.trim();
    // A header carries visible ASCII only; anything else would make
    // every call fail before it reaches the server.
    if (!/^[\x21-\x7e]+$/.test(token)) {
      message.textContent = "A token is printable ASCII without spaces (flexq auth new-token prints one).";
      return;
    }
    sessionStorage.setItem(TOKEN_KEY, token);
    signInShown = false;
    try {
      await start();
    } catch (e) {
      if (!signInShown) {
        sessionStorage.removeItem(TOKEN_KEY);
        signedOut(e.message);
      }
    }
  };
  input.addEventListener("keydown", (ev) => {
    if (ev.key === "Enter") submit();
  });
  const form = h(
    "div",
    { id: "signin" },
    h("label", { for: "signin-token" }, "The token flexq's config gives you (auth.principals):"),
    input,
    h("button", { type: "button", onclick: submit }, "Sign in"),
    message,
  );
  document
    .getElementById("main")
    .replaceChildren(
      h(
        "div",
        { class: "signin" },
        h("h1", null, "Sign in to flexq"),
        h(
          "p",
          { class: "muted" },
          "The token stays in this browser tab until you close it or sign out.",
        ),
        form,
      ),
    );
  input.focus();
}

function showWho() {
  const who = document.getElementById("who");
  const role = me.anonymous ? "admin, no principals configured" : me.role;
  const parts = [h("span", { id: "principal" }, `${me.name} (${role})`)];
  if (sessionStorage.getItem(TOKEN_KEY)) {
    parts.push(
      h(
        "button",
        {
          id: "signout",
          onclick: () => {
            sessionStorage.removeItem(TOKEN_KEY);
            signedOut("Signed out.");
          },
        },
        "Sign out",
      ),
    );
  }
  who.replaceChildren(...parts);
}

// ---------------------------------------------------------------- routing

/** What the current page registered to undo when it is left. */
let leaving = [];
let generation = 0;

function leave() {
  generation += 1;
  for (const f of leaving) f();
  leaving = [];
}

/** The context a page renders in: whether it is still shown, and what to
 * undo when it is left. */
function pageContext() {
  const mine = generation;
  return {
    alive: () => mine === generation,
    onLeave(f) {
      if (mine === generation) leaving.push(f);
      else f();
    },
    watch(path, onEvent) {
      const w = new Watch(path, onEvent);
      watches.add(w);
      updateLive();
      this.onLeave(() => w.close());
      return w;
    },
    every(ms, f) {
      const id = setInterval(f, ms);
      this.onLeave(() => clearInterval(id));
    },
    throttled(f, ms) {
      const t = throttle(f, ms);
      this.onLeave(() => t.cancel());
      return t;
    },
  };
}

function route() {
  const raw = location.hash.replace(/^#\/?/, "");
  const q = raw.indexOf("?");
  const path = q < 0 ? raw : raw.slice(0, q);
  const params = new URLSearchParams(q < 0 ? "" : raw.slice(q + 1));
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  return { page: parts[0] || "capacity", parts: parts.slice(1), params };
}

const pages = {
  capacity: capacityPage,
  queue: queuePage,
  batch: batchPage,
  quotas: quotasPage,
  usage: usagePage,
};

async function render() {
  if (!me) return;
  leave();
  let r;
  try {
    r = route();
  } catch {
    r = { page: "not a page", parts: [], params: new URLSearchParams() };
  }
  for (const a of document.querySelectorAll("#nav a")) {
    a.classList.toggle("active", a.dataset.page === r.page);
  }
  const main = document.getElementById("main");
  const ctx = pageContext();
  const page = pages[r.page];
  if (!page) {
    main.replaceChildren(h("p", { class: "error" }, `No page ${r.page}.`));
    return;
  }
  try {
    await page(main, r, ctx);
  } catch (e) {
    if (ctx.alive() && !signInShown) {
      main.replaceChildren(h("h1", null, "Something went wrong"), h("p", { class: "error" }, e.message));
    }
  }
}

/** Shows `view` in `main` if the page is still the one shown. */
function show(ctx, main, ...view) {
  if (ctx.alive()) main.replaceChildren(...view);
}

/** The configured regions, for the region pickers: those with nodes
 * first, so a page without a region shows one with capacity. */
let regionsCache = null;

async function regions() {
  if (!regionsCache) {
    const cap = await api("v1/regions");
    const busy = new Set(cap.capacity.map((r) => r.region));
    regionsCache = [...cap.regions].sort((a, b) => busy.has(b) - busy.has(a) || a.localeCompare(b));
  }
  return regionsCache;
}

/** A toolbar select that changes one query parameter of the page. */
function picker(label, id, options, value, param) {
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

async function regionOf(r) {
  const all = await regions();
  return { all, region: r.params.get("region") || all[0] || "" };
}

/** The projects a page may be narrowed to: an admin's "every project"
 * and those with quota or queued batches in `region`; a submitter's own. */
async function projectOptions(region, current) {
  if (!isAdmin()) return me.projects.map((p) => [p, p]);
  const known = (await api(`v1/projects/-/regions/${enc(region)}/quotas`)).projects.map((p) => p.project);
  if (current && current !== "-" && !known.includes(current)) known.push(current);
  return [["-", "every project"], ...known.sort().map((p) => [p, p])];
}

// ---------------------------------------------------------------- capacity

async function capacityPage(main, r, ctx) {
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

function cells(allocated, free, cordoned) {
  const out = [];
  for (let i = 0; i < allocated; i++) out.push(h("span", { class: "gpu allocated", title: "allocated" }));
  for (let i = 0; i < free; i++) out.push(h("span", { class: "gpu free", title: "free" }));
  for (let i = 0; i < cordoned; i++) {
    out.push(h("span", { class: "gpu cordoned", title: "free, not offered (cordoned or retired)" }));
  }
  return h("div", { class: "cells" }, out);
}

function capacityView(rows, nodes) {
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

function zoneView(region, zone, rows, nodes) {
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
              const offered = n.state === "SCHEDULABLE";
              const allocated = n.gpus - n.freeGpus;
              return h(
                "div",
                { class: "node", "data-node": n.id, title: `${n.id}: ${n.state}, ${n.runningParts} running parts` },
                h("div", { class: "name" }, n.id),
                n.virtual ? h("span", { class: "tag" }, "virtual ") : null,
                offered ? null : h("span", { class: "tag" }, n.state),
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

// ---------------------------------------------------------------- queue

async function queuePage(main, r, ctx) {
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

function queueTable(entries, region) {
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
          h("td", null, h("a", { href: `#/batch/${enc(e.project)}/${enc(region)}/${enc(id)}` }, id)),
          h("td", null, e.project),
          h("td", null, e.shape),
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

// ---------------------------------------------------------------- a batch

async function batchPage(main, r, ctx) {
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
  const paint = () => {
    cancel.update();
    body.replaceChildren(...batchView(batch, deleted, project, region, cancel.el));
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
  const stream = `v1/projects/${enc(project)}/locations/${enc(region)}/batches:watch?batchId=${enc(id)}`;
  ctx.watch(stream, (event, data) => {
    if (event === "batch") {
      events += 1;
      take(data.batch);
      paint();
      if (data.changes.includes("output") || batch.state !== "PENDING") pull().catch(() => {});
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

function batchView(b, deleted, project, region, cancel) {
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
    ["Zone", f.zone],
    ["Allocated", f.allocateTime ? when(f.allocateTime) : ""],
    ["Allocation deadline", f.allocationDeadline && f.provisioningState === "QUEUED" ? clock(f.allocationDeadline, "until") : ""],
    ["Queue position", f.queuePosition ? h("span", { id: "queue-position" }, number(f.queuePosition)) : ""],
    ["Estimated start", f.estimatedStartTime ? when(f.estimatedStartTime) : ""],
    ["Attempt", f.attempt],
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
  out.push(h("div", { class: "cols" }, h("div", null, left), h("div", null, h("h2", null, "History"), timeline(b))));
  return out;
}

function nodesView(parts) {
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

function timeline(b) {
  const steps = (b.stateHistory ?? []).map((s) => ({ state: s.state, message: s.stateMessage, at: s.stateStartTime }));
  // flexq's history already ends with the state now (with its message)
  // when that state was entered with a message; then the last step is now.
  const last = steps[steps.length - 1];
  if (last && last.state === b.state && last.message === b.stateMessage) last.now = true;
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
function cancelControl(project, current) {
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

// ---------------------------------------------------------------- quotas

async function quotasPage(main, r, ctx) {
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

function quotaTable(projects) {
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

// ---------------------------------------------------------------- usage

const WINDOWS = [
  ["1", "the last 24 hours"],
  ["7", "the last 7 days"],
  ["30", "the last 30 days"],
];

async function usagePage(main, r, ctx) {
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

function usageTable(rows) {
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
        ["Project", "GPU", "GPU-hours", "Share", "SSD GB-hours", "Batches", "Allocated", "Expired", "Wait p50", "Wait p95"].map((c, i) =>
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

// ---------------------------------------------------------------- start

async function start() {
  me = await api("v1/principal");
  signInShown = false;
  showWho();
  await render();
}

window.addEventListener("hashchange", () => render());
start().catch((e) => {
  if (!signInShown) {
    document.getElementById("main").replaceChildren(h("p", { class: "error" }, e.message));
  }
});

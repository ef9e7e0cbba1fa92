// The console's API and session: calls of the REST API with the caller's
// bearer token (kept for the browser session in sessionStorage), the
// event stream's watches, who is signed in (and the sign-in form when
// nobody is), and the lifetime of the page shown: what it registered to
// undo when it is left.

import { h, sleep, throttle } from "./dom.js";

// The API's root: the folder above /console/, wherever flexq is served.
export const API = new URL("../", location.href);
export const TOKEN_KEY = "flexq.token";

// ---------------------------------------------------------------- the API

export class ApiError extends Error {
  constructor(status, body, text) {
    const e = body && body.error;
    super(e ? `${e.status ?? status}: ${e.message}` : `HTTP ${status}: ${text || "no answer"}`);
    this.status = status;
    this.code = e && e.status;
  }
}

export function authHeaders(extra) {
  const headers = { Accept: "application/json", ...extra };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = `Bearer ${token}`;
  return headers;
}

/** A call of the REST API; throws ApiError with the server's message. */
export async function api(path, { method = "GET", body } = {}) {
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
export class Watch {
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

export const watches = new Set();

export function updateLive() {
  const el = document.getElementById("live");
  const all = [...watches];
  const on = all.length > 0 && all.every((w) => w.connected);
  el.classList.toggle("on", on);
  el.title = on ? `Event stream: connected (${all.length})` : "Event stream: not connected";
}

// ---------------------------------------------------------------- session

/** Who is signed in: GET /v1/principal. */
export let me = null;

export const isAdmin = () => me && (me.anonymous || me.role === "admin");
export const mayWrite = (project) => isAdmin() || (me && me.projects.includes(project));
/** The projects whose batches the caller sees: `-` stands for all. */
export const scopes = () => (isAdmin() ? ["-"] : me.projects);

export let signInShown = false;

export function signedOut(why) {
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

export function showWho() {
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

/** What signing in does once the principal is known: app.js renders the
 * page shown. */
export let afterSignIn = async () => {};

export function onSignIn(f) {
  afterSignIn = f;
}

export async function start() {
  me = await api("v1/principal");
  signInShown = false;
  showWho();
  await afterSignIn();
}

// ---------------------------------------------------------------- a page's lifetime

/** What the current page registered to undo when it is left. */
export let leaving = [];
export let generation = 0;

export function leave() {
  generation += 1;
  for (const f of leaving) f();
  leaving = [];
}

/** The context a page renders in: whether it is still shown, and what to
 * undo when it is left. */
export function pageContext() {
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

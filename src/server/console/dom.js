// The console's shared helpers: building elements (`h`; text always
// goes in as text), pacing calls (`throttle`, `latest`), and formatting
// numbers, durations and times, with the clocks a ticker keeps current.

/** An element: h("td", {class: "num"}, "3"). Children are text or nodes. */
export function h(tag, attrs, ...children) {
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

/** An SVG element: svg("path", {d: "M0 0"}). Attributes only; no text. */
export function svg(tag, attrs, ...children) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs ?? {})) {
    if (v != null && v !== false) el.setAttribute(k, String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c == null || c === false) continue;
    el.append(c instanceof Node ? c : String(c));
  }
  return el;
}

export const enc = encodeURIComponent;
export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** Calls `fn` (which may return a promise) at once, then, while calls
 * keep coming, once more at most every `ms` after the last run ended. */
export function throttle(fn, ms) {
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
export function latest(load) {
  let seq = 0;
  return (...args) => {
    const mine = ++seq;
    return load(() => mine === seq, ...args);
  };
}

/** "1h 02m", "3m 05s", "42s". */
export function duration(seconds) {
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

export const secondsSince = (t) => (Date.now() - Date.parse(t)) / 1000;

export function when(t) {
  if (!t) return "";
  const d = new Date(t);
  return d.toLocaleString(undefined, { hour12: false });
}

/** A span whose text the page's ticker keeps current: "3m 05s" since, or
 * "in 12m" / "passed" until, `t`. */
export function clock(t, mode) {
  const el = h("span", { class: "clock", "data-t": t, "data-mode": mode, title: when(t) });
  tickOne(el);
  return el;
}

export function tickOne(el) {
  const t = el.getAttribute("data-t");
  const s = secondsSince(t);
  if (el.getAttribute("data-mode") === "since") el.textContent = duration(s);
  else el.textContent = s >= 0 ? "passed" : `in ${duration(-s)}`;
}

setInterval(() => document.querySelectorAll("span.clock").forEach(tickOne), 1000);

export function stateBadge(state, id) {
  return h("span", { class: `badge state-${state}`, id }, state ?? "");
}

export function number(n, digits = 0) {
  return Number(n ?? 0).toLocaleString(undefined, {
    minimumFractionDigits: digits,
    maximumFractionDigits: digits,
  });
}

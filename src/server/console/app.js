// The flexq web console: capacity, the queue, a batch, quotas and usage,
// kept live by the event stream (docs/console.md).
//
// It reads and acts only through flexq's REST API, with the caller's own
// bearer token (kept for the browser session in sessionStorage), so it can
// do exactly what its user could do with curl. Every address is relative
// to the page, so flexq may be served under a path prefix. No framework:
// elements are built with `h` (dom.js), and text always goes in as text.
//
// This file routes between the pages, one module each (capacity.js,
// queue.js, batch.js, quotas.js, usage.js), and starts the console; what
// they share is dom.js (elements, formatting), session.js (the API, the
// event stream, who is signed in) and page.js (the route, pickers).

import { h } from "./dom.js";
import { me, signInShown, onSignIn, start, leave, pageContext } from "./session.js";
import { route } from "./page.js";
import { capacityPage } from "./capacity.js";
import { queuePage } from "./queue.js";
import { batchPage } from "./batch.js";
import { quotasPage } from "./quotas.js";
import { usagePage } from "./usage.js";

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


// ---------------------------------------------------------------- start

onSignIn(render);
window.addEventListener("hashchange", () => render());
start().catch((e) => {
  if (!signInShown) {
    document.getElementById("main").replaceChildren(h("p", { class: "error" }, e.message));
  }
});

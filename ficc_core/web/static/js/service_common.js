// What the services list and the service page share: the header's identity and
// logout, a poller that refreshes while the page is visible, and filling a table
// whose cells name their column (the phone-width layout shows it beside the value).

import { openSession, sessionEnded } from "./api.js";

export const REFRESH_MS = Number(document.body.dataset.refreshMs) || 5000;

// Every request settled, then the first failure thrown (a 401 first): a page never
// leaves with a request of its own still in flight.
export async function allAnswered(requests) {
  const answers = await Promise.allSettled(requests);
  const failures = answers.filter((a) => a.status === "rejected").map((a) => a.reason);
  if (failures.length) throw failures.find(sessionEnded) || failures[0];
  return answers.map((a) => a.value);
}

export function fillTable(table, rows, note, emptyText) {
  const columns = [...table.tHead.rows[0].cells].map((cell) => cell.textContent);
  for (const row of rows) {
    [...row.cells].forEach((cell, index) => {
      if (cell.tagName !== "TD") return;
      cell.setAttribute("data-label", columns[index]);
      const value = document.createElement("div");
      value.className = "value";
      value.append(...cell.childNodes);
      cell.append(value);
    });
  }
  table.tBodies[0].replaceChildren(...rows);
  table.closest(".table-wrap").hidden = rows.length === 0;
  if (note) {
    note.textContent = rows.length === 0 ? emptyText : "";
    note.hidden = rows.length !== 0;
  }
}

// Calls `refresh` now and every REFRESH_MS while the page is visible; `stop()` ends
// it, `settled()` waits for the refresh in flight.
export class Poller {
  constructor(refresh, every = REFRESH_MS) {
    this.refresh = refresh;
    this.every = every;
    this.timer = null;
    this.stopped = false;
    this.current = Promise.resolve();
    document.addEventListener("visibilitychange", () => {
      if (!document.hidden) this.schedule(0);
    });
  }

  schedule(delay) {
    clearTimeout(this.timer);
    if (this.stopped) return;
    this.timer = setTimeout(async () => {
      if (document.hidden || this.stopped) return; // visibilitychange schedules the next
      await this.now();
      this.schedule(this.every);
    }, delay);
  }

  async now() {
    const run = this.current.then(() => (this.stopped ? null : this.refresh()));
    this.current = run.catch(() => null);
    await this.current;
  }

  start() {
    this.schedule(0);
  }

  async stop() {
    this.stopped = true;
    clearTimeout(this.timer);
    await this.current;
  }
}

// The header: who is logged in, and the logout button, which first lets `beforeLeave`
// stop the page's own requests and streams (api.js's openSession, shared by the pages).
export function header(beforeLeave) {
  return openSession(beforeLeave);
}

// A click on a link to another console page first lets `beforeLeave` stop the page's
// own requests and streams (a navigation would abort those in flight), then goes.
export function guardLinks(beforeLeave) {
  document.addEventListener("click", async (event) => {
    const link = event.target.closest("a[href]");
    if (!link || event.defaultPrevented || event.button !== 0) return;
    if (event.metaKey || event.ctrlKey || event.shiftKey || event.altKey || link.target) return;
    const url = new URL(link.href, window.location.href);
    if (url.origin !== window.location.origin || (url.pathname === window.location.pathname && url.hash)) return;
    event.preventDefault();
    await beforeLeave();
    window.location.assign(url.href);
  });
}

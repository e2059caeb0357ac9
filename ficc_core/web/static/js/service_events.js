// The service page's events: the newest few (GET .../events?limit=), newest first, in
// an area of bounded height that scrolls; each poll adds the new ones (`after=` the last
// read); "Show older events" reads the page before the oldest one read (`before=`)
// until the server has no older one.

import { api, leave, sessionEnded } from "./api.js";
import { clock, el, stamp } from "./format.js";
import { fillTable } from "./service_common.js";

//: Events shown at first, and how many more each "Show older events" adds.
export const EVENTS_PAGE = 20;
const $ = (id) => document.getElementById(id);

function subjectText(event) {
  if (event.subject === "node") return `node ${event.node_id || event.subject_id}`;
  if (event.replica !== null && event.replica !== undefined) return `replica ${event.replica}`;
  return event.subject;
}

function eventLine(event) {
  return el(
    "tr",
    { "data-event-id": event.id, "data-kind": event.kind },
    el("td", { title: stamp(event.at) }, clock(event.at)),
    el("td", {}, el("code", {}, event.kind)),
    el("td", {}, subjectText(event)),
    el("td", {}, event.message),
  );
}

// `base`: the service's API path; `gone()`: whether the service is no longer there.
// Answers { read(), draw(), empty() }.
export function eventsPane(base, gone) {
  let events = []; // read so far, oldest first: the newest `shown` are shown
  let shown = EVENTS_PAGE;
  let after = null;
  let olderLeft = true; // whether events older than the first read may be on record

  function draw() {
    const rows = [...events].reverse().map(eventLine);
    fillTable($("events"), rows, document.querySelector('.note[data-for="events"]'), "Nothing has happened yet.");
    $("events-scroll").hidden = rows.length === 0;
    const count = rows.length === 1 ? "1 event" : `${rows.length} events`;
    $("events-count").textContent = rows.length === 0 ? "" : olderLeft ? `The latest ${count}, newest first.` : `All ${count} on record, newest first.`;
    $("events-older").hidden = !olderLeft || rows.length === 0;
  }

  // New events since the last read (the newest page at first); the oldest beyond what
  // is shown are let go, and "Show older events" reads them again with `before`.
  // Answers whether there were new ones.
  async function read() {
    const query = after === null ? `limit=${EVENTS_PAGE}` : `after=${after}&limit=500`;
    const page = await api("GET", `${base}/events?${query}`);
    if (after === null) olderLeft = page.events.length === EVENTS_PAGE;
    if (page.events.length) {
      events = events.concat(page.events);
      if (events.length > shown) {
        events = events.slice(-shown);
        olderLeft = true;
      }
    }
    if (page.next_after !== null && page.next_after !== undefined) after = page.next_after;
    else if (page.events.length) after = page.events[page.events.length - 1].id;
    return page.events.length > 0;
  }

  // The next older page, before the oldest event read.
  async function readOlder() {
    const button = $("events-older");
    button.disabled = true;
    try {
      const query = events.length ? `before=${events[0].id}&limit=${EVENTS_PAGE}` : `limit=${EVENTS_PAGE}`;
      const page = await api("GET", `${base}/events?${query}`);
      events = page.events.concat(events);
      shown = events.length;
      olderLeft = page.events.length === EVENTS_PAGE;
      draw();
    } catch (error) {
      if (sessionEnded(error)) return leave();
      $("events-count").textContent = `Could not read older events: ${error.message}`;
    } finally {
      button.disabled = gone();
    }
  }

  $("events-older").addEventListener("click", readOlder);
  return { read, draw, empty: () => events.length === 0 };
}

// The dashboard: nodes, services, models and recent events, polled from /api/v1 every
// `data-refresh-ms` while the page is visible, redrawn in place (no reload). A section
// whose route needs a scope the session lacks says so instead of asking.

import { api, leave, openSession, sessionEnded } from "./api.js";
import { clock } from "./format.js";
import {
  eventRow,
  fillRows,
  modelRow,
  nodeRow,
  serviceLink,
  serviceRow,
  serviceUsageCells,
} from "./tables.js";
import { note } from "./page.js";

const REFRESH_MS = Number(document.body.dataset.refreshMs) || 5000;
const EVENTS_SHOWN = 20;
const SERVICES_FOLLOWED = 20;
// The services' request figures cover the last hour (GET /api/v1/usage, by service).
const USAGE_PERIOD = "1h";
const USAGE_SECONDS = 3600;

const SECTIONS = {
  nodes: { scope: "contributors:read", what: "nodes" },
  services: { scope: "inference:read", what: "services" },
  models: { scope: "models:read", what: "models" },
  events: { scope: "inference:read", what: "events" },
};

let principal = null;
let timer = null;
let stopped = false;
let current = Promise.resolve(); // the refresh in flight, awaited before leaving the page

const has = (scope) => principal.scopes.includes(scope);

function fill(section, rows, emptyText) {
  const table = document.getElementById(section);
  fillRows(table, rows);
  table.closest(".table-wrap").hidden = rows.length === 0;
  note(section, rows.length === 0 ? emptyText : "");
}

async function recentEvents(services) {
  const followed = [...services]
    .sort((a, b) => b.updated_at - a.updated_at)
    .slice(0, SERVICES_FOLLOWED);
  const answers = await Promise.allSettled(
    followed.map((s) => api("GET", `/api/v1/inference/${encodeURIComponent(s.id)}/events?limit=${EVENTS_SHOWN}`)),
  );
  // A service removed since it was listed has no events to show; any other failure is.
  const failed = answers.find((a) => a.status === "rejected" && a.reason.status !== 404);
  if (failed) throw failed.reason;
  const pages = answers.filter((a) => a.status === "fulfilled").map((a) => a.value);
  // A node's events are in the listing of every service placed on it: each once.
  const unique = new Map(pages.flatMap((page) => page.events).map((e) => [e.id, e]));
  return [...unique.values()]
    .sort((a, b) => b.at - a.at || b.id - a.id)
    .slice(0, EVENTS_SHOWN);
}

// Every request settled, then the first failure thrown: a page never leaves with a
// request of its own still in flight.
async function allAnswered(requests) {
  const answers = await Promise.allSettled(requests);
  const failures = answers.filter((a) => a.status === "rejected").map((a) => a.reason);
  if (failures.length) throw failures.find(sessionEnded) || failures[0];
  return answers.map((a) => a.value);
}

async function refresh() {
  const problem = document.getElementById("problem");
  try {
    const [nodes, services, models, usage] = await allAnswered([
      has("contributors:read") ? api("GET", "/api/v1/contributors") : null,
      has("inference:read") ? api("GET", "/api/v1/inference") : null,
      has("models:read") ? api("GET", "/api/v1/models") : null,
      has("inference:read") ? api("GET", `/api/v1/usage?period=${USAGE_PERIOD}&group_by=service`) : null,
    ]);
    const served = new Map((usage ? usage.groups : []).map((g) => [g.service.id, g]));
    const events = services ? await recentEvents(services.services) : null;
    const modelNames = new Map((models ? models.models : []).map((m) => [m.id, m.name]));
    const aliases = new Map((services ? services.services : []).map((s) => [s.id, s.alias]));
    if (nodes) fill("nodes", nodes.contributors.map(nodeRow), "No node has connected yet.");
    if (services) {
      const rows = services.services.map((s) => {
        const row = serviceLink(serviceRow(s, modelNames), s);
        row.append(...serviceUsageCells(served.get(s.id), USAGE_SECONDS));
        return row;
      });
      fill("services", rows, "This project has no service yet.");
    }
    if (models) fill("models", models.models.map(modelRow), "This project has no model yet.");
    if (events) fill("events", events.map((e) => eventRow(e, aliases)), "Nothing has happened yet.");
    problem.hidden = true;
    document.getElementById("refreshed").textContent =
      `Updated ${clock(Date.now() / 1000)}, every ${REFRESH_MS / 1000} s`;
    document.body.dataset.refreshes = String(Number(document.body.dataset.refreshes || 0) + 1);
  } catch (error) {
    if (sessionEnded(error)) {
      stopped = true;
      leave();
      return;
    }
    problem.textContent = `Could not refresh: ${error.message}`;
    problem.hidden = false;
  }
}

function schedule(delay) {
  clearTimeout(timer);
  if (stopped) return;
  timer = setTimeout(async () => {
    if (document.hidden || stopped) return; // visibilitychange schedules the next one
    current = refresh();
    await current;
    schedule(REFRESH_MS);
  }, delay);
}

// Logging out stops the refreshes and leaves no request of this page unanswered.
function settled() {
  stopped = true;
  clearTimeout(timer);
  return current;
}

async function start() {
  try {
    principal = await openSession(settled);
  } catch (error) {
    const problem = document.getElementById("problem");
    problem.textContent = `Could not load the dashboard: ${error.message}`;
    problem.hidden = false;
    return;
  }
  if (principal === null) return; // the session had ended: back to the login form
  for (const [section, { scope, what }] of Object.entries(SECTIONS)) {
    if (!has(scope)) {
      document.getElementById(section).closest(".table-wrap").hidden = true;
      note(section, `This session lacks the ${scope} scope that listing ${what} needs.`);
    }
  }
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden) schedule(0);
  });
  current = refresh();
  await current;
  schedule(REFRESH_MS);
}

start();

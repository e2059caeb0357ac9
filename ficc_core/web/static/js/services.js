// The services list: every service of the project, each linked to its page, polled
// from GET /api/v1/inference (and the models' names) while the page is visible; below
// it, the form that previews, creates and starts a service (services_create.js).

import { api, leave, sessionEnded } from "./api.js";
import { clock } from "./format.js";
import { Poller, REFRESH_MS, allAnswered, fillTable, guardLinks, header } from "./service_common.js";
import { setUpCreate } from "./services_create.js";
import { serviceLink, serviceRow } from "./tables.js";

const problem = document.getElementById("problem");
const note = document.querySelector('.note[data-for="services"]');
let principal = null;
let poller = null;

async function refresh() {
  try {
    const canModels = principal.scopes.includes("models:read");
    const [services, models] = await allAnswered([
      api("GET", "/api/v1/inference"),
      canModels ? api("GET", "/api/v1/models") : null,
    ]);
    const names = new Map((models ? models.models : []).map((m) => [m.id, m.name]));
    const rows = services.services
      .slice()
      .sort((a, b) => a.alias.localeCompare(b.alias))
      .map((s) => serviceLink(serviceRow(s, names), s));
    fillTable(document.getElementById("services"), rows, note, "This project has no service yet.");
    problem.hidden = true;
    document.getElementById("refreshed").textContent =
      `Updated ${clock(Date.now() / 1000)}, every ${REFRESH_MS / 1000} s`;
    document.body.dataset.refreshes = String(Number(document.body.dataset.refreshes || 0) + 1);
  } catch (error) {
    if (sessionEnded(error)) {
      poller.stopped = true;
      leave();
      return;
    }
    problem.textContent = `Could not refresh: ${error.message}`;
    problem.hidden = false;
  }
}

async function start() {
  poller = new Poller(refresh);
  guardLinks(() => poller.stop());
  try {
    principal = await header(() => poller.stop());
  } catch (error) {
    problem.textContent = `Could not load the services: ${error.message}`;
    problem.hidden = false;
    return;
  }
  if (!principal) return;
  // Without inference:read the list says so and is never asked; the create form is set
  // up (or says which scopes it lacks) either way, with nothing to redraw after a create.
  const canList = principal.scopes.includes("inference:read");
  if (canList) {
    poller.start();
  } else {
    document.getElementById("services").closest(".table-wrap").hidden = true;
    document.getElementById("refreshed").textContent = "";
    note.textContent = "This session lacks the inference:read scope that listing services needs.";
    note.hidden = false;
  }
  try {
    await setUpCreate(principal, canList ? () => poller.now() : async () => null);
  } catch (error) {
    if (sessionEnded(error)) {
      await poller.stop();
      leave();
      return;
    }
    problem.textContent = `Could not set up the create form: ${error.message}`;
    problem.hidden = false;
  }
}

start();

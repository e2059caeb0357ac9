// The keys page: the project's keys, whoever made them (GET/POST/DELETE /api/v1/tokens;
// an application key made here is `lasting`: logging out does not revoke it), a
// project's service keys (POST/GET/DELETE /api/v1/inference/{id}/tokens) and the
// person's personal keys (/api/v1/me/tokens). A key just made is shown once,
// with a copy button, and never again: the server answers its token only to the
// request that made it, and the page keeps it nowhere but in the box until "hide".

import { api, leave, openSession, sessionEnded } from "./api.js";
import { ago, badge, el, fromNow, stamp } from "./format.js";
import { fillRows } from "./tables.js";
import { $, note, problem, status } from "./page.js";

// A personal session works in the reserved project no one can name (docs/people.md).
const PERSONAL_PROJECT = "~personal";
const SERVICE_SCOPES = ["inference:read", "inference:manage", "tokens:manage"];
const CREATE_SCOPE = "inference:invoke"; // a service key holds it: its maker must too
const MANAGE_SCOPE = "tokens:manage"; // lists, makes and revokes the project's keys

let principal = null;
let issuedId = null; // the key shown in the box, hidden with it when revoked
const inFlight = new Set();
const inProject = () => Boolean(principal.project && principal.project.id && principal.project.id !== PERSONAL_PROJECT);

// Every request of the page is tracked, so logging out waits for them all.
function track(promise) {
  inFlight.add(promise);
  promise.finally(() => inFlight.delete(promise)).catch(() => {});
  return promise;
}

const call = (method, path, body) => track(api(method, path, body));

// Run a page action: its failure is said on the page; a session gone leaves it.
async function attempt(what, action) {
  try {
    return await action();
  } catch (error) {
    if (sessionEnded(error)) {
      leave();
      return undefined;
    }
    problem(`${what}: ${error.message}`);
    return undefined;
  }
}

function keyState(key) {
  if (key.revoked_at) return "revoked";
  if (key.expires_at !== null && key.expires_at <= Date.now() / 1000) return "expired";
  return "active";
}

function keyRow(key, onRevoke, extra = {}) {
  const state = keyState(key);
  const label = key.name || key.id;
  return el(
    "tr",
    { "data-key-id": key.id, "data-key-name": key.name },
    el("th", { scope: "row" }, label, el("div", { class: "muted small" }, key.id)),
    ...(extra.scopes
      ? [el("td", { class: "scopes" }, key.scopes.join(", "), key.service_id ? el("div", { class: "muted small" }, "one service only") : null)]
      : []),
    el("td", { class: "state" }, badge(state)),
    el("td", { title: stamp(key.created_at) }, ago(key.created_at)),
    el(
      "td",
      { title: key.expires_at ? stamp(key.expires_at) : null },
      state === "revoked" ? el("span", { class: "muted" }, `revoked ${ago(key.revoked_at)}`) : fromNow(key.expires_at),
    ),
    ...(extra.lastUse
      ? [el("td", { class: "last-used", title: key.last_used_at ? stamp(key.last_used_at) : null }, key.last_used_at ? ago(key.last_used_at) : "never")]
      : []),
    el(
      "td",
      { class: "action" },
      state === "active"
        ? button("Revoke", { class: "danger small-button", "aria-label": `Revoke ${label}` }, () => onRevoke(key))
        : "–",
    ),
  );
}

function button(text, attributes, onClick) {
  const node = el("button", { type: "button", ...attributes }, text);
  node.addEventListener("click", onClick);
  return node;
}

function showRows(tableId, keys, onRevoke, emptyText, section, extra = {}) {
  const table = $(tableId);
  const sorted = [...keys].sort((a, b) => b.created_at - a.created_at || (a.id < b.id ? 1 : -1));
  fillRows(table, sorted.map((key) => keyRow(key, onRevoke, extra)));
  table.closest(".table-wrap").hidden = sorted.length === 0;
  note(section, sorted.length === 0 ? emptyText : "");
}

// The confirmation dialog: resolves true when "Revoke" is chosen.
function confirmRevoke(text) {
  const dialog = $("confirm");
  $("confirm-text").textContent = text;
  return new Promise((resolve) => {
    const done = (answer) => {
      $("confirm-yes").removeEventListener("click", yes);
      $("confirm-no").removeEventListener("click", no);
      dialog.removeEventListener("cancel", no);
      dialog.close();
      resolve(answer);
    };
    const yes = () => done(true);
    const no = (event) => {
      if (event) event.preventDefault();
      done(false);
    };
    $("confirm-yes").addEventListener("click", yes);
    $("confirm-no").addEventListener("click", no);
    dialog.addEventListener("cancel", no);
    dialog.showModal();
    $("confirm-no").focus();
  });
}

function duration(seconds) {
  if (seconds >= 86400) return `${Math.round(seconds / 86400)} d`;
  if (seconds >= 3600) return `${Math.round(seconds / 3600)} h`;
  return `${Math.max(1, Math.round(seconds / 60))} min`;
}

// The key just made, shown this once.
function reveal(answer, what) {
  const credential = answer.credential;
  issuedId = credential.id;
  $("issued-token").value = answer.token;
  $("issued-what").textContent = `${what} "${credential.name}", ${
    credential.expires_at ? `expiring ${fromNow(credential.expires_at)} (${stamp(credential.expires_at)})` : "never expiring"
  }.`;
  const capped = credential.capped;
  const cappedNote = $("issued-capped");
  if (capped) {
    const why =
      capped.by === "issuer_expiry"
        ? "this browser session ends sooner, and a key lives no longer than what made it"
        : "the server's longest lifetime (token_max_lifetime) is shorter";
    cappedNote.textContent = `Its lifetime was shortened to ${duration(capped.granted)}: ${why}.`;
  }
  cappedNote.hidden = !capped;
  $("issued-copied").textContent = "";
  const section = $("issued");
  section.hidden = false;
  section.focus();
}

function hideIssued() {
  issuedId = null;
  $("issued-token").value = "";
  $("issued-copied").textContent = "";
  $("issued").hidden = true;
}

async function copyIssued() {
  const input = $("issued-token");
  const said = $("issued-copied");
  try {
    if (!navigator.clipboard || !window.isSecureContext) throw new Error("no clipboard");
    await navigator.clipboard.writeText(input.value);
    said.textContent = "Copied to the clipboard.";
  } catch {
    input.focus();
    input.select();
    // Over plain http (not localhost) the clipboard API is withheld: the older command.
    const copied = document.execCommand && document.execCommand("copy");
    said.textContent = copied
      ? "Copied to the clipboard."
      : "This browser would not copy it: the key is selected, copy it yourself (Ctrl+C).";
  }
}

// -- the project's keys -----------------------------------------------------------------

async function loadProjectKeys() {
  const answer = await call("GET", "/api/v1/tokens");
  showRows("project-keys", answer.tokens, revokeProjectKey, "This project has no key yet.", "project-keys", {
    scopes: true,
    lastUse: true,
  });
}

async function revokeProjectKey(key) {
  if (!(await confirmRevoke(`Key "${key.name}" stops working at once, and so does every key it made.`))) return;
  await attempt("Could not revoke the key", async () => {
    await call("DELETE", `/api/v1/tokens/${encodeURIComponent(key.id)}`);
    problem("");
    if (key.id === issuedId) hideIssued();
    status(`Key "${key.name}" is revoked.`);
    await loadProjectKeys();
  });
}

async function createProjectKey(event) {
  event.preventDefault();
  const form = event.target;
  const name = form.elements.name.value.trim();
  const scopes = [...form.querySelectorAll("input[name=scope]:checked")].map((box) => box.value);
  if (!name) {
    problem("An application key needs a name.");
    form.elements.name.focus();
    return;
  }
  if (scopes.length === 0) {
    problem("Choose at least one scope for the key.");
    return;
  }
  const body = { name, scopes, lifetime: Number(form.elements.lifetime.value), lasting: !form.elements.session.checked };
  const submit = form.querySelector("button[type=submit]");
  submit.disabled = true;
  await attempt("Could not create the key", async () => {
    const answer = await call("POST", "/api/v1/tokens", body);
    problem("");
    status("");
    form.elements.name.value = "";
    reveal(answer, body.lasting ? "The application key" : "The application key (ending with this session)");
    await loadProjectKeys();
  });
  submit.disabled = false;
}

async function startProjectKeys() {
  if (!inProject()) {
    note("project-keys", "A personal session has no project: log in to a project to manage its keys.");
    return;
  }
  if (!principal.scopes.includes(MANAGE_SCOPE)) {
    note("project-keys", `This session lacks the ${MANAGE_SCOPE} scope that the project's keys need.`);
    return;
  }
  const grantable = principal.scopes.filter((scope) => scope !== "admin").sort();
  $("project-key-scopes").append(
    ...grantable.map((scope) =>
      el(
        "label",
        { class: "check" },
        el("input", { type: "checkbox", name: "scope", value: scope, checked: scope === CREATE_SCOPE }),
        scope,
      ),
    ),
  );
  const form = $("project-key-form");
  form.hidden = false;
  form.addEventListener("submit", createProjectKey);
  await loadProjectKeys();
}

// -- service keys ----------------------------------------------------------------------

const serviceSelect = () => $("service");

function chosenService() {
  return serviceSelect().value;
}

async function loadServiceKeys() {
  const serviceId = chosenService();
  if (!serviceId) return;
  const answer = await call("GET", `/api/v1/inference/${encodeURIComponent(serviceId)}/tokens`);
  if (serviceId !== chosenService()) return; // another was chosen meanwhile
  const alias = serviceSelect().selectedOptions[0].dataset.alias;
  showRows("service-keys", answer.tokens, revokeServiceKey, `Service ${alias} has no key yet.`, "service-keys");
}

async function revokeServiceKey(key) {
  const serviceId = chosenService();
  const alias = serviceSelect().selectedOptions[0].dataset.alias;
  if (!(await confirmRevoke(`Key "${key.name}" of service ${alias} stops working at once; requests in flight with it end too.`))) return;
  await attempt("Could not revoke the key", async () => {
    await call("DELETE", `/api/v1/inference/${encodeURIComponent(serviceId)}/tokens/${encodeURIComponent(key.id)}`);
    problem("");
    if (key.id === issuedId) hideIssued();
    status(`Key "${key.name}" is revoked.`);
    await loadServiceKeys();
    if (!$("project-key-form").hidden) await loadProjectKeys();
  });
}

async function createServiceKey(event) {
  event.preventDefault();
  const form = event.target;
  const serviceId = chosenService();
  const alias = serviceSelect().selectedOptions[0].dataset.alias;
  const name = form.elements.name.value.trim();
  const body = { lifetime: Number(form.elements.lifetime.value) };
  if (name) body.name = name;
  const submit = form.querySelector("button[type=submit]");
  submit.disabled = true;
  await attempt("Could not create the key", async () => {
    const answer = await call("POST", `/api/v1/inference/${encodeURIComponent(serviceId)}/tokens`, body);
    problem("");
    status("");
    form.elements.name.value = "";
    reveal(answer, `A key of service ${alias}`);
    await loadServiceKeys();
    if (!$("project-key-form").hidden) await loadProjectKeys();
  });
  submit.disabled = false;
}

async function startServiceKeys() {
  if (!inProject()) {
    note("service-keys", "A personal session has no project: log in to a project to manage its service keys.");
    return;
  }
  const lacking = SERVICE_SCOPES.filter((scope) => !principal.scopes.includes(scope));
  if (lacking.length) {
    note("service-keys", `This session lacks the ${lacking.join(", ")} scope${lacking.length > 1 ? "s" : ""} that service keys need.`);
    return;
  }
  const answer = await call("GET", "/api/v1/inference");
  const services = [...answer.services].sort((a, b) => a.alias.localeCompare(b.alias));
  if (services.length === 0) {
    note("service-keys", "This project has no service yet.");
    return;
  }
  const wanted = new URLSearchParams(window.location.search).get("service");
  serviceSelect().replaceChildren(
    ...services.map((s) =>
      el("option", { value: s.id, "data-alias": s.alias, selected: s.id === wanted || s.alias === wanted }, `${s.alias} (${s.state})`),
    ),
  );
  const form = $("service-key-form");
  if (principal.scopes.includes(CREATE_SCOPE)) {
    form.hidden = false;
    form.addEventListener("submit", createServiceKey);
  } else {
    // Listing and revoking need no more; only making one does.
    form.hidden = false;
    form.querySelector("button[type=submit]").hidden = true;
    for (const field of ["service-key-name", "service-key-lifetime"]) $(field).closest(".field").hidden = true;
    form.append(el("p", { class: "hint" }, `This session lacks the ${CREATE_SCOPE} scope a new service key would hold: it lists and revokes keys only.`));
  }
  serviceSelect().addEventListener("change", () => {
    const url = new URL(window.location.href);
    url.searchParams.set("service", chosenService());
    window.history.replaceState(null, "", url);
    status("");
    attempt("Could not list the service's keys", loadServiceKeys);
  });
  await loadServiceKeys();
}

// -- personal keys ---------------------------------------------------------------------

async function loadPersonalKeys() {
  const answer = await call("GET", "/api/v1/me/tokens");
  showRows("personal-keys", answer.tokens, revokePersonalKey, "You have no personal key yet.", "personal-keys");
}

async function revokePersonalKey(key) {
  if (!(await confirmRevoke(`Your personal key "${key.name}" stops working at once.`))) return;
  await attempt("Could not revoke the key", async () => {
    await call("DELETE", `/api/v1/me/tokens/${encodeURIComponent(key.id)}`);
    problem("");
    if (key.id === issuedId) hideIssued();
    status(`Key "${key.name}" is revoked.`);
    await loadPersonalKeys();
  });
}

async function createPersonalKey(event) {
  event.preventDefault();
  const form = event.target;
  const name = form.elements.name.value.trim();
  if (!name) {
    problem("A personal key needs a name.");
    form.elements.name.focus();
    return;
  }
  const submit = form.querySelector("button[type=submit]");
  submit.disabled = true;
  await attempt("Could not create the key", async () => {
    const answer = await call("POST", "/api/v1/me/tokens", { name, lifetime: Number(form.elements.lifetime.value) });
    problem("");
    status("");
    form.elements.name.value = "";
    reveal(answer, "Your personal key");
    await loadPersonalKeys();
  });
  submit.disabled = false;
}

async function startPersonalKeys() {
  if (!principal.user) {
    note("personal-keys", "This session is not a person's: personal keys belong to people.");
    return;
  }
  const form = $("personal-key-form");
  form.hidden = false;
  form.addEventListener("submit", createPersonalKey);
  await loadPersonalKeys();
}

async function start() {
  try {
    principal = await openSession(() => Promise.allSettled([...inFlight]));
  } catch (error) {
    problem(`Could not load the page: ${error.message}`);
    return;
  }
  if (!principal) return;
  if (principal.expires_at) $("session-ends").textContent = `it ends ${fromNow(principal.expires_at)}`;
  $("issued-copy").addEventListener("click", copyIssued);
  $("issued-done").addEventListener("click", hideIssued);
  await Promise.all([
    attempt("Could not list the project's keys", startProjectKeys),
    attempt("Could not list the service keys", startServiceKeys),
    attempt("Could not list your personal keys", startPersonalKeys),
  ]);
  document.body.dataset.loaded = "true";
}

start();

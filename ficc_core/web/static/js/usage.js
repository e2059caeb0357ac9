// The usage page: requests, errors, tokens, spend and latency per key, service, person,
// model or project over a period (GET /api/v1/usage, or /api/v1/me/usage for a person's
// personal keys), redrawn every `data-refresh-ms` while visible; and the limits and
// budgets set on the project, the person and the project's keys, with their use.

import { api, leave, openSession, sessionEnded } from "./api.js";
import { el, number, stamp } from "./format.js";
import { fillRows } from "./tables.js";
import { $, note, problem } from "./page.js";

const REFRESH_MS = Number(document.body.dataset.refreshMs) || 5000;
const KEYS_CHECKED = 100; // the project's active keys whose limits are read, at most
const GROUP_NAMES = { key: "Key", service: "Service", person: "Person", model: "Model", project: "Project" };
// A personal session works in the reserved project no one can name (docs/people.md).
const PERSONAL_PROJECT = "~personal";
const PERSONAL_GROUPS = new Set(["", "key", "service", "model"]);

let principal = null;
let timer = null;
let loop = 0;
let stopped = false;
let current = Promise.resolve();
const inFlight = new Set();
const has = (scope) => principal.scopes.includes(scope);
const projectId = () => {
  const id = principal.project && principal.project.id;
  return id && id !== PERSONAL_PROJECT ? id : null;
};

function call(method, path) {
  const promise = api(method, path);
  inFlight.add(promise);
  promise.finally(() => inFlight.delete(promise)).catch(() => {});
  return promise;
}

// -- formatting --------------------------------------------------------------------------

const count = (n) => Number(n).toLocaleString("en-US");
const spend = (milli) => (Number(milli) / 1000).toFixed(3);

function seconds(value) {
  if (value === null || value === undefined) return "–";
  return value < 1 ? `${Math.round(value * 1000)} ms` : `${number(value, 2)} s`;
}

function codes(byCode) {
  const entries = Object.entries(byCode || {}).sort((a, b) => b[1] - a[1]);
  return entries.map(([code, n]) => `${code} ${n}`).join(", ");
}

// -- the form ----------------------------------------------------------------------------

const FIELDS = { whose: "whose", period: "period", by: "group-by", service: "usage-service" };

function chosen() {
  return Object.fromEntries(Object.entries(FIELDS).map(([name, id]) => [name, $(id).value]));
}

function remember() {
  const url = new URL(window.location.href);
  for (const [name, value] of Object.entries(chosen())) url.searchParams.set(name, value);
  window.history.replaceState(null, "", url);
}

function pick(id, value) {
  const select = $(id);
  if ([...select.options].some((o) => o.value === value && !o.disabled)) select.value = value;
}

function usagePath() {
  const { whose, period, by, service } = chosen();
  const query = new URLSearchParams();
  if (period) query.set("period", period);
  if (by) query.set("group_by", by);
  if (service && whose !== "me") query.set("service", service);
  // An administrator sees every project's usage; "this project" narrows it to its own.
  if (whose === "project" && has("admin")) query.set("project", projectId());
  const base = whose === "me" ? "/api/v1/me/usage" : "/api/v1/usage";
  const text = query.toString();
  return text ? `${base}?${text}` : base;
}

function syncForm() {
  const whose = $("whose").value;
  const personal = whose === "me";
  $("usage-service").disabled = personal;
  $("usage-service").closest(".field").hidden = personal;
  for (const option of $("group-by").options) {
    option.hidden = option.disabled = personal && !PERSONAL_GROUPS.has(option.value);
  }
  if ($("group-by").selectedOptions[0].disabled) $("group-by").value = "key";
}

// -- usage -------------------------------------------------------------------------------

function figure(name, label, amount) {
  return el(
    "div",
    { class: "figure", role: "listitem", "data-figure": name },
    el("div", { class: "label" }, label),
    el("div", { class: "amount" }, amount),
  );
}

function groupLabel(group, by) {
  const value = group[by] || {};
  if (by === "key" && value.id && !value.name) return ["browser session", value.id];
  if (!value.id) return [by === "service" ? "refused before a service" : "–", null];
  return [value.name || "(removed)", value.id];
}

function groupRow(group, by) {
  const [label, id] = by ? groupLabel(group, by) : ["all", null];
  const latency = group.latency || {};
  const duration = latency.duration || {};
  const ttfb = latency.ttfb || {};
  return el(
    "tr",
    { "data-group-id": id || "", "data-group-name": label },
    el("th", { scope: "row" }, label, id && id !== label ? el("div", { class: "muted small" }, id) : null),
    el("td", { class: "number requests" }, count(group.requests)),
    el("td", { class: "errors" }, count(group.errors), group.errors ? el("div", { class: "muted small" }, codes(group.errors_by_code)) : null),
    el("td", { class: "number" }, count(group.prompt_tokens)),
    el("td", { class: "number" }, count(group.completion_tokens)),
    el("td", { class: "number spend" }, spend(group.spend_milli)),
    el("td", {}, `${seconds(duration.p50)} / ${seconds(duration.p99)}`),
    el("td", {}, seconds(ttfb.p50)),
  );
}

function showUsage(report) {
  const totals = report.totals;
  const latency = totals.latency || {};
  $("totals").replaceChildren(
    figure("requests", "Requests", count(totals.requests)),
    figure("errors", "Errors", count(totals.errors)),
    figure("prompt", "Prompt tokens", count(totals.prompt_tokens)),
    figure("completion", "Completion tokens", count(totals.completion_tokens)),
    figure("spend", "Spend (units)", spend(totals.spend_milli)),
    figure("latency", "Latency p50", seconds((latency.duration || {}).p50)),
    figure("ttfb", "First byte p50", seconds((latency.ttfb || {}).p50)),
  );
  const byCode = codes(totals.errors_by_code);
  $("totals-codes").textContent = byCode ? `Errors by code: ${byCode}.` : "";
  $("totals-codes").hidden = !byCode;
  $("totals-when").textContent = report.since ? `from ${stamp(report.since)} to now` : "since the first request";
  const by = report.group_by[0] || "";
  const what = GROUP_NAMES[by];
  $("groups-title").textContent = what ? `Per ${what.toLowerCase()}` : "Not grouped";
  $("group-column").textContent = what || "Selection";
  const groups = by ? [...report.groups].sort((a, b) => b.requests - a.requests) : [];
  const table = $("groups");
  fillRows(table, groups.map((g) => groupRow(g, by)));
  table.closest(".table-wrap").hidden = groups.length === 0;
  note("groups", !by ? "Choose what to group by to see the totals split." : groups.length ? "" : "No request in this period.");
}

async function refreshUsage() {
  try {
    showUsage(await call("GET", usagePath()));
    problem("");
    $("refreshed").textContent = `Updated ${new Date().toLocaleTimeString([], { hour12: false })}, every ${REFRESH_MS / 1000} s`;
    document.body.dataset.refreshes = String(Number(document.body.dataset.refreshes || 0) + 1);
  } catch (error) {
    if (sessionEnded(error)) {
      stopped = true;
      leave();
      return;
    }
    problem(`Could not read the usage: ${error.message}`);
  }
}

// One refresh loop: each call starts it afresh (a changed form asks at once), and an
// older loop's timer never fires again.
function schedule(delay) {
  clearTimeout(timer);
  if (stopped) return;
  const mine = ++loop;
  timer = setTimeout(async () => {
    if (document.hidden || stopped || mine !== loop) return; // visibilitychange restarts it
    current = refreshUsage();
    await current;
    if (mine === loop) schedule(REFRESH_MS);
  }, delay);
}

// -- limits ------------------------------------------------------------------------------

function isSet(view) {
  const limits = view.limits;
  return limits.rpm !== null || limits.tpm !== null || limits.budget !== null;
}

function rate(limit, used, unit) {
  if (limit === null) return el("td", {}, el("span", { class: "muted" }, "not set"), el("div", { class: "muted small" }, `${count(used)} ${unit} this minute`));
  if (limit === 0) return el("td", {}, "no limit (0)", el("div", { class: "muted small" }, `${count(used)} ${unit} this minute`));
  return el(
    "td",
    {},
    `${count(used)} of ${count(limit)}`,
    el("meter", { class: "meter", min: 0, max: limit, value: Math.min(used, limit), "aria-label": `${unit} this minute, of ${limit}` }),
  );
}

function budget(limits, use) {
  if (limits.budget === null) return el("td", {}, el("span", { class: "muted" }, "not set"));
  if (limits.budget === 0) return el("td", {}, "no budget (0)");
  const period = limits.period || use.period;
  const when = { day: "today (UTC)", month: "this month (UTC)" }[period] || "this period";
  return el(
    "td",
    {},
    `${Number(use.spent).toFixed(3)} of ${count(limits.budget)} units ${when}`,
    el("meter", { class: "meter", min: 0, max: limits.budget, value: Math.min(use.spent, limits.budget), "aria-label": `spent ${when}, of ${limits.budget} units` }),
    use.in_flight ? el("div", { class: "muted small" }, `${Number(use.in_flight).toFixed(3)} in flight`) : null,
  );
}

const SCOPE_NAMES = { project: "Project", user: "Person", credential: "Key" };

function limitRow(view) {
  return el(
    "tr",
    { "data-scope": view.scope, "data-id": view.id },
    el("th", { scope: "row" }, `${SCOPE_NAMES[view.scope] || view.scope} ${view.name || view.id}`, el("div", { class: "muted small" }, view.id)),
    rate(view.limits.rpm, view.use.requests, "requests"),
    rate(view.limits.tpm, view.use.tokens, "tokens"),
    budget(view.limits, view.use),
  );
}

async function activeKeys() {
  const answer = await call("GET", "/api/v1/tokens");
  const now = Date.now() / 1000;
  return answer.tokens
    .filter((t) => !t.revoked_at && (t.expires_at === null || t.expires_at > now))
    .slice(-KEYS_CHECKED);
}

async function refreshLimits() {
  const asked = [];
  const checked = [];
  const project = projectId();
  if (has("admin") && project) {
    asked.push(call("GET", `/api/v1/projects/${encodeURIComponent(project)}/limits`));
    checked.push("the project");
  }
  if (has("admin") && principal.user) {
    asked.push(call("GET", `/api/v1/users/${encodeURIComponent(principal.user.id)}/limits`));
    checked.push("you");
  }
  if (has("tokens:manage") && project) {
    const keys = await activeKeys();
    for (const key of keys) asked.push(call("GET", `/api/v1/tokens/${encodeURIComponent(key.id)}/limits`));
    checked.push("the project's keys");
  }
  const answers = await Promise.allSettled(asked);
  // A key revoked between the listing and its limits is 404: it has none to show.
  const failed = answers.find((a) => a.status === "rejected" && a.reason.status !== 404);
  if (failed) throw failed.reason;
  const views = answers.filter((a) => a.status === "fulfilled").map((a) => a.value).filter(isSet);
  const table = $("limits");
  fillRows(table, views.map(limitRow));
  table.closest(".table-wrap").hidden = views.length === 0;
  const notes = [];
  if (!checked.length) {
    notes.push("Limits are read by administrators (the project's and a person's) and by token managers (the keys'): this session is neither.");
  } else if (!views.length) {
    notes.push(`No limit is set on ${checked.join(", ")}: the server's defaults apply.`);
  }
  if (checked.length && !has("admin")) {
    notes.push("Your own limits and the project's are shown to administrators only.");
  }
  note("limits", notes.join(" "));
}

// The usage now (and on), and the limits once.
async function refreshAll() {
  remember();
  schedule(0);
  await refreshLimits().catch(limitsFailed);
}

function limitsFailed(error) {
  if (sessionEnded(error)) {
    stopped = true;
    leave();
    return;
  }
  problem(`Could not read the limits: ${error.message}`);
}

// -- start -------------------------------------------------------------------------------

async function services() {
  if (!has("inference:read") || !projectId()) return;
  const answer = await call("GET", "/api/v1/inference");
  const sorted = [...answer.services].sort((a, b) => a.alias.localeCompare(b.alias));
  $("usage-service").append(...sorted.map((s) => el("option", { value: s.id }, s.alias)));
}

async function start() {
  try {
    principal = await openSession(() => {
      stopped = true;
      clearTimeout(timer);
      return Promise.allSettled([current, ...inFlight]);
    });
  } catch (error) {
    problem(`Could not load the page: ${error.message}`);
    return;
  }
  if (!principal) return;
  const whose = $("whose");
  const project = projectId();
  for (const option of [...whose.options]) {
    const allowed =
      (option.value === "project" && project && has("inference:read")) ||
      (option.value === "everyone" && has("admin")) ||
      (option.value === "me" && principal.user);
    if (allowed) {
      option.hidden = option.disabled = false;
    } else {
      option.remove();
    }
  }
  if (whose.options.length === 0) {
    problem("This session may read no usage: it lacks inference:read and is not a person's.");
    return;
  }
  try {
    await services();
  } catch (error) {
    if (sessionEnded(error)) {
      leave();
      return;
    }
    problem(`Could not list the services: ${error.message}`);
  }
  const query = new URLSearchParams(window.location.search);
  for (const [name, id] of Object.entries(FIELDS)) if (query.has(name)) pick(id, query.get(name));
  syncForm();
  for (const id of Object.values(FIELDS)) {
    $(id).addEventListener("change", () => {
      syncForm();
      remember();
      schedule(0);
    });
  }
  $("usage-form").addEventListener("submit", (event) => {
    event.preventDefault();
    refreshAll();
  });
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden) schedule(0);
  });
  await refreshAll();
  document.body.dataset.loaded = "true";
}

start();

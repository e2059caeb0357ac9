// One service's page: its state, replicas (GET .../status), logs per replica (the
// latest lines read at once, then live through the ticketed SSE stream), events
// (service_events.js), usage charts (buckets of GET /api/v1/usage), the
// specification, the rollout form (service_rollout.js), and actions with a
// confirmation, each sending the revision read afresh just before it (409
// stale_revision, or a change of what the operator saw, says to reload). A service that is not there (or no longer)
// is said so, with nothing left to act on it and no more polling.

import { api, ApiError, leave, sessionEnded } from "./api.js";
import { lineChart } from "./charts.js";
import { badge, bytes, clock, el, number, stamp } from "./format.js";
import { Poller, REFRESH_MS, allAnswered, fillTable, guardLinks, header } from "./service_common.js";
import { eventsPane } from "./service_events.js";
import { rolloutForm } from "./service_rollout.js";
import { $ } from "./page.js";
import { reservationText } from "./tables.js";

const SERVICE_ID = decodeURIComponent(window.location.pathname.split("/").pop());
const BASE = `/api/v1/inference/${encodeURIComponent(SERVICE_ID)}`;
const LOG_LINES_KEPT = 1000;
//: Lines of a replica's log read when it is chosen (the logs API's tail).
const LOG_TAIL = 100;
const USAGE_BUCKETS = 12;
const USAGE_EVERY_MS = Math.max(5000, REFRESH_MS * 6);
const dash = "–";

const problem = $("problem");

let principal = null;
let poller = null;
let view = null; // GET /inference/{id}: the revision every action sends
let status = null;
let events = null; // the events pane (service_events.js)
let usageAt = 0;
let specShown = null; // the spec the rollout form was filled from
let stream = null; // the EventSource of the log followed
let logRead = null; // "index/attempt" of the log whose latest lines were read (or asked)
let rollout = null; // the rollout form (service_rollout.js)
let modelNames = new Map(); // the project's models' names, read once
let gone = false; // a read answered 404: the service is not there (or no longer)

const has = (scope) => principal.scopes.includes(scope);

function showProblem(text) {
  problem.textContent = text;
  problem.hidden = !text;
}

// ---- replicas ------------------------------------------------------------------------

function lastExit(exit) {
  if (!exit) return dash;
  if (exit.memory_limit) return "memory limit";
  if (exit.signal !== null && exit.signal !== undefined) return `signal ${exit.signal}`;
  if (exit.exit_code !== null && exit.exit_code !== undefined) return `status ${exit.exit_code}`;
  return exit.reason || dash;
}

// Replica states that a reason explains even when their last exit was no failure.
const NEEDS_REASON = new Set(["stopped", "failed", "unknown"]);

// The REASON under a replica's state, as `ficc inference show` says it: the current
// attempt's own reason, else its last exit's where that explains the state (a failure,
// or any end of a replica stopped, failed or unknown now). A replica running again after
// a stop it was asked for (restart_requested, moved) needs none.
function reasonShown(replica) {
  if (replica.reason) return replica.reason;
  const last = replica.last_exit;
  if (!last) return null;
  if (NEEDS_REASON.has(replica.state) || last.failed !== false) return last.reason || null;
  return null;
}

function replicaRow(replica, held) {
  const node = replica.node || {};
  const nodeText = node.state && node.state !== "connected" ? `${node.name || node.id} (${node.state})` : node.name || node.id;
  const reason = reasonShown(replica);
  const move = el("button", { type: "button", class: "plain-button small-button", "data-move": replica.index }, `Move replica ${replica.index}…`);
  move.disabled = !(replica.serving && view.desired === "running");
  return el(
    "tr",
    { "data-replica": replica.index },
    el("th", { scope: "row" }, String(replica.index)),
    el(
      "td",
      { class: "state" },
      badge(replica.state),
      reason ? el("div", { class: "reason small" }, reason) : null,
    ),
    el("td", { class: "node" }, nodeText, node.trouble ? el("div", { class: "reason small" }, node.trouble) : null),
    el("td", { title: replica.attempt_id || null }, replica.attempt ? `${replica.attempt} (generation ${replica.generation})` : dash),
    el("td", { class: "pid" }, replica.pid ? String(replica.pid) : dash),
    el("td", {}, String(replica.restarts)),
    el("td", { title: replica.last_exit && replica.last_exit.message ? replica.last_exit.message : null }, lastExit(replica.last_exit)),
    el("td", { class: "health", title: replica.health_at ? `since ${stamp(replica.health_at)}` : null }, replica.health || dash),
    el("td", {}, String(replica.in_flight || 0)),
    el("td", {}, reservationText(held)),
    el("td", {}, move),
  );
}

function drawReplicas() {
  const held = new Map(view.replicas.map((r) => [r.index, r.reservation]));
  const rows = status.replicas.map((r) => replicaRow(r, held.get(r.index)));
  fillTable($("replicas"), rows, document.querySelector('.note[data-for="replicas"]'), "This service has no replica.");
  // The log's replica choice follows the replicas, keeping the one chosen.
  const select = $("log-replica");
  const chosen = select.value;
  const options = status.replicas.map((r) =>
    el("option", { value: r.index }, `Replica ${r.index} (${r.state}${r.attempt ? `, attempt ${r.attempt}` : ""})`),
  );
  select.replaceChildren(...options);
  if (chosen !== "" && status.replicas.some((r) => String(r.index) === chosen)) select.value = chosen;
  updateLogButtons();
}

// ---- summary and actions ---------------------------------------------------------------

const SETTLED = { running: ["ready", "idle"], stopped: ["stopped"], draining: ["draining"], removed: ["removing"] };

function drawSummary() {
  document.title = `${view.alias} · FICC Inference`;
  $("service-title").textContent = view.alias;
  $("state").replaceChildren(badge(view.state));
  const settled = (SETTLED[view.desired] || []).includes(view.state);
  $("desired").textContent = settled ? `desired: ${view.desired}` : `on its way to: ${view.desired}`;
  $("reason").textContent = view.reason || "";
  $("reason").hidden = !view.reason;
  $("revision").textContent = `${view.id} · revision ${view.revision}, generation ${view.generation}` +
    (view.scaling ? ` · scaling ${view.scaling.running} running, min ${view.scaling.min}, max ${view.scaling.max}${view.scaling.pinned ? ", pinned" : ""}` : "");
  $("summary").hidden = false;
  $("summary").dataset.state = view.state;

  const running = view.desired === "running";
  const manage = has("inference:manage");
  const buttons = Object.fromEntries([...document.querySelectorAll("[data-action]")].map((b) => [b.dataset.action, b]));
  buttons.start.disabled = !manage || running || view.state === "removing";
  buttons.drain.disabled = !manage || !running;
  buttons.stop.disabled = !manage || (view.desired === "stopped" && view.state === "stopped");
  buttons.restart.disabled = !manage || !running;
  buttons.pin.hidden = !view.scaling || view.scaling.pinned;
  buttons.unpin.hidden = !view.scaling || !view.scaling.pinned;
  buttons.pin.disabled = buttons.unpin.disabled = !manage;
  rollout.update();
}

const ACTIONS = {
  start: {
    label: "Start",
    text: (a) => `Start ${a}? Each replica is launched on its node; the service takes requests once one is ready.`,
    call: (revision) => api("POST", `${BASE}/control/start`, { revision }),
    done: (a) => `${a} is starting.`,
  },
  drain: {
    label: "Drain",
    text: (a) => `Drain ${a}? New requests are refused at once; those in flight finish (within the drain timeout), then it stops.`,
    call: (revision) => api("POST", `${BASE}/control/drain`, { revision }),
    done: (a) => `${a} is draining.`,
  },
  stop: {
    label: "Stop",
    text: (a) => `Stop ${a}? New requests are refused at once, and those in flight end with the engines.`,
    call: (revision) => api("POST", `${BASE}/control/stop`, { revision }),
    done: (a) => `${a} is stopping.`,
  },
  restart: {
    label: "Restart",
    text: (a) => `Restart every replica of ${a}, one at a time? Each is replaced once its successor is ready (a one-replica service is unavailable meanwhile).`,
    call: (revision) => api("POST", `${BASE}/restart`, { revision }),
    busy: (a) => `Restarting ${a}: this answers once every replacement is ready…`,
    done: (a, answer) => `${a} restarted: ${answer.replicas.map((r) => `replica ${r.replica} ${r.ok ? "ready again" : "failed"}`).join(", ")}.`,
  },
  pin: {
    label: "Pin",
    text: (a) => `Pin ${a}? It is never scaled to zero while pinned (an idle one wakes now).`,
    call: (revision) => api("POST", `${BASE}/pin`, { revision }),
    done: (a) => `${a} is pinned.`,
  },
  unpin: {
    label: "Unpin",
    text: (a) => `Unpin ${a}? It may be scaled to zero again after its idle timeout.`,
    call: (revision) => api("POST", `${BASE}/unpin`, { revision }),
    done: (a) => `${a} is no longer pinned.`,
  },
};

// Asks in the confirmation dialog; answers whether the operator confirmed.
function confirmed(title, text, okLabel) {
  const dialog = $("confirm");
  $("confirm-title").textContent = title;
  $("confirm-text").textContent = text;
  $("confirm-ok").textContent = okLabel;
  dialog.returnValue = "";
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
    dialog.showModal();
    $("confirm-cancel").focus();
  });
}

// What the operator saw changed in a way that matters before an action was sent.
class ServiceChanged extends Error {
  constructor(seen, fresh) {
    super("the service changed");
    this.details = { requested: seen.revision, revision: fresh.revision };
  }
}

// The revision an action sends, read afresh just before it, as the command line does:
// the page's last read may be a poll old, and the revision moves on with every change
// of an attempt's state. If the desired state or the generation is no longer the one
// the page shows, nothing is sent and the page says the service changed.
async function freshRevision() {
  const seen = view;
  const fresh = await api("GET", BASE);
  if (fresh.desired !== seen.desired || fresh.generation !== seen.generation) throw new ServiceChanged(seen, fresh);
  return fresh.revision;
}

function actionFailed(error) {
  const text = $("action-problem-text");
  const reload = $("action-reload");
  if (error instanceof ServiceChanged || (error instanceof ApiError && error.code === "stale_revision")) {
    text.textContent = `The service changed since this page read it (revision ${error.details.requested ?? view.revision} read, ${error.details.revision} now): nothing was done. Reload it, check, and try again.`;
    reload.hidden = false;
  } else {
    text.textContent = error.message;
    reload.hidden = true;
  }
  $("action-problem").hidden = false;
}

// Runs `run(revision)` with the revision read afresh (freshRevision), saying `busy`,
// then `done(answer)` or why it failed; then reads the service again.
// `failed(error)`, if given, may show a refusal itself (answering true).
async function act(name, run, { busy, done, after, failed } = {}) {
  $("action-problem").hidden = true;
  $("action-status").textContent = busy || `${name}…`;
  try {
    const answer = await run(await freshRevision());
    $("action-status").textContent = done ? done(answer) : "";
    if (after) after(answer);
  } catch (error) {
    if (sessionEnded(error)) return leave();
    $("action-status").textContent = "";
    if (!(failed && failed(error))) actionFailed(error);
  }
  await poller.now();
}

async function onAction(event) {
  if (!view || gone) return;
  const name = event.currentTarget.dataset.action;
  const action = ACTIONS[name];
  const alias = view.alias;
  if (!(await confirmed(`${action.label} ${alias}`, action.text(alias), action.label))) return;
  await act(action.label, action.call, {
    busy: action.busy ? action.busy(alias) : `${action.label}: asking…`,
    done: (answer) => action.done(alias, answer),
  });
}

// ---- move ------------------------------------------------------------------------------

async function openMove(index) {
  const form = $("move-form");
  const select = $("move-target");
  $("move-replica").textContent = String(index);
  form.dataset.replica = String(index);
  form.hidden = false;
  select.replaceChildren();
  $("move-submit").disabled = true;
  const note = $("move-note");
  if (!has("contributors:read")) {
    note.textContent = "This session lacks the contributors:read scope that listing nodes needs.";
    return;
  }
  note.textContent = "Checking which nodes it fits on…";
  const source = view.spec.placements[index].node_id;
  try {
    const { contributors } = await api("GET", "/api/v1/contributors");
    const candidates = contributors.filter((n) => n.id !== source && n.state === "connected");
    // Each candidate checked by the server: the spec with this replica placed there,
    // planned beside the serving generation (a move holds both while it runs).
    const checks = await allAnswered(
      candidates.map((node) => {
        const spec = structuredClone(view.spec);
        spec.placements[index].node_id = node.id;
        return api("POST", `${BASE}/rollout/preview`, { spec });
      }),
    );
    const fits = [];
    const refused = [];
    candidates.forEach((node, i) => {
      const planned = checks[i].beside_serving.replicas.find((r) => r.index === index);
      if (planned && planned.fits) fits.push(node);
      else refused.push(`${node.name || node.id}: ${planned ? planned.reasons.map((r) => r.message).join("; ") : "not planned"}`);
    });
    select.replaceChildren(...fits.map((n) => el("option", { value: n.id }, n.name || n.id)));
    $("move-submit").disabled = fits.length === 0;
    const none = candidates.length === 0 ? `No other connected node than ${source}.` : fits.length === 0 ? "It fits on no other node." : `It fits on ${fits.length} of ${candidates.length} other node(s).`;
    note.textContent = [none, ...refused].join(" ");
    if (fits.length) select.focus();
  } catch (error) {
    if (sessionEnded(error)) return leave();
    note.textContent = `Could not check the nodes: ${error.message}`;
  }
}

async function submitMove(event) {
  event.preventDefault();
  const index = Number($("move-form").dataset.replica);
  const target = $("move-target").value;
  if (!target) return;
  const text = `Move replica ${index} of ${view.alias} from ${view.spec.placements[index].node_id} to ${target}? It starts there first and the source keeps serving until the target is ready.`;
  if (!(await confirmed(`Move replica ${index}`, text, "Move"))) return;
  await act("Move", (revision) => api("POST", `${BASE}/replicas/${index}/move`, { target_node_id: target, revision }), {
    busy: `Moving replica ${index} to ${target}…`,
    done: (answer) => `Replica ${index}: ${answer.final_state} (${answer.from_node} → ${answer.to_node}).`,
    after: () => {
      $("move-form").hidden = true;
    },
  });
}

// ---- logs ------------------------------------------------------------------------------

function logStatus(text) {
  $("log-status").textContent = text;
}

function updateLogButtons() {
  const index = $("log-replica").value;
  const replica = status && status.replicas.find((r) => String(r.index) === index);
  $("log-follow").disabled = gone || stream !== null || !replica || !replica.attempt_id;
  $("log-stop").hidden = stream === null;
  if (stream === null && replica && !replica.attempt_id) {
    logStatus(`Replica ${index} has not been started yet, so it has no log.`);
    $("log").replaceChildren();
    $("log").classList.remove("no-lines");
    logRead = null;
  } else if (stream === null && replica && !gone && logRead === null) {
    if (launched(replica)) readLog(replica);
    else logStatus(`Replica ${index}'s engine is being launched: its lines are read once it runs.`);
  }
}

//: A replica's states in which its attempt's engine runs on its node.
const RUNNING = new Set(["loading", "ready", "degraded", "draining", "stopping"]);

// Whether the replica's latest attempt reached its node's executor (which has its log
// from then on): its engine runs, or it ran and exited and nothing was launched since.
function launched(replica) {
  if (!replica.attempt_id) return false;
  if (RUNNING.has(replica.state)) return true;
  return (replica.state === "stopped" || replica.state === "failed") && Boolean(replica.last_exit);
}

// The latest lines of the chosen replica's latest attempt (GET .../logs?tail=), read
// when the page opens or another replica is chosen, so the pane is never empty while
// there is a log: "No lines yet." only when the log has none.
async function readLog(replica) {
  const index = String(replica.index);
  const reading = `${index}/${replica.attempt_id}`;
  logRead = reading;
  logStatus(`Reading replica ${index}'s latest lines…`);
  const log = $("log");
  try {
    const found = await api("GET", `${BASE}/replicas/${index}/logs?tail=${LOG_TAIL}`);
    if (logRead !== reading || stream !== null) return; // another replica chosen, or followed, meanwhile
    log.replaceChildren();
    for (const line of found.lines) log.append(el("span", { class: "line" }, line), "\n");
    log.classList.toggle("no-lines", found.lines.length === 0);
    log.scrollTop = log.scrollHeight;
    const attempt = replica.attempt ? `attempt ${replica.attempt}` : "latest attempt";
    const count = found.lines.length === LOG_TAIL ? `The last ${LOG_TAIL} lines` : found.lines.length === 1 ? "The only line" : `All ${found.lines.length} lines`;
    logStatus(
      found.lines.length === 0
        ? `Replica ${index}'s ${attempt} (${found.attempt_state}) has written no line yet. Follow live to see them come.`
        : `${count} of replica ${index}'s ${attempt} (${found.attempt_state}). Follow live to see new ones.`,
    );
  } catch (error) {
    if (sessionEnded(error)) return leave();
    if (logRead !== reading || stream !== null) return;
    log.replaceChildren();
    log.classList.remove("no-lines");
    logStatus(`Could not read replica ${index}'s log: ${error.message}`);
  }
}

function appendLine(text) {
  const log = $("log");
  const atEnd = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
  log.append(el("span", { class: "line" }, text), "\n");
  while (log.childNodes.length > 2 * LOG_LINES_KEPT) {
    log.firstChild.remove();
    log.firstChild.remove();
  }
  if (atEnd) log.scrollTop = log.scrollHeight;
}

function closeStream(text) {
  if (stream) stream.close();
  stream = null;
  if (text) logStatus(text);
  updateLogButtons();
}

async function follow() {
  const index = $("log-replica").value;
  if (index === "" || gone) return;
  closeStream();
  $("log").replaceChildren();
  $("log").classList.remove("no-lines");
  logRead = `${index}/followed`;
  $("log-follow").disabled = true;
  logStatus(`Opening replica ${index}'s log…`);
  let ticket;
  try {
    ticket = (await api("POST", `${BASE}/replicas/${index}/logs/ticket`)).ticket;
  } catch (error) {
    if (sessionEnded(error)) return leave();
    logStatus(`Could not open the log: ${error.message}`);
    updateLogButtons();
    return;
  }
  const url = `${BASE}/replicas/${index}/logs/stream?tail=100&ticket=${encodeURIComponent(ticket)}`;
  const source = new EventSource(url);
  stream = source;
  updateLogButtons();
  source.onopen = () => logStatus(`Following replica ${index}'s log live.`);
  source.onmessage = (event) => {
    $("log").classList.remove("no-lines");
    appendLine(event.data);
  };
  // The attempt ended: the server closes the stream next (closing it here would abort
  // a response still open), and the error event that closing fires ends it here.
  let ended = false;
  source.addEventListener("end", () => {
    ended = true;
    logStatus(`Replica ${index}'s attempt ended; its log is complete.`);
  });
  // A ticket opens its stream once: never let the browser reconnect with it.
  source.addEventListener("error", (event) => {
    if (ended) {
      if (stream === source) closeStream();
      return;
    }
    let text = `The log stream of replica ${index} closed.`;
    if (event.data) {
      try {
        text = `The log stream of replica ${index} ended: ${JSON.parse(event.data).error.message}`;
      } catch {
        // not the error envelope: the plain sentence says enough
      }
    }
    if (stream === source) closeStream(text);
  });
}

// ---- usage -----------------------------------------------------------------------------

async function readUsage() {
  const window_ = Number($("usage-window").value);
  const now = Date.now() / 1000;
  const width = window_ / USAGE_BUCKETS;
  const start = now - window_;
  const service = encodeURIComponent(SERVICE_ID);
  const buckets = Array.from({ length: USAGE_BUCKETS }, (_, i) => start + i * width);
  const [total, ...parts] = await allAnswered([
    api("GET", `/api/v1/usage?service=${service}&since=${start.toFixed(3)}`),
    ...buckets.map((since) => api("GET", `/api/v1/usage?service=${service}&since=${since.toFixed(3)}&until=${(since + width).toFixed(3)}`)),
  ]);
  const t = total.totals;
  const latency = t.latency && t.latency.ttfb;
  // null: no request reached a replica in the window, so there is no time to say.
  const secs = (v) => (v === null || v === undefined ? dash : `${number(v, 3)} s`);
  $("usage-totals").textContent =
    `${t.requests} requests (${t.errors} errors), ${t.prompt_tokens} prompt and ${t.completion_tokens} completion tokens` +
    (latency ? `, time to first token p50 ${secs(latency.p50)}, p99 ${secs(latency.p99)}` : "") +
    ` in the ${$("usage-window").selectedOptions[0].textContent.toLowerCase()}.`;
  const pick = (f) => parts.map((p) => f(p.totals));
  const ends = buckets.map((since) => since + width); // each point says its bucket's end
  const ttfb = (q) => (x) => (x.latency && x.latency.ttfb ? x.latency.ttfb[q] : null);
  lineChart($("chart-requests"), {
    title: "Requests",
    times: ends,
    series: [
      { name: "requests", values: pick((x) => x.requests), class: "s1" },
      { name: "errors", values: pick((x) => x.errors), class: "s3" },
    ],
    format: (v) => number(v, 0),
  });
  lineChart($("chart-tokens"), {
    title: "Tokens",
    times: ends,
    series: [
      { name: "prompt", values: pick((x) => x.prompt_tokens), class: "s1" },
      { name: "completion", values: pick((x) => x.completion_tokens), class: "s2" },
    ],
    format: (v) => number(v, 0),
  });
  lineChart($("chart-latency"), {
    title: "Time to first token",
    times: ends,
    series: [
      { name: "p50", values: pick(ttfb("p50")), class: "s1" },
      { name: "p99", values: pick(ttfb("p99")), class: "s3" },
    ],
    format: (v) => number(v, 2),
    floor: 0.1,
  });
}

// ---- specification and rollout ---------------------------------------------------------

function specEntries(spec) {
  const runtime = spec.runtime || {};
  const entries = [
    ["Alias", spec.alias],
    ["Model", modelNames.has(spec.model_id) ? `${modelNames.get(spec.model_id)} (${spec.model_id})` : spec.model_id],
    ["Engine", spec.engine],
    ["Runtime", `${runtime.executor_provider} · isolation ${runtime.isolation} · network ${runtime.network}`],
    ["Executable", spec.image_executable],
    ["Context", `${spec.context} tokens`],
    ["Concurrency", `${spec.concurrency} requests per replica`],
  ];
  const optional = [
    ["description", "Description"],
    ["gpu_layers", "GPU layers"],
    ["tensor_split", "Tensor split"],
    ["parallelism", "Parallelism"],
    ["request_deadline", "Request deadline (s)"],
    ["context_length", "Context length"],
    ["max_output", "Max output"],
    ["prompt_cache_bytes", "Host prompt cache (bytes)"],
    ["aliases", "Also answers to"],
    ["fallbacks", "Fallbacks"],
    ["capabilities", "Capabilities"],
    ["scaling", "Scaling"],
  ];
  for (const [key, label] of optional) {
    const value = spec[key];
    if (value === undefined || value === null) continue;
    const text = Array.isArray(value) ? value.join(", ") : typeof value === "object" ? Object.entries(value).map(([k, v]) => `${k}: ${v}`).join(", ") : String(value);
    entries.push([label, text]);
  }
  spec.placements.forEach((p, i) => {
    entries.push([`Replica ${i}`, `on ${p.node_id}: ${reservationText(p.limits)}`]);
  });
  return entries;
}

function drawSpec() {
  const key = JSON.stringify(view.spec);
  if (key === specShown) return;
  specShown = key;
  $("spec").replaceChildren(...specEntries(view.spec).flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
  $("spec-json").textContent = JSON.stringify(view.spec, null, 2);
  rollout.shown(view.spec);
}

// ---- refresh ---------------------------------------------------------------------------

// A read answered 404: the service is not in this project, or no longer (removed while
// the page was open). Say so, stop polling and following its log, and disable
// everything that would act on it.
function serviceGone() {
  gone = true;
  poller.stopped = true;
  closeStream();
  if (view) {
    showProblem("This service no longer exists: it was removed while this page was open.");
    $("state").replaceChildren(badge("removed"));
    $("summary").dataset.state = "removed";
    $("desired").textContent = "";
    $("reason").hidden = true;
    $("refreshed").textContent = "No longer refreshed.";
  } else {
    showProblem("No such service in this project: it was removed, or it is another project's.");
    $("service-title").textContent = "No such service";
    $("refreshed").textContent = "";
  }
  const controls = "[data-action], [data-move], #move-submit, #action-reload, #log-follow, #log-replica, #events-older";
  for (const control of document.querySelectorAll(controls)) control.disabled = true;
  rollout.disable();
  $("move-form").hidden = true;
}

async function refresh() {
  try {
    const [service, replicas] = await allAnswered([api("GET", BASE), api("GET", `${BASE}/status`)]);
    view = service;
    status = replicas;
    const newEvents = await events.read();
    drawSummary();
    drawReplicas();
    drawSpec();
    if (newEvents || events.empty()) events.draw();
    if (Date.now() - usageAt >= USAGE_EVERY_MS) {
      usageAt = Date.now();
      await readUsage();
    }
    showProblem("");
    $("refreshed").textContent = `Updated ${clock(Date.now() / 1000)}, every ${REFRESH_MS / 1000} s`;
    document.body.dataset.refreshes = String(Number(document.body.dataset.refreshes || 0) + 1);
  } catch (error) {
    if (sessionEnded(error)) {
      poller.stopped = true;
      closeStream();
      leave();
      return;
    }
    if (error instanceof ApiError && error.status === 404) {
      serviceGone();
      return;
    }
    showProblem(`Could not refresh: ${error.message}`);
  }
}

async function start() {
  poller = new Poller(refresh);
  rollout = rolloutForm({ base: BASE, view: () => view, act, confirmed });
  events = eventsPane(BASE, () => gone);
  const beforeLeave = async () => {
    closeStream();
    await poller.stop();
  };
  guardLinks(beforeLeave);
  try {
    principal = await header(beforeLeave);
  } catch (error) {
    showProblem(`Could not load the service: ${error.message}`);
    return;
  }
  if (!principal) return;
  for (const button of document.querySelectorAll("[data-action]")) button.addEventListener("click", onAction);
  $("action-reload").addEventListener("click", async () => {
    $("action-problem").hidden = true;
    await poller.now();
    $("action-status").textContent = `Reloaded: revision ${view.revision}.`;
  });
  $("replicas").addEventListener("click", (event) => {
    const button = event.target.closest("[data-move]");
    if (button) openMove(Number(button.dataset.move));
  });
  $("move-form").addEventListener("submit", submitMove);
  $("move-cancel").addEventListener("click", () => {
    $("move-form").hidden = true;
  });
  $("log-follow").addEventListener("click", follow);
  $("log-stop").addEventListener("click", () => closeStream("Stopped following."));
  $("log-replica").addEventListener("change", () => {
    logRead = null;
    updateLogButtons();
  });
  $("usage-window").addEventListener("change", () => {
    usageAt = 0;
    poller.now();
  });
  window.addEventListener("pagehide", () => closeStream());
  if (!has("inference:read")) {
    showProblem("This session lacks the inference:read scope that reading a service needs.");
    return;
  }
  if (has("models:read")) {
    try {
      modelNames = new Map((await api("GET", "/api/v1/models")).models.map((m) => [m.id, m.name]));
    } catch (error) {
      if (sessionEnded(error)) return leave();
      // Without the names the specification shows the model's ID.
    }
  }
  poller.start();
}

start();

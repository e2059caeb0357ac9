// The services list's create form: a partial specification (model, engine, alias,
// replicas, context, concurrency, scaling), as `ficc inference create --model` sends
// it, to POST /api/v1/inference/preview; the completed specification it answers, the
// plan and the warnings are shown; Create (only after a preview that fits, with the
// form unchanged since) submits exactly that specification to POST /api/v1/inference,
// then starts it with its revision (or offers Start). Refusals are shown at the field
// their path names, or at the plan.

import { api, sessionEnded, leave } from "./api.js";
import { el } from "./format.js";
import { reservationText } from "./tables.js";

//: The engines a preview knows how to complete when no node lists its runtimes' engines.
const KNOWN_ENGINES = ["llama_cpp", "ollama", "vllm"];
//: The most replicas a service is created with here (`ficc inference create --replicas`).
const MAX_REPLICAS = 64;
const dash = "–";
const $ = (id) => document.getElementById(id);

//: A refusal's path's first part → the form's field it is about.
const FIELDS = {
  alias: "create-alias",
  model_id: "create-model",
  engine: "create-engine",
  context: "create-context",
  context_length: "create-context",
  concurrency: "create-concurrency",
  placements: "create-replicas",
  "scaling.min": "create-min",
  "scaling.max": "create-max",
  "scaling.idle_timeout": "create-idle",
  scaling: "create-min",
};

let previewed = null; // the preview answered for the form as it is now, when it fits
let afterCreate = () => null;
let modelNames = new Map(); // the project's verified models' names by ID

function fieldFor(path) {
  const bare = String(path || "").replace(/^\$\.?/, "");
  const dotted = bare.replace(/\[\d+\]/g, "");
  if (FIELDS[dotted]) return FIELDS[dotted];
  const first = dotted.split(".")[0];
  if (first === "scaling") return FIELDS["scaling.min"];
  return FIELDS[first] || null;
}

function clearErrors() {
  for (const error of document.querySelectorAll("#create-form .field-error")) {
    error.textContent = "";
    error.hidden = true;
  }
  for (const input of document.querySelectorAll("#create-form [aria-invalid]")) input.removeAttribute("aria-invalid");
  $("create-problem").hidden = true;
}

function fieldError(id, text) {
  const input = $(id);
  const error = $(`${id}-error`);
  error.textContent = error.textContent ? `${error.textContent} ${text}` : text;
  error.hidden = false;
  input.setAttribute("aria-invalid", "true");
}

// A field edited: its refusal is out of date.
function clearField(input) {
  if (!input.id || input.getAttribute("aria-invalid") !== "true") return;
  input.removeAttribute("aria-invalid");
  const error = $(`${input.id}-error`);
  if (error) {
    error.textContent = "";
    error.hidden = true;
  }
}

function problem(text) {
  $("create-problem").textContent = text;
  $("create-problem").hidden = false;
}

// Show a refusal: each listed field path at its field (the first one focused), the
// rest (and a refusal naming no field) in the form's alert.
function refused(error, what) {
  if (sessionEnded(error)) return leave();
  const errors = (error.details && error.details.errors) || [];
  const elsewhere = [];
  let first = null;
  if (error.code === "service_exists") {
    fieldError("create-alias", error.message);
    first = "create-alias";
  }
  for (const item of errors) {
    const id = fieldFor(item.path);
    if (id) {
      fieldError(id, `${item.message} (${item.path})`);
      first = first || id;
    } else elsewhere.push(`${item.path}: ${item.message}`);
  }
  if (!first || elsewhere.length) {
    const detail = elsewhere.length ? ` ${elsewhere.join("; ")}` : "";
    problem(`${what}: ${error.message}${detail}`);
  }
  if (first) $(first).focus();
}

function integer(id) {
  const text = $(id).value.trim();
  if (text === "") return null;
  const value = Number(text);
  return Number.isFinite(value) ? value : text; // a bad one goes as is: the server says why
}

// The number of replicas, as `ficc inference create --replicas` takes it (a whole
// number from 1 to MAX_REPLICAS), or null: the page then says so at the field rather
// than send another number than the one shown.
function replicaCount() {
  const text = $("create-replicas").value.trim();
  const value = Number(text);
  return text !== "" && Number.isInteger(value) && value >= 1 && value <= MAX_REPLICAS ? value : null;
}

// What the form says that no preview could take, as [field ID, why]: each said at its
// field before anything is sent.
function formErrors() {
  const errors = [];
  if (!$("create-alias").value.trim()) errors.push(["create-alias", "Give the service an alias."]);
  if (replicaCount() === null) {
    const text = $("create-replicas").value.trim();
    errors.push([
      "create-replicas",
      text === ""
        ? `Give the number of replicas: a whole number from 1 to ${MAX_REPLICAS}.`
        : `The number of replicas must be a whole number from 1 to ${MAX_REPLICAS}, not ${text}.`,
    ]);
  }
  return errors;
}

// The partial specification the form says (inference_create.partial_spec's shape);
// formErrors() is empty.
function partialSpec() {
  const spec = {
    alias: $("create-alias").value.trim(),
    model_id: $("create-model").value,
    engine: $("create-engine").value,
    context: integer("create-context"),
    concurrency: integer("create-concurrency"),
    placements: Array.from({ length: replicaCount() }, () => ({})),
  };
  const scaling = {};
  const min = integer("create-min");
  const max = integer("create-max");
  const idle = integer("create-idle");
  if (min !== null) scaling.min = min;
  if (max !== null) scaling.max = max;
  if (idle !== null) scaling.idle_timeout = idle;
  if (Object.keys(scaling).length) {
    if (!("min" in scaling)) scaling.min = 1;
    spec.scaling = scaling;
  }
  return spec;
}

function planTable(preview) {
  const rows = preview.replicas.map((r) =>
    el(
      "tr",
      { "data-replica": r.index, class: r.fits ? "fits" : "refused" },
      el("th", { scope: "row" }, String(r.index)),
      el("td", { class: "node", "data-label": "Node" }, r.node_id),
      el("td", { "data-label": "Reservation" }, reservationText(r.reservation)),
      el("td", { class: "held", "data-label": "Held" }, r.held === false ? "planned" : "held"),
      el("td", { class: "fit", "data-label": "Fits" }, r.fits ? "fits" : "does not fit"),
      el(
        "td",
        { class: "reasons", "data-label": "Reasons" },
        r.reasons.length ? el("ul", { class: "plain" }, r.reasons.map((x) => el("li", {}, el("code", {}, x.code), ` ${x.message}`))) : dash,
      ),
    ),
  );
  return el(
    "div",
    { class: "table-wrap plan", tabindex: "0", role: "region", "aria-label": "The plan" },
    el(
      "table",
      { id: "create-plan" },
      el("caption", {}, "The plan: each replica's node and reservation"),
      el("thead", {}, el("tr", {}, ["Replica", "Node", "Reservation", "Held", "Fits", "Reasons"].map((h) => el("th", { scope: "col" }, h)))),
      el("tbody", {}, rows),
    ),
  );
}

function completedList(preview) {
  const spec = preview.spec;
  const filled = new Set((preview.suggested || []).map((p) => p.replace(/\[\d+\]/g, "[]")));
  const mark = (...paths) => (paths.some((p) => filled.has(p)) ? el("span", { class: "filled" }, "suggested") : null);
  const runtime = spec.runtime || {};
  const entries = [
    ["Alias", spec.alias],
    ["Model", modelNames.has(spec.model_id) ? `${modelNames.get(spec.model_id)} (${spec.model_id})` : spec.model_id],
    ["Engine", `${spec.engine} (context ${spec.context} × concurrency ${spec.concurrency})`],
    ["Runtime", [`${runtime.executor_provider || dash} ${String(runtime.image_digest || "").slice(0, 19)}…`, mark("$.runtime")]],
    ["Executable", [spec.image_executable || dash, mark("$.image_executable")]],
    [
      "Placements",
      [
        (spec.placements || [])
          .map((p, i) => `${i}: ${p.node_id} (${p.limits ? reservationText({ ...p.limits, gpus: p.limits.gpus || [] }) : dash})`)
          .join("; "),
        mark("$.placements", "$.placements[].node_id", "$.placements[].limits", "$.placements[].limits.gpus"),
      ],
    ],
  ];
  if (spec.scaling) {
    const s = spec.scaling;
    entries.push(["Scaling", `min ${s.min}, max ${s.max ?? spec.placements.length}${s.idle_timeout ? `, idle ${s.idle_timeout} s` : ""}`]);
  }
  return el(
    "dl",
    { class: "completed", id: "create-completed" },
    entries.flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]),
  );
}

function invalidate() {
  previewed = null;
  $("create-submit").disabled = true;
}

async function preview(event) {
  event.preventDefault();
  clearErrors();
  invalidate();
  $("create-done").replaceChildren();
  const out = $("create-result");
  const errors = formErrors();
  if (errors.length) {
    for (const [id, text] of errors) fieldError(id, text);
    $(errors[0][0]).focus();
    out.replaceChildren();
    return;
  }
  const spec = partialSpec();
  out.replaceChildren(el("p", { class: "note" }, "Planning…"));
  let answer;
  try {
    answer = await api("POST", "/api/v1/inference/preview", spec);
  } catch (error) {
    out.replaceChildren();
    refused(error, "The preview was refused");
    return;
  }
  const scaling = answer.scaling;
  const fits = answer.fits && (!scaling || scaling.max_fits !== false);
  const verdict = fits
    ? "It fits: Create submits this specification."
    : "It does not fit: see the reasons in the plan; Create stays disabled.";
  const shown = [
    el("p", { id: "create-verdict", class: fits ? "verdict fits" : "verdict refused" }, verdict),
    completedList(answer),
    ...(answer.warnings || []).map((w) =>
      el("p", { class: "notice" }, typeof w === "string" ? w : `${w.message || JSON.stringify(w)}${w.code ? ` [${w.code}]` : ""}`),
    ),
    planTable(answer),
    scaling ? el("p", { class: "muted small" }, `Held at the start: ${scaling.held.join(", ") || "none"}; planned: ${scaling.planned.join(", ") || "none"}; ${scaling.fit_together} of ${scaling.max} fit together.`) : null,
    el("p", { class: "muted small" }, `Plan ${answer.plan_digest}`),
  ];
  out.replaceChildren(...shown.filter(Boolean));
  if (fits) {
    previewed = answer;
    $("create-submit").disabled = false;
  }
}

function openLink(service) {
  return el("a", { href: `/ui/services/${encodeURIComponent(service.id)}`, id: "create-open" }, `Open ${service.alias}`);
}

async function startService(service) {
  const done = $("create-done");
  done.replaceChildren(el("span", {}, `Starting ${service.alias}…`));
  try {
    const started = await api("POST", `/api/v1/inference/${encodeURIComponent(service.id)}/control/start`, { revision: service.revision });
    done.replaceChildren(el("span", {}, `Created ${started.alias} and started it (${started.id}). `), openLink(started));
  } catch (error) {
    if (sessionEnded(error)) return leave();
    done.replaceChildren(el("span", {}, `Created ${service.alias}; the start was refused: ${error.message} `), openLink(service));
  }
  await afterCreate();
}

async function create() {
  if (!previewed) return;
  const spec = previewed.spec;
  clearErrors();
  $("create-submit").disabled = true;
  const done = $("create-done");
  done.replaceChildren(el("span", {}, "Creating…"));
  let service;
  try {
    service = await api("POST", "/api/v1/inference", spec);
  } catch (error) {
    done.replaceChildren();
    refused(error, "The service was not created");
    $("create-submit").disabled = previewed === null;
    return;
  }
  previewed = null;
  if ($("create-start").checked) {
    await startService(service);
    return;
  }
  const start = el("button", { type: "button", id: "create-start-now" }, `Start ${service.alias}`);
  start.addEventListener("click", () => startService(service));
  done.replaceChildren(el("span", {}, `Created ${service.alias} (${service.id}), stopped. `), openLink(service), start);
  await afterCreate();
}

// Fill the selects (verified models; the engines the nodes' runtimes serve, or the
// engine names a preview knows) and wire the form. `refresh` redraws the list.
export async function setUpCreate(principal, refresh) {
  afterCreate = refresh;
  const form = $("create-form");
  const needed = ["inference:manage", "models:read"].filter((s) => !principal.scopes.includes(s));
  if (needed.length) {
    form.hidden = true;
    $("create-note").textContent = `Creating a service needs the ${needed.join(" and ")} scope(s), which this session lacks.`;
    $("create-note").hidden = false;
    return;
  }
  const canNodes = principal.scopes.includes("contributors:read");
  const [models, nodes] = await Promise.all([
    api("GET", "/api/v1/models"),
    canNodes ? api("GET", "/api/v1/contributors").catch(() => null) : null,
  ]);
  const verified = models.models.filter((m) => m.state === "verified").sort((a, b) => a.name.localeCompare(b.name));
  modelNames = new Map(verified.map((m) => [m.id, m.name]));
  const modelSelect = $("create-model");
  modelSelect.replaceChildren(...verified.map((m) => el("option", { value: m.id }, `${m.name} (${m.id})`)));
  if (!verified.length) {
    modelSelect.append(el("option", { value: "" }, "No verified model"));
    fieldError("create-model", "This project has no verified model yet: add one on the Models page.");
  }
  const engines = new Set();
  for (const node of (nodes && nodes.contributors) || []) {
    for (const runtime of (node.snapshot && node.snapshot.runtimes) || []) {
      for (const engine of runtime.engines || []) engines.add(engine);
    }
  }
  const names = engines.size ? [...engines].sort() : KNOWN_ENGINES;
  $("create-engine").replaceChildren(...names.map((n) => el("option", { value: n }, n)));
  if (names.includes("llama_cpp")) $("create-engine").value = "llama_cpp";
  form.addEventListener("submit", preview);
  form.addEventListener("input", (event) => {
    if (event.target.id === "create-start") return;
    invalidate();
    clearField(event.target);
  });
  form.addEventListener("change", (event) => {
    if (event.target.id !== "create-start") invalidate();
  });
  $("create-submit").addEventListener("click", create);
  form.hidden = false; // only once wired: a form without its handlers would submit natively
}

// The models page: the project's models polled live (state, format, size, verification
// and acquisition progress), a local GGUF uploaded from the browser in chunks (hashed
// here first, resumed from the server's durable offset after a reload), a model
// registered from a hub repository after its preview, acquisition started and paused,
// and a model deleted (with or without evicting its content) after a confirmation.
// Everything goes through the public /api/v1/models routes.

import { ApiError, api, apiBytes, leave, sessionEnded } from "./api.js";
import { badge, bytes, clock, el } from "./format.js";
import { ggufHead } from "./gguf.js";
import { Sha256 } from "./sha256.js";
import { $ } from "./page.js";
import { fillRows } from "./tables.js";

const REFRESH_MS = Number(document.body.dataset.refreshMs) || 5000;
//: Each upload request carries this much (the byte route takes at most 16 MiB).
const CHUNK = 8 << 20;
//: The file is read this much at a time while it is hashed.
const HASH_SLICE = 4 << 20;
const dash = "–";

let principal = null;
let timer = null;
let stopped = false;
let current = Promise.resolve(); // the refresh in flight, awaited before leaving the page
let listed = []; // the models of the last refresh
let drawn = ""; // what the table shows, to redraw only what changed
let previews = []; // the last hub preview's answers
let uploading = null; // {stop, file}: the upload this page runs
let resumeFor = null; // the model whose upload the user asked to resume
let deleting = null; // the model the delete dialog asks about
let refreshFailed = false; // the problem shown is a refresh's, cleared by the next one

const has = (scope) => principal.scopes.includes(scope);
const modelPath = (id) => `/api/v1/models/${encodeURIComponent(id)}`;

function say(id, text) {
  const node = $(id);
  node.textContent = text || "";
  node.hidden = !text;
}

function status(text) {
  say("status", text);
}

function problem(text) {
  say("problem", text);
  refreshFailed = false;
}


function count(value) {
  if (value === null || value === undefined) return dash;
  const n = Number(value);
  if (n >= 1e9) return `${(n / 1e9).toFixed(1)} B`;
  if (n >= 1e6) return `${(n / 1e6).toFixed(1)} M`;
  if (n >= 1e3) return `${(n / 1e3).toFixed(1)} k`;
  return String(n);
}

function percent(part, whole) {
  return whole ? Math.floor((100 * part) / whole) : 100;
}

// --- the models table -------------------------------------------------------------

// The files of `model` a browser upload fills: no URL to acquire them from, not verified.
function uploadable(model) {
  return model.files.filter((file) => !file.url && file.state !== "verified");
}

function acquirable(model) {
  return model.files.some((file) => file.url && file.state !== "verified");
}

function reasonOf(model) {
  const acquisition = model.acquisition;
  if (acquisition && acquisition.reason) return acquisition.reason;
  const failed = model.files.find((file) => file.reason);
  return failed ? failed.reason : null;
}

function stateCell(model) {
  const acquisition = model.acquisition && model.acquisition.state;
  const reason = reasonOf(model);
  const [only] = model.files;
  const fileState = model.files.length === 1 && only.state !== model.state ? only.state : null;
  return el(
    "td",
    { class: "state" },
    badge(model.state),
    acquisition ? el("div", { class: "muted small" }, `acquisition: ${acquisition}`) : null,
    fileState ? el("div", { class: "muted small" }, `file: ${fileState}`) : null,
    reason && model.state !== "verified" ? el("div", { class: "reason small" }, reason) : null,
  );
}

function progressCell(model) {
  const size = model.size || 0;
  const verified = model.verified_bytes || 0;
  const received = model.received_bytes || 0;
  const files =
    model.files.length > 1
      ? el(
          "ul",
          { class: "plain files" },
          model.files.map((file) =>
            el("li", {}, `${file.path}: ${file.state}, ${bytes(file.received_bytes)} of ${bytes(file.size)}`),
          ),
        )
      : null;
  return el(
    "td",
    { class: "progress" },
    el("progress", {
      max: size || 1,
      value: size ? verified : 1,
      "aria-label": `${model.name}: verified`,
    }),
    ` ${percent(verified, size)}% verified`,
    received > verified
      ? el("div", { class: "received muted small" }, `${bytes(received)} of ${bytes(size)} received (${percent(received, size)}%)`)
      : null,
    files,
  );
}

function sourceCell(model) {
  const source = model.manifest && model.manifest.source;
  if (source && source.repository) {
    const revision = source.revision || "";
    return el(
      "td",
      { class: "source" },
      source.repository,
      revision ? el("div", { class: "muted small" }, `at ${revision.slice(0, 12)}`) : null,
    );
  }
  if (model.files.some((file) => file.url)) return el("td", { class: "source" }, "HTTPS URL");
  return el("td", { class: "source" }, "uploaded");
}

function action(name, model, text, label, extra = {}) {
  return el(
    "button",
    { type: "button", class: "plain-button", "data-action": name, "data-model-id": model.id, "aria-label": label, ...extra },
    text,
  );
}

function actionsCell(model) {
  if (!has("models:manage")) return el("td", { class: "actions" }, dash);
  const buttons = [];
  const running = model.acquisition && model.acquisition.state === "running";
  if (model.state !== "verified" && acquirable(model)) {
    buttons.push(
      running
        ? action("pause", model, "Pause", `Pause the acquisition of ${model.name}`)
        : action("acquire", model, model.received_bytes ? "Resume acquisition" : "Acquire", `Acquire ${model.name}`),
    );
  }
  const busy = uploading && uploading.modelId === model.id;
  if (model.state !== "verified" && !busy && uploadable(model).length === 1) {
    const [file] = uploadable(model);
    buttons.push(
      action("resume-upload", model, file.received_bytes ? "Resume upload…" : "Upload…", `Upload ${model.name}`, {
        "data-path": file.path,
      }),
    );
  }
  buttons.push(action("delete", model, "Delete…", `Delete ${model.name}`, { class: "plain-button danger" }));
  return el("td", { class: "actions" }, el("div", { class: "actions" }, buttons));
}

function modelRow(model) {
  return el(
    "tr",
    { "data-model-id": model.id, "data-model-name": model.name, "data-state": model.state },
    el("th", { scope: "row" }, model.name, el("div", { class: "muted small" }, model.id)),
    stateCell(model),
    el("td", {}, model.format),
    el("td", { class: "size" }, bytes(model.size || 0)),
    progressCell(model),
    sourceCell(model),
    actionsCell(model),
  );
}

function drawModels(models) {
  const key = JSON.stringify([models, uploading && uploading.modelId]);
  if (key === drawn) return;
  drawn = key;
  // A redraw keeps the focus on the same control of the same row.
  const focused = document.activeElement;
  const keep =
    focused && focused.dataset && focused.dataset.action
      ? { action: focused.dataset.action, id: focused.dataset.modelId }
      : null;
  const table = $("models");
  fillRows(table, models.map(modelRow));
  table.closest(".table-wrap").hidden = models.length === 0;
  const note = document.querySelector('.note[data-for="models"]');
  note.textContent = models.length === 0 ? "This project has no model yet." : "";
  note.hidden = models.length !== 0;
  if (keep) {
    const again = table.querySelector(`button[data-action="${keep.action}"][data-model-id="${CSS.escape(keep.id)}"]`);
    if (again) again.focus();
  }
}

// --- refreshing -------------------------------------------------------------------

async function refresh() {
  if (!has("models:read")) return;
  try {
    const answer = await api("GET", "/api/v1/models");
    listed = answer.models;
    drawModels(listed);
    if (refreshFailed) problem(""); // an action's refusal stays until the next action
    $("refreshed").textContent = `Updated ${clock(Date.now() / 1000)}, every ${REFRESH_MS / 1000} s`;
    document.body.dataset.refreshes = String(Number(document.body.dataset.refreshes || 0) + 1);
  } catch (error) {
    if (sessionEnded(error)) {
      stop();
      leave();
      return;
    }
    problem(`Could not refresh: ${error.message}`);
    refreshFailed = true;
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

// Refresh now (after an action), then on the usual period.
async function refreshNow() {
  await current;
  current = refresh();
  await current;
  schedule(REFRESH_MS);
}

function stop() {
  stopped = true;
  clearTimeout(timer);
  if (uploading) uploading.stop = true;
}

// --- uploading a local file -------------------------------------------------------

class Stopped extends Error {}

function uploadPhase(text, done = null, total = null, detail = "") {
  $("upload-progress-block").hidden = false;
  $("upload-phase").textContent = text;
  const bar = $("upload-progress");
  if (total === null) {
    bar.removeAttribute("value"); // indeterminate
  } else {
    bar.max = total || 1;
    bar.value = total ? done : 1;
  }
  $("upload-bytes").textContent = detail;
}

function uploadControls(running) {
  $("upload-start").disabled = running;
  $("upload-file").disabled = running;
  $("upload-stop").hidden = !running;
  $("upload-stop").disabled = false;
}

async function hashFile(file) {
  const hash = new Sha256();
  const started = performance.now();
  for (let at = 0; at < file.size; at += HASH_SLICE) {
    if (uploading.stop) throw new Stopped();
    const piece = new Uint8Array(await file.slice(at, at + HASH_SLICE).arrayBuffer());
    hash.update(piece);
    const done = at + piece.length;
    const seconds = (performance.now() - started) / 1000;
    uploadPhase(
      `Hashing ${file.name} (sha256) in this browser: ${percent(done, file.size)}%`,
      done,
      file.size,
      `${bytes(done)} of ${bytes(file.size)} read${seconds > 0.5 ? `, ${bytes(done / seconds)}/s` : ""}`,
    );
  }
  return hash.hex();
}

// The project's model (and file index) that declares this content and is not verified
// yet: the one the user asked to resume first, else any.
function unfinished(models, sha256, size) {
  const matches = [];
  for (const model of models) {
    for (const file of model.files) {
      if (file.sha256 === sha256 && file.size === size && !file.url && file.state !== "verified") {
        matches.push({ model, index: file.index });
      }
    }
  }
  return matches.find((m) => m.model.id === resumeFor) || matches[0] || null;
}

const wait = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// Send file `index` of `model` from the server's durable offset to the end.
async function sendFile(model, index, file) {
  const path = `${modelPath(model.id)}/files/${index}/bytes`;
  let view = (await api("GET", modelPath(model.id))).files[index];
  let offset = view.received_bytes;
  const from = offset;
  uploading.held = offset;
  let sent = 0;
  const started = performance.now();
  document.body.dataset.uploadFrom = String(from);
  const verb = from > 0 ? `Resuming ${model.name} at ${bytes(from)}, which the server holds` : `Uploading ${model.name}`;
  uploadPhase(`${verb}: ${percent(offset, file.size)}%`, offset, file.size, `${bytes(offset)} of ${bytes(file.size)} on the server`);
  while (view.state !== "verified") {
    if (uploading.stop) throw new Stopped();
    const end = Math.min(offset + CHUNK, file.size);
    try {
      view = await apiBytes(`${path}?offset=${offset}`, file.slice(offset, end));
    } catch (error) {
      if (!(error instanceof ApiError)) throw error;
      const told = error.details && error.details.offset;
      if ((error.code === "offset_mismatch" || error.code === "empty_upload") && Number.isInteger(told) && told !== offset) {
        offset = told; // the server's durable offset: continue from there
        continue;
      }
      if (error.code === "file_verified") return "verified";
      if (error.status === 429 || error.code === "upload_stalled") {
        await wait(1000 * (error.retryAfter || 1));
        continue;
      }
      throw error;
    }
    sent += end - offset;
    offset = view.received_bytes;
    uploading.held = offset;
    const seconds = (performance.now() - started) / 1000;
    uploadPhase(
      `${verb}: ${percent(offset, file.size)}%`,
      offset,
      file.size,
      `${bytes(offset)} of ${bytes(file.size)} on the server` +
        (seconds > 0.5 ? `, ${bytes(sent / seconds)}/s` : ""),
    );
    if (end >= file.size) break;
  }
  return view.state;
}

async function upload(event) {
  event.preventDefault();
  if (uploading) return;
  const input = $("upload-file");
  const file = input.files[0];
  say("upload-error", "");
  if (!file) {
    say("upload-error", "Choose a GGUF file first.");
    input.focus();
    return;
  }
  uploading = { stop: false, modelId: null, held: null };
  uploadControls(true);
  try {
    uploadPhase(`Reading the header of ${file.name}`);
    const head = await ggufHead(file);
    if (head.refused) throw new Error(`${file.name} cannot be uploaded: ${head.refused}`);
    if (!head.gguf) throw new Error(`${file.name} is not a GGUF file: it does not start with "GGUF"`);
    const sha256 = await hashFile(file);
    const models = (await api("GET", "/api/v1/models")).models;
    const found = unfinished(models, sha256, file.size);
    let model;
    let index = 0;
    if (found) {
      ({ model, index } = found);
    } else {
      const name = $("upload-name").value.trim() || head.basename || file.name.replace(/\.gguf$/i, "");
      const manifest = { name, format: "gguf", files: [{ path: file.name, size: file.size, sha256 }] };
      const licence = $("upload-licence").value.trim();
      if (licence) manifest.licence = licence;
      model = await api("POST", "/api/v1/models", manifest);
    }
    uploading.modelId = model.id;
    await refreshNow();
    const state = model.state === "verified" ? "verified" : await sendFile(model, index, file);
    const done = state === "verified";
    uploadPhase(
      done ? `${model.name} is uploaded and verified` : `${model.name} is uploaded; the server is verifying it`,
      file.size,
      file.size,
      done && model.state === "verified" ? "Its content was stored already: nothing was sent." : `sha256 ${sha256}`,
    );
    status(done ? `Model ${model.name} is verified.` : `Model ${model.name} is uploaded.`);
    resumeFor = null;
    input.value = "";
  } catch (error) {
    if (error instanceof Stopped) {
      const held = uploading.held;
      uploadPhase(
        held === null
          ? "Stopped before anything was sent."
          : `Stopped: the server holds ${bytes(held)} of ${bytes(file.size)}. Upload again to continue from there.`,
        held || 0,
        file.size,
      );
    } else if (sessionEnded(error)) {
      stop();
      leave();
      return;
    } else {
      say("upload-error", `The upload failed: ${error.message}`);
    }
  } finally {
    uploading = null;
    uploadControls(false);
  }
  if (!stopped) await refreshNow();
}

// --- the hub ----------------------------------------------------------------------

function previewRow(item, index) {
  const metadata = item.metadata || {};
  const manifest = item.manifest || null;
  const licence = (manifest && manifest.licence) || metadata.licence || dash;
  const yesNo = (value) => (value === undefined || value === null ? dash : value ? "yes" : "no");
  const register = manifest
    ? el(
        "button",
        { type: "button", "data-preview": index, "aria-label": `Register and acquire ${item.filename}` },
        "Register and acquire",
      )
    : el("span", { class: "refusal" }, item.refusal ? `${item.refusal.code}: ${item.refusal.message}` : "cannot be registered");
  return el(
    "tr",
    { "data-filename": item.filename },
    el(
      "th",
      { scope: "row" },
      item.filename,
      item.parts ? el("div", { class: "muted small" }, `${item.parts.length} parts`) : null,
    ),
    el("td", { class: "size" }, item.size === undefined ? dash : bytes(item.size)),
    el("td", {}, metadata.architecture || dash),
    el("td", {}, count(metadata.parameter_count)),
    el("td", {}, metadata.context_length ? String(metadata.context_length) : dash),
    el("td", {}, metadata.quantisation || dash),
    el("td", {}, yesNo(metadata.chat_template)),
    el("td", {}, licence),
    el("td", { class: "register" }, register),
  );
}

async function preview(event) {
  event.preventDefault();
  say("hub-error", "");
  const repository = $("hub-repository").value.trim();
  if (!repository) {
    say("hub-error", "Give a repository (owner/name).");
    $("hub-repository").focus();
    return;
  }
  const body = { repository, revision: $("hub-revision").value.trim() || "main" };
  const filename = $("hub-filename").value.trim();
  if (filename) body.filename = filename;
  const button = $("hub-preview");
  button.disabled = true;
  button.textContent = "Previewing…";
  try {
    previews = (await api("POST", "/api/v1/models/hub-preview", body)).previews;
    fillRows($("previews"), previews.map(previewRow));
    $("previews-source").textContent = `${repository} at ${body.revision}: ${previews.length} GGUF model(s)`;
    $("previews-section").hidden = false;
    $("previews-title").scrollIntoView({ block: "nearest" });
  } catch (error) {
    if (sessionEnded(error)) {
      stop();
      leave();
      return;
    }
    say("hub-error", `The preview failed: ${error.message}`);
  } finally {
    button.disabled = false;
    button.textContent = "Preview";
  }
}

async function registerPreview(index, button) {
  const item = previews[index];
  const name = $("hub-name").value.trim();
  const manifest = name ? { ...item.manifest, name } : item.manifest;
  button.disabled = true;
  say("hub-error", "");
  try {
    let model = await api("POST", "/api/v1/models", manifest);
    if (model.state !== "verified") {
      model = await api("POST", `${modelPath(model.id)}/acquire`);
      status(`Registered ${model.name}; its acquisition from the hub has started.`);
    } else {
      status(`Registered ${model.name}: its content is stored already, verified.`);
    }
  } catch (error) {
    if (sessionEnded(error)) {
      stop();
      leave();
      return;
    }
    say("hub-error", `Could not register ${item.filename}: ${error.message}`);
  } finally {
    button.disabled = false;
  }
  await refreshNow();
}

// --- row actions and the delete dialog ----------------------------------------------

async function rowAction(event) {
  const button = event.target.closest("button[data-action]");
  if (!button) return;
  const model = listed.find((m) => m.id === button.dataset.modelId);
  if (!model) return;
  const name = button.dataset.action;
  problem("");
  if (name === "delete") {
    deleting = model;
    $("delete-title").textContent = `Delete model ${model.name}`;
    $("delete-what").textContent =
      `${model.name} (${model.id}, ${bytes(model.size || 0)}) is removed from this project. ` +
      "A service that uses it must be removed first.";
    $("delete-evict").checked = true;
    $("delete-dialog").showModal();
    // The focus starts on Cancel, as in the other dialogs: Enter never deletes by accident.
    $("delete-cancel").focus();
    return;
  }
  if (name === "resume-upload") {
    resumeFor = model.id;
    const [file] = uploadable(model);
    status(
      file.received_bytes
        ? `Choose ${button.dataset.path} again to continue ${model.name} from ${bytes(file.received_bytes)}, which the server holds.`
        : `Choose ${button.dataset.path} to upload ${model.name}.`,
    );
    $("upload-file").focus();
    return;
  }
  button.disabled = true;
  try {
    if (name === "acquire") {
      await api("POST", `${modelPath(model.id)}/acquire`);
      status(`The acquisition of ${model.name} has started.`);
    } else if (name === "pause") {
      await api("POST", `${modelPath(model.id)}/pause`);
      status(`The acquisition of ${model.name} is paused; its bytes are kept.`);
    }
    problem("");
  } catch (error) {
    if (sessionEnded(error)) {
      stop();
      leave();
      return;
    }
    problem(`Could not ${name} ${model.name}: ${error.message}`);
  }
  await refreshNow();
}

async function deleteClosed() {
  const dialog = $("delete-dialog");
  const model = deleting;
  deleting = null;
  if (dialog.returnValue !== "delete" || !model) {
    $("models-title").focus();
    return;
  }
  const evict = $("delete-evict").checked;
  problem("");
  try {
    const answer = await api("DELETE", `${modelPath(model.id)}?evict=${evict}`);
    const evicted = answer.evicted.length;
    status(
      evict
        ? `Deleted ${model.name}; ${evicted} stored file(s) evicted.`
        : `Deleted ${model.name}; its content stays stored.`,
    );
    problem("");
  } catch (error) {
    if (sessionEnded(error)) {
      stop();
      leave();
      return;
    }
    problem(`Could not delete ${model.name}: ${error.message}`);
  }
  $("models-title").focus();
  await refreshNow();
}

// --- the page ---------------------------------------------------------------------

function identity(who) {
  const user = who.user ? who.user.username : who.id;
  const project = who.project && who.project.name ? who.project.name : "personal";
  return `${user} · ${project}`;
}

async function logout() {
  stop();
  await current; // leave no request of this page unanswered
  try {
    await api("DELETE", "/api/v1/session");
  } catch {
    // Ended already (or the server is away): the cookie goes with the next login.
  }
  leave();
}

async function start() {
  try {
    principal = await api("GET", "/api/v1/whoami");
  } catch (error) {
    if (sessionEnded(error)) {
      leave();
      return;
    }
    problem(`Could not load the models page: ${error.message}`);
    return;
  }
  $("whoami").textContent = identity(principal);
  $("logout").addEventListener("click", logout);
  if (!has("models:read")) {
    $("models").closest(".table-wrap").hidden = true;
    say("refreshed", "");
    const note = document.querySelector('.note[data-for="models"]');
    note.textContent = "This session lacks the models:read scope that listing models needs.";
    note.hidden = false;
  }
  if (has("models:manage")) {
    $("upload-form").addEventListener("submit", upload);
    $("upload-stop").addEventListener("click", () => {
      if (uploading) uploading.stop = true;
      $("upload-stop").disabled = true;
    });
    $("hub-form").addEventListener("submit", preview);
    $("previews").addEventListener("click", (event) => {
      const button = event.target.closest("button[data-preview]");
      if (button) registerPreview(Number(button.dataset.preview), button);
    });
    $("models").addEventListener("click", rowAction);
    $("delete-dialog").addEventListener("close", deleteClosed);
  } else {
    for (const form of document.querySelectorAll(".model-forms .card")) form.hidden = true;
    status("This session lacks the models:manage scope that registering, uploading and deleting need.");
  }
  $("models-title").setAttribute("tabindex", "-1");
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden) schedule(0);
  });
  current = refresh();
  await current;
  schedule(REFRESH_MS);
}

start();

// The chat playground: a conversation with a service of the project (its own route,
// /api/v1/inference/{id}/v1/chat/completions) or with a name of the project endpoint
// (/v1/chat/completions, its `model`), streamed token by token over server-sent
// events with the browser session. Stop aborts the request: the connection closes and
// the gateway cancels the engine's request, freeing its slot. The conversation lives
// in the page only.

import { api, ApiError, leave, openSession, openStream, sessionEnded, sseEvents } from "./api.js";
import { el, number } from "./format.js";

const TARGET_KEY = "ficc.chat.target";

const form = document.getElementById("compose");
const message = document.getElementById("message");
const send = document.getElementById("send");
const stop = document.getElementById("stop");
const target = document.getElementById("target");
const conversation = document.getElementById("conversation");
const chatState = document.getElementById("chat-state");
const problem = document.getElementById("problem");

let principal = null;
const targets = new Map(); // option value -> {path, model, label, limits}
let history = []; // the messages sent so far, without the system prompt
let running = null; // {controller, done} while a reply streams: Stop aborts controller

const has = (scope) => principal.scopes.includes(scope);

function say(text) {
  chatState.textContent = text;
}

function showProblem(text) {
  problem.textContent = text || "";
  problem.hidden = !text;
}

function limitsText(model) {
  if (!model) return "";
  const parts = [];
  if (model.context_length) parts.push(`${model.context_length} tokens per request`);
  if (model.max_output) parts.push(`at most ${model.max_output} per answer`);
  return parts.length ? `${model.id}: ${parts.join(", ")}.` : "";
}

// The choices: the project's services (by alias, with their state), then every name
// the project endpoint routes (each service's alias and its other names).
async function loadTargets(keep = null) {
  const [services, models] = await Promise.allSettled([
    has("inference:read") ? api("GET", "/api/v1/inference") : Promise.resolve(null),
    api("GET", "/v1/models"),
  ]);
  for (const answer of [services, models]) {
    if (answer.status === "rejected") throw answer.reason;
  }
  const listed = models.value ? models.value.data : [];
  const byAlias = new Map(listed.map((m) => [m.id, m]));
  targets.clear();
  const groups = [];
  if (services.value) {
    const options = [...services.value.services]
      .sort((a, b) => a.alias.localeCompare(b.alias))
      .map((service) => {
        const value = `service:${service.id}`;
        targets.set(value, {
          path: `/api/v1/inference/${encodeURIComponent(service.id)}/v1/chat/completions`,
          model: null,
          label: service.alias,
          limits: byAlias.get(service.alias),
          ready: service.state === "ready" || service.state === "idle",
        });
        return el("option", { value }, `${service.alias} (${service.state})`);
      });
    if (options.length) groups.push(el("optgroup", { label: "Services" }, options));
  }
  const names = [];
  for (const model of listed) {
    for (const name of [model.id, ...(model.aliases || [])]) {
      const value = `model:${name}`;
      if (targets.has(value)) continue;
      targets.set(value, { path: "/v1/chat/completions", model: name, label: name, limits: model, ready: true });
      names.push(el("option", { value }, name === model.id ? `${name} (/v1)` : `${name} → ${model.id} (/v1)`));
    }
  }
  if (names.length) groups.push(el("optgroup", { label: "Project endpoint" }, names));
  target.replaceChildren(...groups);
  const remembered = keep || localStorage.getItem(TARGET_KEY);
  const first = [...targets.entries()].find(([, t]) => t.ready);
  if (remembered && targets.has(remembered)) target.value = remembered;
  else if (first) target.value = first[0];
  describeTarget();
  return targets.size;
}

function describeTarget() {
  const chosen = targets.get(target.value);
  document.getElementById("max-tokens-help").textContent = chosen ? limitsText(chosen.limits) : "";
}

function bubble(role, text) {
  const who = role === "user" ? "You" : "Assistant";
  const item = el(
    "li",
    { class: `turn ${role}`, "data-role": role },
    el("div", { class: "who" }, who),
    el("div", { class: "content" }, text),
    el("div", { class: "meta muted small" }),
  );
  conversation.append(item);
  document.getElementById("empty").hidden = true;
  return item;
}

function settings() {
  const temperature = document.getElementById("temperature");
  const maxTokens = document.getElementById("max-tokens");
  for (const input of [temperature, maxTokens]) {
    if (!input.checkValidity()) {
      input.focus();
      throw new Error(`${input.labels[0].textContent}: ${input.validationMessage}`);
    }
  }
  // Usage is relayed only when asked for, as OpenAI does: the reply's token count needs it.
  const body = { stream: true, stream_options: { include_usage: true } };
  if (temperature.value !== "") body.temperature = Number(temperature.value);
  if (maxTokens.value !== "") body.max_tokens = Number(maxTokens.value);
  return body;
}

function statsText(reply) {
  const parts = [];
  if (reply.served) parts.push(`answered by ${reply.served}`);
  if (reply.ttft !== null) parts.push(`first token after ${number(reply.ttft / 1000, 2)} s`);
  const tokens = reply.usage ? reply.usage.completion_tokens : reply.chunks;
  const span = (reply.ended - (reply.firstAt ?? reply.ended)) / 1000;
  if (tokens && span > 0) parts.push(`${number(tokens / span, 1)} tokens/s`);
  if (tokens) parts.push(`${tokens} tokens${reply.usage ? "" : " (counted from chunks)"}`);
  return parts.join(" · ");
}

function explain(error) {
  if (error instanceof ApiError) return `${error.message} (${error.code})`;
  return `The answer broke off: ${error.message}`;
}

async function converse(text, controller) {
  const chosen = targets.get(target.value);
  const body = settings();
  if (!chosen) throw new Error("Choose a model first.");
  const system = document.getElementById("system").value.trim();
  const turn = { role: "user", content: text };
  const sent = [...(system ? [{ role: "system", content: system }] : []), ...history, turn];
  body.messages = sent;
  if (chosen.model) body.model = chosen.model;
  history.push(turn);
  const asked = bubble("user", text);
  const item = bubble("assistant", "");
  const content = item.querySelector(".content");
  const meta = item.querySelector(".meta");
  const reply = { served: null, ttft: null, firstAt: null, ended: null, chunks: 0, usage: null };
  const started = performance.now();
  const setState = (state) => {
    if (item.dataset.state === state) return;
    item.dataset.state = state;
    item.dataset.seen = `${item.dataset.seen || ""} ${state}`.trim();
  };
  setState("waiting");
  item.dataset.chunks = "0";
  say(`Asking ${chosen.label}…`);
  let outcome = "done";
  let failure = null;
  try {
    const response = await openStream(chosen.path, body, controller.signal);
    reply.served = response.headers.get("x-ficc-service");
    for await (const event of sseEvents(response)) {
      if (event.comment !== undefined) {
        // An idle on-demand service loads first: the gateway keeps the stream open with
        // comments until the engine answers.
        if (reply.firstAt === null) {
          setState("loading");
          say(`Waiting for ${chosen.label} to load…`);
        }
        continue;
      }
      if (event.data === "[DONE]") continue; // the server closes the stream next
      const chunk = JSON.parse(event.data);
      if (chunk.error) throw new ApiError(200, chunk);
      if (chunk.usage) reply.usage = chunk.usage;
      const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
      if (delta && delta.content) {
        if (reply.firstAt === null) {
          reply.firstAt = performance.now();
          reply.ttft = reply.firstAt - started;
          setState("streaming");
          say(`${chosen.label} is answering…`);
        }
        reply.chunks += 1;
        item.dataset.chunks = String(reply.chunks);
        content.append(delta.content);
      }
    }
  } catch (error) {
    if (error.name === "AbortError") outcome = "stopped";
    else {
      outcome = "failed";
      failure = error;
    }
  }
  reply.ended = performance.now();
  const answer = content.textContent;
  if (answer) history.push({ role: "assistant", content: answer });
  else if (outcome !== "done") {
    // Nothing came back: the question was not answered, so it leaves the history and
    // goes back into the message box to be sent again.
    history = history.filter((m) => m !== turn);
    asked.classList.add("unanswered");
    if (!message.value) message.value = text;
  }
  if (failure) {
    if (sessionEnded(failure)) {
      leave();
      return;
    }
    item.append(el("p", { class: "problem", role: "alert" }, explain(failure)));
  }
  const stats = statsText(reply);
  meta.textContent = [outcome === "stopped" ? "stopped" : null, stats].filter(Boolean).join(" · ");
  document.getElementById("stats").textContent = stats ? `Last answer: ${stats}` : "";
  // The services' states may have changed (an idle one woke up): list them afresh,
  // keeping the choice, before the turn is settled.
  try {
    await loadTargets(target.value);
  } catch (error) {
    if (sessionEnded(error)) {
      leave();
      return;
    }
  }
  setState(outcome);
  say(outcome === "failed" ? "The last request failed." : outcome === "stopped" ? "Stopped." : "Ready.");
}

async function onSubmit(event) {
  event.preventDefault();
  if (running) return;
  const text = message.value.trim();
  if (!text) {
    message.focus();
    return;
  }
  showProblem("");
  const controller = new AbortController();
  send.disabled = true;
  stop.disabled = false;
  message.value = "";
  const done = converse(text, controller);
  running = { controller, done };
  try {
    await done;
  } catch (error) {
    message.value = message.value || text;
    showProblem(error.message);
  } finally {
    running = null;
    send.disabled = false;
    stop.disabled = true;
    message.focus();
  }
}

function onStop() {
  if (running) running.controller.abort();
}

// Logging out first stops the answer in flight.
async function settled() {
  if (running) {
    running.controller.abort();
    await running.done.catch(() => {});
  }
}

async function start() {
  try {
    principal = await openSession(settled);
  } catch (error) {
    showProblem(`Could not load the playground: ${error.message}`);
    return;
  }
  if (principal === null) return; // the session had ended: back to the login form
  if (!has("inference:invoke")) {
    say("This session lacks the inference:invoke scope that chatting needs.");
    send.disabled = true;
    return;
  }
  try {
    const count = await loadTargets();
    if (!count) {
      say("No service of this project can answer: start one first.");
      send.disabled = true;
      return;
    }
  } catch (error) {
    if (sessionEnded(error)) {
      leave();
      return;
    }
    showProblem(`Could not list the models: ${error.message}`);
    return;
  }
  target.addEventListener("change", () => {
    localStorage.setItem(TARGET_KEY, target.value);
    describeTarget();
  });
  form.addEventListener("submit", onSubmit);
  stop.addEventListener("click", onStop);
  message.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      form.requestSubmit();
    }
  });
  document.addEventListener("keydown", (event) => {
    if (event.key === "Escape" && running) onStop();
  });
  document.getElementById("clear").addEventListener("click", () => {
    if (running) return;
    history = [];
    conversation.replaceChildren();
    document.getElementById("empty").hidden = false;
    document.getElementById("stats").textContent = "";
  });
  say("Ready.");
  document.body.dataset.ready = "true";
}

start();

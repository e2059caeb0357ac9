// The service page's rollout form: what operators change in a rollout (the engine
// context, the concurrency, the replicas, their CPU and memory limits, and the
// strategy), built on the serving specification; Preview sends it to POST
// .../rollout/preview and shows what the server answers (the verdict and the strategy
// it would take, what would change, with the limits it suggested or recomputed, its
// warnings, the plans); Roll out (only after a preview that allows it, with the form
// unchanged since) sends the previewed, completed specification with the revision read
// afresh. Refusals are shown at the field their path names, else under the form. An
// "Advanced" section edits the specification as JSON instead.

import { api, ApiError, leave, sessionEnded } from "./api.js";
import { bytes, el } from "./format.js";
import { reservationText } from "./tables.js";

const MIB = 1024 * 1024;
const MAX_REPLICAS = 64;
const dash = "–";
const $ = (id) => document.getElementById(id);

//: A refusal's path (without indexes) → the field it is about.
const FIELDS = {
  context: "rollout-context",
  concurrency: "rollout-concurrency",
  placements: "rollout-replicas",
  "placements.node_id": "rollout-replicas",
  "placements.limits": "rollout-memory",
  "placements.limits.cpus": "rollout-cpus",
  "placements.limits.memory_bytes": "rollout-memory",
  strategy: "rollout-strategy",
};

//: The strategies a rollout may ask for (the select's options), in words.
const STRATEGY_WORDS = {
  surge: "beside the serving generation",
  rolling: "in place, one replica at a time",
  recreate: "in place, every replica at once",
  scale_down: "a scale-down, applied at once",
};

function fieldFor(path) {
  const bare = String(path || "").replace(/^\$\.?/, "").replace(/\[\d+\]/g, "");
  if (FIELDS[bare]) return FIELDS[bare];
  if (bare.startsWith("placements.limits")) return FIELDS["placements.limits"];
  if (bare.startsWith("placements")) return FIELDS.placements;
  return null;
}

const mib = (size) => (typeof size === "number" ? String(Number((size / MIB).toFixed(3))) : "");

// `options`: base (the service's API path), view() (the service as last read), act
// and confirmed (service.js's: an action with the revision read afresh, and the
// confirmation dialog). Answers { shown(spec), update(), disable() }.
export function rolloutForm({ base, view, act, confirmed }) {
  let source = null; // the specification the form builds on
  let filled = {}; // the fields' texts as filled from `source`
  let touched = false; // edited since filled: a new generation read does not overwrite it
  let rolledOut = false; // a rollout was started: its note goes once its specification serves
  let previewed = null; // { key, spec, strategy } of the last preview that allows a rollout

  const advanced = () => $("rollout-advanced").open;
  const inputs = ["context", "concurrency", "replicas", "cpus", "memory"];

  function fill(spec) {
    source = structuredClone(spec);
    const first = (spec.placements || [])[0] || {};
    const limits = first.limits || {};
    filled = {
      context: spec.context === undefined ? "" : String(spec.context),
      concurrency: spec.concurrency === undefined ? "" : String(spec.concurrency),
      replicas: String((spec.placements || []).length),
      cpus: limits.cpus === undefined ? "" : String(limits.cpus),
      memory: mib(limits.memory_bytes),
    };
    for (const name of inputs) $(`rollout-${name}`).value = filled[name];
    $("rollout-spec").value = JSON.stringify(spec, null, 2);
  }

  function clearErrors() {
    for (const error of document.querySelectorAll("#rollout-form .field-error")) {
      error.textContent = "";
      error.hidden = true;
    }
    for (const input of document.querySelectorAll("#rollout-form [aria-invalid]")) input.removeAttribute("aria-invalid");
    $("rollout-problem").hidden = true;
  }

  function fieldError(id, text) {
    const error = $(`${id}-error`);
    error.textContent = error.textContent ? `${error.textContent} ${text}` : text;
    error.hidden = false;
    $(id).setAttribute("aria-invalid", "true");
  }

  function problem(text) {
    $("rollout-problem").textContent = text;
    $("rollout-problem").hidden = false;
  }

  // The next specification as the form says it; throws a field error's {field, text}
  // for what cannot be sent at all.
  function built() {
    if (!advanced()) return fromFields();
    try {
      return JSON.parse($("rollout-spec").value);
    } catch (error) {
      throw { text: `The specification is not JSON: ${error.message}` };
    }
  }

  function fromFields() {
    const text = Object.fromEntries(inputs.map((name) => [name, $(`rollout-${name}`).value.trim()]));
    const spec = structuredClone(source);
    // Each field sent as typed (the server says what is wrong with it); left empty, it is
    // left out, and the server says it is needed or suggests it.
    for (const name of ["context", "concurrency"]) {
      if (text[name] === "") delete spec[name];
      else spec[name] = Number(text[name]);
    }
    const count = Number(text.replicas);
    if (!Number.isInteger(count) || count < 1 || count > MAX_REPLICAS) {
      throw { field: "rollout-replicas", text: `Give a whole number from 1 to ${MAX_REPLICAS}.` };
    }
    const placements = (spec.placements || []).slice(0, count);
    while (placements.length < count) placements.push(structuredClone(placements[placements.length - 1] || {}));
    for (const placement of placements) {
      const limits = { ...(placement.limits || {}) };
      // Unchanged fields keep each replica's own limits as they were.
      if (text.cpus !== filled.cpus) {
        if (text.cpus === "") delete limits.cpus;
        else limits.cpus = Number(text.cpus);
      }
      if (text.memory !== filled.memory) {
        if (text.memory === "") delete limits.memory_bytes;
        else limits.memory_bytes = Math.round(Number(text.memory) * MIB);
      }
      placement.limits = limits;
    }
    spec.placements = placements;
    return spec;
  }

  // The strategy asked for; "auto" (the server's choice) is not sent.
  function strategy() {
    const field = $("rollout-strategy-field");
    const value = field.hidden ? "auto" : $("rollout-strategy").value;
    return value === "auto" ? null : value;
  }

  // What the preview and the rollout send beside the specification.
  function options() {
    const sent = {};
    if (strategy()) sent.strategy = strategy();
    if ($("rollout-keep-limits").checked) sent.keep_limits = true;
    return sent;
  }

  function key(spec) {
    return JSON.stringify([spec, options()]);
  }

  function update() {
    const current = view();
    let allowed = false;
    if (previewed && current && current.desired === "running") {
      try {
        allowed = key(built()) === previewed.key;
      } catch {
        allowed = false;
      }
    }
    $("rollout-start").disabled = !allowed;
  }

  function refused(error) {
    const errors = (error.details && error.details.errors) || [];
    const unplaced = [];
    for (const entry of errors) {
      const field = advanced() ? null : fieldFor(entry.path);
      if (field && !$(field).closest("[hidden]")) fieldError(field, entry.message);
      else unplaced.push(`${entry.path}: ${entry.message}`);
    }
    if (errors.length && !unplaced.length) {
      problem(`The server refused it: ${error.message.replace(/\.$/, "")} (see the field${errors.length > 1 ? "s" : ""} above).`);
      return;
    }
    // The message names the first error already: add only the ones it does not.
    const more = unplaced.filter((e) => !error.message.includes(e));
    problem(more.length ? `${error.message} ${more.join("; ")}` : error.message);
  }

  // What the next generation changes, in words: each field the form has, each replica's
  // placement, saying which limits the server suggested or recomputed.
  function changes(before, after, answer) {
    const items = [];
    const suggested = new Set(answer.suggested || []);
    const recomputed = new Map((answer.adjusted_limits || []).map((a) => [a.path, a]));
    for (const [name, label, unit] of [["context", "Engine context", " tokens"], ["concurrency", "Concurrency", " requests per replica"]]) {
      if (before[name] !== after[name]) items.push(`${label}: ${before[name] ?? dash}${unit} → ${after[name] ?? dash}${unit}`);
    }
    const was = before.placements || [];
    const next = after.placements || [];
    if (was.length !== next.length) items.push(`Replicas: ${was.length} → ${next.length}`);
    next.forEach((p, i) => {
      const old = was[i];
      const now = `on ${p.node_id}: ${reservationText(p.limits)}`;
      const where = `$.placements[${i}]`;
      let why = "";
      if ([...suggested].some((x) => x === where || x.startsWith(`${where}.`))) why = " (limits suggested by the server)";
      const memory = recomputed.get(`${where}.limits.memory_bytes`);
      if (memory) why = ` (memory recomputed: the model needs about ${bytes(memory.estimate_bytes)} at this context and concurrency)`;
      if (!old) items.push(`Replica ${i} (new): ${now}${why}`);
      else if (JSON.stringify(old) !== JSON.stringify(p)) items.push(`Replica ${i}: on ${old.node_id}: ${reservationText(old.limits)} → ${now}${why}`);
    });
    was.slice(next.length).forEach((p, i) => items.push(`Replica ${next.length + i} on ${p.node_id}: removed`));
    return items;
  }

  // The verdict: whether it can be rolled out, and how: `how`, the server's words for
  // the strategy it would take (when it says one).
  function verdictOf(answer) {
    const beside = answer.beside_serving;
    const choice = answer.strategy && typeof answer.strategy === "object" ? answer.strategy : null;
    const how = choice && choice.message ? `${choice.message[0].toUpperCase()}${choice.message.slice(1)}.` : null;
    const chosen = choice ? choice.chosen : beside.fits ? "surge" : null;
    if (chosen === "surge") return { allows: true, how, text: "The next generation fits beside the serving one: it can be rolled out." };
    if (chosen === "scale_down") return { allows: true, how, text: "A scale-down: it needs no room and is applied at once." };
    if (chosen) {
      const down = choice.downtime ? " The service is down meanwhile." : "";
      return { allows: true, how, text: `The next generation can be rolled out ${STRATEGY_WORDS[chosen] || chosen}.${down}` };
    }
    const inPlace = choice ? (choice.possible || []).filter((w) => w === "rolling" || w === "recreate") : [];
    if (inPlace.length) {
      const ways = inPlace.map((w) => `"${STRATEGY_WORDS[w]}"`).join(" or ");
      return { allows: false, how, text: `The next generation does not fit beside the serving one: choose the strategy ${ways} to roll it out in its place, with less capacity meanwhile.` };
    }
    if (!choice && answer.fits) return { allows: false, how, text: "The next generation would fit alone, but not beside the serving one: a rollout is refused (stop, then replace, or free room first)." };
    return { allows: false, how, text: "The next generation does not fit." };
  }

  function planTable(caption, plan) {
    const rows = plan.replicas.map((r) =>
      el(
        "tr",
        { "data-replica": r.index, class: r.fits ? "fits" : "refused" },
        el("th", { scope: "row" }, String(r.index)),
        el("td", { "data-label": "Node" }, r.node_id),
        el("td", { "data-label": "Reservation" }, reservationText(r.reservation)),
        el("td", { class: "fit", "data-label": "Fits" }, r.fits ? "fits" : "does not fit"),
        el("td", { class: "reasons", "data-label": "Reasons" }, r.reasons.length ? el("ul", { class: "plain" }, r.reasons.map((x) => el("li", {}, el("code", {}, x.code), ` ${x.message}`))) : dash),
      ),
    );
    return el(
      "div",
      { class: "table-wrap plan" },
      el(
        "table",
        {},
        el("caption", {}, caption),
        el("thead", {}, el("tr", {}, ["Replica", "Node", "Reservation", "Fits", "Reasons"].map((h) => el("th", { scope: "col" }, h)))),
        el("tbody", {}, rows),
      ),
    );
  }

  function warningLine(w) {
    if (typeof w === "string") return el("p", { class: "notice" }, w);
    return el("p", { class: "notice", "data-code": w.code || "" }, w.code ? el("code", {}, w.code) : null, w.code ? " " : "", w.message || JSON.stringify(w));
  }

  async function preview(event) {
    event.preventDefault();
    const out = $("rollout-result");
    clearErrors();
    previewed = null;
    update();
    let spec;
    try {
      spec = built();
    } catch (error) {
      if (error.field) fieldError(error.field, error.text);
      else problem(error.text);
      out.replaceChildren();
      return;
    }
    const sent = key(spec);
    const asked = options();
    out.replaceChildren(el("p", { class: "note" }, "Planning…"));
    try {
      const answer = await api("POST", `${base}/rollout/preview`, { spec, ...asked });
      const { allows, text, how } = verdictOf(answer);
      const listed = changes(view().spec, answer.spec, answer);
      const chosen = answer.strategy && answer.strategy.chosen;
      const inPlace = chosen === "rolling" || chosen === "recreate";
      out.replaceChildren(
        el("p", { id: "rollout-verdict", class: allows ? "verdict fits" : "verdict refused" }, text),
        how ? el("p", { id: "rollout-how", class: "note" }, how) : null,
        el("h3", { class: "result-heading" }, "What changes"),
        listed.length
          ? el("ul", { id: "rollout-changes", class: "changes" }, listed.map((t) => el("li", {}, t)))
          : el("p", { id: "rollout-changes", class: "note" }, "Nothing: the next generation would run as the serving one does."),
        ...(answer.warnings || []).map(warningLine),
        inPlace ? null : planTable("Beside the serving generation (while both run)", answer.beside_serving),
        planTable(inPlace ? "In place of the serving generation (after the cut-over)" : "Serving alone (after the cut-over)", answer),
        el("p", { class: "muted small" }, `Plan ${answer.beside_serving.plan_digest}`),
      );
      if (allows) previewed = { key: sent, spec: answer.spec, options: asked, how: chosen };
      update();
    } catch (error) {
      if (sessionEnded(error)) return leave();
      out.replaceChildren();
      refused(error);
    }
  }

  async function rollOut() {
    if (!previewed) return;
    const current = view();
    const { spec, options: asked, how } = previewed;
    const count = (spec.placements || []).length;
    let text = `Roll ${current.alias} out to this specification? Its next generation starts beside the serving one and takes the traffic once every replica is ready.`;
    if (how === "scale_down") text = `Scale ${current.alias} down to ${count} replica(s)? The replicas past ${count} drain and stop.`;
    else if (how && how !== "surge") text = `Roll ${current.alias} out to this specification, ${STRATEGY_WORDS[how] || how}? It serves with fewer replicas meanwhile.`;
    if (!(await confirmed(`Roll out ${current.alias}`, text, "Roll out"))) return;
    clearErrors();
    await act("Rollout", (revision) => api("POST", `${base}/rollout`, { revision, spec, ...asked }), {
      busy: "Starting the rollout…",
      done: (answer) => (answer.rollout ? `Rollout to generation ${answer.rollout.generation} started.` : `${current.alias} changed: ${answer.strategy && answer.strategy.message ? answer.strategy.message : "applied"}.`),
      after: () => {
        previewed = null;
        touched = false;
        rolledOut = true;
        $("rollout-result").replaceChildren(el("p", { class: "note" }, "Rolling out: the form shows the new specification once it serves."));
      },
      // A refusal is shown in the form (a stale revision stays at the actions, with its reload).
      failed: (error) => {
        if (!(error instanceof ApiError) || error.code === "stale_revision") return false;
        refused(error);
        return true;
      },
    });
    update();
  }

  function reset() {
    const current = view();
    if (!current) return;
    touched = false;
    previewed = null;
    fill(current.spec);
    clearErrors();
    $("rollout-result").replaceChildren();
    update();
  }

  function edited(event) {
    touched = true;
    if (event.target.id && event.target.getAttribute("aria-invalid") === "true") {
      event.target.removeAttribute("aria-invalid");
      const error = $(`${event.target.id}-error`);
      if (error) error.hidden = true;
    }
    update();
  }

  $("rollout-form").addEventListener("submit", preview);
  $("rollout-form").addEventListener("input", edited);
  $("rollout-form").addEventListener("change", edited);
  $("rollout-reset").addEventListener("click", reset);
  $("rollout-start").addEventListener("click", rollOut);
  $("rollout-advanced").addEventListener("toggle", () => {
    clearErrors();
    if (advanced()) {
      // Opened: the JSON says what the fields would send.
      try {
        $("rollout-spec").value = JSON.stringify(fromFields(), null, 2);
      } catch {
        // a field cannot be sent: the JSON keeps what it had
      }
    } else {
      // Closed: the fields say what the JSON does (what they do not show is kept).
      try {
        const spec = JSON.parse($("rollout-spec").value);
        if (spec && typeof spec === "object") fill(spec);
      } catch (error) {
        problem(`The JSON was not applied to the fields: ${error.message}`);
      }
    }
    update();
  });
  $("rollout-fields").disabled = false;

  return {
    // The serving specification read (again): filled in unless the operator edited it.
    shown(spec) {
      if (touched && source !== null) return;
      if (rolledOut) {
        rolledOut = false;
        $("rollout-result").replaceChildren();
      }
      fill(spec);
      update();
    },
    update,
    disable() {
      for (const control of document.querySelectorAll("#rollout-form button, #rollout-form input, #rollout-form select, #rollout-form textarea")) control.disabled = true;
    },
  };
}

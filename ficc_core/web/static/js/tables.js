// The dashboard's tables, one function per table: rows built from the API's views.

import { ago, badge, bytes, el, number, stamp } from "./format.js";

const dash = "–";

function sum(items, pick) {
  return items.reduce((total, item) => total + (pick(item) || 0), 0);
}

function gpuCell(resources, reservations) {
  const gpus = (resources && resources.gpus) || [];
  if (gpus.length === 0) return el("td", {}, "none");
  const reserved = new Map();
  for (const reservation of reservations) {
    for (const share of reservation.gpus || []) {
      reserved.set(share.index, (reserved.get(share.index) || 0) + share.memory_bytes);
    }
  }
  const items = gpus.map((gpu) => {
    const held = reserved.get(gpu.index) || 0;
    return el(
      "li",
      { "data-gpu": gpu.index },
      `GPU ${gpu.index} ${gpu.name}: ${bytes(held)} reserved, `,
      el("strong", {}, `${bytes(Math.max(0, gpu.memory_bytes - held))} free`),
      ` of ${bytes(gpu.memory_bytes)}`,
    );
  });
  return el("td", {}, el("ul", { class: "plain" }, items));
}

function chips(labels, muted = false) {
  return Object.entries(labels || {}).map(([key, value]) =>
    el("span", { class: muted ? "chip muted" : "chip" }, `${key}=${value}`),
  );
}

export function nodeRow(node) {
  const snapshot = node.snapshot || {};
  const resources = snapshot.resources || null;
  const reservations = node.reservations || [];
  const cpus = sum(reservations, (r) => r.cpus);
  const memory = sum(reservations, (r) => r.memory_bytes);
  const runtimes = (snapshot.runtimes || []).map((r) =>
    el("span", { class: "chip" }, `${r.name} (${r.executor_provider})`),
  );
  return el(
    "tr",
    { "data-node-id": node.id },
    el("th", { scope: "row" }, node.name || node.id),
    el("td", { class: "state" }, badge(node.state)),
    el("td", {}, resources ? `${number(cpus)} of ${number(resources.cpus)}` : dash),
    el("td", {}, resources ? `${bytes(memory)} of ${bytes(resources.memory_bytes)}` : dash),
    gpuCell(resources, reservations),
    el("td", { class: "chips" }, chips(node.labels), chips(snapshot.labels, true)),
    el("td", { class: "chips" }, runtimes.length ? runtimes : dash),
    el("td", { title: node.last_heartbeat ? stamp(node.last_heartbeat) : null }, ago(node.last_heartbeat)),
  );
}

function replicaSummary(replicas) {
  const counts = new Map();
  for (const replica of replicas) counts.set(replica.state, (counts.get(replica.state) || 0) + 1);
  const parts = [...counts.entries()].map(([state, count]) => `${count} ${state}`);
  return `${parts.join(" · ") || "none"} (of ${replicas.length})`;
}

function scalingCell(scaling) {
  if (!scaling) return el("td", {}, dash);
  const parts = [`${scaling.running} running, min ${scaling.min}, max ${scaling.max}`];
  if (scaling.idle_timeout) parts.push(`idle after ${scaling.idle_timeout} s`);
  return el(
    "td",
    { class: "scaling" },
    parts.join("; "),
    scaling.pinned ? [" ", el("span", { class: "chip" }, "pinned")] : null,
  );
}

// The states a service settles in for what was desired: any other pair is on its way.
const SETTLED = {
  running: ["ready", "idle"],
  stopped: ["stopped"],
  draining: ["draining"],
  removed: ["removing"],
};

function settled(service) {
  return (SETTLED[service.desired] || []).includes(service.state);
}

export function serviceRow(service, modelNames) {
  return el(
    "tr",
    { "data-service-id": service.id, "data-alias": service.alias },
    el("th", { scope: "row" }, service.alias, el("div", { class: "muted small" }, service.id)),
    el(
      "td",
      { class: "state" },
      badge(service.state),
      settled(service) ? null : el("div", { class: "muted small" }, `desired: ${service.desired}`),
      service.reason ? el("div", { class: "reason small" }, service.reason) : null,
    ),
    el("td", { class: "replicas" }, replicaSummary(service.replicas || [])),
    scalingCell(service.scaling),
    el("td", {}, modelNames.get(service.model_id) || service.model_id),
    el("td", {}, `revision ${service.revision}, generation ${service.generation}`),
  );
}

export function modelRow(model) {
  const size = model.size || 0;
  const verified = model.verified_bytes || 0;
  const received = model.received_bytes || 0;
  const percent = size ? Math.floor((100 * verified) / size) : 100;
  const acquisition = model.acquisition && model.acquisition.state;
  return el(
    "tr",
    { "data-model-id": model.id },
    el("th", { scope: "row" }, model.name, el("div", { class: "muted small" }, model.id)),
    el("td", { class: "state" }, badge(model.state), acquisition ? el("div", { class: "muted small" }, `acquisition: ${acquisition}`) : null),
    el("td", {}, model.format),
    el("td", {}, bytes(size)),
    el(
      "td",
      { class: "progress" },
      el("progress", { max: size || 1, value: size ? verified : 1, "aria-label": `${model.name}: verified` }),
      ` ${percent}% verified`,
      received > verified ? el("div", { class: "muted small" }, `${bytes(received)} received`) : null,
    ),
  );
}

export function eventRow(event, aliases) {
  return el(
    "tr",
    { "data-event-id": event.id },
    el("td", { title: stamp(event.at) }, ago(event.at)),
    el("td", {}, aliases.get(event.service_id) || event.service_id || dash),
    el("td", {}, el("code", {}, event.kind)),
    el("td", {}, event.message),
  );
}

// The service page's address: /ui/services/<id>.
export function serviceHref(service) {
  return `/ui/services/${encodeURIComponent(service.id)}`;
}

// A service row (serviceRow) whose name links to the service's page.
export function serviceLink(row, service) {
  const name = row.cells[0].firstChild;
  name.replaceWith(el("a", { href: serviceHref(service), class: "service-link" }, service.alias));
  return row;
}

// The services table's last hour of requests (a group of GET /api/v1/usage grouped by
// service, or undefined when it had none): requests/s with the count, errors with
// their codes, the time to first token's p50 and p99.
export function serviceUsageCells(group, seconds = 3600) {
  const requests = group ? group.requests : 0;
  const errors = group ? group.errors : 0;
  const ttfb = group && group.latency && group.latency.ttfb;
  const codes = group
    ? Object.entries(group.errors_by_code || {}).map(([code, count]) => `${code} ${count}`)
    : [];
  const ms = (value) => (value === null || value === undefined ? dash : `${Math.round(value * 1000)} ms`);
  return [
    el(
      "td",
      { class: "requests" },
      `${requests ? String(Number((requests / seconds).toPrecision(2))) : "0"}/s`,
      el("div", { class: "muted small" }, `${requests} request${requests === 1 ? "" : "s"}`),
    ),
    el("td", { class: "errors" }, String(errors), codes.length ? el("div", { class: "muted small" }, codes.join(", ")) : null),
    el("td", { class: "ttft" }, ttfb && ttfb.p50 !== null ? `${ms(ttfb.p50)} / ${ms(ttfb.p99)}` : dash),
  ];
}

// Put `rows` in `table`'s body, each cell named after its column (the phone-width
// layout shows the name beside the value, console.css), as the dashboard's tables.
export function fillRows(table, rows) {
  const columns = [...table.tHead.rows[0].cells].map((cell) => cell.textContent);
  for (const row of rows) {
    [...row.cells].forEach((cell, index) => {
      if (cell.tagName !== "TD" || cell.hasAttribute("data-label")) return;
      cell.setAttribute("data-label", columns[index]);
      const value = document.createElement("div");
      value.className = "value";
      value.append(...cell.childNodes);
      cell.append(value);
    });
  }
  table.tBodies[0].replaceChildren(...rows);
}

// A reservation (or a placement's limits) as a line: CPUs, memory, each GPU's memory.
export function reservationText(reservation) {
  if (!reservation) return dash;
  const parts = [`${number(reservation.cpus)} CPU`, bytes(reservation.memory_bytes)];
  for (const gpu of reservation.gpus || []) parts.push(`GPU ${gpu.index}: ${bytes(gpu.memory_bytes)}`);
  return parts.join(", ");
}

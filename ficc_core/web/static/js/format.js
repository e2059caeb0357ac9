// Formatting and DOM helpers shared by the console's pages. Every value from the API
// goes into the page as text (textContent), never as HTML.

const UNITS = ["B", "KiB", "MiB", "GiB", "TiB"];

export function bytes(value) {
  if (value === null || value === undefined) return "–";
  let n = Number(value);
  let unit = 0;
  while (Math.abs(n) >= 1024 && unit < UNITS.length - 1) {
    n /= 1024;
    unit += 1;
  }
  const shown = unit === 0 ? String(n) : n.toFixed(n < 10 ? 1 : 0).replace(/\.0$/, "");
  return `${shown} ${UNITS[unit]}`;
}

// `value` with at most `digits` decimals, the trailing zeros after the point dropped
// (12.50 → "12.5", 3.00 → "3"); a whole number keeps its own (10 → "10", 0 → "0").
export function number(value, digits = 2) {
  return Number(value)
    .toFixed(digits)
    .replace(/(\.\d*?)0+$/, "$1")
    .replace(/\.$/, "");
}

export function ago(seconds) {
  if (seconds === null || seconds === undefined) return "never";
  const age = Math.max(0, Date.now() / 1000 - seconds);
  if (age < 60) return `${Math.round(age)} s ago`;
  if (age < 3600) return `${Math.round(age / 60)} min ago`;
  if (age < 86400) return `${Math.round(age / 3600)} h ago`;
  return `${Math.round(age / 86400)} d ago`;
}

export function clock(seconds) {
  return new Date(seconds * 1000).toLocaleTimeString([], { hour12: false });
}

export function stamp(seconds) {
  return new Date(seconds * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC";
}

// el("td", {class: "x", title: "y"}, child, "text", ...): an element with attributes
// and children (strings become text nodes; null and false are skipped).
export function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value === null || value === undefined || value === false) continue;
    node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// A state as a badge; its class colours it (console.css), its text says it.
export function badge(state) {
  return el("span", { class: `badge state-${String(state).replace(/[^a-z_]/g, "")}` }, state);
}

// A time to come, said from now ("in 3 h"); a past one is "expired" (`past`).
export function fromNow(seconds, past = "expired") {
  if (seconds === null || seconds === undefined) return "never";
  const left = seconds - Date.now() / 1000;
  if (left <= 0) return past;
  if (left < 60) return `in ${Math.round(left)} s`;
  if (left < 3600) return `in ${Math.round(left / 60)} min`;
  if (left < 86400) return `in ${Math.round(left / 3600)} h`;
  return `in ${Math.round(left / 86400)} d`;
}

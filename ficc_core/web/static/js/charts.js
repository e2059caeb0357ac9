// Small time-series charts drawn as SVG by this module (no library): one line per
// series over evenly spaced buckets, a y axis from 0 to a rounded maximum, and the
// values in each point's <title> and in the chart's accessible name. Colours come
// from console classes (service.css), never from inline style (the CSP forbids it).

import { clock, number } from "./format.js";

const SVG = "http://www.w3.org/2000/svg";
const WIDTH = 360;
const HEIGHT = 150;
const PAD = { left: 40, right: 8, top: 10, bottom: 22 };

function svg(tag, attributes = {}, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, String(value));
  for (const child of children) node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return node;
}

// 1, 2, 5 × 10^k at least `value` (and at least `floor`).
function ceiling(value, floor) {
  const top = Math.max(value, floor);
  const power = 10 ** Math.floor(Math.log10(top));
  for (const step of [1, 2, 5, 10]) if (step * power >= top) return step * power;
  return 10 * power;
}

// Draws into `container`: `times` (bucket starts, epoch seconds), `series`
// ([{name, values (numbers or null), class}]); `format` writes a value.
export function lineChart(container, { title, times, series, format = (v) => number(v), floor = 1 }) {
  const values = series.flatMap((s) => s.values).filter((v) => v !== null && v !== undefined);
  const top = ceiling(values.length ? Math.max(...values) : 0, floor);
  const inner = { w: WIDTH - PAD.left - PAD.right, h: HEIGHT - PAD.top - PAD.bottom };
  const x = (i) => PAD.left + (times.length > 1 ? (i * inner.w) / (times.length - 1) : inner.w / 2);
  const y = (v) => PAD.top + inner.h - (v / top) * inner.h;
  const latest = series
    .map((s) => {
      const last = [...s.values].reverse().find((v) => v !== null && v !== undefined);
      return `${s.name} ${last === undefined ? "none" : format(last)}`;
    })
    .join(", ");
  const chart = svg("svg", {
    viewBox: `0 0 ${WIDTH} ${HEIGHT}`,
    class: "chart-svg",
    role: "img",
    "aria-label": `${title}: latest bucket ${latest}`,
  });
  chart.append(svg("title", {}, `${title}: latest bucket ${latest}`));
  for (const fraction of [0, 0.5, 1]) {
    const at = y(top * fraction);
    chart.append(svg("line", { x1: PAD.left, x2: WIDTH - PAD.right, y1: at, y2: at, class: "grid" }));
    const tick = top * fraction;
    chart.append(svg("text", { x: PAD.left - 4, y: at + 4, class: "axis", "text-anchor": "end" }, number(tick, tick < 10 ? 2 : 0)));
  }
  if (times.length) {
    chart.append(svg("text", { x: PAD.left, y: HEIGHT - 6, class: "axis" }, clock(times[0])));
    chart.append(
      svg("text", { x: WIDTH - PAD.right, y: HEIGHT - 6, class: "axis", "text-anchor": "end" }, clock(times[times.length - 1])),
    );
  }
  for (const s of series) {
    // A gap (null: nothing measured in that bucket) breaks the line.
    let path = "";
    let open = false;
    s.values.forEach((v, i) => {
      if (v === null || v === undefined) {
        open = false;
        return;
      }
      path += `${open ? "L" : "M"}${x(i).toFixed(1)},${y(v).toFixed(1)} `;
      open = true;
    });
    const group = svg("g", { class: `series ${s.class}` });
    if (path) group.append(svg("path", { d: path.trim(), class: "line" }));
    s.values.forEach((v, i) => {
      if (v === null || v === undefined) return;
      group.append(svg("circle", { cx: x(i), cy: y(v), r: 2.5 }, svg("title", {}, `${clock(times[i])} ${s.name}: ${format(v)}`)));
    });
    chart.append(group);
  }
  const legend = document.createElement("ul");
  legend.className = "legend";
  for (const s of series) {
    const item = document.createElement("li");
    item.className = s.class;
    item.textContent = s.name;
    legend.append(item);
  }
  container.replaceChildren(chart, legend);
}

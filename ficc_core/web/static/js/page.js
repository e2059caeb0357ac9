// What every console page does with its own elements: find one by ID, say a problem
// or a status line, fill a section's note. Each page's template has the elements
// (#problem, #status, .note[data-for=SECTION]) it uses.

export const $ = (id) => document.getElementById(id);

// Say `text` as the page's problem (an alert), or clear it.
export function problem(text) {
  $("problem").textContent = text || "";
  $("problem").hidden = !text;
}

// Say `text` in the page's status line, or clear it.
export function status(text) {
  $("status").textContent = text || "";
}

// Say `text` under a section (a table's empty or missing-scope note), or clear it.
export function note(section, text) {
  const p = document.querySelector(`.note[data-for="${section}"]`);
  p.textContent = text || "";
  p.hidden = !text;
}

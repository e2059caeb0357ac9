// The administration page (scope admin): pending signups to approve
// (POST /api/v1/users/{id}/approve), users (GET/POST /api/v1/users), membership
// (PUT /api/v1/users/{id}/projects/{project}) and projects (GET/POST /api/v1/projects).
// A session without admin is told so by the page itself and asks for nothing.

import { api, leave, openSession, sessionEnded } from "./api.js";
import { ago, badge, el, stamp } from "./format.js";
import { fillRows } from "./tables.js";
import { $, note, problem, status } from "./page.js";

let principal = null;
let users = [];
let projects = [];
const inFlight = new Set();

function call(method, path, body) {
  const promise = api(method, path, body);
  inFlight.add(promise);
  promise.finally(() => inFlight.delete(promise)).catch(() => {});
  return promise;
}

// The control of `form` a refusal's field path names ("$.password": the control named
// password), or null.
function controlFor(form, path) {
  const name = String(path || "").replace(/^\$\.?/, "").split(/[.[]/)[0];
  const control = form && name ? form.elements.namedItem(name) : null;
  return control instanceof HTMLElement ? control : null;
}

// Runs `action`; a refusal is said in the page's alert with each field it names (the
// control's label, or the path) and, for a refusal of `form`, the first such control
// marked invalid and focused.
async function attempt(what, action, form = null) {
  if (form) for (const control of form.querySelectorAll("[aria-invalid]")) control.removeAttribute("aria-invalid");
  try {
    return await action();
  } catch (error) {
    if (sessionEnded(error)) {
      leave();
      return undefined;
    }
    const details = error.details && error.details.errors;
    const errors = Array.isArray(details) ? details : [];
    const controls = errors.map((e) => controlFor(form, e.path));
    const named = errors.map((e, i) => {
      const label = controls[i] && controls[i].labels && controls[i].labels[0];
      return `${label ? label.textContent.trim() : e.path}: ${e.message}`;
    });
    problem(named.length ? `${what}: ${error.message} (${named.join("; ")})` : `${what}: ${error.message}`);
    status("");
    const first = controls.find(Boolean);
    if (first) {
      first.setAttribute("aria-invalid", "true");
      first.focus();
    }
    return undefined;
  }
}

function button(text, attributes, onClick) {
  const node = el("button", { type: "button", ...attributes }, text);
  node.addEventListener("click", onClick);
  return node;
}

const projectName = (id) => (projects.find((p) => p.id === id) || { name: id }).name;

// -- tables ------------------------------------------------------------------------------

function approveButton(user) {
  return button("Approve", { class: "small-button", "aria-label": `Approve ${user.username}` }, () => approve(user));
}

function pendingRow(user) {
  return el(
    "tr",
    { "data-user-id": user.id, "data-username": user.username },
    el("th", { scope: "row" }, user.username, el("div", { class: "muted small" }, user.id)),
    el("td", { title: stamp(user.created_at) }, ago(user.created_at)),
    el("td", { class: "action" }, approveButton(user)),
  );
}

function membershipChips(user) {
  if (!user.projects.length) return el("span", { class: "muted" }, "none");
  return user.projects.map((m) =>
    el(
      "span",
      { class: "chip", title: m.scopes.join(", ") },
      `${projectName(m.project_id)}: ${m.scopes.length} scope${m.scopes.length === 1 ? "" : "s"}`,
    ),
  );
}

function userRow(user) {
  return el(
    "tr",
    { "data-user-id": user.id, "data-username": user.username },
    el("th", { scope: "row" }, user.username, el("div", { class: "muted small" }, user.id)),
    el("td", { class: "state" }, badge(user.status)),
    el("td", {}, user.admin ? "yes" : "no"),
    el("td", { class: "chips" }, membershipChips(user)),
    el("td", { title: stamp(user.created_at) }, ago(user.created_at)),
    el(
      "td",
      { class: "action" },
      user.status === "pending" ? approveButton(user) : null,
      button("Membership", { class: "quiet small-button", "aria-label": `Edit the membership of ${user.username}` }, () => editMembership(user)),
    ),
  );
}

function projectRow(project) {
  const members = users.filter((u) => u.projects.some((m) => m.project_id === project.id));
  return el(
    "tr",
    { "data-project-id": project.id, "data-project-name": project.name },
    el("th", { scope: "row" }, project.name, el("div", { class: "muted small" }, project.id)),
    el("td", {}, members.length ? members.map((u) => u.username).join(", ") : el("span", { class: "muted" }, "none")),
    el("td", {}, project.band || el("span", { class: "muted" }, "default")),
    el("td", { title: stamp(project.created_at) }, ago(project.created_at)),
  );
}

function options(select, items, value, label) {
  const kept = select.value;
  select.replaceChildren(...items.map((item) => el("option", { value: value(item) }, label(item))));
  if ([...select.options].some((o) => o.value === kept)) select.value = kept;
}

function show() {
  const sortedUsers = [...users].sort((a, b) => a.username.localeCompare(b.username));
  const pending = sortedUsers.filter((u) => u.status === "pending");
  fillRows($("pending"), pending.map(pendingRow));
  $("pending").closest(".table-wrap").hidden = pending.length === 0;
  note("pending", pending.length ? "" : "No signup is waiting.");
  fillRows($("users"), sortedUsers.map(userRow));
  $("users").closest(".table-wrap").hidden = sortedUsers.length === 0;
  note("users", sortedUsers.length ? "" : "No user yet.");
  const sortedProjects = [...projects].sort((a, b) => a.name.localeCompare(b.name));
  fillRows($("projects"), sortedProjects.map(projectRow));
  options($("member-user"), sortedUsers, (u) => u.id, (u) => `${u.username}${u.status === "pending" ? " (pending)" : ""}`);
  options($("member-project"), sortedProjects, (p) => p.id, (p) => p.name);
  checkMembership();
}

async function load() {
  const [userList, projectList] = await Promise.all([call("GET", "/api/v1/users"), call("GET", "/api/v1/projects")]);
  users = userList.users;
  projects = projectList.projects;
  show();
}

// -- actions -----------------------------------------------------------------------------

async function approve(user) {
  await attempt(`Could not approve ${user.username}`, async () => {
    await call("POST", `/api/v1/users/${encodeURIComponent(user.id)}/approve`);
    problem("");
    status(`${user.username} is approved and can log in; add them to a project under Membership.`);
    await load();
    $("member-user").value = user.id;
    checkMembership();
  });
}

async function createUser(event) {
  event.preventDefault();
  const form = event.target;
  const username = form.elements.username.value.trim();
  const password = form.elements.password.value;
  if (!username || !password) {
    problem("A new user needs a username and a password.");
    (username ? form.elements.password : form.elements.username).focus();
    return;
  }
  await attempt("Could not create the user", async () => {
    const user = await call("POST", "/api/v1/users", { username, password, admin: form.elements.admin.checked });
    form.reset();
    problem("");
    status(`User ${user.username} is created; add them to a project under Membership.`);
    await load();
    $("member-user").value = user.id;
    checkMembership();
  }, form);
}

async function createProject(event) {
  event.preventDefault();
  const form = event.target;
  const name = form.elements.name.value.trim();
  if (!name) {
    problem("A new project needs a name.");
    form.elements.name.focus();
    return;
  }
  await attempt("Could not create the project", async () => {
    const project = await call("POST", "/api/v1/projects", { name });
    form.reset();
    problem("");
    status(`Project ${project.name} is created.`);
    await load();
  }, form);
}

function scopeBoxes() {
  return [...$("member-scopes").querySelectorAll("input[type=checkbox]")];
}

// The chosen user's scopes in the chosen project, ticked.
function checkMembership() {
  const user = users.find((u) => u.id === $("member-user").value);
  const membership = user && user.projects.find((m) => m.project_id === $("member-project").value);
  const held = new Set(membership ? membership.scopes : []);
  for (const box of scopeBoxes()) box.checked = held.has(box.value);
}

function editMembership(user) {
  $("member-user").value = user.id;
  checkMembership();
  $("membership-title").scrollIntoView({ block: "start" });
  $("member-project").focus();
}

async function setMembership(event) {
  event.preventDefault();
  const user = users.find((u) => u.id === $("member-user").value);
  const projectId = $("member-project").value;
  if (!user || !projectId) return;
  const scopes = scopeBoxes().filter((b) => b.checked).map((b) => b.value);
  await attempt("Could not set the membership", async () => {
    await call("PUT", `/api/v1/users/${encodeURIComponent(user.id)}/projects/${encodeURIComponent(projectId)}`, { scopes });
    problem("");
    const project = projectName(projectId);
    status(
      scopes.length
        ? `${user.username} holds ${scopes.length} scope${scopes.length === 1 ? "" : "s"} in ${project}.`
        : `${user.username} is no longer a member of ${project}.`,
    );
    await load();
  });
}

async function start() {
  try {
    principal = await openSession(() => Promise.allSettled([...inFlight]));
  } catch (error) {
    problem(`Could not load the page: ${error.message}`);
    return;
  }
  if (!principal || !principal.scopes.includes("admin") || !$("users")) {
    document.body.dataset.loaded = "true";
    return; // the page says so (admin.html): nothing here is this session's to ask
  }
  // The scopes a membership may grant: every one but the installation's own (admin).
  const grantable = principal.scopes.filter((scope) => scope !== "admin");
  $("member-scopes").append(
    ...grantable.map((scope) => {
      const id = `scope-${scope.replace(/[^a-z]/g, "-")}`;
      return el("label", { class: "check", for: id }, el("input", { id, type: "checkbox", name: "scopes", value: scope }), scope);
    }),
  );
  $("member-user").addEventListener("change", checkMembership);
  $("member-project").addEventListener("change", checkMembership);
  $("member-all").addEventListener("click", () => {
    for (const box of scopeBoxes()) box.checked = true;
  });
  $("user-form").addEventListener("submit", createUser);
  $("project-form").addEventListener("submit", createProject);
  for (const form of [$("user-form"), $("project-form")]) {
    // A field edited: its refusal is out of date.
    form.addEventListener("input", (event) => event.target.removeAttribute("aria-invalid"));
  }
  $("membership-form").addEventListener("submit", setMembership);
  await attempt("Could not load users and projects", load);
  document.body.dataset.loaded = "true";
}

start();

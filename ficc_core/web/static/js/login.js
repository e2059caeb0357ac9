// The landing page's login form: POST /api/v1/session, keep the CSRF token for this
// tab, then open the dashboard. The project last used is remembered (not a secret).

import { api, ApiError, rememberCsrf } from "./api.js";

const PROJECT_KEY = "ficc.project";
const form = document.getElementById("login-form");
const problem = document.getElementById("login-error");
const project = document.getElementById("project");

const remembered = localStorage.getItem(PROJECT_KEY);
if (remembered !== null) project.value = remembered;

function explain(error) {
  if (!(error instanceof ApiError)) return "The server cannot be reached. Try again in a moment.";
  if (error.code === "login_throttled") {
    const wait = error.details.retry_after;
    return `Too many failed logins. Try again in ${wait ? Math.ceil(wait) + " s" : "a while"}.`;
  }
  return error.message;
}

form.addEventListener("submit", async (event) => {
  event.preventDefault();
  const username = form.elements.username.value.trim();
  const password = form.elements.password.value;
  if (!username || !password) {
    problem.textContent = "Enter your username and password.";
    problem.hidden = false;
    (username ? form.elements.password : form.elements.username).focus();
    return;
  }
  const button = form.querySelector("button[type=submit]");
  button.disabled = true;
  problem.hidden = true;
  const chosen = project.value.trim();
  try {
    const answer = await api("POST", "/api/v1/session", {
      username,
      password,
      project: chosen || null,
    });
    rememberCsrf(answer.csrf_token);
    localStorage.setItem(PROJECT_KEY, chosen);
    window.location.assign("/ui/dashboard");
  } catch (error) {
    problem.textContent = explain(error);
    problem.hidden = false;
    form.elements.password.select();
    form.elements.password.focus();
  } finally {
    button.disabled = false;
  }
});

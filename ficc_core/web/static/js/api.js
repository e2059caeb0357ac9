// The console's one way to the server: the public /api/v1 routes, with the session
// cookie (sent by the browser, HttpOnly) and, on unsafe requests, the CSRF token the
// login answered. The token lives in sessionStorage (this tab); a tab opened later
// reads the ficc_csrf cookie the login set for this purpose. The server never takes
// either as authority: it compares the header with the session's own token.

const CSRF_KEY = "ficc.csrf";
const SAFE = new Set(["GET", "HEAD", "OPTIONS"]);

export class ApiError extends Error {
  constructor(status, envelope) {
    const error = (envelope && envelope.error) || {};
    super(error.message || `the server answered ${status}`);
    this.status = status;
    this.code = error.code || "http_error";
    this.details = error.details || {};
  }
}

export function rememberCsrf(token) {
  sessionStorage.setItem(CSRF_KEY, token);
}

export function forgetCsrf() {
  sessionStorage.removeItem(CSRF_KEY);
}

export function csrfToken() {
  const kept = sessionStorage.getItem(CSRF_KEY);
  if (kept) return kept;
  const cookie = document.cookie.split("; ").find((c) => c.startsWith("ficc_csrf="));
  return cookie ? decodeURIComponent(cookie.slice("ficc_csrf=".length)) : "";
}

async function parsed(response) {
  const text = await response.text();
  try {
    return text ? JSON.parse(text) : null;
  } catch {
    return null; // not JSON (a proxy's error page): ApiError says the status
  }
}

// Call `method path` with `body` (JSON); answer the parsed JSON, or throw ApiError.
// A page that gets 401 (the session expired, was revoked or logged out elsewhere)
// goes back to the login page once its other requests are answered (leave()).
export async function api(method, path, body = undefined) {
  const headers = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (!SAFE.has(method)) headers["X-CSRF-Token"] = csrfToken();
  const response = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: "same-origin",
    cache: "no-store",
  });
  const data = await parsed(response);
  if (!response.ok) throw new ApiError(response.status, data);
  return data;
}

// Whether `error` says the session is gone.
export function sessionEnded(error) {
  return error instanceof ApiError && error.status === 401;
}

// Back to the landing page's login form, forgetting this tab's CSRF token.
export function leave() {
  forgetCsrf();
  window.location.assign("/");
}

function sessionIdentity(who) {
  const user = who.user ? who.user.username : who.id;
  // A personal session works in the reserved project "~personal" (docs/people.md).
  const named = who.project && who.project.name && who.project.id !== "~personal";
  const project = named ? who.project.name : "personal";
  return `${user} · ${project}`;
}

// A console page's session: GET /api/v1/whoami, the header's identity and its Log out
// button, which first awaits `settled()` (the page's requests in flight, so none is
// left unanswered) and then ends the session. Answers the principal; null when the
// session is gone already (the page then goes back to the login form). Any other
// failure is thrown for the page to say.
export async function openSession(settled = () => Promise.resolve()) {
  let principal;
  try {
    principal = await api("GET", "/api/v1/whoami");
  } catch (error) {
    if (sessionEnded(error)) {
      leave();
      return null;
    }
    throw error;
  }
  document.getElementById("whoami").textContent = sessionIdentity(principal);
  const button = document.getElementById("logout");
  button.addEventListener("click", async () => {
    button.disabled = true;
    await Promise.allSettled([settled()]);
    try {
      await api("DELETE", "/api/v1/session");
    } catch {
      // Ended already (or the server is away): the cookie goes with the next login.
    }
    leave();
  });
  return principal;
}

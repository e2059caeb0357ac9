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

// POST `body` (JSON) to an invoke route for a server-sent event stream, with the
// session and the CSRF token as api() sends them; `signal` (an AbortController's)
// aborts it, which closes the connection (the gateway then cancels the engine's
// request). Answers the Response once its head says 2xx; throws ApiError with the
// envelope's message otherwise.
export async function openStream(path, body, signal) {
  const response = await fetch(path, {
    method: "POST",
    headers: {
      Accept: "text/event-stream",
      "Content-Type": "application/json",
      "X-CSRF-Token": csrfToken(),
    },
    body: JSON.stringify(body),
    credentials: "same-origin",
    cache: "no-store",
    signal,
  });
  if (!response.ok) throw new ApiError(response.status, await parsed(response));
  return response;
}

// The events of a text/event-stream Response, as they arrive: {comment} for each
// comment line (": ficc waiting for smol to load"), {event, data} for each event
// (its data lines joined by "\n"). Fields other than data and event are ignored.
export async function* sseEvents(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let data = [];
  let event = "message";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      const lines = buffer.split(/\r\n|\r|\n/);
      buffer = lines.pop();
      for (const line of lines) {
        if (line === "") {
          if (data.length) yield { event, data: data.join("\n") };
          data = [];
          event = "message";
        } else if (line.startsWith(":")) {
          yield { comment: line.slice(1).trim() };
        } else {
          const colon = line.indexOf(":");
          const field = colon < 0 ? line : line.slice(0, colon);
          let text = colon < 0 ? "" : line.slice(colon + 1);
          if (text.startsWith(" ")) text = text.slice(1);
          if (field === "data") data.push(text);
          else if (field === "event") event = text;
        }
      }
    }
    if (data.length) yield { event, data: data.join("\n") };
  } finally {
    // Left early (the consumer stopped reading) or aborted: let the body go.
    await reader.cancel().catch(() => {});
  }
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

// POST `body` (a Blob, ArrayBuffer or typed array) to `path` as application/octet-stream,
// with the CSRF header; answer the parsed JSON, or throw ApiError. `signal` (an
// AbortSignal) may cancel it. The models page's chunked uploads use it.
export async function apiBytes(path, body, signal = undefined) {
  const response = await fetch(path, {
    method: "POST",
    headers: {
      Accept: "application/json",
      "Content-Type": "application/octet-stream",
      "X-CSRF-Token": csrfToken(),
    },
    body,
    signal,
    credentials: "same-origin",
    cache: "no-store",
  });
  const data = await parsed(response);
  if (!response.ok) {
    const error = new ApiError(response.status, data);
    error.retryAfter = Number(response.headers.get("Retry-After")) || 0;
    throw error;
  }
  return data;
}

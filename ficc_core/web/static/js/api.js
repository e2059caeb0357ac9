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

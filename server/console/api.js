// The public HTTP API, as the console calls it: JSON requests and SSE streams read with fetch().
// EventSource cannot send headers, so streams are read from fetch's body: the API key goes in
// `Authorization: Bearer`, never in a URL. The key lives in this tab's sessionStorage only.

const KEY = "corral.api_key";

export const auth = {
  required: document.querySelector('meta[name="corral-keys"]')?.content === "required",
  get key() { return sessionStorage.getItem(KEY) || ""; },
  set key(value) { value ? sessionStorage.setItem(KEY, value) : sessionStorage.removeItem(KEY); },
};

export class ApiError extends Error {
  constructor(status, code, message, details) {
    super(message);
    this.status = status;
    this.code = code;
    this.details = details;
  }
}

let unauthorized = () => {};
/** Called whenever the server answers 401 (the key is missing, wrong, or was revoked). */
export function onUnauthorized(fn) { unauthorized = fn; }

function headers(extra = {}) {
  const h = { Accept: "application/json", ...extra };
  if (auth.key) h.Authorization = `Bearer ${auth.key}`;
  return h;
}

async function failure(response) {
  let error = {};
  try { error = (await response.json()).error || {}; } catch { /* not our envelope */ }
  if (response.status === 401) unauthorized();
  return new ApiError(response.status, error.code || `http_${response.status}`,
    error.message || response.statusText, error.details);
}

/** `path` with each `{}` filled by the next value, percent-encoded. */
export function path(template, ...values) {
  let i = 0;
  return template.replace(/\{\}/g, () => encodeURIComponent(values[i++]));
}

/** One JSON request; resolves to the parsed body (null for 204), rejects with an ApiError. */
export async function api(url, { method = "GET", body, signal } = {}) {
  const init = { method, signal, cache: "no-store",
    headers: headers(body === undefined ? {} : { "Content-Type": "application/json" }) };
  if (body !== undefined) init.body = JSON.stringify(body);
  const response = await fetch(url, init);
  if (!response.ok) throw await failure(response);
  return response.status === 204 ? null : response.json();
}

/** Every item of a list route, following `next_cursor` up to `max` items. */
export async function all(url, max = 1000) {
  const items = [];
  let cursor = null;
  do {
    const sep = url.includes("?") ? "&" : "?";
    const page = await api(`${url}${sep}limit=${Math.min(max, 200)}${cursor ? `&cursor=${cursor}` : ""}`);
    items.push(...page.items);
    cursor = page.next_cursor;
  } while (cursor && items.length < max);
  return items;
}

/**
 * Read the SSE stream at `url`, calling `onEvent({id, name, data})` for each event, until the
 * server ends it (resolves) or `signal` aborts it (resolves too). `lastEventId` resumes.
 */
export async function stream(url, { signal, lastEventId, onEvent, onOpen }) {
  const extra = { Accept: "text/event-stream" };
  if (lastEventId) extra["Last-Event-ID"] = String(lastEventId);
  let response;
  try {
    response = await fetch(url, { headers: headers(extra), signal, cache: "no-store" });
  } catch (error) {
    if (signal?.aborted) return;
    throw error;
  }
  if (!response.ok) throw await failure(response);
  onOpen?.();
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value.replace(/\r\n?/g, "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const event = parse(buffer.slice(0, end));
        buffer = buffer.slice(end + 2);
        if (event) onEvent(event);
      }
    }
  } catch (error) {
    if (!signal?.aborted) throw error;
  }
}

function parse(block) {
  let id = null, name = "message";
  const data = [];
  for (const line of block.split("\n")) {
    if (!line || line.startsWith(":")) continue;
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
    if (field === "id") id = Number(value);
    else if (field === "event") name = value;
    else if (field === "data") data.push(value);
  }
  if (!data.length) return null;
  try { return { id, name, data: JSON.parse(data.join("\n")) }; } catch { return null; }
}

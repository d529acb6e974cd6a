// The OpenAI API of the shim that served this page: models, streamed chat, readable errors.
// URLs are relative to the page (/playground -> v1/...), so a proxy prefix in front works too.

/** An API failure with a message meant for people; `status` 0 is a network failure. */
export class APIError extends Error {
  constructor(status, message, retryAfter = null) {
    super(message);
    this.status = status;
    this.retryAfter = retryAfter;
  }
}

// HTTP's names for the statuses the shim answers with; the message after them is the server's.
const WHAT = {
  400: "Bad request",
  401: "Unauthorized",
  404: "Not found",
  413: "Request too large",
  429: "Too many requests",
  500: "Internal server error",
  503: "Service unavailable",
  504: "Gateway timeout",
};

/** "<what> (<status>): <the server's message>", plus the parameter and when to retry. */
export function describe(status, body, retryAfter) {
  const error = body && typeof body === "object" ? body.error : null;
  let text = `${WHAT[status] || "Request failed"} (${status})`;
  if (error && error.message) text += `: ${error.message}`;
  if (error && error.param) text += ` [parameter: ${error.param}]`;
  if (retryAfter) text += ` Try again in ${retryAfter} s.`;
  return text;
}

async function failure(response) {
  let body = null;
  try {
    body = await response.json();
  } catch {
    // not JSON (a proxy's page): the status says enough
  }
  const retryAfter = response.headers.get("Retry-After");
  return new APIError(response.status, describe(response.status, body, retryAfter), retryAfter);
}

function headers(key) {
  const result = { "Content-Type": "application/json" };
  if (key) result.Authorization = `Bearer ${key}`;
  return result;
}

async function send(path, init) {
  try {
    return await fetch(path, init);
  } catch (error) {
    if (error.name === "AbortError") throw error;
    throw new APIError(0, `Could not reach the server (${error.message}).`);
  }
}

export async function listModels(key) {
  const response = await send("v1/models", { headers: headers(key) });
  if (!response.ok) throw await failure(response);
  return (await response.json()).data.map((model) => model.id);
}

/** Each SSE event's data of a response body; comments (heartbeats) are skipped. */
async function* sseData(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value.replace(/\r\n?/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = event.split("\n").filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).replace(/^ /, "")).join("\n");
      if (data) yield data;
    }
  }
}

/**
 * Streams a chat completion: yields each chunk (OpenAI's chat.completion.chunk objects) until
 * [DONE]. A stream that ends with an error event (or without [DONE]) throws an APIError; aborting
 * `signal` closes the connection, which the shim relays to the engine as a cancellation.
 */
export async function* streamChat(request, key, signal) {
  const response = await send("v1/chat/completions", {
    method: "POST",
    headers: headers(key),
    body: JSON.stringify({ ...request, stream: true, stream_options: { include_usage: true } }),
    signal,
  });
  if (!response.ok) throw await failure(response);
  for await (const data of sseData(response.body)) {
    if (data === "[DONE]") return;
    const chunk = JSON.parse(data);
    if (chunk.error) throw new APIError(500, `The answer was cut by an error: ${chunk.error.message}`);
    yield chunk;
  }
  throw new APIError(0, "The connection closed before the answer was complete.");
}

// The playground page: model list, settings, the conversation, streaming with Stop, stats, API key.

import { APIError, listModels, streamChat } from "./api.js";
import { renderMarkdown } from "./markdown.js";

const $ = (id) => document.getElementById(id);
const KEY_NAME = "conduit-api-key";

const conversation = [];  // {role, content} of finished turns, sent with each new question
let running = null;  // the AbortController of the answer being streamed

// ------------------------------------------------------------------ API key (browser storage only)

function storedKey() {
  return sessionStorage.getItem(KEY_NAME) || localStorage.getItem(KEY_NAME) || "";
}

function storeKey(key, remember) {
  sessionStorage.removeItem(KEY_NAME);
  localStorage.removeItem(KEY_NAME);
  (remember ? localStorage : sessionStorage).setItem(KEY_NAME, key);
}

let keyAsked = null;  // the promise of the open key dialog: every caller waits for the same answer

/** Resolves with the key to use once the dialog closes (Escape keeps the stored one). */
function askForKey(refused) {
  $("key-error").hidden = !refused;
  $("key-error").textContent = refused ? "That key was refused; try another." : "";
  $("change-key").hidden = false;
  keyAsked ??= new Promise((resolve) => {
    $("key").value = "";
    $("key-dialog").addEventListener("close", () => {
      keyAsked = null;
      resolve(storedKey());
    }, { once: true });
    $("key-dialog").showModal();
  });
  return keyAsked;
}

function saveKey(event) {
  event.preventDefault();
  const key = $("key").value.trim();
  if (!key) return;
  storeKey(key, $("remember-key").checked);
  $("key-dialog").close();
}

// ------------------------------------------------------------------ errors

function showError(message) {
  $("error").textContent = message;
  $("error").hidden = false;
}

function clearError() {
  $("error").hidden = true;
  $("error").textContent = "";
}

// ------------------------------------------------------------------ models

async function loadModels() {
  let refused = false;
  for (;;) {
    try {
      const models = await listModels(storedKey());
      const select = $("model");
      select.replaceChildren(...models.map((id) => new Option(id, id)));
      clearError();
      return;
    } catch (error) {
      if (!(error instanceof APIError)) throw error;
      if (error.status !== 401) {
        showError(`Could not list the models. ${error.message}`);
        return;
      }
      await askForKey(refused || Boolean(storedKey()));
      refused = true;
    }
  }
}

// ------------------------------------------------------------------ conversation view

function addTurn(role, text) {
  const turn = document.createElement("article");
  turn.className = `turn ${role}`;
  const body = document.createElement("div");
  body.className = "content";
  if (role === "user") body.textContent = text;
  turn.append(body);
  $("conversation").append(turn);
  turn.scrollIntoView({ block: "end" });
  return turn;
}

function showStats(turn, stats) {
  const line = document.createElement("div");
  line.className = "stats";
  const parts = [];
  if (stats.ttft !== null) parts.push(`TTFT ${stats.ttft.toFixed(2)} s`);
  if (stats.tokensPerSecond !== null) parts.push(`${stats.tokensPerSecond.toFixed(1)} tok/s`);
  if (stats.usage) {
    const u = stats.usage;
    parts.push(`${u.prompt_tokens} prompt + ${u.completion_tokens} completion = ${u.total_tokens} tokens`);
  }
  parts.push(stats.finish ? `finish: ${stats.finish}` : "stopped");
  line.textContent = parts.join(" · ");
  turn.append(line);
}

// ------------------------------------------------------------------ asking

function number(id) {
  const value = $(id).value.trim();
  return value === "" ? null : Number(value);
}

function buildRequest() {
  const request = {
    model: $("model").value,
    messages: [...conversation],
    temperature: Number($("temperature").value),
    top_p: Number($("top-p").value),
  };
  const system = $("system").value.trim();
  if (system) request.messages.unshift({ role: "system", content: system });
  const maxTokens = number("max-tokens");
  if (maxTokens !== null) request.max_tokens = maxTokens;
  const seed = number("seed");
  if (seed !== null) request.seed = seed;
  if ($("json-mode").checked) request.response_format = { type: "json_object" };
  return request;
}

function setRunning(controller) {
  running = controller;
  $("send").disabled = Boolean(controller);
  $("stop").disabled = !controller;
  document.body.classList.toggle("running", Boolean(controller));
}

async function ask(question) {
  clearError();
  conversation.push({ role: "user", content: question });
  const userTurn = addTurn("user", question);
  const turn = addTurn("assistant", "");
  const content = turn.querySelector(".content");
  const controller = new AbortController();
  setRunning(controller);
  const started = performance.now();
  const stats = { ttft: null, tokensPerSecond: null, usage: null, finish: null };
  let text = "";
  let firstAt = null;
  try {
    for (;;) {
      try {
        for await (const chunk of streamChat(buildRequest(), storedKey(), controller.signal)) {
          if (chunk.usage) stats.usage = chunk.usage;
          const choice = chunk.choices[0];
          if (!choice) continue;
          if (choice.finish_reason) stats.finish = choice.finish_reason;
          if (choice.delta.content) {
            firstAt ??= performance.now();
            text += choice.delta.content;
            content.replaceChildren(renderMarkdown(text));
            turn.scrollIntoView({ block: "end" });
          }
        }
        break;
      } catch (error) {
        if (!(error instanceof APIError) || error.status !== 401) throw error;
        await askForKey(true);  // then ask again with the new key
      }
    }
  } catch (error) {
    if (error.name !== "AbortError") {
      // Nothing of a failed exchange stays: the question goes back to the input, to retry.
      conversation.pop();
      userTurn.remove();
      turn.remove();
      if (!$("prompt").value) $("prompt").value = question;
      showError(error instanceof APIError ? error.message : `Unexpected error: ${error.message}`);
      return;
    }
  } finally {
    setRunning(null);
  }
  if (!turn.isConnected) return;  // "New chat" dropped this exchange
  // Finished or stopped: the answer so far is part of the conversation.
  const ended = performance.now();
  if (firstAt !== null) {
    stats.ttft = (firstAt - started) / 1000;
    const generated = stats.usage ? stats.usage.completion_tokens : null;
    if (generated > 1 && ended > firstAt) stats.tokensPerSecond = (generated - 1) / ((ended - firstAt) / 1000);
  }
  conversation.push({ role: "assistant", content: text });
  showStats(turn, stats);
}

// ------------------------------------------------------------------ wiring

function bindRange(id) {
  const show = () => { $(`${id}-value`).textContent = $(id).value; };
  $(id).addEventListener("input", show);
  show();
}

function start() {
  bindRange("temperature");
  bindRange("top-p");
  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    const question = $("prompt").value.trim();
    if (!question || running) return;
    $("prompt").value = "";
    ask(question);
  });
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("key-form").addEventListener("submit", saveKey);
  $("stop").addEventListener("click", () => running && running.abort());
  $("new-chat").addEventListener("click", () => {
    if (running) running.abort();
    conversation.length = 0;
    $("conversation").replaceChildren();
    clearError();
  });
  $("change-key").addEventListener("click", async () => {
    await askForKey(false);
    loadModels();
  });
  if (storedKey()) $("change-key").hidden = false;
  loadModels();
}

start();

// The chat page. Talks to POST /chat and reads the NDJSON reply stream described in
// chatapp/wire.py. Model output and stored chats are untrusted: a reply is rendered as Markdown
// only through the sanitiser in markdown.js; everything else (your messages, titles, notes) is
// inserted as text, never as HTML. Chats and settings are kept in this browser (store.js).
import { MarkdownStream, readableText, renderMarkdown } from "./markdown.js";
import { Store, TITLE_MAX, browserStorage, memoryStorage, newId, titleFrom } from "./store.js";

const $ = (id) => document.getElementById(id);
const log = $("log");
const empty = $("empty");
const form = $("composer");
const input = $("prompt");
const sendButton = $("send");
const stopButton = $("stop");
const modelStatus = $("model-status");
const modelNameLabel = $("model-name");
const chatTitle = $("chat-title");
const chatList = $("chat-list");
const chatListEmpty = $("chat-list-empty");
const storageNote = $("storage-note");
const chatMenu = $("chat-menu");
const announcer = $("announcer");
const template = $("message-template");

const UNREACHABLE = "The chat service is not reachable. Check your connection and try again.";
const MAX_BYTES = Number(document.body.dataset.maxRequestBytes) || 65536;
const MAX_MESSAGES = Number(document.body.dataset.maxMessages) || 200;
const TOKENS_LIMIT = Number(document.body.dataset.maxNewTokensLimit) || 4096;
const CONTROL_CHARS = /[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f-\u009f]/g;

const persistent = browserStorage();
const store = new Store(persistent || memoryStorage());
let settings = store.loadSettings(TOKENS_LIMIT);

/** The open chat: {id, title, renamed, created, updated, messages: [{role, content, ending?}]}. */
let chat = null;
/** One view per message of the open chat (same order), and views of failed exchanges. */
let views = [];
let transient = [];
/** The exchange in flight, or null. */
let active = null;
/** The model's name from /healthz; "Assistant" until known. */
let modelName = null;
const viewOf = new WeakMap();

// ---- Small helpers ---------------------------------------------------------------------------

function nearBottom() {
  return window.innerHeight + window.scrollY >= document.documentElement.scrollHeight - 96;
}

function scrollToEnd(force) {
  if (force || nearBottom()) window.scrollTo(0, document.documentElement.scrollHeight);
}

let announceTimer = null;
/** Say `text` once through the live region (screen readers), e.g. when a reply is complete. */
function announce(text) {
  clearTimeout(announceTimer);
  announcer.textContent = "";
  announceTimer = setTimeout(() => {
    announcer.textContent = text;
  }, 50);
}

function clean(text) {
  // Control characters are invisible, and the model service refuses them.
  return text.replace(CONTROL_CHARS, "");
}

function assistantName() {
  return modelName || "Assistant";
}

async function copyText(text) {
  try {
    await navigator.clipboard.writeText(text);
    return true;
  } catch {
    // No clipboard API (a page served over plain HTTP): copy through a selected text area.
  }
  const focused = document.activeElement;
  const area = document.createElement("textarea");
  area.value = text;
  area.readOnly = true;
  area.className = "clipboard-helper";
  document.body.append(area);
  area.select();
  let copied = false;
  try {
    copied = document.execCommand("copy");
  } catch {
    copied = false;
  }
  area.remove();
  if (focused instanceof HTMLElement) focused.focus();
  return copied;
}

async function copyFrom(button, text) {
  const label = button.textContent;
  const copied = await copyText(text);
  button.textContent = copied ? "Copied" : "Copy failed";
  announce(copied ? "Copied to the clipboard." : "Could not copy to the clipboard.");
  setTimeout(() => {
    button.textContent = label;
  }, 1500);
}

// ---- Messages --------------------------------------------------------------------------------

function messageView(role, text = "") {
  const node = template.content.firstElementChild.cloneNode(true);
  node.classList.add(role);
  const roleLabel = node.querySelector(".role");
  roleLabel.textContent = role === "user" ? "You" : assistantName();
  const body = node.querySelector(".text");
  const meta = node.querySelector(".meta");
  const actions = node.querySelector(".message-actions");
  const view = {
    node,
    role,
    text,
    actions,
    /** The streamed reply: its text so far, rendered as Markdown a block at a time. */
    append(delta) {
      this.text += delta;
      this.stream.update(this.text);
    },
    /** The reply is complete (or will not grow): render its end. */
    complete() {
      this.stream.finish(this.text);
    },
    showMarkdown(value) {
      this.text = value;
      body.classList.add("markdown");
      renderMarkdown(body, value);
    },
    showError(message) {
      body.classList.remove("markdown");
      body.replaceChildren(document.createTextNode(message));
    },
    setState(state, note, badge) {
      node.dataset.state = state;
      node.setAttribute("aria-busy", String(state === "streaming" || state === "waiting"));
      const parts = [];
      if (badge) {
        const span = document.createElement("span");
        span.className = "badge";
        span.textContent = badge;
        parts.push(span);
      }
      if (note) parts.push(document.createTextNode(note));
      meta.replaceChildren(...parts);
    },
    setEnding(ending) {
      if (ending.finish_reason) node.dataset.finishReason = ending.finish_reason;
      this.setState(ending.state, ending.note, ending.badge);
    },
    readable() {
      return role === "assistant" ? readableText(body) : this.text;
    },
  };
  if (role === "user") {
    body.append(document.createTextNode(text));
  } else {
    body.classList.add("markdown");
    view.stream = new MarkdownStream(body, (render) => {
      const follow = nearBottom();
      render();
      if (follow) scrollToEnd(true);
    });
  }
  viewOf.set(node, view);
  return view;
}

function addView(view) {
  empty.hidden = true;
  log.append(view.node);
  return view;
}

function restoredView(message) {
  const view = messageView(message.role, message.content);
  if (message.role === "assistant") {
    view.showMarkdown(message.content);
    if (message.ending) view.setEnding(message.ending);
    else view.setState("done", "");
  }
  return addView(view);
}

function actionButton(className, label, name) {
  const button = document.createElement("button");
  button.type = "button";
  button.className = `action ${className}`;
  button.textContent = label;
  button.setAttribute("aria-label", name);
  return button;
}

/** Copy on every reply; regenerate the last reply and edit your last message when idle. */
function refreshActions() {
  const last = chat.messages.length - 1;
  views.forEach((view, index) => {
    if (view.editing) return;
    const buttons = [];
    if (view.role === "assistant") {
      buttons.push(actionButton("copy-reply", "Copy", "Copy this reply"));
      if (index === last && !active) {
        buttons.push(actionButton("regenerate", "Regenerate", "Regenerate this reply"));
      }
    } else if (index === last - 1 && !active) {
      buttons.push(actionButton("edit", "Edit", "Edit and resend your message"));
    }
    view.actions.replaceChildren(...buttons);
  });
  for (const view of transient) view.actions.replaceChildren();
}

function clearTransient() {
  for (const view of transient) view.node.remove();
  transient = [];
}

// ---- Chats: open, list, save -----------------------------------------------------------------

function blankChat() {
  const now = Date.now();
  return { id: newId(), title: "New chat", renamed: false, created: now, updated: now, messages: [] };
}

function showStorageNote() {
  if (!persistent) {
    storageNote.textContent = "This browser does not let the page keep chats: they last until the page is closed.";
  } else if (!store.ok) {
    storageNote.textContent = "This browser's storage for the page is full: recent changes were not kept. Export or delete old chats.";
  } else {
    storageNote.hidden = true;
    return;
  }
  storageNote.hidden = false;
}

function renderChatList() {
  const items = store.list();
  const nodes = items.map((item) => {
    const li = document.createElement("li");
    const button = document.createElement("button");
    button.type = "button";
    button.className = "chat-link";
    button.dataset.id = item.id;
    button.textContent = item.title;
    if (chat && item.id === chat.id) button.setAttribute("aria-current", "page");
    li.append(button);
    return li;
  });
  chatList.replaceChildren(...nodes);
  chatListEmpty.hidden = items.length > 0;
  showStorageNote();
}

function renderChatHeader() {
  chatTitle.textContent = chat.title;
  const saved = chat.messages.length > 0;
  for (const id of ["rename-chat", "export-json", "export-markdown", "delete-chat"]) {
    $(id).disabled = !saved;
  }
}

function persist(target) {
  if (target.deleted) return;
  target.updated = Date.now();
  if (!target.renamed) target.title = titleFrom(target.messages[0]?.content || "");
  store.save(target);
  if (target === chat) renderChatHeader();
  renderChatList();
}

function openChat(next) {
  if (active) {
    active.abandoned = true; // its chat is no longer shown; it still keeps what came back
    stop();
  }
  closeEdit();
  chat = next;
  views = [];
  transient = [];
  for (const node of log.querySelectorAll(".message")) node.remove();
  for (const message of chat.messages) views.push(restoredView(message));
  empty.hidden = views.length > 0;
  store.setCurrent(chat.messages.length > 0 ? chat.id : null);
  renderChatHeader();
  renderChatList();
  refreshActions();
  scrollToEnd(true);
}

function newChat() {
  openChat(blankChat());
  input.value = "";
  autosize();
  input.focus();
}

function openChatById(id) {
  if (chat && id === chat.id) return;
  const stored = store.load(id);
  if (!stored) {
    renderChatList(); // deleted in another tab
    return;
  }
  openChat(stored);
}

// ---- Model status (GET /healthz) -------------------------------------------------------------

let statusTimer = null;

function showModelStatus(state, label) {
  modelStatus.dataset.state = state;
  modelStatus.querySelector(".label").textContent = label;
}

function setModelName(name) {
  const value = typeof name === "string" && name.trim() ? name.trim().slice(0, 100) : null;
  if (value === modelName) return;
  modelName = value;
  modelNameLabel.textContent = value || "";
  modelNameLabel.hidden = !value;
  for (const role of log.querySelectorAll(".message.assistant .role")) role.textContent = assistantName();
}

async function pollModelStatus() {
  clearTimeout(statusTimer);
  let next = 5000;
  try {
    const response = await fetch("/healthz", { cache: "no-store" });
    const body = await response.json();
    const sidecar = body.sidecar || {};
    setModelName(body.model);
    if (sidecar.ready) {
      showModelStatus("ready", "Model ready");
      next = 30000;
    } else if (sidecar.reachable) {
      const phase = sidecar.detail && typeof sidecar.detail.phase === "string" ? sidecar.detail.phase : "";
      if (phase === "failed") showModelStatus("down", "The model could not be loaded");
      else if (phase === "restarting") showModelStatus("loading", "Model restarting…");
      else showModelStatus("loading", phase ? `Model loading (${phase})…` : "Model loading…");
    } else {
      showModelStatus("down", "Model service not reachable");
    }
  } catch {
    showModelStatus("down", "Chat service not reachable");
  }
  statusTimer = setTimeout(pollModelStatus, next);
}

// ---- One exchange: request, stream, retry, finish --------------------------------------------

function requestBody(messages) {
  const body = { messages, conversation_id: chat.id };
  if (settings.temperature !== null) body.temperature = settings.temperature;
  if (settings.maxNewTokens !== null) body.max_new_tokens = settings.maxNewTokens;
  return body;
}

/** The request for `history`: the system prompt first, then the conversation; its oldest turns
 * go first when it is too big for one request (the model service would leave them out of the
 * model's context anyway). */
function fittedBody(history) {
  const system = settings.system.trim() ? [{ role: "system", content: clean(settings.system) }] : [];
  const encoder = new TextEncoder();
  const fits = (list) =>
    list.length <= MAX_MESSAGES && encoder.encode(JSON.stringify(requestBody(list))).length <= MAX_BYTES * 0.95;
  const kept = [...system, ...history];
  const first = system.length;
  while (kept.length > first + 1 && !fits(kept)) kept.splice(first, 1);
  while (kept.length > first + 1 && kept[first].role !== "user") kept.splice(first, 1);
  return requestBody(kept);
}

function setBusy(busy) {
  sendButton.disabled = busy;
  stopButton.disabled = !busy;
  if (!busy && (document.activeElement === stopButton || document.activeElement === document.body)) {
    input.focus();
  }
}

function autosize() {
  input.style.height = "auto";
  input.style.height = `${input.scrollHeight}px`;
}

/** Send `turn` (the user's message) after the open chat's history; `question` shows it. */
function start(turn, question) {
  clearTransient();
  const exchange = {
    chat,
    turn,
    body: fittedBody([...chat.messages.map(({ role, content }) => ({ role, content })), turn]),
    question,
    reply: addView(messageView("assistant")),
    controller: null,
    timer: null,
    stopped: false,
    finished: false,
  };
  active = exchange;
  setBusy(true);
  refreshActions();
  scrollToEnd(true);
  run(exchange);
}

function submit() {
  if (active) return;
  const text = clean(input.value);
  if (!text.trim()) {
    input.focus();
    return;
  }
  closeEdit();
  input.value = "";
  autosize();
  start({ role: "user", content: text }, addView(messageView("user", text)));
}

async function run(exchange) {
  exchange.controller = new AbortController();
  exchange.reply.setState("streaming", "");
  let response;
  try {
    response = await fetch("/chat", {
      method: "POST",
      headers: { "Content-Type": "application/json", Accept: "application/x-ndjson" },
      body: JSON.stringify(exchange.body),
      signal: exchange.controller.signal,
    });
  } catch {
    finish(exchange, exchange.stopped ? { kind: "stopped" } : { kind: "error", message: UNREACHABLE });
    return;
  }
  if (!response.ok) {
    const error = await readError(response);
    if (exchange.stopped) {
      finish(exchange, { kind: "stopped" });
    } else if (response.status === 503 && RETRIED.has(error.type)) {
      const seconds = parseInt(response.headers.get("Retry-After") || "", 10);
      waitAndRetry(exchange, error.type, Number.isFinite(seconds) && seconds > 0 ? seconds : 5);
    } else {
      finish(exchange, { kind: "error", message: error.message });
    }
    return;
  }
  finish(exchange, await readReply(response, exchange));
}

async function readError(response) {
  try {
    const body = await response.json();
    if (body && body.error && typeof body.error.message === "string") return body.error;
  } catch {
    // Not our JSON envelope (a proxy's page, say): fall through to a generic sentence.
  }
  return { message: `The chat service answered with an error (HTTP ${response.status}).`, type: "http" };
}

/** Errors that heal by waiting: the page counts down Retry-After and sends again. */
const RETRIED = new Map([
  ["loading", "Model loading"],
  ["restarting", "Model restarting"],
  ["busy", "Model busy"],
]);

function waitAndRetry(exchange, type, seconds) {
  const label = RETRIED.get(type) || "Model busy";
  if (type !== "busy") showModelStatus("loading", `${label}…`);
  let left = seconds;
  const tick = () => {
    if (exchange.finished) return;
    if (left <= 0) {
      exchange.timer = null;
      run(exchange);
      return;
    }
    exchange.reply.setState("waiting", `${label}, retrying in ${left} s`);
    left -= 1;
    exchange.timer = setTimeout(tick, 1000);
  };
  tick();
}

/** Reads the NDJSON stream; returns how it ended: done, cut-off or stopped. */
async function readReply(response, exchange) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder("utf-8");
  let buffer = "";
  let ending = null;
  const handle = (line) => {
    if (!line.trim()) return;
    let message;
    try {
      message = JSON.parse(line);
    } catch {
      return; // Not a whole line of ours; the missing done line will mark the reply cut off.
    }
    if (typeof message.delta === "string") {
      exchange.reply.append(message.delta);
    } else if (message.done === true) {
      ending = { kind: "done", stats: message };
    } else if (message.error) {
      ending = { kind: "cut-off", message: String(message.error.message || "The reply broke off.") };
    }
    // {"ping": true} and anything unknown: nothing to show.
  };
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let newline = buffer.indexOf("\n");
      while (newline >= 0) {
        handle(buffer.slice(0, newline));
        buffer = buffer.slice(newline + 1);
        newline = buffer.indexOf("\n");
      }
    }
    buffer += decoder.decode();
    handle(buffer);
  } catch {
    if (exchange.stopped) return { kind: "stopped" };
    return ending || { kind: "cut-off", message: "The connection dropped before the reply was complete." };
  }
  return ending || { kind: "cut-off", message: "The reply ended before it was complete." };
}

const count = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;

/** How a complete reply ended, for its note: the length limit, speed, context. */
function doneEnding(stats) {
  const parts = [];
  if (typeof stats.ttft_ms === "number") {
    parts.push(
      stats.ttft_ms < 1000
        ? `first token ${Math.round(stats.ttft_ms)} ms`
        : `first token ${(stats.ttft_ms / 1000).toFixed(1)} s`,
    );
  }
  if (typeof stats.tokens_per_s === "number") parts.push(`${stats.tokens_per_s.toFixed(1)} tokens/s`);
  if (typeof stats.tokens === "number") parts.push(count(stats.tokens, "token"));
  if (typeof stats.cached_tokens === "number" && stats.cached_tokens > 0 && typeof stats.prompt_tokens === "number") {
    parts.push(`${stats.cached_tokens} of ${count(stats.prompt_tokens, "prompt token")} cached`);
  }
  if (typeof stats.dropped_messages === "number" && stats.dropped_messages > 0) {
    parts.push(`${count(stats.dropped_messages, "earlier message")} left out to fit the model's context`);
  }
  const ending = { state: "done", note: parts.join(" · "), badge: "" };
  if (stats.finish_reason === "stop" || stats.finish_reason === "length") ending.finish_reason = stats.finish_reason;
  if (stats.finish_reason === "length") ending.badge = "Stopped at the length limit";
  return ending;
}

function finish(exchange, outcome) {
  if (exchange.finished) return;
  exchange.finished = true;
  clearTimeout(exchange.timer);
  const { reply, question, turn, chat: owner } = exchange;
  const shown = owner === chat && !exchange.abandoned;
  const answered = reply.text.length > 0;
  let ending = null;
  if (outcome.kind === "done") {
    ending = doneEnding(outcome.stats);
  } else if (outcome.kind === "stopped") {
    const note = answered ? "" : "Stopped before the reply started.";
    ending = { state: "stopped", note, badge: "Stopped", finish_reason: "cancelled" };
  } else if (outcome.kind === "cut-off" && answered) {
    ending = { state: "cut-off", note: outcome.message, badge: "Cut off" };
  }
  if (outcome.kind === "done" || answered) {
    reply.complete();
    reply.setEnding(ending);
    owner.messages.push(turn, { role: "assistant", content: reply.text, ending });
    if (shown) views.push(question, reply);
    persist(owner);
    const said = ending.badge ? ` ${ending.badge}.` : "";
    announce(`${assistantName()} replied: ${reply.readable() || "(nothing)"}${said}`);
  } else {
    if (ending) {
      reply.setEnding(ending);
      announce("Stopped before the reply started.");
    } else {
      reply.showError(outcome.message);
      reply.setState("error", "", "Error");
      announce(outcome.message);
    }
    if (shown) {
      // Nothing came back: the message is not part of the conversation. Offer it again.
      transient.push(question, reply);
      question.setState("unsent", "Not sent; your message is back in the box.");
      if (!input.value) {
        input.value = turn.content;
        autosize();
      }
    }
  }
  if (active === exchange) {
    active = null;
    setBusy(false);
  }
  if (shown) refreshActions();
  scrollToEnd(false);
}

function stop() {
  const exchange = active;
  if (!exchange) return;
  exchange.stopped = true;
  if (exchange.timer !== null) {
    finish(exchange, { kind: "stopped" }); // waiting to retry: nothing in flight
  } else {
    exchange.controller.abort();
  }
}

/** Send the last message again for a new reply (the old reply goes). */
function regenerate() {
  if (active || chat.messages.length < 2) return;
  const reply = views.pop();
  const question = views.pop();
  chat.messages.pop();
  const turn = chat.messages.pop();
  reply.node.remove();
  question.setState("", "");
  persist(chat);
  start({ role: "user", content: turn.content }, question);
}

// ---- Editing the last message ----------------------------------------------------------------

let editing = null;

function closeEdit() {
  if (!editing) return;
  const { view, editor } = editing;
  editor.remove();
  view.node.querySelector(".bubble").hidden = false;
  view.editing = false;
  editing = null;
  if (chat) refreshActions();
}

function startEdit(view) {
  if (active) return;
  closeEdit();
  const editor = document.createElement("form");
  editor.className = "edit-form";
  const label = document.createElement("label");
  label.className = "visually-hidden";
  label.htmlFor = "edit-box";
  label.textContent = "Edit your message";
  const area = document.createElement("textarea");
  area.id = "edit-box";
  area.value = view.text;
  area.rows = Math.min(10, view.text.split("\n").length + 1);
  const buttons = document.createElement("div");
  buttons.className = "edit-actions";
  const cancel = document.createElement("button");
  cancel.type = "button";
  cancel.className = "button secondary";
  cancel.textContent = "Cancel";
  const send = document.createElement("button");
  send.type = "submit";
  send.className = "button primary";
  send.textContent = "Send";
  buttons.append(cancel, send);
  editor.append(label, area, buttons);
  view.node.querySelector(".bubble").hidden = true;
  view.node.querySelector(".bubble").after(editor);
  view.editing = true;
  view.actions.replaceChildren();
  editing = { view, editor };

  const done = () => {
    closeEdit();
    view.node.querySelector(".message-actions .edit")?.focus();
  };
  cancel.addEventListener("click", done);
  area.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing && event.keyCode !== 229) {
      event.preventDefault();
      editor.requestSubmit();
    } else if (event.key === "Escape") {
      event.preventDefault();
      event.stopPropagation();
      done();
    }
  });
  editor.addEventListener("submit", (event) => {
    event.preventDefault();
    const text = clean(area.value);
    if (!text.trim()) {
      area.focus();
      return;
    }
    resend(view, text);
  });
  area.focus();
  area.setSelectionRange(area.value.length, area.value.length);
}

/** Replace the last message (and its reply) with `text`, and send it. */
function resend(view, text) {
  if (active) return;
  const index = views.indexOf(view);
  if (index < 0) return;
  closeEdit();
  for (const old of views.splice(index)) old.node.remove();
  chat.messages.splice(index);
  persist(chat);
  input.focus();
  start({ role: "user", content: text }, addView(messageView("user", text)));
}

// ---- Export, rename, delete ------------------------------------------------------------------

function download(filename, type, text) {
  const url = URL.createObjectURL(new Blob([text], { type }));
  const link = document.createElement("a");
  link.href = url;
  link.download = filename;
  link.hidden = true;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

function fileName(extension) {
  const slug = chat.title
    .toLowerCase()
    .normalize("NFKD")
    .replace(/[^a-z0-9]+/g, "-")
    .replace(/^-+|-+$/g, "")
    .slice(0, 60);
  return `${slug || "chat"}.${extension}`;
}

function exportJson() {
  const data = {
    format: "chat-export",
    version: 1,
    id: chat.id,
    title: chat.title,
    created: new Date(chat.created).toISOString(),
    updated: new Date(chat.updated).toISOString(),
    model: modelName,
    messages: chat.messages.map(({ role, content, ending }) => {
      const message = { role, content };
      if (ending && ending.finish_reason) message.finish_reason = ending.finish_reason;
      return message;
    }),
  };
  download(fileName("json"), "application/json", `${JSON.stringify(data, null, 2)}\n`);
}

function exportMarkdown() {
  const parts = [`# ${chat.title}`];
  for (const message of chat.messages) {
    const who = message.role === "user" ? "You" : assistantName();
    let section = `## ${who}\n\n${message.content.trim()}`;
    if (message.ending && message.ending.badge) section += `\n\n_(${message.ending.badge.toLowerCase()})_`;
    parts.push(section);
  }
  download(fileName("md"), "text/markdown", `${parts.join("\n\n")}\n`);
}

function showDialog(dialog, opener) {
  dialog.returnFocusTo = opener;
  dialog.showModal();
}

function closeDialog(dialog) {
  dialog.close();
}

for (const dialog of document.querySelectorAll("dialog")) {
  // The close event comes a moment after close(): by then the focus may have moved on.
  dialog.addEventListener("close", () => {
    const focused = document.activeElement;
    if (focused && focused !== document.body && !dialog.contains(focused)) return;
    const target = dialog.returnFocusTo;
    if (target && target.isConnected && !target.disabled) target.focus();
    else input.focus();
  });
}

function renameChat() {
  const dialog = $("rename-dialog");
  const field = $("rename-input");
  field.value = chat.title;
  showDialog(dialog, chatMenu.querySelector("summary"));
  field.select();
}

$("rename-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const title = $("rename-input").value.replace(/\s+/g, " ").trim().slice(0, TITLE_MAX);
  if (!title) {
    $("rename-input").focus();
    return;
  }
  chat.title = title;
  chat.renamed = true;
  persist(chat);
  closeDialog($("rename-dialog"));
  announce(`Chat renamed to ${title}.`);
});
$("rename-cancel").addEventListener("click", () => closeDialog($("rename-dialog")));

function deleteChat() {
  $("delete-text").textContent = `“${chat.title}” and its messages will be removed from this browser.`;
  showDialog($("delete-dialog"), chatMenu.querySelector("summary"));
  $("delete-cancel").focus();
}

$("delete-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const doomed = chat;
  if (active && active.chat === doomed) stop();
  doomed.deleted = true;
  store.remove(doomed.id);
  $("delete-dialog").returnFocusTo = input;
  closeDialog($("delete-dialog"));
  const next = store.list()[0];
  openChat((next && store.load(next.id)) || blankChat());
  announce(`Deleted the chat “${doomed.title}”.`);
});
$("delete-cancel").addEventListener("click", () => closeDialog($("delete-dialog")));

// ---- Settings --------------------------------------------------------------------------------

const settingsDialog = $("settings-dialog");
const settingsForm = $("settings-form");
const systemField = $("setting-system");
const temperatureField = $("setting-temperature");
const tokensField = $("setting-max-tokens");
const settingsError = $("settings-error");

function renderSettingsSummary() {
  const parts = [];
  if (settings.system.trim()) parts.push("system prompt on");
  if (settings.temperature !== null) parts.push(`temperature ${settings.temperature}`);
  if (settings.maxNewTokens !== null) parts.push(`up to ${count(settings.maxNewTokens, "token")}`);
  $("settings-summary").textContent = parts.length ? ` · ${parts.join(", ")}` : "";
}

function openSettings() {
  systemField.value = settings.system;
  temperatureField.value = settings.temperature === null ? "" : String(settings.temperature);
  tokensField.value = settings.maxNewTokens === null ? "" : String(settings.maxNewTokens);
  settingsError.hidden = true;
  for (const field of [temperatureField, tokensField]) field.removeAttribute("aria-invalid");
  showDialog(settingsDialog, $("open-settings"));
  systemField.focus();
}

function readNumber(field, { min, max, integer, name }) {
  const raw = field.value.trim();
  field.removeAttribute("aria-invalid");
  if (raw === "" && !field.validity.badInput) return { value: null };
  const value = Number(raw);
  if (raw === "" || !Number.isFinite(value) || value < min || value > max || (integer && !Number.isInteger(value))) {
    field.setAttribute("aria-invalid", "true");
    return { error: `${name} must be ${integer ? "a whole number" : "a number"} from ${min} to ${max}, or empty.` };
  }
  return { value };
}

settingsForm.addEventListener("submit", (event) => {
  event.preventDefault();
  const temperature = readNumber(temperatureField, { min: 0, max: 2, integer: false, name: "Temperature" });
  const tokens = readNumber(tokensField, { min: 1, max: TOKENS_LIMIT, integer: true, name: "Max reply length" });
  const error = temperature.error || tokens.error;
  if (error) {
    settingsError.textContent = error;
    settingsError.hidden = false;
    (temperature.error ? temperatureField : tokensField).focus();
    return;
  }
  settings = { system: clean(systemField.value), temperature: temperature.value, maxNewTokens: tokens.value };
  store.saveSettings(settings);
  showStorageNote();
  renderSettingsSummary();
  closeDialog(settingsDialog);
  announce("Settings saved.");
});
$("settings-cancel").addEventListener("click", () => closeDialog(settingsDialog));
$("settings-reset").addEventListener("click", () => {
  systemField.value = "";
  temperatureField.value = "";
  tokensField.value = "";
  settingsError.hidden = true;
  systemField.focus();
});

// ---- The chat list on a phone: a drawer ------------------------------------------------------

const narrow = window.matchMedia("(max-width: 52rem)");

function setSidebar(open) {
  const toggle = $("open-sidebar");
  document.body.classList.toggle("sidebar-open", open);
  toggle.setAttribute("aria-expanded", String(open));
  $("main").inert = open && narrow.matches;
  if (open) {
    (chatList.querySelector("[aria-current]") || $("close-sidebar")).focus();
  } else if (narrow.matches && $("sidebar").contains(document.activeElement)) {
    toggle.focus();
  }
}

// ---- Wiring ----------------------------------------------------------------------------------

form.addEventListener("submit", (event) => {
  event.preventDefault();
  submit();
});
input.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing && event.keyCode !== 229) {
    event.preventDefault();
    submit();
  }
});
input.addEventListener("input", autosize);
stopButton.addEventListener("click", stop);
$("new-chat").addEventListener("click", newChat);
$("open-settings").addEventListener("click", openSettings);
$("open-sidebar").addEventListener("click", () => setSidebar(!document.body.classList.contains("sidebar-open")));
$("close-sidebar").addEventListener("click", () => setSidebar(false));
narrow.addEventListener("change", () => setSidebar(false));

chatList.addEventListener("click", (event) => {
  const button = event.target.closest(".chat-link");
  if (!button) return;
  openChatById(button.dataset.id);
  if (narrow.matches) setSidebar(false);
  input.focus();
});

function closeMenu() {
  chatMenu.open = false;
}
for (const [id, action] of [
  ["rename-chat", renameChat],
  ["export-json", exportJson],
  ["export-markdown", exportMarkdown],
  ["delete-chat", deleteChat],
]) {
  $(id).addEventListener("click", () => {
    closeMenu();
    action();
  });
}
document.addEventListener("click", (event) => {
  if (chatMenu.open && !chatMenu.contains(event.target)) closeMenu();
  // On a phone, a tap beside the open chat list closes it.
  const sidebar = $("sidebar");
  if (document.body.classList.contains("sidebar-open") && !sidebar.contains(event.target)) {
    if (!$("open-sidebar").contains(event.target)) setSidebar(false);
  }
});
chatMenu.addEventListener("keydown", (event) => {
  if (event.key === "Escape" && chatMenu.open) {
    event.preventDefault();
    event.stopPropagation();
    closeMenu();
    chatMenu.querySelector("summary").focus();
  }
});
chatMenu.addEventListener("focusout", (event) => {
  if (chatMenu.open && !chatMenu.contains(event.relatedTarget)) closeMenu();
});

log.addEventListener("click", (event) => {
  const target = event.target.closest("button");
  if (!target) return;
  const view = viewOf.get(target.closest(".message"));
  if (target.classList.contains("copy-code")) {
    const code = target.closest(".code-block").querySelector("pre");
    copyFrom(target, code.textContent);
  } else if (view && target.classList.contains("copy-reply")) {
    copyFrom(target, view.text);
  } else if (view && target.classList.contains("regenerate")) {
    regenerate();
  } else if (view && target.classList.contains("edit")) {
    startEdit(view);
  }
});

document.addEventListener("keydown", (event) => {
  if (event.key !== "Escape" || event.defaultPrevented || document.querySelector("dialog[open]")) return;
  if (document.body.classList.contains("sidebar-open") && narrow.matches) {
    setSidebar(false);
  } else if (active) {
    event.preventDefault();
    stop();
  }
});

// Another tab changed the saved chats: show the new list.
window.addEventListener("storage", (event) => {
  if (event.key === null || event.key.startsWith("chat.v1.")) renderChatList();
});

// Leaving in the middle of a reply keeps the part received, marked as cut off.
window.addEventListener("pagehide", () => {
  const exchange = active;
  if (!exchange || exchange.finished || !exchange.reply.text) return;
  exchange.finished = true;
  const ending = { state: "cut-off", note: "The page was closed before the reply was complete.", badge: "Cut off" };
  exchange.chat.messages.push(exchange.turn, { role: "assistant", content: exchange.reply.text, ending });
  persist(exchange.chat);
});

const last = store.current();
openChat((last && store.load(last)) || blankChat());
renderSettingsSummary();
pollModelStatus();
input.focus();

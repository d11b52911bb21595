// One exchange: POST /chat, the NDJSON reply stream (chatapp/relay/wire.py), retries after
// Retry-After, and how the reply ended. The model it asks (model-picker.js) is kept with the
// reply.
import { restoreImages } from "./attachments.js";
import { persist, showStorageNote } from "./chats.js";
import { dataUrl } from "./images.js";
import { keepImage, loadImage } from "./image-store.js";
import { chatModel, refreshModels } from "./model-picker.js";
import {
  $,
  announce,
  autosize,
  clean,
  count,
  input,
  MAX_BYTES,
  MAX_IMAGES,
  MAX_MESSAGES,
  scrollToEnd,
  sendButton,
  stopButton,
  UNREACHABLE,
} from "./page.js";
import { assistantName, state, store } from "./state.js";
import { modelName } from "./store.js";
import { loadingText, progressText } from "./sources.js";
import { showModelStatus } from "./status.js";
import { addView, clearTransient, messageView, refreshActions } from "./views.js";

const useDocuments = $("use-documents");
const CHANGED_ELSEWHERE =
  "The chat could not be changed on the server: it changed elsewhere (another tab?). Reload the page to see it as kept.";

function requestBody(messages, chat, model) {
  // A chat the server keeps goes on from its stored turns: only the new message is sent.
  const body = chat.onServer ? { messages, chat_id: chat.id } : { messages, conversation_id: chat.id };
  if (model) body.model = model;
  if (useDocuments.checked) body.documents = true;
  if (state.settings.temperature !== null) body.temperature = state.settings.temperature;
  if (state.settings.maxNewTokens !== null) body.max_new_tokens = state.settings.maxNewTokens;
  return body;
}

/** A message as POST /chat takes it: its text, or with images OpenAI's content parts, the
 * images first (Phi-3-vision's own convention). An image this browser no longer keeps is left
 * out (its message says so on the page). */
async function wireMessage({ role, content, images, grounding }) {
  // A grounded turn goes back with the passages it was sent with (chatapp/documents/search/grounding.py),
  // so the model service's conversation cache finds the same prompt.
  if (grounding) return { ...(await wireMessage({ role, content, images })), grounding };
  if (!images?.length) return { role, content };
  const urls = [];
  for (const meta of images) {
    const image = await loadImage(meta.id);
    if (image) urls.push(await dataUrl(image));
  }
  if (!urls.length) return { role, content };
  const parts = urls.map((url) => ({ type: "image_url", image_url: { url } }));
  if (content) parts.push({ type: "text", text: content });
  return { role, content: parts };
}

const isImage = (part) => part.type === "image_url";

/** `message` with its image URLs emptied: what the app counts against MAX_BYTES. */
function textPart(message) {
  if (!Array.isArray(message.content)) return message;
  const content = message.content.map((part) => (isImage(part) ? { ...part, image_url: { url: "" } } : part));
  return { ...message, content };
}

/** The messages to send: a turn left empty (an image alone, no longer kept) goes, and the
 * reply to it. */
function sendable(messages) {
  const kept = [];
  for (let index = 0; index < messages.length; index += 1) {
    const message = messages[index];
    if (message.role === "user" && message.content === "" && index < messages.length - 1) {
      if (messages[index + 1].role === "assistant") index += 1;
      continue;
    }
    kept.push(message);
  }
  return kept;
}

/** The request for `history`: the system prompt first, then the conversation; its oldest turns
 * go first when it is too big for one request (the model service would leave them out of the
 * model's context anyway), or holds more images than the app takes. The app counts the text
 * (the body less its image URLs) against MAX_BYTES (chatapp/relay/images.py); each image was checked
 * against MAX_IMAGE_BYTES when it was attached. */
async function fittedBody(history, chat, model) {
  const system = state.settings.system.trim() ? [{ role: "system", content: clean(state.settings.system) }] : [];
  const encoder = new TextEncoder();
  const fits = (list) => {
    const images = list.reduce((sum, m) => sum + (Array.isArray(m.content) ? m.content.filter(isImage).length : 0), 0);
    const text = encoder.encode(JSON.stringify(requestBody(list.map(textPart), chat, model))).length;
    return list.length <= MAX_MESSAGES && images <= MAX_IMAGES && text <= MAX_BYTES * 0.95;
  };
  const kept = [...system, ...sendable(await Promise.all(history.map(wireMessage)))];
  const first = system.length;
  while (kept.length > first + 1 && !fits(kept)) kept.splice(first, 1);
  while (kept.length > first + 1 && kept[first].role !== "user") kept.splice(first, 1);
  return requestBody(kept, chat, model);
}

export function setBusy(busy) {
  sendButton.disabled = busy;
  stopButton.disabled = !busy;
  if (!busy && (document.activeElement === stopButton || document.activeElement === document.body)) {
    input.focus();
  }
}

/** Send `turn` (the user's message: {role, content, images?}) after the open chat's history;
 * `question` shows it. Its images are kept with the chat from now on (image-store.js). `cut`:
 * the server cutting its copy of the chat back (edit, regenerate), awaited before sending. */
export function start(turn, question, cut = null) {
  clearTransient();
  const chat = state.chat;
  for (const meta of turn.images || []) {
    loadImage(meta.id).then((image) => image && keepImage(image, chat.id).then(showStorageNote));
  }
  const exchange = {
    chat,
    turn,
    history: [...chat.messages, turn],
    body: null,
    model: chatModel(), // the same for its retries
    question,
    reply: addView(messageView("assistant")),
    controller: null,
    timer: null,
    stopped: false,
    finished: false,
    cut,
  };
  exchange.reply.model = exchange.model;
  state.active = exchange;
  setBusy(true);
  refreshActions();
  scrollToEnd(true);
  run(exchange);
}

async function run(exchange) {
  exchange.controller = new AbortController();
  exchange.reply.setState("streaming", "");
  try {
    if (store.server && !exchange.chat.onServer) await store.create(exchange.chat);
  } catch {
    finish(exchange, { kind: "error", message: "The chat could not be kept on the server; try again." });
    return;
  }
  try {
    await exchange.cut;
  } catch {
    finish(exchange, exchange.stopped ? { kind: "stopped" } : { kind: "error", message: CHANGED_ELSEWHERE });
    return;
  }
  if (exchange.finished) return; // stopped while the server cut the chat
  const history = exchange.chat.onServer ? [exchange.turn] : exchange.history;
  try {
    exchange.body ??= JSON.stringify(await fittedBody(history, exchange.chat, exchange.model));
  } catch {
    finish(exchange, { kind: "error", message: "The images of this chat could not be read; attach them again." });
    return;
  }
  if (exchange.finished) return; // stopped while the images were read
  let response;
  try {
    response = await fetch("/chat", {
      method: "POST",
      headers: { "Content-Type": "application/json", Accept: "application/x-ndjson" },
      body: exchange.body,
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
  const outcome = await readReply(response, exchange);
  if (outcome.kind === "retry" && !exchange.stopped) {
    waitAndRetry(exchange, outcome.type, outcome.seconds); // a grounded turn's refusal in its stream
    return;
  }
  finish(exchange, outcome);
}

async function readError(response) {
  try {
    const body = await response.json();
    if (body?.error && typeof body.error.message === "string") return body.error;
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
    } else if (Array.isArray(message.sources)) {
      exchange.sources = message.sources; // before the model is asked: shown at once
      exchange.reply.showSources(message.sources);
    } else if (message.loading && typeof message.loading.model === "string") {
      if (exchange.reply.text) return;
      const text = loadingText(message.loading); // a cold model loads first (model-picker.js)
      exchange.reply.showProgress(text);
      if (!exchange.announcedLoading) announce(text);
      exchange.announcedLoading = true;
    } else if (message.progress && typeof message.progress.read === "number") {
      if (exchange.reply.text) return;
      const text = progressText(message.progress, exchange.sources);
      exchange.reply.showProgress(text);
      // Said once, not every second (the line itself is no live region)
      if (!exchange.announcedReading) announce(text);
      exchange.announcedReading = true;
    } else if (message.done === true) {
      ending = { kind: "done", stats: message };
    } else if (message.error) {
      const { type, retry_after: seconds } = message.error;
      if (RETRIED.has(type) && Number.isInteger(seconds) && seconds > 0 && !exchange.reply.text) {
        ending = { kind: "retry", type, seconds };
      } else {
        ending = { kind: "cut-off", message: String(message.error.message || "The reply broke off.") };
      }
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
  // Passages the model had read before (the passage store): what made a grounded reply quick
  if (typeof stats.passage_cached_tokens === "number" && stats.passage_cached_tokens > 0) {
    parts.push(`${count(stats.passage_cached_tokens, "token")} of passages read before`);
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
  const shown = exchange.chat === state.chat && !exchange.abandoned;
  try {
    settle(exchange, outcome, shown);
  } finally {
    // Whatever the reply holds, the exchange is over: the page takes the next message.
    if (state.active === exchange) {
      state.active = null;
      setBusy(false);
    }
  }
  if (shown) refreshActions();
  scrollToEnd(false);
  refreshModels(); // a cold model is loaded now; a model taken out is no longer offered
}

/** Keep the reply (or offer the message again) and show how it ended. */
function settle(exchange, outcome, shown) {
  const { reply, question, turn, chat: owner } = exchange;
  const answered = reply.text.length > 0;
  reply.hideProgress();
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
    // Kept first: the reply belongs to the chat whatever rendering its end does.
    const answer = { role: "assistant", content: reply.text, ending };
    const stats = outcome.kind === "done" ? outcome.stats : {};
    // The model that answered: the done line's, else the one asked; the chat keeps it.
    const model = modelName(stats.model) || exchange.model;
    if (model) {
      answer.model = model;
      owner.model ??= model;
    }
    reply.model = model || null;
    if (typeof stats.grounding === "string") turn.grounding = stats.grounding;
    if (Array.isArray(stats.citations)) answer.citations = stats.citations;
    if (exchange.sources) answer.sources = exchange.sources;
    owner.messages.push(turn, answer);
    if (shown) state.views.push(question, reply);
    persist(owner);
    reply.complete();
    reply.linkCitations(answer.citations);
    reply.markCited(answer.citations);
    reply.setEnding(ending);
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
      state.transient.push(question, reply);
      question.setState("unsent", "Not sent; your message is back in the box.");
      if (!input.value) {
        input.value = turn.content;
        autosize();
      }
      restoreTurnImages(turn);
    }
  }
}

export function stop() {
  const exchange = state.active;
  if (!exchange) return;
  exchange.stopped = true;
  if (exchange.timer !== null) {
    finish(exchange, { kind: "stopped" }); // waiting to retry: nothing in flight
  } else {
    exchange.controller.abort();
  }
}

/** Send the last message again for a new reply (the old reply goes). */
export function regenerate() {
  if (state.active || state.chat.messages.length < 2) return;
  // A chat the server keeps is cut there too (server-chats.js), before the question is sent again.
  const cut = store.server && state.chat.onServer ? store.cut(state.chat, state.chat.messages.length - 2) : null;
  const reply = state.views.pop();
  const question = state.views.pop();
  state.chat.messages.pop();
  const turn = state.chat.messages.pop();
  reply.node.remove();
  question.setState("", "");
  persist(state.chat);
  start(turn, question, cut);
}

/** A message that was not sent: its images go back to the composer with its text. */
async function restoreTurnImages(turn) {
  const images = [];
  for (const meta of turn.images || []) {
    const image = await loadImage(meta.id);
    if (image) images.push(image);
  }
  restoreImages(images);
}

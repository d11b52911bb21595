// The chat page. Talks to POST /chat and reads the NDJSON reply stream described in
// chatapp/wire.py. Model output is only ever inserted as text (text nodes), never as HTML.
"use strict";

(() => {
  const $ = (id) => document.getElementById(id);
  const log = $("log");
  const empty = $("empty");
  const form = $("composer");
  const input = $("prompt");
  const sendButton = $("send");
  const stopButton = $("stop");
  const newChatButton = $("new-chat");
  const modelStatus = $("model-status");
  const template = $("message-template");

  const UNREACHABLE = "The chat service is not reachable. Check your connection and try again.";
  const MAX_BYTES = Number(document.body.dataset.maxRequestBytes) || 65536;
  const MAX_MESSAGES = Number(document.body.dataset.maxMessages) || 200;
  const CONTROL_CHARS = /[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f-\u009f]/g;

  /** Completed turns, sent with every message: [{role, content}]. */
  let history = [];
  /** Bumped by "New chat" so that a reply still finishing cannot touch the new history. */
  let conversation = 0;
  /** The exchange in flight, or null. */
  let active = null;

  // ---- Rendering ---------------------------------------------------------------------------

  function nearBottom() {
    return window.innerHeight + window.scrollY >= document.documentElement.scrollHeight - 96;
  }

  function scrollToEnd(force) {
    if (force || nearBottom()) window.scrollTo(0, document.documentElement.scrollHeight);
  }

  function addMessage(role, text) {
    const node = template.content.firstElementChild.cloneNode(true);
    node.classList.add(role);
    node.querySelector(".role").textContent = role === "user" ? "You" : "Phi-3";
    const textNode = document.createTextNode(text);
    node.querySelector(".text").append(textNode);
    const meta = node.querySelector(".meta");
    empty.hidden = true;
    log.append(node);
    scrollToEnd(true);
    return {
      node,
      text,
      append(delta) {
        const follow = nearBottom();
        this.text += delta;
        textNode.appendData(delta);
        if (follow) scrollToEnd(true);
      },
      replaceText(value) {
        this.text = value;
        textNode.data = value;
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
    };
  }

  function formatStats(stats) {
    const parts = [];
    if (typeof stats.ttft_ms === "number") {
      parts.push(
        stats.ttft_ms < 1000
          ? `first token ${Math.round(stats.ttft_ms)} ms`
          : `first token ${(stats.ttft_ms / 1000).toFixed(1)} s`,
      );
    }
    if (typeof stats.tokens_per_s === "number") parts.push(`${stats.tokens_per_s.toFixed(1)} tokens/s`);
    if (typeof stats.tokens === "number") parts.push(`${stats.tokens} token${stats.tokens === 1 ? "" : "s"}`);
    if (stats.finish_reason === "length") parts.push("stopped at the length limit");
    if (stats.dropped_messages > 0) {
      const n = stats.dropped_messages;
      parts.push(`${n} earlier message${n === 1 ? "" : "s"} left out to fit the model's context`);
    }
    return parts.join(" · ");
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

  // ---- Model status (GET /healthz) ---------------------------------------------------------

  let statusTimer = null;

  function showModelStatus(state, label) {
    modelStatus.dataset.state = state;
    modelStatus.querySelector(".label").textContent = label;
  }

  async function pollModelStatus() {
    clearTimeout(statusTimer);
    let next = 5000;
    try {
      const response = await fetch("/healthz", { cache: "no-store" });
      const body = await response.json();
      const sidecar = body.sidecar || {};
      if (sidecar.ready) {
        showModelStatus("ready", "Model ready");
        next = 30000;
      } else if (sidecar.reachable) {
        const phase = sidecar.detail && typeof sidecar.detail.phase === "string" ? sidecar.detail.phase : "";
        showModelStatus("loading", phase ? `Model loading (${phase})…` : "Model loading…");
      } else {
        showModelStatus("down", "Model service not reachable");
      }
    } catch {
      showModelStatus("down", "Chat service not reachable");
    }
    statusTimer = setTimeout(pollModelStatus, next);
  }

  // ---- One exchange: request, stream, retry, finish ----------------------------------------

  /** The conversation to send: the oldest turns go first when it is too big for one request
   * (the model service would leave them out of the model's context anyway). */
  function fitted(messages) {
    const encoder = new TextEncoder();
    const fits = (list) =>
      list.length <= MAX_MESSAGES &&
      encoder.encode(JSON.stringify({ messages: list })).length <= MAX_BYTES * 0.95;
    const kept = [...messages];
    const first = kept[0] && kept[0].role === "system" ? 1 : 0;
    while (kept.length > first + 1 && !fits(kept)) kept.splice(first, 1);
    while (kept.length > first + 1 && kept[first].role !== "user") kept.splice(first, 1);
    return kept;
  }

  function submit() {
    if (active) return;
    // Control characters are invisible, and the model service refuses them.
    const text = input.value.replace(CONTROL_CHARS, "");
    if (!text.trim()) {
      input.focus();
      return;
    }
    input.value = "";
    autosize();
    const turn = { role: "user", content: text };
    const exchange = {
      conversation,
      turn,
      messages: fitted([...history, turn]),
      question: addMessage("user", text),
      reply: addMessage("assistant", ""),
      controller: null,
      timer: null,
      stopped: false,
      finished: false,
    };
    active = exchange;
    setBusy(true);
    run(exchange);
  }

  async function run(exchange) {
    exchange.controller = new AbortController();
    exchange.reply.setState("streaming", "");
    let response;
    try {
      response = await fetch("/chat", {
        method: "POST",
        headers: { "Content-Type": "application/json", Accept: "application/x-ndjson" },
        body: JSON.stringify({ messages: exchange.messages }),
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
      } else if (response.status === 503 && (error.type === "loading" || error.type === "busy")) {
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

  function waitAndRetry(exchange, type, seconds) {
    if (type === "loading") showModelStatus("loading", "Model loading…");
    const label = type === "loading" ? "Model loading" : "Model busy";
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
        ending = { kind: "cut-off", message: message.error.message };
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

  function finish(exchange, outcome) {
    if (exchange.finished) return;
    exchange.finished = true;
    clearTimeout(exchange.timer);
    const { reply, question, turn } = exchange;
    const current = exchange.conversation === conversation;
    const answered = reply.text.length > 0;
    if (current && (outcome.kind === "done" || answered)) {
      history.push(turn, { role: "assistant", content: reply.text });
    }
    if (outcome.kind === "done") {
      reply.setState("done", formatStats(outcome.stats));
    } else if (outcome.kind === "stopped") {
      reply.setState("stopped", answered ? "" : "Stopped before the reply started.", "Stopped");
    } else if (outcome.kind === "cut-off" && answered) {
      reply.setState("cut-off", outcome.message, "Cut off");
    } else {
      reply.replaceText(outcome.message);
      reply.setState("error", "", "Error");
    }
    if (current && !answered && outcome.kind !== "done") {
      // Nothing came back: the message is not part of the conversation. Offer it again.
      question.setState("unsent", "Not sent; your message is back in the box.");
      if (!input.value) {
        input.value = turn.content;
        autosize();
      }
    }
    if (active === exchange) {
      active = null;
      setBusy(false);
    }
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

  function newChat() {
    if (active) {
      active.conversation = -1;
      stop();
    }
    conversation += 1;
    history = [];
    for (const node of log.querySelectorAll(".message")) node.remove();
    empty.hidden = false;
    input.value = "";
    autosize();
    input.focus();
  }

  // ---- Wiring ------------------------------------------------------------------------------

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    submit();
  });
  input.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing && event.keyCode !== 229) {
      event.preventDefault();
      submit();
    } else if (event.key === "Escape" && active) {
      event.preventDefault();
      stop();
    }
  });
  input.addEventListener("input", autosize);
  stopButton.addEventListener("click", stop);
  newChatButton.addEventListener("click", newChat);

  pollModelStatus();
  input.focus();
})();

// Chats kept on the server, per signed-in user (chatapp/chats/api.py): the same methods as the
// browser's Store (store.js) for the rest of the page, over an in-memory copy of what the
// server said. The server stores each turn itself when POST /chat with a chat_id ends, so
// saving here only names a chat (PATCH) and keeps the list in order; each reply's model is
// stored with it, and a chat goes on with its last reply's. Everything it returns is
// checked like input (cleanChat), exactly like chats read back from localStorage.
import { remember } from "./image-store.js";
import { cleanChat, newId } from "./store.js";

const JSON_HEADERS = { "Content-Type": "application/json" };

/** GET /api/me: {auth_mode, server_chats, user}; null when the app does not say. */
export async function whoAmI() {
  try {
    const response = await fetch("/api/me", { headers: { Accept: "application/json" } });
    return response.ok ? await response.json() : null;
  } catch {
    return null;
  }
}

async function call(method, path, body) {
  const init = { method, headers: { Accept: "application/json" } };
  if (body !== undefined) {
    init.headers = { ...init.headers, ...JSON_HEADERS };
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  if (!response.ok) throw Object.assign(new Error(`HTTP ${response.status}`), { status: response.status });
  return response.status === 204 ? null : response.json();
}

const millis = (iso) => {
  const value = Date.parse(iso);
  return Number.isFinite(value) ? value : Date.now();
};

/** A data: URL's image as image-store.js holds one (in memory, for this page's life). */
function imageFrom(url) {
  const match = /^data:(image\/[a-z]+);base64,([A-Za-z0-9+/=]+)$/.exec(url);
  if (!match) return null;
  const bytes = Uint8Array.from(atob(match[2]), (c) => c.charCodeAt(0));
  const image = { id: newId(), type: match[1], blob: new Blob([bytes], { type: match[1] }), width: 0, height: 0, name: "" };
  remember(image);
  return image;
}

/** How a stored reply ended (its `finish`), as the page shows endings. */
function endingOf(finish) {
  if (finish === "stop") return { state: "done", note: "", badge: "", finish_reason: "stop" };
  if (finish === "length") return { state: "done", note: "", badge: "Stopped at the length limit", finish_reason: "length" };
  if (finish === "client_gone") return { state: "stopped", note: "", badge: "Stopped", finish_reason: "cancelled" };
  return { state: "cut-off", note: "The reply broke off before it was complete.", badge: "Cut off" };
}

const ROLES_SHOWN = new Set(["user", "assistant"]);
const pause = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** The server's positions of the messages the page does not show (an API client's system
 * messages), so the page's message i can be named by the server's position. */
function hiddenPositions(chat) {
  const messages = Array.isArray(chat.messages) ? chat.messages : [];
  return messages.flatMap((message, position) => (ROLES_SHOWN.has(message?.role) ? [] : [position]));
}

/** The server's chat in the page's own form. */
function pageChat(chat) {
  const shown = (Array.isArray(chat.messages) ? chat.messages : []).filter((message) => ROLES_SHOWN.has(message?.role));
  const messages = shown.map((message) => {
    const out = { role: message.role, content: message.content };
    if (message.role === "assistant") out.ending = endingOf(message.finish);
    // A grounded reply's citations (its [n] chips) and every source it was given, as stored
    // with it: listed under the reply, the cited ones marked, as a browser-kept chat shows them.
    if (Array.isArray(message.citations)) out.citations = message.citations;
    if (Array.isArray(message.sources)) out.sources = message.sources;
    if (message.role === "assistant" && message.model) out.model = message.model;
    const images = (Array.isArray(message.images) ? message.images : []).map(imageFrom).filter(Boolean);
    if (images.length) out.images = images.map(({ id, type }) => ({ id, type, width: 0, height: 0, name: "" }));
    return out;
  });
  // The server keeps each reply's model: the chat goes on with its last reply's.
  const replies = messages.filter((message) => message.role === "assistant");
  const clean = cleanChat({
    id: chat.id,
    title: chat.title,
    renamed: true,
    created: millis(chat.created_at),
    updated: millis(chat.updated_at),
    messages,
    model: replies.at(-1)?.model,
  });
  if (clean) clean.onServer = true;
  return clean;
}

export class ServerStore {
  /** `local`: the browser's Store, which keeps the settings (and the chats to import). */
  constructor(local) {
    this.local = local;
    this.ok = true;
    this.server = true;
    this.index = [];
    this.chats = new Map();
    this.titles = new Map(); // each chat's title as the server has it
    this.hidden = new Map(); // each chat's positions the page does not show (hiddenPositions)
    this.query = "";
  }

  /** Read the list again (or the chats matching `query`). */
  async refresh(query = this.query) {
    this.query = query;
    const path = query.trim() ? `/api/chats?q=${encodeURIComponent(query.trim())}` : "/api/chats";
    try {
      const body = await call("GET", path);
      this.index = (body.chats || []).filter((c) => cleanChat({ id: c.id })).map((c) => ({ id: c.id, title: String(c.title || "Chat"), updated: millis(c.updated_at) }));
      for (const entry of this.index) this.titles.set(entry.id, entry.title);
      this.ok = true;
    } catch {
      this.ok = false;
    }
  }

  list() {
    return this.index;
  }

  current() {
    return this.query ? null : this.index[0]?.id || null;
  }

  setCurrent() {}

  load(id) {
    return this.chats.get(id) || null;
  }

  /** The chat `id` from the server (null when it is gone, or not this user's). */
  async fetch(id) {
    try {
      const body = await call("GET", `/api/chats/${encodeURIComponent(id)}`);
      const chat = pageChat(body);
      if (chat) {
        this.chats.set(chat.id, chat);
        this.hidden.set(chat.id, hiddenPositions(body));
      }
      return chat;
    } catch {
      return null;
    }
  }

  /** Make `chat` on the server before its first message; its id becomes the server's. */
  async create(chat) {
    const made = await call("POST", "/api/chats", {});
    chat.id = made.id;
    chat.onServer = true;
    this.chats.set(chat.id, chat);
    this.titles.set(chat.id, made.title);
  }

  /** Cut the stored `chat` back to before its message `index` (one of the person's), as the
   * page is about to (edit, regenerate): DELETE /api/chats/<id>/messages with the length the
   * page holds, so a chat changed elsewhere is never cut blindly (409). Called before the page
   * changes `chat.messages`. A 409 is tried again for a moment: a reply the person stopped is
   * stored when the server notices, a moment later. Resolves when the server has cut; rejects
   * otherwise. */
  async cut(chat, index) {
    const hidden = this.hidden.get(chat.id) || [];
    let from = index;
    for (const position of hidden) if (position <= from) from += 1;
    const length = chat.messages.length + hidden.length;
    const path = `/api/chats/${encodeURIComponent(chat.id)}/messages?from=${from}&length=${length}`;
    for (let attempt = 0; ; attempt += 1) {
      try {
        await call("DELETE", path);
        break;
      } catch (error) {
        if (error.status !== 409 || attempt >= 4) throw error;
        await pause(250 * 2 ** attempt);
      }
    }
    this.hidden.set(chat.id, hidden.filter((position) => position < from));
  }

  save(chat) {
    if (!chat.onServer) return true;
    this.chats.set(chat.id, chat);
    const entry = { id: chat.id, title: chat.title, updated: chat.updated };
    if (!this.query) this.index = [entry, ...this.index.filter((other) => other.id !== chat.id)];
    if (chat.renamed && this.titles.get(chat.id) !== chat.title) {
      this.titles.set(chat.id, chat.title);
      call("PATCH", `/api/chats/${encodeURIComponent(chat.id)}`, { title: chat.title }).catch(() => {
        this.ok = false;
      });
    }
    return true;
  }

  remove(id) {
    this.chats.delete(id);
    this.index = this.index.filter((chat) => chat.id !== id);
    call("DELETE", `/api/chats/${encodeURIComponent(id)}`).catch(() => {
      this.ok = false;
    });
  }

  loadSettings(limit) {
    return this.local.loadSettings(limit);
  }

  saveSettings(settings) {
    return this.local.saveSettings(settings);
  }

  loadLastModel() {
    return this.local.loadLastModel();
  }

  saveLastModel(model) {
    return this.local.saveLastModel(model);
  }
}

// Chats and settings kept in this browser (localStorage; nothing is kept by the app). Each chat
// is stored under its own key, so saving one writes only that one, plus a small index. A
// message's images are named here by id; their files are in IndexedDB (image-store.js). All that
// is read back is checked like input: stored text is untrusted, exactly like model output, and
// the page only ever shows it as text or through the Markdown sanitiser.

const PREFIX = "chat.v1.";
const INDEX_KEY = `${PREFIX}index`;
const SETTINGS_KEY = `${PREFIX}settings`;
const MODEL_KEY = `${PREFIX}model`;
const chatKey = (id) => `${PREFIX}chat.${id}`;

export const ID_PATTERN = /^[A-Za-z0-9_-]{1,64}$/;
const ROLES = new Set(["user", "assistant"]);
const STATES = new Set(["done", "stopped", "cut-off"]);
const FINISH_REASONS = new Set(["stop", "length", "cancelled"]);
export const IMAGE_TYPES = new Set(["image/png", "image/jpeg", "image/webp", "image/gif"]);
export const TITLE_MAX = 120;

/** A random id for a new chat: 32 hex digits (works on plain HTTP too, unlike randomUUID). */
export function newId() {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  return Array.from(bytes, (byte) => byte.toString(16).padStart(2, "0")).join("");
}

/** A chat's default title: the start of its first message, on one line. */
export function titleFrom(text) {
  const line = text.replace(/\s+/g, " ").trim();
  return line.length > 60 ? `${line.slice(0, 57).trimEnd()}…` : line || "New chat";
}

const text = (value, max) => (typeof value === "string" ? value.slice(0, max) : "");
/** A model's id as POST /chat takes it (chatapp/relay/wire.py: 1 to 256 characters, no spaces
 * or control characters), or null. */
export const modelName = (value) =>
  typeof value === "string" && value.length > 0 && value.length <= 256 && !/[\s\p{Cc}\p{Cs}]/u.test(value) ? value : null;
const time = (value) => (Number.isFinite(value) && value > 0 ? value : Date.now());

function cleanEnding(ending) {
  if (!ending || typeof ending !== "object" || !STATES.has(ending.state)) return null;
  const clean = { state: ending.state, note: text(ending.note, 500), badge: text(ending.badge, 60) };
  if (FINISH_REASONS.has(ending.finish_reason)) clean.finish_reason = ending.finish_reason;
  return clean;
}

const size = (value) => (Number.isInteger(value) && value > 0 && value <= 100000 ? value : 0);

/** A user message's images as kept beside its text (the files are in image-store.js). */
function cleanImages(images) {
  const clean = [];
  for (const image of Array.isArray(images) ? images : []) {
    if (!image || !ID_PATTERN.test(image.id) || !IMAGE_TYPES.has(image.type)) continue;
    if (clean.some((other) => other.id === image.id)) continue;
    clean.push({
      id: image.id,
      type: image.type,
      width: size(image.width),
      height: size(image.height),
      name: text(image.name, 200),
    });
  }
  return clean;
}

/** A chat's title from its first message (an image alone: "Image"). */
export function firstTitle(messages) {
  const first = messages[0];
  return titleFrom(first?.content || (first?.images?.length ? "Image" : ""));
}

/** A grounded reply's sources (the stream's first line, sources.js), those well formed. */
function cleanSources(sources) {
  if (!Array.isArray(sources)) return null;
  return sources
    .filter((s) => s && typeof s === "object" && Number.isInteger(s.n) && typeof s.name === "string")
    .map((s) => ({
      n: s.n,
      name: text(s.name, 500),
      page: Number.isInteger(s.page) ? s.page : null,
      document_id: Number.isInteger(s.document_id) ? s.document_id : null,
    }));
}

/** A reply's citations (chatapp/documents/search/grounding.py's done line), those well formed. */
function cleanCitations(citations) {
  if (!Array.isArray(citations)) return null;
  return citations.filter((c) => c && typeof c === "object" && Number.isInteger(c.n) && typeof c.text === "string");
}

/** A stored chat, checked; null when it is not one. */
export function cleanChat(value) {
  if (!value || typeof value !== "object" || !ID_PATTERN.test(value.id)) return null;
  const messages = [];
  for (const message of Array.isArray(value.messages) ? value.messages : []) {
    if (!message || !ROLES.has(message.role) || typeof message.content !== "string") continue;
    const clean = { role: message.role, content: message.content };
    const ending = message.role === "assistant" ? cleanEnding(message.ending) : null;
    if (ending) clean.ending = ending;
    const images = message.role === "user" ? cleanImages(message.images) : [];
    if (images.length) clean.images = images;
    // A grounded turn's passages (sent back with it) and a reply's checked citations (its chips).
    if (message.role === "user" && typeof message.grounding === "string") clean.grounding = message.grounding;
    const citations = message.role === "assistant" ? cleanCitations(message.citations) : null;
    if (citations) clean.citations = citations;
    const sources = message.role === "assistant" ? cleanSources(message.sources) : null;
    if (sources) clean.sources = sources;
    // The model a reply was asked of (model-picker.js); none: the model service's default.
    const model = message.role === "assistant" ? modelName(message.model) : null;
    if (model) clean.model = model;
    messages.push(clean);
  }
  const chat = {
    id: value.id,
    title: text(value.title, TITLE_MAX) || firstTitle(messages),
    renamed: value.renamed === true,
    created: time(value.created),
    updated: time(value.updated),
    messages,
  };
  // The model chosen for the chat (model-picker.js); none: the model service's default.
  const model = modelName(value.model);
  if (model) chat.model = model;
  return chat;
}

export class Store {
  constructor(storage) {
    this.storage = storage;
    /** False while the browser refuses to keep what the page writes (storage full). */
    this.ok = true;
  }

  _read(key) {
    try {
      const raw = this.storage.getItem(key);
      return raw === null ? null : JSON.parse(raw);
    } catch {
      return null; // unreadable or not JSON: as if absent
    }
  }

  _write(key, value) {
    try {
      this.storage.setItem(key, JSON.stringify(value));
      this.ok = true;
      return true;
    } catch {
      this.ok = false; // quota exceeded, or storage disabled
      return false;
    }
  }

  _index() {
    const index = this._read(INDEX_KEY);
    const chats = [];
    for (const entry of Array.isArray(index?.chats) ? index.chats : []) {
      if (entry && ID_PATTERN.test(entry.id) && !chats.some((chat) => chat.id === entry.id)) {
        chats.push({ id: entry.id, title: text(entry.title, TITLE_MAX) || "Chat", updated: time(entry.updated) });
      }
    }
    const current = typeof index?.current === "string" ? index.current : null;
    return { current, chats };
  }

  /** Saved chats, the most recently used first: [{id, title, updated}]. */
  list() {
    return this._index().chats.sort((a, b) => b.updated - a.updated);
  }

  /** The id of the chat that was open last, if it is still saved. */
  current() {
    const { current, chats } = this._index();
    return chats.some((chat) => chat.id === current) ? current : null;
  }

  setCurrent(id) {
    const index = this._index();
    if (index.current !== id) this._write(INDEX_KEY, { ...index, current: id });
  }

  load(id) {
    return ID_PATTERN.test(id) ? cleanChat(this._read(chatKey(id))) : null;
  }

  /** Keep `chat` (and make it the current one); false when the browser refused. */
  save(chat) {
    if (!this._write(chatKey(chat.id), chat)) return false;
    const index = this._index();
    const entry = { id: chat.id, title: chat.title, updated: chat.updated };
    const chats = [entry, ...index.chats.filter((other) => other.id !== chat.id)];
    return this._write(INDEX_KEY, { current: chat.id, chats });
  }

  remove(id) {
    try {
      this.storage.removeItem(chatKey(id));
    } catch {
      // Nothing to do: the index below no longer lists it.
    }
    const index = this._index();
    const chats = index.chats.filter((chat) => chat.id !== id);
    this._write(INDEX_KEY, { current: index.current === id ? null : index.current, chats });
  }

  /** Settings: {system: string, temperature: number|null, maxNewTokens: number|null}. */
  loadSettings(maxNewTokensLimit) {
    const stored = this._read(SETTINGS_KEY) || {};
    const temperature = Number.isFinite(stored.temperature) ? stored.temperature : null;
    const tokens = Number.isInteger(stored.maxNewTokens) ? stored.maxNewTokens : null;
    return {
      system: text(stored.system, 20000),
      temperature: temperature !== null && temperature >= 0 && temperature <= 2 ? temperature : null,
      maxNewTokens: tokens !== null && tokens >= 1 ? Math.min(tokens, maxNewTokensLimit) : null,
    };
  }

  saveSettings(settings) {
    return this._write(SETTINGS_KEY, settings);
  }

  /** The model chosen last (a new chat's, model-picker.js), or null. */
  loadLastModel() {
    return modelName(this._read(MODEL_KEY));
  }

  saveLastModel(model) {
    return this._write(MODEL_KEY, model);
  }
}

/** The browser's localStorage, or null where the browser gives the page none. */
export function browserStorage() {
  try {
    const storage = window.localStorage;
    storage.getItem(INDEX_KEY);
    return storage;
  } catch {
    return null;
  }
}

/** A stand-in for localStorage that lasts as long as the page. */
export function memoryStorage() {
  const items = new Map();
  return {
    getItem: (key) => (items.has(key) ? items.get(key) : null),
    setItem: (key, value) => items.set(key, String(value)),
    removeItem: (key) => items.delete(key),
  };
}

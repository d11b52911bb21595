// What the page holds between events: the saved chats, the settings, the open chat and its views,
// the exchange in flight. One object, so that every module reads and changes the same values.
import { TOKENS_LIMIT } from "./page.js";
import { Store, browserStorage, memoryStorage } from "./store.js";

/** The browser's storage, or null where the page may not keep anything. */
export const persistent = browserStorage();
export const store = new Store(persistent || memoryStorage());

export const state = {
  settings: store.loadSettings(TOKENS_LIMIT),
  /** The open chat: {id, title, renamed, created, updated, messages: [{role, content, ending?}]}. */
  chat: null,
  /** One view per message of the open chat (same order), and views of failed exchanges. */
  views: [],
  transient: [],
  /** The exchange in flight, or null. */
  active: null,
  /** The model's name from /healthz; "Assistant" until known. */
  modelName: null,
};

/** The view of each message element, for the buttons inside it. */
export const viewOf = new WeakMap();

export function assistantName() {
  return state.modelName || "Assistant";
}

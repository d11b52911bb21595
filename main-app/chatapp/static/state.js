// What the page holds between events: the saved chats, the settings, the open chat and its views,
// the exchange in flight. One object, so that every module reads and changes the same values.
import { TOKENS_LIMIT } from "./page.js";
import { Store, browserStorage, memoryStorage } from "./store.js";

/** The browser's storage, or null where the page may not keep anything. */
export const persistent = browserStorage();
/** The browser's own store: its settings, and its chats when the server keeps none. */
export const localStore = new Store(persistent || memoryStorage());
/** Where chats are kept: `localStore`, or the server's for a signed-in user (server-chats.js). */
export let store = localStore;

export function useStore(next) {
  store = next;
}

export const state = {
  settings: localStore.loadSettings(TOKENS_LIMIT),
  /** The open chat: {id, title, renamed, created, updated, messages: [{role, content, ending?}]}. */
  chat: null,
  /** One view per message of the open chat (same order), and views of failed exchanges. */
  views: [],
  transient: [],
  /** The exchange in flight, or null. */
  active: null,
  /** The model's name from /healthz; "Assistant" until known. */
  modelName: null,
  /** Whether the model service serves several chat models (model-picker.js): a reply is then
   * "Assistant", its meta line naming its model. */
  severalModels: false,
};

/** The view of each message element, for the buttons inside it. */
export const viewOf = new WeakMap();

export function assistantName() {
  return (!state.severalModels && state.modelName) || "Assistant";
}

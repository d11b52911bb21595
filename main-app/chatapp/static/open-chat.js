// Which chat is shown: opening one, a new one, one from the list.
import { attachedImages } from "./attachments.js";
import { blankChat, renderChatHeader, renderChatList } from "./chats.js";
import { closeEdit } from "./edit.js";
import { stop } from "./exchange.js";
import { showChatModel } from "./model-picker.js";
import { autosize, empty, input, log, scrollToEnd } from "./page.js";
import { state, store } from "./state.js";
import { refreshActions, restoredView } from "./views.js";

export function openChat(next) {
  if (state.active) {
    state.active.abandoned = true; // its chat is no longer shown; it still keeps what came back
    stop();
  }
  closeEdit();
  state.chat = next;
  state.views = [];
  state.transient = [];
  for (const node of log.querySelectorAll(".message")) node.remove();
  for (const message of state.chat.messages) state.views.push(restoredView(message));
  empty.hidden = state.views.length > 0;
  store.setCurrent(state.chat.messages.length > 0 ? state.chat.id : null);
  renderChatHeader();
  renderChatList();
  refreshActions();
  showChatModel();
  scrollToEnd(true);
}

export function newChat() {
  openChat(blankChat());
  attachedImages({ take: true });
  input.value = "";
  autosize();
  input.focus();
}

export async function openChatById(id) {
  if (state.chat && id === state.chat.id) return;
  const stored = store.load(id) || (store.server ? await store.fetch(id) : null);
  if (!stored) {
    renderChatList(); // deleted in another tab
    return;
  }
  openChat(stored);
}

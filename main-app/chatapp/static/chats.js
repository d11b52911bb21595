// The saved chats: the list beside the conversation, the open chat's header, saving.
import { imageStorage } from "./image-store.js";
import { $, chatList, chatListEmpty, chatTitle, storageNote } from "./page.js";
import { persistent, state, store } from "./state.js";
import { firstTitle, newId } from "./store.js";

export function blankChat() {
  const now = Date.now();
  return { id: newId(), title: "New chat", renamed: false, created: now, updated: now, messages: [] };
}

export function showStorageNote() {
  if (!persistent) {
    storageNote.textContent = "This browser does not let the page keep chats: they last until the page is closed.";
  } else if (store.server && !store.ok) {
    storageNote.textContent = "The server did not answer: the list may be out of date. Reload the page.";
  } else if (!store.ok) {
    storageNote.textContent = "This browser's storage for the page is full: recent changes were not kept. Export or delete old chats.";
  } else if (!imageStorage.kept) {
    storageNote.textContent = "This browser did not keep some images: they last until the page is closed. Delete old chats to make room.";
  } else {
    storageNote.hidden = true;
    return;
  }
  storageNote.hidden = false;
}

export function renderChatList() {
  const items = store.list();
  const nodes = items.map((item) => {
    const li = document.createElement("li");
    const button = document.createElement("button");
    button.type = "button";
    button.className = "chat-link";
    button.dataset.id = item.id;
    button.textContent = item.title;
    if (state.chat && item.id === state.chat.id) button.setAttribute("aria-current", "page");
    li.append(button);
    return li;
  });
  chatList.replaceChildren(...nodes);
  chatListEmpty.hidden = items.length > 0;
  showStorageNote();
}

export function renderChatHeader() {
  chatTitle.textContent = state.chat.title;
  const saved = state.chat.messages.length > 0;
  for (const id of ["rename-chat", "export-json", "export-markdown", "delete-chat"]) {
    $(id).disabled = !saved;
  }
}

export function persist(target) {
  if (target.deleted) return;
  target.updated = Date.now();
  if (!target.renamed) target.title = firstTitle(target.messages);
  store.save(target);
  if (target === state.chat) renderChatHeader();
  renderChatList();
}

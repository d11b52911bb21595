// The chat page. Talks to POST /chat and reads the NDJSON reply stream described in
// chatapp/relay/wire.py. Model output and stored chats are untrusted: a reply is rendered as Markdown
// only through the sanitiser in markdown.js; everything else (your messages, titles, notes) is
// inserted as text, never as HTML. Chats and settings are kept in this browser (store.js), or,
// for a signed-in user, chats on the server (server-chats.js; import-chats.js offers this
// browser's own chats once). In a chat the server keeps, each turn sends only the new message
// with the chat's id, and the server stores the turn; editing and regenerating cut the stored
// chat back first (DELETE /api/chats/<id>/messages), then send the turn again.
//
// This module wires the page's events to the modules that do the work: views.js (a message),
// exchange.js (POST /chat and its stream), chats.js and open-chat.js (saved chats), edit.js,
// chat-menu.js, settings-dialog.js, dialogs.js, drawer.js, status.js, attachments.js and
// images.js (images to send), image-store.js (their files, in IndexedDB), image-viewer.js,
// library.js (the documents panel), citations.js (a grounded reply's sources),
// model-picker.js (the model each chat asks, where several are served) and
// microphone.js (a spoken message, transcribed into the box; loaded by status.js);
// page.js and state.js hold what they share. The browser loads them as ES modules, with no build step.
import { attachedImages, preparingImages, showAttachNote } from "./attachments.js";
import { deleteChat, exportJson, exportMarkdown, renameChat } from "./chat-menu.js";
import { blankChat, persist, renderChatList } from "./chats.js";
import { narrow, setSidebar } from "./drawer.js";
import { closeEdit, startEdit } from "./edit.js";
import { regenerate, start, stop } from "./exchange.js";
import { openImage } from "./image-viewer.js";
import { imageMeta } from "./images.js";
import { installLibrary } from "./library.js";
import { newChat, openChat, openChatById } from "./open-chat.js";
import {
  $,
  autosize,
  chatList,
  chatMenu,
  clean,
  copyFrom,
  form,
  input,
  log,
  stopButton,
} from "./page.js";
import { openSettings, renderSettingsSummary } from "./settings-dialog.js";
import { importChats } from "./import-chats.js";
import { ServerStore, whoAmI } from "./server-chats.js";
import { localStore, state, store, useStore, viewOf } from "./state.js";
import { pollModelStatus } from "./status.js";
import { addView, messageView } from "./views.js";

// A message sent before the page has opened a chat (GET /api/me and the signed-in user's
// list are still on their way) is sent once it has: the text stays in the box till then.
let sendWhenOpen = false;

function submit() {
  if (!state.chat) {
    sendWhenOpen = true;
    return;
  }
  if (state.active) return;
  if (preparingImages()) {
    showAttachNote("An image is still being prepared; send again in a moment.");
    return;
  }
  const text = clean(input.value);
  if (!text.trim() && !attachedImages().length) {
    input.focus();
    return;
  }
  closeEdit();
  input.value = "";
  autosize();
  const images = attachedImages({ take: true }).map(imageMeta);
  const turn = images.length ? { role: "user", content: text, images } : { role: "user", content: text };
  start(turn, addView(messageView("user", text, images)));
}

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
  if (target.classList.contains("open-image")) {
    openImage(target.dataset.id, target);
  } else if (target.classList.contains("copy-code")) {
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
  } else if (state.active) {
    event.preventDefault();
    stop();
  }
});

// Another tab changed the saved chats: show the new list.
window.addEventListener("storage", (event) => {
  if (store.server) return;
  if (event.key === null || event.key.startsWith("chat.v1.")) renderChatList();
});

// Leaving in the middle of a reply keeps the part received, marked as cut off.
window.addEventListener("pagehide", () => {
  const exchange = state.active;
  if (!exchange || exchange.finished || !exchange.reply.text) return;
  exchange.finished = true;
  const ending = { state: "cut-off", note: "The page was closed before the reply was complete.", badge: "Cut off" };
  const answer = { role: "assistant", content: exchange.reply.text, ending };
  if (exchange.model) answer.model = exchange.model;
  exchange.chat.messages.push(exchange.turn, answer);
  persist(exchange.chat);
});

// A signed-in user's chats are kept on the server (GET /api/me says so): the list, search and
// each chat come from there, and the chats this browser kept before are offered for import.
const me = await whoAmI();
if (me?.server_chats && me.user) {
  const server = new ServerStore(localStore);
  await server.refresh();
  useStore(server);
  $("signed-in").textContent = me.user.name ? `Signed in as ${me.user.name}` : "Signed in";
  $("signed-in").hidden = false;
  $("chat-search").hidden = false;
  let searching = null;
  $("chat-search-input").addEventListener("input", (event) => {
    clearTimeout(searching);
    searching = setTimeout(async () => {
      await server.refresh(event.target.value);
      renderChatList();
    }, 200);
  });
  $("chat-search").addEventListener("submit", (event) => event.preventDefault());
  importChats(localStore, me.user.name || "user", async () => {
    await server.refresh();
    renderChatList();
  });
}
const last = store.current();
openChat((last && (store.load(last) || (store.server ? await store.fetch(last) : null))) || blankChat());
renderSettingsSummary();
pollModelStatus();
installLibrary();
input.focus();
if (sendWhenOpen) submit();

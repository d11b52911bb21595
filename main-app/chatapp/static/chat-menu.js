// The open chat's menu: export as JSON or Markdown, rename, delete.
import { blankChat, persist } from "./chats.js";
import { closeDialog, showDialog } from "./dialogs.js";
import { stop } from "./exchange.js";
import { openChat } from "./open-chat.js";
import { $, announce, chatMenu, input } from "./page.js";
import { assistantName, state, store } from "./state.js";
import { TITLE_MAX } from "./store.js";

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
  const slug = state.chat.title
    .toLowerCase()
    .normalize("NFKD")
    .replace(/[^a-z0-9]+/g, "-")
    .replace(/^-+|-+$/g, "")
    .slice(0, 60);
  return `${slug || "chat"}.${extension}`;
}

export function exportJson() {
  const data = {
    format: "chat-export",
    version: 1,
    id: state.chat.id,
    title: state.chat.title,
    created: new Date(state.chat.created).toISOString(),
    updated: new Date(state.chat.updated).toISOString(),
    model: state.modelName,
    messages: state.chat.messages.map(({ role, content, ending }) => {
      const message = { role, content };
      if (ending?.finish_reason) message.finish_reason = ending.finish_reason;
      return message;
    }),
  };
  download(fileName("json"), "application/json", `${JSON.stringify(data, null, 2)}\n`);
}

export function exportMarkdown() {
  const parts = [`# ${state.chat.title}`];
  for (const message of state.chat.messages) {
    const who = message.role === "user" ? "You" : assistantName();
    let section = `## ${who}\n\n${message.content.trim()}`;
    if (message.ending?.badge) section += `\n\n_(${message.ending.badge.toLowerCase()})_`;
    parts.push(section);
  }
  download(fileName("md"), "text/markdown", `${parts.join("\n\n")}\n`);
}

export function renameChat() {
  const dialog = $("rename-dialog");
  const field = $("rename-input");
  field.value = state.chat.title;
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
  state.chat.title = title;
  state.chat.renamed = true;
  persist(state.chat);
  closeDialog($("rename-dialog"));
  announce(`Chat renamed to ${title}.`);
});
$("rename-cancel").addEventListener("click", () => closeDialog($("rename-dialog")));

export function deleteChat() {
  $("delete-text").textContent = `“${state.chat.title}” and its messages will be removed from this browser.`;
  showDialog($("delete-dialog"), chatMenu.querySelector("summary"));
  $("delete-cancel").focus();
}

$("delete-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const doomed = state.chat;
  if (state.active && state.active.chat === doomed) stop();
  doomed.deleted = true;
  store.remove(doomed.id);
  $("delete-dialog").returnFocusTo = input;
  closeDialog($("delete-dialog"));
  const next = store.list()[0];
  openChat((next && store.load(next.id)) || blankChat());
  announce(`Deleted the chat “${doomed.title}”.`);
});
$("delete-cancel").addEventListener("click", () => closeDialog($("delete-dialog")));

// The open chat's menu: export as JSON or Markdown, rename, delete.
import { blankChat, persist } from "./chats.js";
import { closeDialog, showDialog } from "./dialogs.js";
import { stop } from "./exchange.js";
import { forgetChat, loadImage } from "./image-store.js";
import { dataUrl } from "./images.js";
import { openChat, openChatById } from "./open-chat.js";
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

function fileName(extension, chat = state.chat) {
  const slug = chat.title
    .toLowerCase()
    .normalize("NFKD")
    .replace(/[^a-z0-9]+/g, "-")
    .replace(/^-+|-+$/g, "")
    .slice(0, 60);
  return `${slug || "chat"}.${extension}`;
}

/** A message's images for an export: their data: URLs, or a note for one not kept. */
async function exportedImages(message) {
  const images = [];
  for (const meta of message.images || []) {
    const image = await loadImage(meta.id);
    images.push(image ? { type: meta.type, name: meta.name, url: await dataUrl(image) } : { type: meta.type, name: meta.name, missing: true });
  }
  return images;
}

export async function exportJson() {
  const chat = state.chat;
  const images = await Promise.all(chat.messages.map(exportedImages));
  const data = {
    format: "chat-export",
    version: 1,
    id: chat.id,
    title: chat.title,
    created: new Date(chat.created).toISOString(),
    updated: new Date(chat.updated).toISOString(),
    model: state.modelName,
    messages: chat.messages.map(({ role, content, ending }, index) => {
      const message = { role, content };
      if (images[index].length) message.images = images[index];
      if (ending?.finish_reason) message.finish_reason = ending.finish_reason;
      return message;
    }),
  };
  download(fileName("json", chat), "application/json", `${JSON.stringify(data, null, 2)}\n`);
}

export function exportMarkdown() {
  const parts = [`# ${state.chat.title}`];
  for (const message of state.chat.messages) {
    const who = message.role === "user" ? "You" : assistantName();
    const pictures = (message.images || []).map((image, index) => `_(image ${index + 1}${image.name ? `: ${image.name}` : ""})_`);
    let section = `## ${who}\n\n${[...pictures, message.content.trim()].filter(Boolean).join("\n\n")}`;
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
  const where = store.server ? "your account" : "this browser";
  $("delete-text").textContent = `“${state.chat.title}” and its messages will be removed from ${where}.`;
  showDialog($("delete-dialog"), chatMenu.querySelector("summary"));
  $("delete-cancel").focus();
}

$("delete-form").addEventListener("submit", (event) => {
  event.preventDefault();
  const doomed = state.chat;
  if (state.active && state.active.chat === doomed) stop();
  doomed.deleted = true;
  store.remove(doomed.id);
  forgetChat(doomed.id); // its images go with it
  $("delete-dialog").returnFocusTo = input;
  closeDialog($("delete-dialog"));
  const next = store.list()[0];
  openChat((next && store.load(next.id)) || blankChat());
  if (next && !store.load(next.id) && store.server) openChatById(next.id);
  announce(`Deleted the chat “${doomed.title}”.`);
});
$("delete-cancel").addEventListener("click", () => closeDialog($("delete-dialog")));

// The page's elements and limits, and the small helpers every part of it uses.

export const $ = (id) => document.getElementById(id);
export const log = $("log");
export const empty = $("empty");
export const form = $("composer");
export const input = $("prompt");
export const sendButton = $("send");
export const stopButton = $("stop");
export const modelStatus = $("model-status");
export const modelNameLabel = $("model-name");
export const chatTitle = $("chat-title");
export const chatList = $("chat-list");
export const chatListEmpty = $("chat-list-empty");
export const storageNote = $("storage-note");
export const chatMenu = $("chat-menu");
export const announcer = $("announcer");
export const template = $("message-template");
export const attachButton = $("attach");
export const attachInput = $("attach-input");
export const attachmentList = $("attachments");
export const attachNote = $("attach-note");

export const UNREACHABLE = "The chat service is not reachable. Check your connection and try again.";
export const MAX_BYTES = Number(document.body.dataset.maxRequestBytes) || 65536;
export const MAX_MESSAGES = Number(document.body.dataset.maxMessages) || 200;
export const TOKENS_LIMIT = Number(document.body.dataset.maxNewTokensLimit) || 4096;
// The app's limits on images (chatapp/relay/images.py: the sidecar's MAX_IMAGE_BYTES, MAX_IMAGES);
// MAX_IMAGES 0: the app takes none.
const imageBytes = Number(document.body.dataset.maxImageBytes);
const images = Number(document.body.dataset.maxImages);
export const MAX_IMAGE_BYTES = Number.isFinite(imageBytes) && imageBytes > 0 ? imageBytes : 5 * 1024 * 1024;
export const MAX_IMAGES = Number.isInteger(images) && images >= 0 ? images : 4;
// Control characters are invisible, and the model service refuses them.
// biome-ignore lint/suspicious/noControlCharactersInRegex: matching them is the point
const CONTROL_CHARS = /[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f-\u009f]/g;

export function nearBottom() {
  return window.innerHeight + window.scrollY >= document.documentElement.scrollHeight - 96;
}

export function scrollToEnd(force) {
  if (force || nearBottom()) window.scrollTo(0, document.documentElement.scrollHeight);
}

let announceTimer = null;
/** Say `text` once through the live region (screen readers), e.g. when a reply is complete. */
export function announce(text) {
  clearTimeout(announceTimer);
  announcer.textContent = "";
  announceTimer = setTimeout(() => {
    announcer.textContent = text;
  }, 50);
}

export function clean(text) {
  return text.replace(CONTROL_CHARS, "");
}

export async function copyText(text) {
  try {
    await navigator.clipboard.writeText(text);
    return true;
  } catch {
    // No clipboard API (a page served over plain HTTP): copy through a selected text area.
  }
  const focused = document.activeElement;
  const area = document.createElement("textarea");
  area.value = text;
  area.readOnly = true;
  area.className = "clipboard-helper";
  document.body.append(area);
  area.select();
  let copied = false;
  try {
    copied = document.execCommand("copy");
  } catch {
    copied = false;
  }
  area.remove();
  if (focused instanceof HTMLElement) focused.focus();
  return copied;
}

export async function copyFrom(button, text) {
  const label = button.textContent;
  const copied = await copyText(text);
  button.textContent = copied ? "Copied" : "Copy failed";
  announce(copied ? "Copied to the clipboard." : "Could not copy to the clipboard.");
  setTimeout(() => {
    button.textContent = label;
  }, 1500);
}

export function autosize() {
  input.style.height = "auto";
  input.style.height = `${input.scrollHeight}px`;
}

export const count = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;

/** A byte count as people read it: 5 MB, 340 KB. */
export function sizeText(bytes) {
  if (bytes >= 1024 * 1024) return `${(bytes / (1024 * 1024)).toFixed(1).replace(/\.0$/, "")} MB`;
  return `${Math.max(1, Math.round(bytes / 1024))} KB`;
}

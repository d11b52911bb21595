// The library panel: add files (picker or drop), watch each one's progress, cancel, retry,
// delete (POST/GET/DELETE /api/documents, chatapp/documents/routes.py). Names and reasons
// come from the server and are inserted as text only.
import { $ } from "./page.js";

const dialog = $("library-dialog");
const list = $("library-list");
const emptyNote = $("library-empty");
const note = $("library-note");
const input = $("library-input");
const drop = $("library-drop");
let timer = null;

const STATUS = { queued: "Waiting", reading: "Reading", ready: "Ready", failed: "Failed" };

function button(label, name, action) {
  const element = document.createElement("button");
  element.type = "button";
  element.className = "button secondary small";
  element.textContent = label;
  element.setAttribute("aria-label", name);
  element.addEventListener("click", action);
  return element;
}

async function call(method, path) {
  const response = await fetch(path, { method });
  if (!response.ok && response.status !== 204) {
    const body = await response.json().catch(() => null);
    showNote(body?.error?.message || `The library answered ${response.status}.`);
  }
  await refresh();
}

function showNote(message) {
  note.textContent = message;
  note.hidden = !message;
}

function row(document_) {
  const item = document.createElement("li");
  item.className = "library-item";
  item.dataset.status = document_.status;
  item.dataset.id = String(document_.id);
  const name = document.createElement("span");
  name.className = "library-name";
  name.textContent = document_.name;
  const status = document.createElement("span");
  status.className = "library-status";
  let text = STATUS[document_.status] || document_.status;
  if (document_.status === "ready") text += ` · ${document_.chunks} passages`;
  if (document_.error) text += `: ${document_.error.message}`;
  status.textContent = text;
  item.append(name, status);
  if (document_.status === "queued" || document_.status === "reading") {
    const bar = document.createElement("progress");
    bar.max = 1;
    bar.value = document_.progress;
    bar.setAttribute("aria-label", `${document_.name}: read ${Math.round(document_.progress * 100)}%`);
    item.append(bar, button("Cancel", `Cancel ${document_.name}`, () => call("POST", `/api/documents/${document_.id}/cancel`)));
  }
  if (document_.status === "failed") {
    item.append(button("Retry", `Retry ${document_.name}`, () => call("POST", `/api/documents/${document_.id}/retry`)));
  }
  item.append(button("Delete", `Delete ${document_.name}`, () => call("DELETE", `/api/documents/${document_.id}`)));
  return item;
}

export async function refresh() {
  clearTimeout(timer);
  let documents = [];
  try {
    const response = await fetch("/api/documents");
    documents = (await response.json()).documents || [];
  } catch {
    showNote("The library is not reachable.");
    return;
  }
  list.replaceChildren(...documents.map(row));
  emptyNote.hidden = documents.length > 0;
  // Poll while something is being read and the panel is open.
  if (dialog.open && documents.some((d) => d.status === "queued" || d.status === "reading")) {
    timer = setTimeout(refresh, 1000);
  }
}

async function upload(files) {
  if (!files.length) return;
  const body = new FormData();
  for (const file of files) body.append("file", file, file.name);
  showNote("");
  const response = await fetch("/api/documents", { method: "POST", body }).catch(() => null);
  if (!response) showNote("The library is not reachable.");
  else if (response.status !== 202) {
    const answer = await response.json().catch(() => null);
    showNote(answer?.error?.message || `The upload was refused (${response.status}).`);
  }
  await refresh();
}

export function openLibrary() {
  dialog.showModal();
  refresh();
}

/** The panel's buttons, picker and drop zone. */
export function installLibrary() {
  $("open-library").addEventListener("click", openLibrary);
  $("library-close").addEventListener("click", () => dialog.close());
  dialog.addEventListener("close", () => clearTimeout(timer));
  $("library-pick").addEventListener("click", () => input.click());
  input.addEventListener("change", () => {
    upload([...input.files]);
    input.value = "";
  });
  drop.addEventListener("dragover", (event) => {
    event.preventDefault();
    drop.dataset.over = "true";
  });
  drop.addEventListener("dragleave", () => delete drop.dataset.over);
  drop.addEventListener("drop", (event) => {
    event.preventDefault();
    delete drop.dataset.over;
    upload([...(event.dataTransfer?.files || [])]);
  });
}

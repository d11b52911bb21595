// Editing the last message and sending it again.
import { persist } from "./chats.js";
import { start } from "./exchange.js";
import { clean, input } from "./page.js";
import { state, store } from "./state.js";
import { addView, messageView, refreshActions } from "./views.js";

let editing = null;

export function closeEdit() {
  if (!editing) return;
  const { view, editor } = editing;
  editor.remove();
  view.node.querySelector(".bubble").hidden = false;
  view.editing = false;
  editing = null;
  if (state.chat) refreshActions();
}

export function startEdit(view) {
  if (state.active) return;
  closeEdit();
  const editor = document.createElement("form");
  editor.className = "edit-form";
  const label = document.createElement("label");
  label.className = "visually-hidden";
  label.htmlFor = "edit-box";
  label.textContent = "Edit your message";
  const area = document.createElement("textarea");
  area.id = "edit-box";
  area.value = view.text;
  area.rows = Math.min(10, view.text.split("\n").length + 1);
  const buttons = document.createElement("div");
  buttons.className = "edit-actions";
  const cancel = document.createElement("button");
  cancel.type = "button";
  cancel.className = "button secondary";
  cancel.textContent = "Cancel";
  const send = document.createElement("button");
  send.type = "submit";
  send.className = "button primary";
  send.textContent = "Send";
  buttons.append(cancel, send);
  editor.append(label, area, buttons);
  view.node.querySelector(".bubble").hidden = true;
  view.node.querySelector(".bubble").after(editor);
  view.editing = true;
  view.actions.replaceChildren();
  editing = { view, editor };

  const done = () => {
    closeEdit();
    view.node.querySelector(".message-actions .edit")?.focus();
  };
  cancel.addEventListener("click", done);
  area.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing && event.keyCode !== 229) {
      event.preventDefault();
      editor.requestSubmit();
    } else if (event.key === "Escape") {
      event.preventDefault();
      event.stopPropagation();
      done();
    }
  });
  editor.addEventListener("submit", (event) => {
    event.preventDefault();
    const text = clean(area.value);
    if (!text.trim() && !view.images.length) {
      area.focus();
      return;
    }
    resend(view, text);
  });
  area.focus();
  area.setSelectionRange(area.value.length, area.value.length);
}

/** Replace the last message (and its reply) with `text`, and send it; its images stay. */
function resend(view, text) {
  if (state.active) return;
  const index = state.views.indexOf(view);
  if (index < 0) return;
  closeEdit();
  // A chat the server keeps is cut there too (server-chats.js), before the message is sent.
  const cut = store.server && state.chat.onServer ? store.cut(state.chat, index) : null;
  for (const old of state.views.splice(index)) old.node.remove();
  state.chat.messages.splice(index);
  persist(state.chat);
  input.focus();
  const images = view.images;
  const turn = images.length ? { role: "user", content: text, images } : { role: "user", content: text };
  start(turn, addView(messageView("user", text, images)), cut);
}

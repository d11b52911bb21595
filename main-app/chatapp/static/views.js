// One message on the page: its element, how a streamed reply is rendered into it, its buttons.
import { linkCitations } from "./citations.js";
import { imageName, imageUrl } from "./images.js";
import { loadImage } from "./image-store.js";
import { MarkdownStream, readableText, renderMarkdown } from "./markdown.js";
import { empty, log, nearBottom, scrollToEnd, template } from "./page.js";
import { markCited, sourcesList } from "./sources.js";
import { assistantName, state, viewOf } from "./state.js";

export const MISSING_IMAGE = "Image not kept in this browser: the model no longer sees it. Attach it again.";

/** A message's images: a button per image that opens it whole (image-viewer.js); shown as
 * soon as the file is at hand (from memory, or read back from IndexedDB after a reload). */
function imagesRow(images) {
  const list = document.createElement("ul");
  list.className = "message-images";
  list.setAttribute("aria-label", images.length === 1 ? "Attached image" : "Attached images");
  images.forEach((meta, index) => {
    const item = document.createElement("li");
    const button = document.createElement("button");
    button.type = "button";
    button.className = "open-image";
    button.dataset.id = meta.id;
    button.setAttribute("aria-label", `Open ${imageName(meta, index).replace(/^Image/, "image")}`);
    const picture = document.createElement("img");
    picture.alt = imageName(meta, index);
    if (meta.width && meta.height) {
      picture.width = meta.width;
      picture.height = meta.height;
    }
    button.append(picture);
    item.append(button);
    list.append(item);
    loadImage(meta.id).then((image) => {
      if (image) {
        picture.src = imageUrl(image);
        return;
      }
      const note = document.createElement("span");
      note.className = "missing-image";
      note.textContent = MISSING_IMAGE;
      item.dataset.missing = "true";
      button.replaceWith(note);
    });
  });
  return list;
}

export function messageView(role, text = "", images = []) {
  const node = template.content.firstElementChild.cloneNode(true);
  node.classList.add(role);
  const roleLabel = node.querySelector(".role");
  roleLabel.textContent = role === "user" ? "You" : assistantName();
  const body = node.querySelector(".text");
  if (images.length) {
    node.querySelector(".bubble").before(imagesRow(images));
    if (!text) node.querySelector(".bubble").classList.add("no-text");
  }
  const meta = node.querySelector(".meta");
  const actions = node.querySelector(".message-actions");
  let sources = null;
  let reading = null;
  const view = {
    node,
    role,
    text,
    images,
    actions,
    /** The model a reply was asked of (model-picker.js), shown first in its meta line. */
    model: null,
    /** The streamed reply: its text so far, rendered as Markdown a block at a time. */
    append(delta) {
      this.text += delta;
      this.hideProgress(); // the first word: the reading is over
      this.stream.update(this.text);
    },
    /** A grounded reply's sources (sources.js), under it from the start. */
    showSources(list) {
      const box = sourcesList(list);
      if (sources) sources.replaceWith(box);
      else node.querySelector(".bubble").after(box);
      sources = box;
    },
    markCited(citations) {
      if (sources) markCited(sources, citations);
    },
    /** How far the reading of a long prompt is; not a live region: it changes every second. */
    showProgress(text) {
      if (!reading) {
        reading = document.createElement("p");
        reading.className = "reading";
        node.querySelector(".bubble").after(reading);
      }
      reading.textContent = text;
    },
    hideProgress() {
      reading?.remove();
      reading = null;
    },
    /** The reply is complete (or will not grow): render its end. */
    complete() {
      this.stream.finish(this.text);
    },
    showMarkdown(value) {
      this.text = value;
      body.classList.add("markdown");
      renderMarkdown(body, value);
    },
    showError(message) {
      body.classList.remove("markdown");
      body.replaceChildren(document.createTextNode(message));
    },
    setState(kind, note, badge) {
      node.dataset.state = kind;
      node.setAttribute("aria-busy", String(kind === "streaming" || kind === "waiting"));
      const parts = [];
      if (this.model && kind !== "error") {
        const name = document.createElement("span");
        name.className = "reply-model";
        name.textContent = this.model;
        parts.push(name);
      }
      if (badge) {
        const span = document.createElement("span");
        span.className = "badge";
        span.textContent = badge;
        parts.push(span);
      }
      if (note) parts.push(document.createTextNode(note));
      meta.replaceChildren(...parts);
    },
    setEnding(ending) {
      if (ending.finish_reason) node.dataset.finishReason = ending.finish_reason;
      this.setState(ending.state, ending.note, ending.badge);
    },
    /** Its [n] marks as chips that open their passages (citations.js). */
    linkCitations(citations) {
      linkCitations(body, citations);
    },
    readable() {
      return role === "assistant" ? readableText(body) : this.text;
    },
  };
  if (role === "user") {
    body.append(document.createTextNode(text));
  } else {
    body.classList.add("markdown");
    view.stream = new MarkdownStream(body, (render) => {
      const follow = nearBottom();
      render();
      if (follow) scrollToEnd(true);
    });
  }
  viewOf.set(node, view);
  return view;
}

/** Name every reply again (the model's name from /healthz, or "Assistant" where the page
 * offers several models: status.js, model-picker.js). */
export function relabelReplies() {
  for (const role of log.querySelectorAll(".message.assistant .role")) role.textContent = assistantName();
}

export function addView(view) {
  empty.hidden = true;
  log.append(view.node);
  return view;
}

export function restoredView(message) {
  const view = messageView(message.role, message.content, message.images || []);
  if (message.role === "assistant") {
    view.model = message.model || null;
    view.showMarkdown(message.content);
    view.linkCitations(message.citations);
    if (Array.isArray(message.sources)) {
      view.showSources(message.sources);
      view.markCited(message.citations);
    }
    if (message.ending) view.setEnding(message.ending);
    else view.setState("done", "");
  }
  return addView(view);
}

function actionButton(className, label, name) {
  const button = document.createElement("button");
  button.type = "button";
  button.className = `action ${className}`;
  button.textContent = label;
  button.setAttribute("aria-label", name);
  return button;
}

/** Copy on every reply; regenerate the last reply and edit your last message when idle (in a
 * chat the server keeps too: the server's copy is cut back first, server-chats.js). */
export function refreshActions() {
  const last = state.chat.messages.length - 1;
  state.views.forEach((view, index) => {
    if (view.editing) return;
    const buttons = [];
    if (view.role === "assistant") {
      buttons.push(actionButton("copy-reply", "Copy", "Copy this reply"));
      if (index === last && !state.active) {
        buttons.push(actionButton("regenerate", "Regenerate", "Regenerate this reply"));
      }
    } else if (index === last - 1 && !state.active) {
      buttons.push(actionButton("edit", "Edit", "Edit and resend your message"));
    }
    view.actions.replaceChildren(...buttons);
  });
  for (const view of state.transient) view.actions.replaceChildren();
}

export function clearTransient() {
  for (const view of state.transient) view.node.remove();
  state.transient = [];
}

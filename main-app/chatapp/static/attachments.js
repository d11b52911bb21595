// Images attached to the message being written: the Attach button (a file picker), a pasted
// image, a dropped file; thumbnails with a remove button until the message is sent; one inline
// note for what cannot be attached (never an alert). Whether the model reads images comes from
// the app's /healthz (status.js) or, where several models are offered, the chosen one's entry
// in /api/models (model-picker.js): a model that reads text only turns the button off and says
// so.
import { imageName, imageUrl, prepareImage } from "./images.js";
import { remember } from "./image-store.js";
import { $, announce, attachButton, attachInput, attachmentList, attachNote, count, input, MAX_IMAGES } from "./page.js";

const reason = $("attach-reason");
const composer = $("composer");
let pending = [];
let preparing = 0; // files waiting to be read
let queue = Promise.resolve();
/** true, false, or undefined (the model service does not say: images are offered). */
let imageInput;

export const TEXT_ONLY = "The model reads text only: it cannot see images.";
const NO_IMAGES = "This chat app does not take images.";

/** Why images cannot be attached now, or null. */
function blocked() {
  if (MAX_IMAGES === 0) return NO_IMAGES;
  if (imageInput === false) return TEXT_ONLY;
  return null;
}

export function showAttachNote(text) {
  attachNote.textContent = text;
  attachNote.hidden = !text;
}

function render() {
  const items = pending.map((image, index) => {
    const item = document.createElement("li");
    item.className = "attachment";
    const picture = document.createElement("img");
    picture.src = imageUrl(image);
    picture.alt = imageName(image, index);
    const remove = document.createElement("button");
    remove.type = "button";
    remove.className = "remove-attachment";
    remove.dataset.id = image.id;
    remove.textContent = "×";
    remove.setAttribute("aria-label", `Remove ${imageName(image, index).replace(/^Image/, "image")}`);
    remove.title = "Remove";
    item.append(picture, remove);
    return item;
  });
  attachmentList.replaceChildren(...items);
  attachmentList.hidden = items.length === 0;
}

/** Say whether the model reads images: true, false, or undefined when unknown. */
export function setImageInput(value) {
  imageInput = value;
  const why = blocked();
  attachButton.setAttribute("aria-disabled", String(Boolean(why)));
  attachButton.title = why || `Attach images (up to ${MAX_IMAGES})`;
  reason.textContent = why || "";
  if (!why && attachNote.textContent.startsWith(TEXT_ONLY)) showAttachNote("");
  // Images attached, then a model chosen that cannot see them (model-picker.js): said at once
  if (why && pending.length) showAttachNote(`${why} Remove the images, or choose a model that reads them.`);
}

/** Attach `files` (a FileList or an array), as many as fit, in the order given (one batch
 * after another: a paste, then a drop). */
export function addFiles(files) {
  const list = Array.from(files);
  if (!list.length) return queue;
  const why = blocked();
  if (why) {
    showAttachNote(why);
    return queue;
  }
  preparing += list.length;
  queue = queue.then(() => attach(list)).catch(() => showAttachNote("The image could not be attached."));
  return queue;
}

async function attach(list) {
  const notes = [];
  const full = `A message can carry up to ${count(MAX_IMAGES, "image")}.`;
  for (const file of list) {
    try {
      if (pending.length >= MAX_IMAGES) {
        if (!notes.includes(full)) notes.push(full);
        continue;
      }
      const prepared = await prepareImage(file);
      if (prepared.error) {
        notes.push(prepared.error);
        continue;
      }
      remember(prepared.image);
      pending.push(prepared.image);
      render();
      announce(`Attached ${imageName(prepared.image, pending.length - 1).replace(/^Image/, "image")}.`);
    } finally {
      preparing -= 1;
    }
  }
  showAttachNote(notes.join(" "));
}

/** The images attached now; `take` also clears them (the message is being sent). */
export function attachedImages({ take = false } = {}) {
  const images = pending;
  if (take) {
    pending = [];
    render();
    showAttachNote("");
  }
  return images;
}

/** Whether an image is still being read (the message waits for it). */
export function preparingImages() {
  return preparing > 0;
}

/** Put `images` back (a message that was not sent), unless others were attached since. */
export function restoreImages(images) {
  if (pending.length || !images.length) return;
  pending = images.slice(0, MAX_IMAGES);
  render();
}

attachButton.addEventListener("click", () => {
  const why = blocked();
  if (why) showAttachNote(why);
  else attachInput.click();
});
attachInput.addEventListener("change", () => {
  const files = Array.from(attachInput.files || []);
  attachInput.value = ""; // the same file may be chosen again
  addFiles(files);
});
attachmentList.addEventListener("click", (event) => {
  const button = event.target.closest(".remove-attachment");
  if (!button) return;
  const index = pending.findIndex((image) => image.id === button.dataset.id);
  if (index < 0) return;
  const [removed] = pending.splice(index, 1);
  render();
  announce(`Removed ${imageName(removed, index).replace(/^Image/, "image")}.`);
  const next = attachmentList.querySelectorAll(".remove-attachment")[Math.min(index, pending.length - 1)];
  (next || input).focus();
});

// A pasted image; text pasted with it (a copied web page gives both) is pasted as usual.
input.addEventListener("paste", (event) => {
  const files = Array.from(event.clipboardData?.files || []).filter((file) => file.type.startsWith("image/"));
  if (!files.length) return;
  if (!event.clipboardData.types.includes("text/plain")) event.preventDefault();
  addFiles(files);
});

// Files dropped anywhere on the page go to the message (a browser would otherwise open them).
const carriesFiles = (event) => Array.from(event.dataTransfer?.types || []).includes("Files");
document.addEventListener("dragover", (event) => {
  if (!carriesFiles(event)) return;
  event.preventDefault();
  event.dataTransfer.dropEffect = blocked() ? "none" : "copy";
  composer.classList.add("dropping");
});
document.addEventListener("dragleave", (event) => {
  if (!event.relatedTarget) composer.classList.remove("dropping");
});
document.addEventListener("drop", (event) => {
  if (!carriesFiles(event)) return;
  event.preventDefault();
  composer.classList.remove("dropping");
  addFiles(event.dataTransfer.files);
  input.focus();
});

setImageInput(undefined);

// An attached image shown whole, in a dialog (Esc or Close gives the focus back).
import { showDialog } from "./dialogs.js";
import { imageUrl } from "./images.js";
import { loadImage } from "./image-store.js";
import { $ } from "./page.js";

const dialog = $("image-dialog");
const picture = $("image-full");
const heading = $("image-heading");

/** Show the image `id` whole; `opener` gets the focus back. */
export async function openImage(id, opener) {
  const image = await loadImage(id);
  if (!image) return;
  const name = opener.querySelector("img")?.alt || "Image";
  heading.textContent = name;
  picture.alt = name;
  picture.src = imageUrl(image);
  showDialog(dialog, opener);
  $("image-close").focus();
}

$("image-close").addEventListener("click", () => dialog.close());
// A click on the backdrop (outside the picture and its bar) closes it too.
dialog.addEventListener("click", (event) => {
  if (event.target === dialog) dialog.close();
});

// An image the person attaches: checked, made smaller when it is larger than any model here
// reads, and turned into the data: URL POST /chat takes (chatapp/relay/images.py).
//
// Why 1344 x 1344 pixels' worth: Phi-3-vision's processor cuts an image into at most 16 crops
// of 336 x 336 (onnxruntime-extensions hard-codes 16), so more pixels add nothing the model
// sees, only bytes to send, keep and decode. A phone's 12-megapixel photo (3-8 MB) becomes a
// JPEG of a few hundred KB; a PNG (a screenshot) stays PNG unless that is still over the app's
// MAX_IMAGE_BYTES, then it becomes JPEG too. A file already within both bounds is sent as it
// is. The aspect ratio is kept (a long strip keeps its length in crops).
import { MAX_IMAGE_BYTES, sizeText } from "./page.js";
import { IMAGE_TYPES, newId } from "./store.js";

export const MAX_PIXELS = 1344 * 1344;
// A file larger than this is not even read (decoding it could take the tab's memory).
const MAX_FILE_BYTES = 64 * 1024 * 1024;
const JPEG_QUALITY = 0.9;

const urls = new Map(); // image id -> object URL, for as long as the page lives
const dataUrls = new Map(); // image id -> data: URL, made once

/** How a file is named in a sentence. */
function label(file) {
  const name = typeof file.name === "string" && file.name.trim() ? file.name.trim() : "";
  return name ? `“${name.slice(0, 80)}”` : "The pasted image";
}

function encode(canvas, type, quality) {
  return new Promise((resolve) => canvas.toBlob(resolve, type, quality));
}

/** `bitmap` drawn at width x height; `opaque` paints white under it (JPEG has no alpha). */
function draw(bitmap, width, height, opaque) {
  const canvas = document.createElement("canvas");
  canvas.width = width;
  canvas.height = height;
  const context = canvas.getContext("2d");
  if (opaque) {
    context.fillStyle = "#ffffff";
    context.fillRect(0, 0, width, height);
  }
  context.drawImage(bitmap, 0, 0, width, height);
  return canvas;
}

/** A file from the picker, the clipboard or a drop, ready to send:
 * {image: {id, type, blob, width, height, name}} or {error: "one sentence"}. */
export async function prepareImage(file) {
  const who = label(file);
  if (!IMAGE_TYPES.has(file.type)) return { error: `${who} is not a PNG, JPEG, WEBP or GIF image.` };
  if (file.size > MAX_FILE_BYTES) return { error: `${who} is too large to attach (${sizeText(file.size)}).` };
  let bitmap;
  try {
    bitmap = await createImageBitmap(file);
  } catch {
    return { error: `${who} could not be read as an image.` };
  }
  try {
    let { width, height } = bitmap;
    let blob = file;
    const scale = Math.min(1, Math.sqrt(MAX_PIXELS / (width * height)));
    if (scale < 1 || file.size > MAX_IMAGE_BYTES) {
      // Rounded down: the pixel count stays within MAX_PIXELS.
      width = Math.max(1, Math.floor(width * scale));
      height = Math.max(1, Math.floor(height * scale));
      const lossless = file.type === "image/png" || file.type === "image/gif";
      blob = lossless ? await encode(draw(bitmap, width, height, false), "image/png") : null;
      if (!blob || blob.size > MAX_IMAGE_BYTES) {
        blob = await encode(draw(bitmap, width, height, true), "image/jpeg", JPEG_QUALITY);
      }
    }
    if (!blob) return { error: `${who} could not be read as an image.` };
    if (blob.size > MAX_IMAGE_BYTES) {
      return { error: `${who} is larger than the ${sizeText(MAX_IMAGE_BYTES)} allowed for an image, even made smaller.` };
    }
    const name = typeof file.name === "string" ? file.name.trim().slice(0, 200) : "";
    return { image: { id: newId(), type: blob.type || file.type, blob, width, height, name } };
  } finally {
    bitmap.close();
  }
}

/** An object URL to show `image` (made once per image and page). */
export function imageUrl(image) {
  if (!urls.has(image.id)) urls.set(image.id, URL.createObjectURL(image.blob));
  return urls.get(image.id);
}

/** The data: URL POST /chat sends for `image`. */
export function dataUrl(image) {
  if (!dataUrls.has(image.id)) {
    dataUrls.set(
      image.id,
      new Promise((resolve, reject) => {
        const reader = new FileReader();
        reader.onload = () => resolve(reader.result);
        reader.onerror = () => reject(reader.error);
        reader.readAsDataURL(image.blob);
      }),
    );
  }
  return dataUrls.get(image.id);
}

/** What a chat keeps of an image beside its text (the file itself is in image-store.js). */
export function imageMeta(image) {
  return { id: image.id, type: image.type, width: image.width, height: image.height, name: image.name };
}

/** How an image is named to a screen reader. */
export function imageName(meta, index) {
  return meta.name ? `Image ${index + 1}: ${meta.name}` : `Image ${index + 1}`;
}

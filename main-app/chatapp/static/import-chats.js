// On first sign-in, the chats this browser kept before are offered for import: each goes to
// POST /api/chats with its messages (its images as data: URLs, at most MAX_IMAGES per chat, the
// newest kept; its text up to the server's MAX_IMPORT_BYTES), then the browser's copy stays as
// it was. Asked once per user and browser; the chats the server refused are named.
import { dataUrl } from "./images.js";
import { loadImage } from "./image-store.js";
import { $, announce, count, MAX_IMAGES } from "./page.js";

const askedKey = (user) => `chat.v1.import-asked.${user}`;

async function serverMessages(chat) {
  let imagesLeft = MAX_IMAGES;
  const messages = [];
  for (const message of [...chat.messages].reverse()) {
    const out = { role: message.role, content: message.content };
    if (message.ending?.finish_reason === "stop" || message.ending?.finish_reason === "length") {
      out.finish = message.ending.finish_reason;
    } else if (message.ending?.state === "stopped") {
      out.finish = "client_gone";
    } else if (message.ending?.state === "cut-off") {
      out.finish = "upstream_disconnected";
    }
    if (message.role === "assistant" && message.model) out.model = message.model;
    const urls = [];
    for (const meta of message.images || []) {
      if (imagesLeft <= 0) break;
      const image = await loadImage(meta.id);
      if (image) {
        urls.push(await dataUrl(image));
        imagesLeft -= 1;
      }
    }
    if (urls.length) out.images = urls;
    messages.unshift(out);
  }
  return messages;
}

const pause = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** POST /api/chats; a 503 (the app holds as many large bodies as it takes) is sent again
 * after its Retry-After, a few times. */
async function post(body) {
  for (let attempt = 0; ; attempt += 1) {
    const response = await fetch("/api/chats", {
      method: "POST",
      headers: { "Content-Type": "application/json", Accept: "application/json" },
      body,
    });
    if (response.status !== 503 || attempt >= 3) return response.ok;
    const seconds = parseInt(response.headers.get("Retry-After") || "", 10);
    await pause(1000 * Math.min(Number.isFinite(seconds) && seconds > 0 ? seconds : 2, 10));
  }
}

/** Import each chat; {done, failed}: a chat the server refused (larger than its
 * MAX_IMPORT_BYTES, say) stays in this browser only. */
async function importAll(local, chats) {
  let done = 0;
  let failed = 0;
  for (const entry of chats) {
    const chat = local.load(entry.id);
    if (!chat?.messages.length) continue;
    const body = {
      title: chat.title,
      messages: await serverMessages(chat),
      created_at: chat.created,
      updated_at: chat.updated,
    };
    let ok = false;
    try {
      ok = await post(JSON.stringify(body));
    } catch {
      ok = false; // the server did not answer
    }
    if (ok) done += 1;
    else failed += 1;
  }
  return { done, failed };
}

/** Offer the browser's chats to the signed-in `user` once; `onImported` redraws the list. */
export function importChats(local, user, onImported) {
  const chats = local.list();
  if (!chats.length || local.storage.getItem(askedKey(user)) !== null) return;
  const offer = $("import-offer");
  $("import-text").textContent = `This browser holds ${count(chats.length, "chat")} from before you signed in. Keep them with your account?`;
  offer.hidden = false;
  const asked = () => {
    try {
      local.storage.setItem(askedKey(user), String(Date.now()));
    } catch {
      // Storage full: the offer comes back next time.
    }
    offer.hidden = true;
  };
  $("skip-import").addEventListener("click", asked, { once: true });
  $("import-chats").addEventListener(
    "click",
    async () => {
      $("import-chats").disabled = true;
      const { done, failed } = await importAll(local, chats);
      asked();
      await onImported();
      let said = `Imported ${count(done, "chat")}.`;
      if (failed) {
        said += ` ${count(failed, "chat")} could not be kept with your account (too large, or the server did not answer); this browser still holds them.`;
        // Shown, not only announced: the person should know which copy is where.
        $("import-text").textContent = said;
        $("import-chats").hidden = true;
        $("skip-import").hidden = true;
        offer.hidden = false;
      }
      announce(said);
    },
    { once: true },
  );
}

// On first sign-in, the chats this browser kept before are offered for import: each goes to
// POST /api/chats with its messages (its images as data: URLs, at most MAX_IMAGES per chat, the
// newest kept), then the browser's copy stays as it was. Asked once per user and browser.
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

async function importAll(local, chats) {
  let done = 0;
  for (const entry of chats) {
    const chat = local.load(entry.id);
    if (!chat?.messages.length) continue;
    const body = {
      title: chat.title,
      messages: await serverMessages(chat),
      created_at: chat.created,
      updated_at: chat.updated,
    };
    const response = await fetch("/api/chats", {
      method: "POST",
      headers: { "Content-Type": "application/json", Accept: "application/json" },
      body: JSON.stringify(body),
    });
    if (response.ok) done += 1;
  }
  return done;
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
      const done = await importAll(local, chats);
      asked();
      await onImported();
      announce(`Imported ${count(done, "chat")}.`);
    },
    { once: true },
  );
}

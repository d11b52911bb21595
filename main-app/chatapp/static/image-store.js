// The images of saved chats, kept in this browser's IndexedDB: localStorage holds a few MB in
// all, a handful of photos. A chat (store.js) names its images by id; each record here is
// {id, chat, type, blob, width, height, name}, found by its id or, to delete a chat's images
// with it, by its chat. Every image of this page's life is also kept in memory, so a browser
// without IndexedDB (or with its storage full) still sends and shows them until the page
// closes; `imageStorage.kept` then says the browser did not keep them.

const DB_NAME = "chat-images";
const STORE = "images";
const memory = new Map();
let database = null;

/** `kept` false once the browser refused to keep an image (no IndexedDB, storage full). */
export const imageStorage = { kept: true };

function opened() {
  if (!database) {
    database = new Promise((resolve) => {
      try {
        const request = indexedDB.open(DB_NAME, 1);
        request.onupgradeneeded = () => {
          const store = request.result.createObjectStore(STORE, { keyPath: "id" });
          store.createIndex("chat", "chat");
        };
        request.onsuccess = () => resolve(request.result);
        request.onerror = () => resolve(null);
        request.onblocked = () => resolve(null);
      } catch {
        resolve(null); // no IndexedDB here (some private modes)
      }
    });
  }
  return database;
}

/** Run `action(store)` in one transaction; its result, or null when the browser refused. */
async function transaction(mode, action) {
  const db = await opened();
  if (!db) return null;
  return new Promise((resolve) => {
    try {
      const tx = db.transaction(STORE, mode);
      let result = null;
      const request = action(tx.objectStore(STORE));
      if (request) {
        request.onsuccess = () => {
          result = request.result;
        };
      }
      tx.oncomplete = () => resolve({ result });
      tx.onerror = () => resolve(null);
      tx.onabort = () => resolve(null);
    } catch {
      resolve(null);
    }
  });
}

/** Hold `image` for this page (before its chat is saved). */
export function remember(image) {
  memory.set(image.id, image);
}

/** Keep `image` with the chat `chatId`; false when the browser refused. */
export async function keepImage(image, chatId) {
  const record = { ...image, chat: chatId };
  memory.set(image.id, record);
  const done = await transaction("readwrite", (store) => store.put(record));
  if (!done) imageStorage.kept = false;
  return Boolean(done);
}

/** The image `id`: from memory, else from IndexedDB; null when it is not kept. */
export async function loadImage(id) {
  if (memory.has(id)) return memory.get(id);
  const done = await transaction("readonly", (store) => store.get(id));
  const record = done?.result;
  if (!record || !(record.blob instanceof Blob) || record.id !== id) return null;
  memory.set(id, record);
  return record;
}

/** Forget every image of the chat `chatId`, in memory and in IndexedDB. */
export async function forgetChat(chatId) {
  for (const [id, image] of memory) {
    if (image.chat === chatId) memory.delete(id);
  }
  await transaction("readwrite", (store) => {
    const cursor = store.index("chat").openKeyCursor(IDBKeyRange.only(chatId));
    cursor.onsuccess = () => {
      if (cursor.result) {
        store.delete(cursor.result.primaryKey);
        cursor.result.continue();
      }
    };
    return null;
  });
}

// The model picker (issue 56): the chat models the model service serves (GET /api/models,
// chatapp/relay/model_list.py), offered when there are several, each with whether it is loaded
// or how long a cold one takes to load. The choice is kept per chat (store.js, server-chats.js)
// and sent as POST /chat's `model`; a new chat takes the model chosen last. The paperclip
// follows what the chosen model reads (attachments.js).
import { setImageInput } from "./attachments.js";
import { $ } from "./page.js";
import { state, store } from "./state.js";
import { modelName } from "./store.js";
import { relabelReplies } from "./views.js";

const row = $("model-row");
const picker = $("model-picker");
const badge = $("model-badge");

/** [{id, default, state, load_s, input_modalities, aliases}], as the app lists them. */
let models = [];
/** What /healthz says the default model reads: true, false or undefined (status.js). */
let defaultReads;

const seconds = (value) => `~${Math.max(1, Math.round(value))} s`;

/** How ready `model` is, in a few words; "" when the model service does not say. */
export function readiness(model) {
  if (model.state === "loaded") return "loaded";
  if (model.state === "loading") return "loading";
  if (model.state === "failed") return "failed to load";
  if (model.state === "available") {
    return typeof model.load_s === "number" ? `cold, loads in ${seconds(model.load_s)}` : "cold";
  }
  return "";
}

function cleanModels(listed) {
  const kept = [];
  for (const model of Array.isArray(listed) ? listed : []) {
    const id = modelName(model?.id);
    if (!id || kept.some((other) => other.id === id)) continue;
    kept.push({
      id,
      default: model.default === true,
      state: typeof model.state === "string" ? model.state : null,
      load_s: typeof model.load_s === "number" && model.load_s >= 0 ? model.load_s : null,
      input_modalities: Array.isArray(model.input_modalities) ? model.input_modalities : null,
      aliases: (Array.isArray(model.aliases) ? model.aliases : []).map(modelName).filter(Boolean),
    });
  }
  return kept;
}

/** The listed model a name (an id or an alias) stands for, or undefined. */
const listed = (name) => models.find((model) => model.id === name || model.aliases.includes(name));

/** The model the open chat asks: its own if it is still served; a chat not yet begun takes
 * the one chosen last; else the default. */
function chosen() {
  const own = state.chat?.model && listed(state.chat.model);
  if (own) return own;
  const last = !state.chat?.messages.length && listed(store.loadLastModel());
  return last || models.find((model) => model.default) || models[0];
}

/** POST /chat's `model`: the chosen one's id where the page offers a choice; null where the
 * model service has one model (or did not say), which then answers as before. */
export function chatModel() {
  return models.length > 1 ? chosen().id : null;
}

function applyImageInput() {
  const model = models.length > 1 ? chosen() : null;
  if (model && Array.isArray(model.input_modalities)) {
    setImageInput(model.input_modalities.includes("image"));
  } else {
    // One model, or one not known yet: the default's, as /healthz says it (else offered)
    setImageInput(!model || model.default ? defaultReads : undefined);
  }
}

/** /healthz's answer for the default model (status.js). */
export function setDefaultImageInput(value) {
  defaultReads = value;
  applyImageInput();
}

function render() {
  const several = models.length > 1;
  row.hidden = !several;
  document.body.classList.toggle("several-models", several);
  if (several !== state.severalModels) {
    state.severalModels = several;
    relabelReplies(); // the header's model no longer names every reply
  }
  if (several) {
    const options = models.map((model) => {
      const option = document.createElement("option");
      option.value = model.id;
      const words = [model.default ? `${model.id} (default)` : model.id, readiness(model)];
      option.textContent = words.filter(Boolean).join(" · ");
      return option;
    });
    picker.replaceChildren(...options);
    const model = chosen();
    picker.value = model.id;
    const said = readiness(model);
    badge.textContent = said ? said[0].toUpperCase() + said.slice(1) : "";
    badge.hidden = !said;
    badge.dataset.state = model.state === "available" ? "cold" : model.state || "";
  }
  applyImageInput();
}

/** Ask the app for the list again (at the start, after each reply, as /healthz is polled); a
 * failure keeps the list the page has. */
export async function refreshModels() {
  try {
    const response = await fetch("/api/models", { headers: { Accept: "application/json" }, cache: "no-store" });
    if (!response.ok) return;
    models = cleanModels((await response.json()).models);
  } catch {
    return;
  }
  render();
}

/** The open chat changed (open-chat.js): show its model. */
export function showChatModel() {
  render();
}

picker.addEventListener("change", () => {
  const chat = state.chat;
  const model = listed(picker.value);
  if (!chat || !model) return;
  chat.model = model.id;
  store.saveLastModel(model.id);
  // Kept with the chat without moving it up the list; a chat not yet begun keeps it in memory
  // until its first message is saved.
  if (chat.messages.length && !store.server) store.save(chat);
  render();
});

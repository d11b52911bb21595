// The model's status beside the title, from the app's GET /healthz, whether it reads images and
// whether it transcribes speech.
import { setImageInput } from "./attachments.js";
import { setSpeech } from "./microphone.js";
import { log, modelNameLabel, modelStatus } from "./page.js";
import { assistantName, state } from "./state.js";

let statusTimer = null;

export function showModelStatus(kind, label) {
  modelStatus.dataset.state = kind;
  modelStatus.querySelector(".label").textContent = label;
}

function setModelName(name) {
  const value = typeof name === "string" && name.trim() ? name.trim().slice(0, 100) : null;
  if (value === state.modelName) return;
  state.modelName = value;
  modelNameLabel.textContent = value || "";
  modelNameLabel.hidden = !value;
  for (const role of log.querySelectorAll(".message.assistant .role")) role.textContent = assistantName();
}

export async function pollModelStatus() {
  clearTimeout(statusTimer);
  let next = 5000;
  try {
    const response = await fetch("/healthz", { cache: "no-store" });
    const body = await response.json();
    const sidecar = body.sidecar || {};
    setModelName(body.model);
    if (sidecar.ready) {
      showModelStatus("ready", "Model ready");
      // Whether it reads images: true, false, or not said (unknown: images are offered).
      const imageInput = sidecar.detail?.image_input;
      setImageInput(typeof imageInput === "boolean" ? imageInput : undefined);
      // Whether it transcribes speech (the microphone): said, or not (offered).
      setSpeech(sidecar.detail?.speech);
      next = 30000;
    } else if (sidecar.reachable) {
      const phase = sidecar.detail && typeof sidecar.detail.phase === "string" ? sidecar.detail.phase : "";
      if (phase === "failed") showModelStatus("down", "The model could not be loaded");
      else if (phase === "restarting") showModelStatus("loading", "Model restarting…");
      else showModelStatus("loading", phase ? `Model loading (${phase})…` : "Model loading…");
    } else {
      showModelStatus("down", "Model service not reachable");
    }
  } catch {
    showModelStatus("down", "Chat service not reachable");
  }
  statusTimer = setTimeout(pollModelStatus, next);
}

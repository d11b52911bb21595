// The model's status beside the title, from the app's GET /healthz, whether it reads images and
// whether it transcribes speech; the models to pick from are asked for as often.
import { setSpeech } from "./microphone.js";
import { refreshModels, setDefaultImageInput } from "./model-picker.js";
import { modelNameLabel, modelStatus } from "./page.js";
import { state } from "./state.js";
import { relabelReplies } from "./views.js";

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
  relabelReplies();
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
      setDefaultImageInput(typeof imageInput === "boolean" ? imageInput : undefined);
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
  refreshModels();
  statusTimer = setTimeout(pollModelStatus, next);
}

// The settings (kept per browser): a system prompt, the temperature, the longest reply.
import { showStorageNote } from "./chats.js";
import { closeDialog, showDialog } from "./dialogs.js";
import { $, announce, clean, count, TOKENS_LIMIT } from "./page.js";
import { state, store } from "./state.js";

const settingsDialog = $("settings-dialog");
const settingsForm = $("settings-form");
const systemField = $("setting-system");
const temperatureField = $("setting-temperature");
const tokensField = $("setting-max-tokens");
const settingsError = $("settings-error");

export function renderSettingsSummary() {
  const parts = [];
  if (state.settings.system.trim()) parts.push("system prompt on");
  if (state.settings.temperature !== null) parts.push(`temperature ${state.settings.temperature}`);
  if (state.settings.maxNewTokens !== null) parts.push(`up to ${count(state.settings.maxNewTokens, "token")}`);
  $("settings-summary").textContent = parts.length ? ` · ${parts.join(", ")}` : "";
}

export function openSettings() {
  systemField.value = state.settings.system;
  temperatureField.value = state.settings.temperature === null ? "" : String(state.settings.temperature);
  tokensField.value = state.settings.maxNewTokens === null ? "" : String(state.settings.maxNewTokens);
  settingsError.hidden = true;
  for (const field of [temperatureField, tokensField]) field.removeAttribute("aria-invalid");
  showDialog(settingsDialog, $("open-settings"));
  systemField.focus();
}

function readNumber(field, { min, max, integer, name }) {
  const raw = field.value.trim();
  field.removeAttribute("aria-invalid");
  if (raw === "" && !field.validity.badInput) return { value: null };
  const value = Number(raw);
  if (raw === "" || !Number.isFinite(value) || value < min || value > max || (integer && !Number.isInteger(value))) {
    field.setAttribute("aria-invalid", "true");
    return { error: `${name} must be ${integer ? "a whole number" : "a number"} from ${min} to ${max}, or empty.` };
  }
  return { value };
}

settingsForm.addEventListener("submit", (event) => {
  event.preventDefault();
  const temperature = readNumber(temperatureField, { min: 0, max: 2, integer: false, name: "Temperature" });
  const tokens = readNumber(tokensField, { min: 1, max: TOKENS_LIMIT, integer: true, name: "Max reply length" });
  const error = temperature.error || tokens.error;
  if (error) {
    settingsError.textContent = error;
    settingsError.hidden = false;
    (temperature.error ? temperatureField : tokensField).focus();
    return;
  }
  state.settings = { system: clean(systemField.value), temperature: temperature.value, maxNewTokens: tokens.value };
  store.saveSettings(state.settings);
  showStorageNote();
  renderSettingsSummary();
  closeDialog(settingsDialog);
  announce("Settings saved.");
});
$("settings-cancel").addEventListener("click", () => closeDialog(settingsDialog));
$("settings-reset").addEventListener("click", () => {
  systemField.value = "";
  temperatureField.value = "";
  tokensField.value = "";
  settingsError.hidden = true;
  systemField.focus();
});

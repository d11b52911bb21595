// The microphone beside the message box (issue 57): the button records with MediaRecorder
// (webm/opus where the browser has it), a bar shows the elapsed time and a live level; pressing
// the button again stops and sends the recording to POST /api/transcribe, whose text goes into
// the message box to read and edit: it is never sent by itself. Cancel or Esc drops the
// recording (or the transcription on its way). The recording lives in memory until its text
// comes back, never stored. Whether the model service transcribes speech, and for how long a
// recording, comes from /healthz (status.js calls setSpeech): without it the button is off and
// says why. Every problem is a sentence under the composer, never an alert.
import { $, announce, autosize, input } from "./page.js";

const button = $("mic");
const reason = $("mic-reason");
const bar = $("recording");
const barState = $("recording-state");
const clock = $("recording-time");
const level = $("recording-level");
const note = $("mic-note");

// The sidecar's SPEECH_MAX_SECONDS default, until /healthz says the model service's own.
let maxSeconds = 300;
/** Why the button is off (a sentence), or null. */
let off = null;
/** The recording under way: {recorder, stream, chunks, started, timer, audio, frame, dropped}. */
let take = null;
/** The transcription on its way (an AbortController). */
let sending = null;

// What the browser records, best first; Safari records mp4 only.
const TYPES = ["audio/webm;codecs=opus", "audio/ogg;codecs=opus", "audio/webm", "audio/mp4"];
const UNSUPPORTED = "Voice input needs a browser that can record, on an https page.";
const SPEECH_OFF = "The model service has no speech model: voice input is off.";
const SPEECH_FAILED = "The speech model could not be loaded: voice input is off.";
const SPEECH_LOADING = "The speech model is still loading.";

const supported = () => Boolean(navigator.mediaDevices?.getUserMedia && window.MediaRecorder);

function showNote(text) {
  note.textContent = text;
}

function minutes(seconds) {
  const whole = Math.floor(seconds);
  return `${Math.floor(whole / 60)}:${String(whole % 60).padStart(2, "0")}`;
}

function render() {
  const why = off || (supported() ? null : UNSUPPORTED);
  button.setAttribute("aria-disabled", String(Boolean(why)));
  button.setAttribute("aria-pressed", String(Boolean(take)));
  button.title = why || (take ? "Stop and transcribe" : `Speak your message (up to ${minutes(maxSeconds)})`);
  reason.textContent = why || "";
  button.classList.toggle("busy", Boolean(sending));
  bar.hidden = !take && !sending;
  if (sending) barState.textContent = "Transcribing…";
  else if (take) barState.textContent = "Recording";
  clock.hidden = Boolean(sending);
  level.hidden = Boolean(sending);
}

/** What the model service says of speech (/healthz's `speech`), or undefined: not said, so
 * the button is offered and a refusal shows as its sentence. */
export function setSpeech(speech) {
  if (speech && typeof speech === "object") {
    if (speech.served === false) off = SPEECH_OFF;
    else if (speech.phase === "failed") off = SPEECH_FAILED;
    else if (speech.phase && speech.phase !== "ready") off = SPEECH_LOADING;
    else off = null;
    if (Number.isFinite(speech.max_seconds) && speech.max_seconds > 0) maxSeconds = speech.max_seconds;
  } else {
    off = null;
  }
  if (!off && [SPEECH_OFF, SPEECH_FAILED, SPEECH_LOADING].includes(note.textContent)) showNote("");
  render();
}

async function record() {
  showNote("");
  let stream;
  try {
    stream = await navigator.mediaDevices.getUserMedia({ audio: true });
  } catch (error) {
    const denied = error?.name === "NotAllowedError" || error?.name === "SecurityError";
    if (denied) showNote("The microphone is not allowed for this page: allow it in the browser's site settings to speak a message.");
    else if (error?.name === "NotFoundError") showNote("No microphone was found.");
    else showNote("The microphone could not be started.");
    return;
  }
  const mimeType = TYPES.find((type) => MediaRecorder.isTypeSupported(type));
  const recorder = new MediaRecorder(stream, mimeType ? { mimeType } : undefined);
  const current = { recorder, stream, chunks: [], started: performance.now(), dropped: false };
  take = current;
  recorder.addEventListener("dataavailable", (event) => {
    if (event.data.size) current.chunks.push(event.data);
  });
  recorder.addEventListener("stop", () => ended(current));
  recorder.start(1000);
  listen(current);
  current.timer = setInterval(() => tick(current), 250);
  tick(current);
  render();
  announce("Recording");
}

function tick(current) {
  const seconds = (performance.now() - current.started) / 1000;
  clock.textContent = `${minutes(seconds)} / ${minutes(maxSeconds)}`;
  if (seconds >= maxSeconds && current.recorder.state === "recording") {
    showNote(`A recording can be ${minutes(maxSeconds)} long: it was stopped there.`);
    current.recorder.stop();
  }
}

/** The live level: the loudness of the last few milliseconds, drawn each frame. */
function listen(current) {
  try {
    current.audio = new AudioContext();
    const analyser = current.audio.createAnalyser();
    analyser.fftSize = 1024;
    current.audio.createMediaStreamSource(current.stream).connect(analyser);
    const samples = new Float32Array(analyser.fftSize);
    const draw = () => {
      analyser.getFloatTimeDomainData(samples);
      let sum = 0;
      for (const sample of samples) sum += sample * sample;
      level.value = Math.min(1, Math.sqrt(sum / samples.length) * 4);
      current.frame = requestAnimationFrame(draw);
    };
    draw();
  } catch {
    level.hidden = true; // no level where the browser has no Web Audio: the clock still runs
  }
}

function release(current) {
  clearInterval(current.timer);
  cancelAnimationFrame(current.frame);
  for (const track of current.stream.getTracks()) track.stop();
  current.audio?.close().catch(() => {});
  level.value = 0;
}

function ended(current) {
  release(current);
  if (take === current) take = null;
  const chunks = current.chunks;
  current.chunks = [];
  if (current.dropped || !chunks.length) {
    render();
    return;
  }
  transcribe(new Blob(chunks, { type: current.recorder.mimeType || "audio/webm" }));
}

function extension(type) {
  if (type.includes("ogg")) return "ogg";
  if (type.includes("mp4")) return "m4a";
  return "webm";
}

async function transcribe(recording) {
  const controller = new AbortController();
  sending = controller;
  render();
  announce("Transcribing");
  const form = new FormData();
  form.append("file", recording, `recording.${extension(recording.type)}`);
  try {
    const response = await fetch("/api/transcribe", { method: "POST", body: form, signal: controller.signal });
    const body = await response.json().catch(() => ({}));
    if (!response.ok) {
      const type = body.error?.type;
      if (type === "speech_not_served") off = SPEECH_OFF;
      else if (type === "speech_failed") off = SPEECH_FAILED;
      showNote(body.error?.message || "The recording could not be transcribed.");
      return;
    }
    const text = typeof body.text === "string" ? body.text.trim() : "";
    if (!text) {
      showNote("No speech was heard in the recording; try again, closer to the microphone.");
      announce("No speech was heard");
      return;
    }
    place(text);
    announce("Transcript ready");
  } catch {
    if (!controller.signal.aborted) showNote("The chat service is not reachable. Check your connection and try again.");
  } finally {
    if (sending === controller) sending = null;
    render();
  }
}

/** The transcript into the message box where the caret is, to be read and edited. */
function place(text) {
  const start = input.selectionStart ?? input.value.length;
  const end = input.selectionEnd ?? start;
  const before = input.value.slice(0, start);
  const after = input.value.slice(end);
  const gap = before && !/\s$/.test(before) ? " " : "";
  input.value = `${before}${gap}${text}${after}`;
  const caret = before.length + gap.length + text.length;
  input.focus();
  input.setSelectionRange(caret, caret);
  autosize();
}

/** Drop the recording, or the transcription on its way; false when there is neither. */
export function cancelVoice() {
  if (take) {
    take.dropped = true;
    take.recorder.stop();
    take = null;
  } else if (sending) {
    sending.abort();
    sending = null;
  } else {
    return false;
  }
  render();
  announce("Recording cancelled");
  button.focus();
  return true;
}

button.addEventListener("click", () => {
  const why = off || (supported() ? null : UNSUPPORTED);
  if (take) take.recorder.stop();
  else if (sending) return;
  else if (why) showNote(why);
  else record();
});
$("recording-cancel").addEventListener("click", cancelVoice);
// Esc drops a recording before anything else it would do (chat.js: stop a reply).
document.addEventListener(
  "keydown",
  (event) => {
    if (event.key !== "Escape" || document.querySelector("dialog[open]")) return;
    if (cancelVoice()) {
      event.preventDefault();
      event.stopPropagation();
    }
  },
  true,
);

render();

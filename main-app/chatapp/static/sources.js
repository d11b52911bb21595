// A grounded reply's sources (the stream's first line, chatapp/relay/wire.py): listed under the
// reply as soon as they are chosen, kept there once it ends, the ones it cited marked. And the
// line that says how far the model is in reading a long prompt, or in loading, until the first
// word.
import { count } from "./page.js";

function where(source) {
  return source.page ? `${source.name}, page ${source.page}` : source.name;
}

/** The list of `sources` ([{n, name, page, document_id}]); empty when none was found. */
export function sourcesList(sources) {
  const box = document.createElement("div");
  box.className = "sources";
  const heading = document.createElement("p");
  heading.className = "sources-heading";
  heading.textContent = sources.length ? "Sources" : "No source in your documents matched";
  box.append(heading);
  if (!sources.length) return box;
  const list = document.createElement("ol");
  list.setAttribute("aria-label", "Sources");
  for (const source of sources) {
    const item = document.createElement("li");
    item.dataset.n = String(source.n);
    const number = document.createElement("span");
    number.className = "source-n";
    number.textContent = `[${source.n}]`;
    const name = document.createElement("span");
    name.className = "source-name";
    name.textContent = where(source);
    item.append(number, " ", name);
    list.append(item);
  }
  box.append(list);
  return box;
}

/** Mark the sources the reply cited (the done line's checked `citations`). */
export function markCited(box, citations) {
  const cited = new Set((Array.isArray(citations) ? citations : []).map((c) => c.n));
  for (const item of box.querySelectorAll("li")) {
    const yes = cited.has(Number(item.dataset.n));
    item.classList.toggle("cited", yes);
    item.querySelector(".source-cited")?.remove();
    if (yes) {
      const mark = document.createElement("span");
      mark.className = "source-cited";
      mark.textContent = "cited";
      item.append(" ", mark);
    }
  }
}

/** "Reading 3 sources · 41% · about 12 s left", or "Reading your message · 41%". */
export function progressText(progress, sources) {
  const what = sources?.length ? `Reading ${count(sources.length, "source")}` : "Reading your message";
  const parts = [what];
  if (progress.total > 0) parts.push(`${Math.floor((100 * progress.read) / progress.total)}%`);
  if (typeof progress.seconds_left === "number" && progress.read < progress.total) {
    parts.push(`about ${Math.max(1, Math.round(progress.seconds_left))} s left`);
  }
  return parts.join(" · ");
}

/** "Loading smollm2 · about 12 s", while a cold model loads (the stream's `loading` lines);
 * its first load: how long it has taken so far. */
export function loadingText(loading) {
  const parts = [`Loading ${loading.model}`];
  if (typeof loading.seconds_left === "number") {
    parts.push(`about ${Math.max(1, Math.round(loading.seconds_left))} s`);
  } else if (typeof loading.seconds === "number" && loading.seconds >= 1) {
    parts.push(`${Math.round(loading.seconds)} s so far`);
  }
  return parts.join(" · ");
}

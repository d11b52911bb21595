// Citations in a grounded reply: each [n] the app checked (the done line's `citations`,
// chatapp/documents/search/grounding.py) becomes a chip that opens its passage, its file and page; a
// number the app found no passage for (`unknown_citations`) is shown struck through, linked
// to nothing. Only text outside code is touched, and only as text nodes.
import { $ } from "./page.js";

const dialog = $("citation-dialog");
const MARK = /\[(\d{1,4}(?:\s*,\s*\d{1,4})*)\](?!\()/g;

function openCitation(citation) {
  $("citation-heading").textContent = `Source [${citation.n}]`;
  $("citation-where").textContent = citation.page ? `${citation.name}, page ${citation.page}` : citation.name;
  $("citation-text").textContent = citation.text;
  dialog.showModal();
}

function chip(n, citation) {
  if (!citation) {
    const unknown = document.createElement("s");
    unknown.className = "citation unknown";
    unknown.title = "No such passage was given: this number is not a source";
    unknown.textContent = `[${n}]`;
    return unknown;
  }
  const element = document.createElement("button");
  element.type = "button";
  element.className = "citation";
  element.textContent = String(n);
  element.setAttribute("aria-label", `Source ${n}: ${citation.name}${citation.page ? `, page ${citation.page}` : ""}`);
  element.addEventListener("click", () => openCitation(citation));
  return element;
}

/** Turn the [n] marks of a rendered reply (`body`) into chips, given its citations. */
export function linkCitations(body, citations) {
  if (!Array.isArray(citations)) return;
  const byNumber = new Map(citations.map((citation) => [citation.n, citation]));
  const walker = document.createTreeWalker(body, NodeFilter.SHOW_TEXT, {
    acceptNode: (node) =>
      node.parentElement?.closest("code, pre, a") ? NodeFilter.FILTER_REJECT : NodeFilter.FILTER_ACCEPT,
  });
  const nodes = [];
  while (walker.nextNode()) nodes.push(walker.currentNode);
  for (const node of nodes) {
    const text = node.nodeValue;
    if (!MARK.test(text)) continue;
    MARK.lastIndex = 0;
    const parts = [];
    let end = 0;
    for (const match of text.matchAll(MARK)) {
      parts.push(document.createTextNode(text.slice(end, match.index)));
      for (const number of match[1].split(",").map((part) => Number(part.trim()))) {
        parts.push(chip(number, byNumber.get(number)));
      }
      end = match.index + match[0].length;
    }
    parts.push(document.createTextNode(text.slice(end)));
    node.replaceWith(...parts);
  }
}

$("citation-close").addEventListener("click", () => dialog.close());

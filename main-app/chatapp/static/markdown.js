// Replies as Markdown. marked turns the model's text into HTML, DOMPurify keeps only an
// allow-list of it, and the result goes into the page as DOM nodes (a DocumentFragment, never an
// HTML string). Model output and stored history are untrusted: raw HTML in the Markdown
// is shown as text, and no script, event handler, style, frame, form, SVG or MathML, nor any
// link other than http(s) or mailto, survives. Links open in a new tab without a referrer.
//
// While a reply streams, the blocks that can no longer change (every block before the one
// being written) are rendered once and kept; only the open last block is rendered again, at
// most once per animation frame. Code is coloured (highlight.js, class names only) once its
// block is complete.
import { Marked } from "./vendor/marked/marked.esm.js";
import DOMPurify from "./vendor/dompurify/purify.es.mjs";
import hljs from "./vendor/highlightjs/highlight.min.js";

const SANITIZE = {
  ALLOWED_TAGS: [
    "a", "blockquote", "br", "code", "del", "em", "h1", "h2", "h3", "h4", "h5", "h6", "hr",
    "li", "ol", "p", "pre", "s", "span", "strong", "table", "tbody", "td", "th", "thead", "tr",
    "ul",
  ],
  ALLOWED_ATTR: ["href", "title", "class", "start", "align"],
  ALLOWED_URI_REGEXP: /^(?:https?|mailto):/i,
  // Attributes whose values are not addresses (DOMPurify checks all others like href).
  ADD_URI_SAFE_ATTR: ["align", "start"],
  ALLOW_DATA_ATTR: false,
  ALLOW_ARIA_ATTR: false,
  RETURN_DOM_FRAGMENT: true,
};
// Class names that the renderer below writes; any other class (there should be none) goes.
const KNOWN_CLASS = /^(?:hljs(?:-[a-z_]+)*|[a-z_]+_|language-[\w+#.-]{1,40})$/;

DOMPurify.addHook("uponSanitizeAttribute", (_node, data) => {
  if (data.attrName === "class") {
    data.attrValue = data.attrValue
      .split(/\s+/)
      .filter((name) => KNOWN_CLASS.test(name))
      .join(" ");
    if (!data.attrValue) data.keepAttr = false;
  }
});
DOMPurify.addHook("afterSanitizeAttributes", (node) => {
  if (node.nodeName === "A" && node.hasAttribute("href")) {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer nofollow");
  }
});

const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
const escapeHtml = (text) => String(text).replace(/[&<>"']/g, (char) => ESCAPES[char]);

/** Whether code blocks are coloured in the render under way (only blocks that are complete). */
let colouring = false;

const markdown = new Marked({
  gfm: true,
  breaks: true,
  renderer: {
    // Raw HTML in the model's Markdown is shown as the text it is.
    html({ text, block }) {
      return block ? `<p>${escapeHtml(text.trim())}</p>\n` : escapeHtml(text);
    },
    // No images: a model's image URL could carry data out of the page. Show a link instead.
    image({ href, text }) {
      const label = text ? `image: ${text}` : "image";
      return `<a href="${escapeHtml(href)}">${escapeHtml(label)}</a>`;
    },
    checkbox({ checked }) {
      return checked ? "☑ " : "☐ ";
    },
    code({ text, lang }) {
      const language = ((lang || "").match(/^\S*/) || [""])[0].toLowerCase();
      let body = escapeHtml(text);
      let classes = language ? `language-${language}` : "";
      if (colouring && language && hljs.getLanguage(language)) {
        try {
          body = hljs.highlight(text, { language, ignoreIllegals: true }).value;
          classes += " hljs";
        } catch {
          // Leave the block uncoloured.
        }
      }
      return `<pre><code class="${escapeHtml(classes)}">${body}</code></pre>\n`;
    },
  },
});

const normalize = (text) => text.replace(/\r\n?/g, "\n");

/** Sanitised DOM for HTML that marked wrote, with code blocks and tables made usable. */
function toFragment(html) {
  const fragment = DOMPurify.sanitize(html, SANITIZE);
  for (const pre of fragment.querySelectorAll("pre")) {
    const code = pre.querySelector("code");
    const language = code
      ? [...code.classList].find((name) => name.startsWith("language-"))?.slice(9)
      : "";
    const block = document.createElement("div");
    block.className = "code-block";
    const head = document.createElement("div");
    head.className = "code-head";
    const label = document.createElement("span");
    label.className = "code-lang";
    label.textContent = language || "code";
    const copy = document.createElement("button");
    copy.type = "button";
    copy.className = "copy-code";
    copy.textContent = "Copy code";
    head.append(label, copy);
    pre.tabIndex = 0; // a wide block scrolls sideways from the keyboard too
    pre.replaceWith(block);
    block.append(head, pre);
  }
  for (const table of fragment.querySelectorAll("table")) {
    const wrap = document.createElement("div");
    wrap.className = "table-wrap";
    wrap.tabIndex = 0;
    table.replaceWith(wrap);
    wrap.append(table);
  }
  return fragment;
}

function renderTokens(tokens, colour) {
  colouring = colour;
  try {
    return toFragment(markdown.parser(tokens));
  } finally {
    colouring = false;
  }
}

/** Render the whole of `text` into `container`, replacing what it held. */
export function renderMarkdown(container, text) {
  container.replaceChildren(renderTokens(markdown.lexer(normalize(text)), true));
}

/** The text a person reads in a rendered reply (without the code blocks' buttons). */
export function readableText(container) {
  const copy = container.cloneNode(true);
  for (const head of copy.querySelectorAll(".code-head")) head.remove();
  return copy.textContent.replace(/\s+/g, " ").trim();
}

/** A reply being written: `update(text)` with the text so far, `finish(text)` at the end. */
export class MarkdownStream {
  /** `around(render)` runs each render (the page keeps the end of the reply in view). */
  constructor(container, around = (render) => render()) {
    this.container = container;
    this.around = around;
    this.text = "";
    this.stableEnd = 0; // characters of the (normalized) text rendered as finished blocks
    this.live = []; // the nodes of the open block, replaced at each render
    this.frame = 0;
  }

  update(text) {
    this.text = text;
    if (!this.frame) {
      this.frame = requestAnimationFrame(() => {
        this.frame = 0;
        this.around(() => this.render(false));
      });
    }
  }

  finish(text) {
    cancelAnimationFrame(this.frame);
    this.frame = 0;
    this.text = text;
    const source = normalize(text);
    // Reference-style links are defined anywhere in a reply: with any, render it whole once.
    const all = markdown.lexer(source);
    if (Object.keys(all.links || {}).length > 0) {
      this.around(() => renderMarkdown(this.container, text));
      return;
    }
    this.around(() => this.render(true));
  }

  render(final) {
    const source = normalize(this.text);
    const tokens = markdown.lexer(source.slice(this.stableEnd));
    let open = tokens.length - 1;
    while (open >= 0 && tokens[open].type === "space") open -= 1;
    if (final) open = tokens.length; // everything is finished
    if (open > 0) {
      const finished = tokens.slice(0, open);
      const raw = finished.map((token) => token.raw).join("");
      if (source.startsWith(raw, this.stableEnd)) {
        const fragment = renderTokens(finished, true);
        for (const node of this.live) node.remove();
        this.live = [];
        this.container.append(fragment);
        this.stableEnd += raw.length;
        if (final) return;
        tokens.splice(0, open);
      }
    }
    const fragment = renderTokens(tokens, final);
    for (const node of this.live) node.remove();
    this.live = [...fragment.childNodes];
    this.container.append(fragment);
  }
}

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
import { Marked, Tokenizer } from "./vendor/marked/marked.esm.js";
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

// How deep lists and quotes may nest. marked's lexer recurses once per level, so a reply stuck
// in a list ("- - - - …x", 3 KB) or a quote (">>>>…") overflowed the browser's stack; and a page
// hundreds of levels deep is unreadable anyway. Past the cap, a line's next container marker is
// escaped (it shows as the character it is), and indentation, which nests lists too, is cut to
// MAX_INDENT columns. Code (fenced) is left as written.
export const MAX_NESTING = 8;
const MAX_INDENT = 4 * MAX_NESTING;
const CONTAINER = /^[ \t]{0,3}(?:(?:[*+-]|\d{1,9}[.)])(?:[ \t]+|$)|>[ \t]?)/;
const THEMATIC_BREAK = /^ {0,3}(?:(?:-[ \t]*){3,}|(?:_[ \t]*){3,}|(?:\*[ \t]*){3,})$/;
const FENCE = /^(`{3,}(?=[^`]*$)|~{3,})/;
const LEADING_SPACE = /^[ \t]*/;

/** Columns of leading white space, tabs to the next multiple of 4 (as CommonMark counts). */
function columns(space) {
  let width = 0;
  for (const char of space) width = char === "\t" ? width + 4 - (width % 4) : width + 1;
  return width;
}

/** `line` with its nesting capped, and what follows its container markers (its content). */
function capLine(line) {
  const space = LEADING_SPACE.exec(line)[0];
  let kept = columns(space) > MAX_INDENT ? " ".repeat(MAX_INDENT) : space;
  let rest = line.slice(space.length);
  for (let depth = 0; !THEMATIC_BREAK.test(rest); depth += 1) {
    const marker = CONTAINER.exec(rest);
    if (!marker) break;
    if (depth === MAX_NESTING) {
      const at = marker[0].search(/[*+\->.)]/);
      rest = `${rest.slice(0, at)}\\${rest.slice(at)}`;
      break;
    }
    kept += marker[0];
    rest = rest.slice(marker[0].length);
  }
  return { line: kept + rest, content: rest };
}

/** `source` with no line nested deeper than MAX_NESTING (see above); line by line, so a text's
 * start is capped the same way whatever follows it (the streamed blocks rely on that). */
export function capNesting(source) {
  const lines = source.split("\n");
  let fence = null; // the open code fence ("```", "~~~~", ...), or null
  for (let i = 0; i < lines.length; i += 1) {
    if (fence) {
      // Inside a fence only its end counts (behind the same markers and indentation).
      let rest = lines[i].trimStart();
      for (let marker = CONTAINER.exec(rest); marker; marker = CONTAINER.exec(rest)) {
        rest = rest.slice(marker[0].length).trimStart();
      }
      const run = rest.match(/^(`+|~+)[ \t]*$/);
      if (run && run[1][0] === fence[0] && run[1].length >= fence.length) fence = null;
      continue;
    }
    const { line, content } = capLine(lines[i]);
    lines[i] = line;
    fence = FENCE.exec(content.trimStart())?.[1] || null;
  }
  return lines.join("\n");
}

// Emphasis nests too ("*a *a *a … a* a*"), inside a paragraph where no line-by-line cap can see
// it: marked's inline lexer recurses once per level and scans the rest of the paragraph at each,
// so 3,000 levels took seconds before they overflowed the stack. Past MAX_NESTING levels of
// emphasis or strikethrough, a run of delimiters is text.
let emphasisDepth = 0;
function nestingCapped(name) {
  const tokenize = Tokenizer.prototype[name];
  return function (src, ...rest) {
    if (emphasisDepth >= MAX_NESTING) {
      const run = /^(?:\*+|_+|~+)/.exec(src);
      return run ? { type: "text", raw: run[0], text: run[0], escaped: false } : undefined;
    }
    emphasisDepth += 1;
    try {
      return tokenize.call(this, src, ...rest);
    } finally {
      emphasisDepth -= 1;
    }
  };
}
markdown.use({ tokenizer: { emStrong: nestingCapped("emStrong"), del: nestingCapped("del") } });

/** What marked reads: line ends normalised, nesting capped. */
const prepare = (text) => capNesting(normalize(text));

/** A block shown as the text it is: the fallback for one marked or the sanitiser cannot take. */
function plainBlock(text) {
  const block = document.createElement("p");
  block.className = "plain-text";
  block.textContent = text.replace(/^\n+|\n+$/g, "");
  return block;
}

/** marked's tokens for `source`; never throws. If marked fails on the whole, each part between
 * blank lines is read alone, and a part it fails on becomes a `plain` token (its raw text). The
 * tokens' raw texts still add up to `source`. */
function lex(source) {
  try {
    return markdown.lexer(source);
  } catch {
    const tokens = [];
    tokens.links = {};
    for (const part of source.split(/(?<=\n[ \t]*\n)/)) {
      try {
        const partTokens = markdown.lexer(part);
        tokens.push(...partTokens);
        Object.assign(tokens.links, partTokens.links);
      } catch {
        tokens.push({ type: "plain", raw: part });
      }
    }
    return tokens;
  }
}

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

function parsed(tokens, colour) {
  colouring = colour;
  try {
    return toFragment(markdown.parser(tokens));
  } finally {
    colouring = false;
  }
}

/** DOM for `tokens` (from `lex`); never throws: a token that cannot be rendered shows as text. */
function renderTokens(tokens, colour) {
  const fragment = document.createDocumentFragment();
  let run = [];
  const flush = () => {
    if (run.length === 0) return;
    try {
      fragment.append(parsed(run, colour));
    } catch {
      for (const token of run) {
        try {
          fragment.append(parsed([token], colour));
        } catch {
          fragment.append(plainBlock(token.raw));
        }
      }
    }
    run = [];
  };
  for (const token of tokens) {
    if (token.type === "plain") {
      flush();
      fragment.append(plainBlock(token.raw));
    } else {
      run.push(token);
    }
  }
  flush();
  return fragment;
}

/** Render the whole of `text` into `container`, replacing what it held; never throws. */
export function renderMarkdown(container, text) {
  try {
    container.replaceChildren(renderTokens(lex(prepare(text)), true));
  } catch {
    container.replaceChildren(plainBlock(text)); // not expected: the reply still shows
  }
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
    this.stableEnd = 0; // characters of the prepared text rendered as finished blocks
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
    // Reference-style links are defined anywhere in a reply: with any, render it whole once.
    const all = lex(prepare(text));
    if (Object.keys(all.links || {}).length > 0) {
      this.around(() => renderMarkdown(this.container, text));
      return;
    }
    this.around(() => this.render(true));
  }

  /** Render what is new; never throws (at worst the reply so far shows as plain text). */
  render(final) {
    try {
      this.renderBlocks(final);
    } catch {
      // Not expected (lex and renderTokens do not throw): the reply so far shows as text, and
      // the next render starts from its beginning.
      this.live = [plainBlock(this.text)];
      this.stableEnd = 0;
      this.container.replaceChildren(...this.live);
    }
  }

  renderBlocks(final) {
    const source = prepare(this.text);
    const tokens = lex(source.slice(this.stableEnd));
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

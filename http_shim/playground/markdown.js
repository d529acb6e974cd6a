// A small Markdown renderer for model answers: fenced code blocks, headings, lists, block quotes,
// rules, paragraphs; inline code, bold, italic and http(s) links.
//
// Safety by construction: it builds DOM nodes and puts model text in them only as text nodes
// (never innerHTML), so "<script>" in an answer is shown as the characters it is. Links keep
// only http: and https: URLs; anything else stays plain text.

const FENCE = /^\s*(```|~~~)\s*([\w+#.-]*)/;
const HEADING = /^(#{1,6})\s+(.*?)\s*#*\s*$/;
const BULLET = /^\s*[-*+]\s+(.*)$/;
const NUMBERED = /^\s*(\d{1,9})[.)]\s+(.*)$/;
const QUOTE = /^\s*>\s?(.*)$/;
const RULE = /^\s*([-*_])(\s*\1){2,}\s*$/;
// One inline token, earliest first: `code`, **bold**, __bold__, *italic*, _italic_, [text](url).
const INLINE = /(`+)([\s\S]*?[^`])\1(?!`)|\*\*(?=\S)([\s\S]*?\S)\*\*|__(?=\S)([\s\S]*?\S)__|\*(?=[^\s*])([^*]*?[^\s*]|[^\s*])\*|(?<![\w])_(?=\S)([^_]*?\S)_(?![\w])|\[([^\]]+)\]\(\s*([^\s)]+)\s*\)/g;

function element(tag, children = [], className = "") {
  const node = document.createElement(tag);
  if (className) node.className = className;
  node.append(...children);  // strings become text nodes
  return node;
}

function safeUrl(text) {
  try {
    const url = new URL(text);
    return url.protocol === "http:" || url.protocol === "https:" ? url.href : null;
  } catch {
    return null;
  }
}

/** The inline nodes (text nodes and elements) of one run of text. */
export function renderInline(text) {
  const nodes = [];
  let last = 0;
  for (const match of text.matchAll(INLINE)) {
    if (match.index > last) nodes.push(text.slice(last, match.index));
    const [whole, , code, bold1, bold2, italic1, italic2, label, href] = match;
    if (code !== undefined) {
      nodes.push(element("code", [code]));
    } else if (bold1 !== undefined || bold2 !== undefined) {
      nodes.push(element("strong", renderInline(bold1 ?? bold2)));
    } else if (italic1 !== undefined || italic2 !== undefined) {
      nodes.push(element("em", renderInline(italic1 ?? italic2)));
    } else {
      const url = safeUrl(href);
      if (url) {
        const link = element("a", renderInline(label));
        link.href = url;
        link.target = "_blank";
        link.rel = "noopener noreferrer";
        nodes.push(link);
      } else {
        nodes.push(whole);
      }
    }
    last = match.index + whole.length;
  }
  if (last < text.length) nodes.push(text.slice(last));
  return nodes;
}

/** Lines joined inside one block, each line break kept as a <br>. */
function lines(texts) {
  const nodes = [];
  texts.forEach((text, i) => {
    if (i) nodes.push(document.createElement("br"));
    nodes.push(...renderInline(text.trim()));
  });
  return nodes;
}

function startsBlock(line) {
  return FENCE.test(line) || HEADING.test(line) || BULLET.test(line) || NUMBERED.test(line)
    || QUOTE.test(line) || RULE.test(line);
}

/** A DocumentFragment holding `markdown` rendered; an unclosed fence (mid-stream) runs to the end. */
export function renderMarkdown(markdown) {
  const fragment = document.createDocumentFragment();
  const all = markdown.replace(/\r\n?/g, "\n").split("\n");
  let i = 0;
  while (i < all.length) {
    const line = all[i];
    let match;
    if (!line.trim()) {
      i++;
    } else if ((match = FENCE.exec(line))) {
      const body = [];
      for (i++; i < all.length && all[i].trim() !== match[1]; i++) body.push(all[i]);
      i++;  // the closing fence
      const code = element("code", [body.join("\n")]);
      if (match[2]) code.dataset.language = match[2];
      fragment.append(element("pre", [code]));
    } else if ((match = HEADING.exec(line))) {
      fragment.append(element(`h${match[1].length}`, renderInline(match[2])));
      i++;
    } else if (RULE.test(line)) {
      fragment.append(document.createElement("hr"));
      i++;
    } else if (QUOTE.test(line)) {
      const quoted = [];
      for (; i < all.length && (match = QUOTE.exec(all[i])); i++) quoted.push(match[1]);
      fragment.append(element("blockquote", [renderMarkdown(quoted.join("\n"))]));
    } else if (BULLET.test(line) || NUMBERED.test(line)) {
      const pattern = BULLET.test(line) ? BULLET : NUMBERED;
      const list = document.createElement(pattern === BULLET ? "ul" : "ol");
      if (pattern === NUMBERED && Number(NUMBERED.exec(line)[1]) !== 1) list.start = Number(NUMBERED.exec(line)[1]);
      while (i < all.length && (match = pattern.exec(all[i]))) {
        const item = [match[match.length - 1]];
        // Indented lines that start no block continue the item.
        for (i++; i < all.length && /^\s+\S/.test(all[i]) && !startsBlock(all[i]); i++) item.push(all[i]);
        list.append(element("li", lines(item)));
        while (i < all.length && !all[i].trim() && all[i + 1] !== undefined && pattern.test(all[i + 1])) i++;
      }
      fragment.append(list);
    } else {
      const paragraph = [];
      for (; i < all.length && all[i].trim() && !startsBlock(all[i]); i++) paragraph.push(all[i]);
      fragment.append(element("p", lines(paragraph)));
    }
  }
  return fragment;
}

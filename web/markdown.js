/* global document, window, URL */
// A small, safe Markdown renderer for interaction details: it builds DOM nodes
// and puts every piece of text in through textContent, so nothing in the text
// can become markup or script. Supported: paragraphs, # headings, - and 1.
// lists, > quotes, ``` code blocks, `code`, **bold**, *emphasis*, and
// [links](https://…) to http(s) only, each followed by the host it goes to;
// anything else shows as the text it is.
'use strict';

(() => {
  const INLINE = /(`[^`\n]+`)|(\*\*[^*\n]+\*\*)|(\*[^*\s][^*\n]*\*)|(\[[^\]\n]+\]\([^)\s]+\))/;

  function el(tag, text) {
    const node = document.createElement(tag);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  /** An http(s) address, or undefined: javascript:, data: and relative links stay text. */
  function safeUrl(href) {
    try {
      const url = new URL(href);
      return url.protocol === 'http:' || url.protocol === 'https:' ? url : undefined;
    } catch {
      return undefined;
    }
  }

  function inline(parent, text) {
    let rest = text;
    while (rest) {
      const match = INLINE.exec(rest);
      if (!match) {
        parent.append(document.createTextNode(rest));
        return;
      }
      if (match.index > 0) parent.append(document.createTextNode(rest.slice(0, match.index)));
      const [token] = match;
      if (match[1]) parent.append(el('code', token.slice(1, -1)));
      else if (match[2]) parent.append(el('strong', token.slice(2, -2)));
      else if (match[3]) parent.append(el('em', token.slice(1, -1)));
      else {
        const close = token.indexOf('](');
        const label = token.slice(1, close);
        const url = safeUrl(token.slice(close + 2, -1));
        if (url) {
          const a = el('a', label);
          a.href = url.href;
          a.title = url.href;
          a.rel = 'noopener noreferrer nofollow';
          a.target = '_blank';
          // The agent wrote the label: `[https://sso.example.com](https://evil.example)` reads as one
          // place and goes to another. Where it goes is shown beside it, as the browser parsed it
          // (an internationalised host in its xn-- form, so a look-alike shows as what it is).
          const host = el('span', ` (${url.host})`);
          host.className = 'link-host';
          parent.append(a, host);
        } else parent.append(document.createTextNode(token));
      }
      rest = rest.slice(match.index + token.length);
    }
  }

  /** `text` as a fragment of safe nodes. */
  function render(text) {
    const out = document.createDocumentFragment();
    const lines = String(text).replace(/\r\n?/g, '\n').split('\n');
    let paragraph = [];
    let list;
    const flush = () => {
      if (paragraph.length) {
        const p = el('p');
        inline(p, paragraph.join(' '));
        out.append(p);
      }
      paragraph = [];
      list = undefined;
    };
    for (let i = 0; i < lines.length; i++) {
      const line = lines[i];
      if (/^```/.test(line)) {
        flush();
        const code = [];
        for (i += 1; i < lines.length && !/^```/.test(lines[i]); i++) code.push(lines[i]);
        const pre = el('pre');
        pre.append(el('code', code.join('\n')));
        out.append(pre);
        continue;
      }
      const heading = /^(#{1,3})\s+(.*)$/.exec(line);
      const bullet = /^\s*[-*+]\s+(.*)$/.exec(line);
      const numbered = /^\s*\d+[.)]\s+(.*)$/.exec(line);
      const quote = /^>\s?(.*)$/.exec(line);
      if (heading) {
        flush();
        const h = el(`h${heading[1].length + 2}`);
        inline(h, heading[2]);
        out.append(h);
      } else if (bullet || numbered) {
        const tag = bullet ? 'UL' : 'OL';
        if (paragraph.length) flush();
        if (!list || list.tagName !== tag) {
          list = el(tag.toLowerCase());
          out.append(list);
        }
        const li = el('li');
        inline(li, (bullet || numbered)[1]);
        list.append(li);
      } else if (quote) {
        flush();
        const q = el('blockquote');
        inline(q, quote[1]);
        out.append(q);
      } else if (line.trim() === '') flush();
      else {
        list = undefined;
        paragraph.push(line.trim());
      }
    }
    flush();
    return out;
  }

  window.stasisMarkdown = { render };
})();

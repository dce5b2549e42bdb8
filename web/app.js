/* global document, window, sessionStorage, fetch, history, URL, URLSearchParams, setTimeout, clearTimeout, NodeFilter */
// The approval page: every pending interaction, oldest first, a page at a time,
// from one list request per refresh (GET /api/v1/interactions), or one
// interaction by its deep link #/runs/<runId>/interactions/<id>. Plain DOM, no
// build step; every value from the server goes in through textContent (details
// through the safe Markdown renderer, markdown.js), and then control, bidi and
// invisible characters are shown escaped and marked (markUnsafe).
'use strict';

(() => {
  const POLL_MS = 1500;
  const TOKEN_KEY = 'stasis.token';
  const ANSWERED_KEY = 'stasis.answered';
  const ANSWERED_KEEP = 20;
  const DEFAULT_PAGE_SIZE = 25;
  /** The page's own bound on `?per=`, well within the API's `limit`. */
  const MAX_PAGE_SIZE = 100;
  const PAGE_SIZE = pageSize(new URLSearchParams(window.location.search).get('per'));
  const $ = (id) => document.getElementById(id);
  let pollTimer;
  let generation = 0; // bumped on sign-in/out and navigation so a stale poll does not render
  /** Cursors of the pages before this one (`after` of each), and this page's. */
  let pages = [undefined];
  let nextCursor;
  /** Answers given from this page: a list that lags a moment behind does not offer them again. */
  const answeredHere = new Set();

  /**
   * The page size a `?per=` link asks for, when it is a whole number from 1 to MAX_PAGE_SIZE.
   * Anything else is ignored: the API would refuse it at every refresh, and the page would never list.
   */
  function pageSize(per) {
    const n = Number(per);
    return per !== null && Number.isInteger(n) && n >= 1 && n <= MAX_PAGE_SIZE ? n : DEFAULT_PAGE_SIZE;
  }

  /** A `?token=` link (printed by `stasis dev`) signs in and is removed from the address bar. */
  function takeTokenFromUrl() {
    const url = new URL(window.location.href);
    const token = url.searchParams.get('token');
    if (token === null) return;
    url.searchParams.delete('token');
    history.replaceState(null, '', url.pathname + url.search + url.hash);
    if (token) sessionStorage.setItem(TOKEN_KEY, token);
  }

  class ApiError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  async function api(method, path, body) {
    const headers = { authorization: `Bearer ${sessionStorage.getItem(TOKEN_KEY)}` };
    if (body !== undefined) headers['content-type'] = 'application/json';
    const response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const payload = await response.json().catch(() => undefined);
    if (!response.ok) {
      const error = (payload && payload.error) || {};
      throw new ApiError(response.status, error.code, error.message || `HTTP ${response.status}`);
    }
    return payload;
  }

  /**
   * The characters shown escaped, never as they are: C0 and C1 controls, DEL, bidi overrides and
   * isolates, and invisible ones (zero-width, separators, fillers, tags). The CLI's set
   * (common/unsafe-text.ts), which the server hands the page as /unsafe-text.js, with its flags (`u`:
   * an astral tag character is one match).
   */
  const UNSAFE = new RegExp(window.stasisUnsafeText.source, `${window.stasisUnsafeText.flags}g`);
  /** Where a line break or a tab shows as one (pre-wrap text): kept there as they are, escaped elsewhere. */
  const KEEPS_LINES = 'pre, .prompt, .markdown';

  /**
   * One character as `\uXXXX` (an astral one `\u{XXXXX}`, as the CLI shows it) in a marked span:
   * text an agent chose cannot make one (it goes in as text), so the mark tells an escape the page
   * made from the same characters typed by the agent.
   */
  function escapedChar(c) {
    const code = c.codePointAt(0);
    const hex = code.toString(16);
    const span = document.createElement('span');
    span.className = 'escaped';
    span.textContent = code > 0xffff ? `\\u{${hex}}` : `\\u${hex.padStart(4, '0')}`;
    span.title = `U+${hex.toUpperCase().padStart(4, '0')}, shown escaped: it is in the text but cannot be shown as it is`;
    return span;
  }

  /**
   * Shows each unsafe character of the text under `root` escaped and marked, so a bidi override
   * cannot reorder what an approver reads (a command's tail, an option) nor a control hide part of it.
   * `pageText`: the page's own text nodes (the template's line breaks), left as they are.
   */
  function markUnsafe(root, pageText = new Set()) {
    for (const node of textNodes(root)) {
      if (pageText.has(node)) continue;
      const text = node.nodeValue;
      const keepLines = Boolean(node.parentElement && node.parentElement.closest(KEEPS_LINES));
      const parts = [];
      let last = 0;
      for (const match of text.matchAll(UNSAFE)) {
        const c = match[0];
        if (keepLines && (c === '\n' || c === '\t')) continue;
        if (match.index > last) parts.push(text.slice(last, match.index));
        parts.push(escapedChar(c));
        last = match.index + c.length;
      }
      if (parts.length === 0) continue;
      if (last < text.length) parts.push(text.slice(last));
      node.replaceWith(...parts);
    }
  }

  /** The text nodes under `root`, in document order. */
  function textNodes(root) {
    const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
    const nodes = [];
    for (let node = walker.nextNode(); node; node = walker.nextNode()) nodes.push(node);
    return nodes;
  }

  /**
   * `text` in `el` with its leading and trailing whitespace escaped and marked: an option
   * `'staging '` does not look like `'staging'`, nor a path `'a.txt '` like `'a.txt'`.
   */
  function withMarkedEdges(el, text) {
    const start = text.length - text.trimStart().length;
    const end = Math.max(start, text.trimEnd().length);
    const marked = (part) => [...part].map(escapedChar);
    el.append(...marked(text.slice(0, start)), text.slice(start, end), ...marked(text.slice(end)));
  }

  function age(iso) {
    const seconds = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
    if (seconds < 5) return 'just now';
    if (seconds < 60) return `${seconds} s ago`;
    if (seconds < 3600) return `${Math.floor(seconds / 60)} min ago`;
    if (seconds < 86400) return `${Math.floor(seconds / 3600)} h ago`;
    return `${Math.floor(seconds / 86400)} d ago`;
  }

  function notice(text, kind) {
    const el = $('notice');
    el.textContent = text;
    markUnsafe(el);
    el.className = kind;
  }

  /**
   * The interaction a deep link names, or undefined for the list. A link whose ids are not valid
   * percent-encoding (`%E0%A4`) names none: `malformed`, so the page says it cannot load it.
   */
  function deepLink() {
    const match = /^#\/runs\/([^/]+)\/interactions\/([^/]+)$/.exec(window.location.hash);
    if (!match) return undefined;
    try {
      return { runId: decodeURIComponent(match[1]), id: decodeURIComponent(match[2]) };
    } catch {
      return { malformed: true };
    }
  }

  const linkTo = (runId, id) => `#/runs/${encodeURIComponent(runId)}/interactions/${encodeURIComponent(id)}`;
  const keyOf = (runId, id) => `${runId}/${id}`;
  /**
   * What an item shows of its interaction (all but its answer, which showStatus shows). The key alone
   * is not enough: a Run started again under an id used before asks `int-1` again, about something else.
   */
  const contentOf = ({ runStartedAt, interaction, diffTruncated }) => {
    const { status: _status, response: _response, respondedBy: _by, respondedAt: _at, ...shown } = interaction;
    return JSON.stringify([runStartedAt, diffTruncated, shown]);
  };
  /** An interaction answered on this page, by what it showed: the same key asking something else is shown. */
  const answeredKeyOf = (item) => `${item.dataset.key}\n${item.dataset.content}`;

  function showSignedIn(signedIn, message) {
    generation += 1;
    clearTimeout(pollTimer);
    $('sign-in').hidden = signedIn;
    $('waiting').hidden = !signedIn;
    $('sign-out').hidden = !signedIn;
    $('sign-in-error').textContent = message || '';
    if (signedIn) {
      renderAnswered();
      void poll(generation);
    } else {
      sessionStorage.removeItem(TOKEN_KEY);
      sessionStorage.removeItem(ANSWERED_KEY);
      $('interactions').replaceChildren();
      notice('', '');
      $('token').focus();
    }
  }

  /** Starts over (a new page or a deep link): the list is rebuilt from the next response. */
  function restart() {
    if (!sessionStorage.getItem(TOKEN_KEY)) return;
    generation += 1;
    clearTimeout(pollTimer);
    $('interactions').replaceChildren();
    void poll(generation);
  }

  async function poll(gen) {
    await refresh(gen);
    if (gen === generation) pollTimer = setTimeout(() => void poll(gen), POLL_MS);
  }

  async function refresh(gen) {
    const link = deepLink();
    try {
      if (link && link.malformed) {
        render([], { single: true });
        throw new Error('the link is not valid percent-encoding');
      } else if (link) {
        const run = await api('GET', `/api/v1/runs/${encodeURIComponent(link.runId)}`);
        if (gen !== generation) return;
        const interaction = run.interactions.find((i) => i.id === link.id);
        if (!interaction) throw new ApiError(404, 'NOT_FOUND', `interaction ${link.id} not found`);
        $('connection').textContent = '';
        render([{ runId: run.runId, interaction }], { single: true });
      } else {
        const after = pages[pages.length - 1];
        const query = `limit=${PAGE_SIZE}${after ? `&after=${encodeURIComponent(after)}` : ''}`;
        const { interactions, next } = await api('GET', `/api/v1/interactions?${query}`);
        if (gen !== generation) return;
        $('connection').textContent = '';
        nextCursor = next;
        render(interactions, { single: false });
      }
    } catch (error) {
      if (gen !== generation) return;
      if (error instanceof ApiError && error.status === 401)
        showSignedIn(false, 'The token was refused. Sign in again.');
      else if (link) showConnection(`Cannot load this interaction (${error.message}).`);
      else showConnection(`Cannot load the waiting interactions (${error.message}); retrying…`);
    }
  }

  /**
   * Says why the page cannot load, escaped and marked as agent text is: the message may hold a link's
   * ids (`#/runs/<runId>/interactions/<id>`, anyone's to write) or the server's words about them.
   */
  function showConnection(text) {
    const el = $('connection');
    el.textContent = text;
    markUnsafe(el);
  }

  /** Updates the list in place, in the order given, so a half-typed answer survives a refresh. */
  function render(entries, { single }) {
    const list = $('interactions');
    const answered = (e) => answeredHere.has(`${keyOf(e.runId, e.interaction.id)}\n${contentOf(e)}`);
    const shown = single ? entries : entries.filter((e) => !answered(e));
    const keep = new Set(shown.map((e) => keyOf(e.runId, e.interaction.id)));
    for (const item of [...list.children]) if (!keep.has(item.dataset.key)) item.remove();
    let previous;
    for (const entry of shown) {
      const key = keyOf(entry.runId, entry.interaction.id);
      let item = [...list.children].find((el) => el.dataset.key === key);
      // Rebuilt when what it shows changed, so its buttons answer what is on the screen.
      if (item && item.dataset.content !== contentOf(entry)) {
        const fresh = interactionItem(entry);
        item.replaceWith(fresh);
        item = fresh;
      }
      if (!item) item = interactionItem(entry);
      // Oldest first: place it right after the one before it.
      if (previous ? previous.nextElementSibling !== item : list.firstElementChild !== item) {
        if (previous) previous.after(item);
        else list.prepend(item);
      }
      previous = item;
      item.querySelector('.age').textContent = age(entry.interaction.createdAt);
      item.querySelector('.run-age').textContent = entry.runStartedAt ? age(entry.runStartedAt) : 'earlier';
      if (single) showStatus(item, entry.interaction);
    }
    $('empty').hidden = shown.length > 0 || single;
    $('single-nav').hidden = !single;
    $('pager').hidden = single || (pages.length === 1 && !nextCursor);
    $('prev-page').disabled = pages.length === 1;
    $('next-page').disabled = !nextCursor;
    $('page-info').textContent = `Page ${pages.length}`;
  }

  /** On a deep link, an interaction no longer pending says what became of it. */
  function showStatus(item, interaction) {
    const status = item.querySelector('.status');
    if (interaction.status === 'pending') return;
    status.hidden = false;
    status.textContent =
      interaction.status === 'answered'
        ? `Answered${interaction.respondedBy ? ` by ${interaction.respondedBy}` : ''}: ${JSON.stringify(interaction.response)}`
        : `This interaction is ${interaction.status}.`;
    markUnsafe(status);
    item.querySelector('.answer').hidden = true;
  }

  function interactionItem(entry) {
    const { runId, interaction, diffTruncated } = entry;
    const item = $('interaction-template').content.firstElementChild.cloneNode(true);
    const pageText = new Set(textNodes(item));
    item.dataset.runId = runId;
    item.dataset.interactionId = interaction.id;
    item.dataset.key = keyOf(runId, interaction.id);
    item.dataset.content = contentOf(entry);
    const runLink = item.querySelector('.run-id');
    runLink.textContent = `${runId} · ${interaction.id}`;
    runLink.href = linkTo(runId, interaction.id);
    const labels = item.querySelector('.labels');
    for (const [name, value] of Object.entries(interaction.labels || {})) {
      const chip = document.createElement('span');
      chip.className = 'label';
      chip.textContent = `${name}: ${value}`;
      labels.append(chip);
    }
    const title = item.querySelector('.title');
    if (interaction.title) title.textContent = interaction.title;
    else title.remove();
    item.querySelector('.prompt').textContent = interaction.prompt;
    item.querySelector('.kind').textContent = interaction.kind === 'input' ? 'asks for input' : 'asks for approval';
    const details = item.querySelector('.details');
    if (interaction.details) details.append(window.stasisMarkdown.render(interaction.details));
    else details.remove();
    showAction(item, runId, interaction, diffTruncated);
    wireAnswers(item, runId, interaction);
    // Every piece of agent text it shows: title, prompt, details, labels, command, files, diff, options.
    markUnsafe(item, pageText);
    return item;
  }

  function showAction(item, runId, interaction, diffTruncated) {
    const action = interaction.action;
    if (!action) return;
    const section = item.querySelector('.action');
    section.hidden = false;
    const command = section.querySelector('.command');
    if (action.command !== undefined) command.textContent = action.command;
    else command.remove();
    const files = section.querySelector('.files');
    for (const file of action.files || []) {
      const li = document.createElement('li');
      withMarkedEdges(li, file);
      files.append(li);
    }
    const diff = section.querySelector('.diff');
    if (action.diff !== undefined) {
      for (const line of action.diff.split('\n')) {
        const span = document.createElement('span');
        span.className = line.startsWith('+') ? 'added' : line.startsWith('-') ? 'removed' : '';
        span.textContent = `${line}\n`;
        diff.append(span);
      }
    } else diff.remove();
    if (diffTruncated) {
      section.querySelector('.diff-note').hidden = false;
      section.querySelector('.full-link').href = linkTo(runId, interaction.id);
    }
  }

  /** The controls of the answers the interaction accepts; the rest are removed. */
  function wireAnswers(item, runId, interaction) {
    const accepts = interaction.accepts || (interaction.kind === 'input' ? ['input'] : ['approve', 'deny']);
    const has = (kind) => accepts.includes(kind);
    const comment = item.querySelector('.comment');
    const withComment = (response) => (comment.value ? { ...response, comment: comment.value } : response);
    const send = (response, verb) => void answer(item, runId, interaction, response, verb);
    // Enter in the comment field never answers: an approval takes a click or a key on its button.
    comment.addEventListener('keydown', (event) => {
      if (event.key === 'Enter') event.preventDefault();
    });
    if (!has('approve') && !has('deny') && !has('edit') && !has('option')) comment.remove();

    const input = item.querySelector('.input');
    if (has('input')) {
      const sendInput = () => send({ input: input.value }, 'Answered');
      item.querySelector('.send').addEventListener('click', sendInput);
      input.addEventListener('keydown', (event) => {
        if (event.key === 'Enter') {
          event.preventDefault();
          sendInput();
        }
      });
    } else item.querySelector('.input-answer').remove();

    const options = item.querySelector('.options');
    if (has('option')) {
      for (const option of interaction.options || []) {
        const button = document.createElement('button');
        button.type = 'button';
        button.className = 'option';
        withMarkedEdges(button, option);
        button.addEventListener('click', () => send(withComment({ option }), `Chose “${option}” for`));
        options.append(button);
      }
    } else options.remove();

    const decisions = item.querySelector('.decisions');
    const approve = item.querySelector('.approve');
    const deny = item.querySelector('.deny');
    const editOpen = item.querySelector('.edit-open');
    const edit = item.querySelector('.edit');
    if (has('approve')) approve.addEventListener('click', () => send(withComment({ decision: 'approve' }), 'Approved'));
    else approve.remove();
    if (has('deny')) deny.addEventListener('click', () => send(withComment({ decision: 'deny' }), 'Denied'));
    else deny.remove();
    if (has('edit')) {
      const text = item.querySelector('.edit-command');
      const warning = item.querySelector('.edit-warning');
      const preview = item.querySelector('.edit-preview');
      // A text box shows a bidi override or a control as it is: what it holds is shown escaped below it.
      const showPreview = () => {
        const unsafe = [...text.value.matchAll(UNSAFE)].some(([c]) => c !== '\n' && c !== '\t');
        warning.hidden = preview.hidden = !unsafe;
        preview.textContent = unsafe ? text.value : '';
        if (unsafe) markUnsafe(preview);
      };
      text.addEventListener('input', showPreview);
      editOpen.addEventListener('click', () => {
        text.value = (interaction.action && interaction.action.command) || '';
        showPreview();
        edit.hidden = false;
        decisions.hidden = true;
        text.focus();
      });
      item.querySelector('.cancel-edit').addEventListener('click', () => {
        edit.hidden = true;
        decisions.hidden = false;
      });
      item.querySelector('.approve-edited').addEventListener('click', () => {
        if (!text.value.trim()) return notice('The edited command is empty: write one, or cancel the edit.', 'refused');
        send(withComment({ decision: 'edit', action: { command: text.value } }), 'Approved (edited)');
      });
    } else {
      editOpen.remove();
      edit.remove();
    }
    if (!decisions.querySelector('button')) decisions.remove();
  }

  function setBusy(item, busy) {
    for (const control of item.querySelectorAll('input, textarea, button')) control.disabled = busy;
  }

  async function answer(item, runId, interaction, response, verb) {
    setBusy(item, true);
    const what = `“${interaction.title || interaction.prompt}” (${runId})`;
    try {
      await api(
        'POST',
        `/api/v1/runs/${encodeURIComponent(runId)}/interactions/${encodeURIComponent(interaction.id)}`,
        response,
      );
      answeredHere.add(answeredKeyOf(item));
      notice(`${verb}: ${what}`, 'ok');
      remember({ runId, id: interaction.id, what, verb, at: new Date().toISOString() });
    } catch (error) {
      if (error instanceof ApiError && error.status === 401)
        return showSignedIn(false, 'The token was refused. Sign in again.');
      notice(refusal(error, what), 'refused');
      // An answer someone else gave, or a Run that moved on, cannot be retried: the list drops it.
      if (error instanceof ApiError && error.status === 409) answeredHere.add(answeredKeyOf(item));
      else setBusy(item, false);
    }
    void refresh(generation);
  }

  function refusal(error, what) {
    if (error.code === 'ALREADY_ANSWERED') return `Someone else answered first: ${what}. Your answer was not recorded.`;
    if (
      error.code === 'INVALID_STATE_TRANSITION' ||
      error.code === 'STALE_SANDBOX_ROUTE' ||
      error.code === 'NOT_FOUND'
    ) {
      return `This run is no longer waiting (${error.message}). Your answer was not recorded.`;
    }
    return `Your answer to ${what} was refused: ${error.message}`;
  }

  function answeredList() {
    try {
      const list = JSON.parse(sessionStorage.getItem(ANSWERED_KEY) || '[]');
      return Array.isArray(list) ? list : [];
    } catch {
      return [];
    }
  }

  function remember(entry) {
    const list = [entry, ...answeredList()].slice(0, ANSWERED_KEEP);
    sessionStorage.setItem(ANSWERED_KEY, JSON.stringify(list));
    renderAnswered();
  }

  function renderAnswered() {
    const list = answeredList();
    $('answered-empty').hidden = list.length > 0;
    $('answered-list').replaceChildren(
      ...list.map((entry) => {
        const li = document.createElement('li');
        const link = document.createElement('a');
        link.href = linkTo(entry.runId, entry.id);
        link.textContent = `${entry.verb}: ${entry.what}`;
        const when = document.createElement('span');
        when.className = 'when';
        when.textContent = ` · ${age(entry.at)}`;
        li.append(link, when);
        return li;
      }),
    );
    markUnsafe($('answered-list'));
  }

  $('sign-in').addEventListener('submit', (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $('token').value.trim());
    $('token').value = '';
    showSignedIn(true);
  });
  $('sign-out').addEventListener('click', () => showSignedIn(false));
  $('next-page').addEventListener('click', () => {
    if (!nextCursor) return;
    pages.push(nextCursor);
    nextCursor = undefined;
    restart();
  });
  $('prev-page').addEventListener('click', () => {
    if (pages.length > 1) pages.pop();
    restart();
  });
  window.addEventListener('hashchange', () => {
    pages = [undefined];
    nextCursor = undefined;
    restart();
  });

  takeTokenFromUrl();
  showSignedIn(Boolean(sessionStorage.getItem(TOKEN_KEY)));
})();

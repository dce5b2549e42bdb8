/* global document, window, sessionStorage, fetch, history, URL, setTimeout, clearTimeout */
// The approval page: the Runs waiting on a person and their pending
// interactions, refreshed by polling the REST API. Plain DOM, no build step;
// every value from the server goes in through textContent.
'use strict';

(() => {
  const POLL_MS = 1500;
  const TOKEN_KEY = 'stasis.token';
  const $ = (id) => document.getElementById(id);
  let pollTimer;
  let generation = 0; // bumped on sign-in/out so a stale poll does not render

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

  function age(createdAt) {
    const seconds = Math.max(0, Math.round((Date.now() - Date.parse(createdAt)) / 1000));
    if (seconds < 5) return 'just now';
    if (seconds < 60) return `${seconds} s ago`;
    if (seconds < 3600) return `${Math.floor(seconds / 60)} min ago`;
    if (seconds < 86400) return `${Math.floor(seconds / 3600)} h ago`;
    return `${Math.floor(seconds / 86400)} d ago`;
  }

  function notice(text, kind) {
    const el = $('notice');
    el.textContent = text;
    el.className = kind;
  }

  function showSignedIn(signedIn, message) {
    generation += 1;
    clearTimeout(pollTimer);
    $('sign-in').hidden = signedIn;
    $('waiting').hidden = !signedIn;
    $('sign-out').hidden = !signedIn;
    $('sign-in-error').textContent = message || '';
    if (signedIn) {
      void poll(generation);
    } else {
      sessionStorage.removeItem(TOKEN_KEY);
      $('runs').replaceChildren();
      notice('', '');
      $('token').focus();
    }
  }

  async function poll(gen) {
    await refresh(gen);
    if (gen === generation) pollTimer = setTimeout(() => void poll(gen), POLL_MS);
  }

  async function refresh(gen) {
    try {
      const { runs } = await api('GET', '/api/v1/runs?status=WAITING');
      if (gen !== generation) return;
      $('connection').textContent = '';
      render(runs);
    } catch (error) {
      if (gen !== generation) return;
      if (error instanceof ApiError && error.status === 401)
        showSignedIn(false, 'The token was refused. Sign in again.');
      else $('connection').textContent = `Cannot load the waiting runs (${error.message}); retrying…`;
    }
  }

  /** Updates the list in place, so a half-typed answer survives a refresh. */
  function render(runs) {
    const list = $('runs');
    const waiting = runs
      .map((run) => ({ run, pending: run.interactions.filter((i) => i.status === 'pending') }))
      .filter(({ pending }) => pending.length > 0);
    const keep = new Set(waiting.map(({ run }) => run.runId));
    for (const item of [...list.children]) if (!keep.has(item.dataset.runId)) item.remove();
    for (const { run, pending } of waiting) {
      let runItem = [...list.children].find((item) => item.dataset.runId === run.runId);
      if (!runItem) {
        runItem = $('run-template').content.firstElementChild.cloneNode(true);
        runItem.dataset.runId = run.runId;
        runItem.querySelector('.run-id').textContent = run.runId;
        list.append(runItem);
      }
      renderInteractions(runItem.querySelector('.interactions'), run.runId, pending);
    }
    $('empty').hidden = waiting.length > 0;
  }

  function renderInteractions(list, runId, pending) {
    const keep = new Set(pending.map((i) => i.id));
    for (const item of [...list.children]) if (!keep.has(item.dataset.interactionId)) item.remove();
    for (const interaction of pending) {
      let item = [...list.children].find((el) => el.dataset.interactionId === interaction.id);
      if (!item) {
        item = interactionItem(runId, interaction);
        list.append(item);
      }
      item.querySelector('.age').textContent = age(interaction.createdAt);
    }
  }

  function interactionItem(runId, interaction) {
    const item = $('interaction-template').content.firstElementChild.cloneNode(true);
    item.dataset.interactionId = interaction.id;
    item.querySelector('.prompt').textContent = interaction.prompt;
    item.querySelector('.kind').textContent = interaction.kind === 'input' ? 'asks for input' : 'asks for approval';
    const isInput = interaction.kind === 'input';
    item.querySelector(isInput ? '.approval-answer' : '.input-answer').remove();
    const form = item.querySelector('.answer');
    form.addEventListener('submit', (event) => {
      event.preventDefault();
      const response = isInput
        ? { input: form.querySelector('.input').value }
        : {
            decision: event.submitter.value,
            ...(form.querySelector('.comment').value ? { comment: form.querySelector('.comment').value } : {}),
          };
      void answer(runId, interaction, response, form);
    });
    return item;
  }

  function setBusy(form, busy) {
    for (const control of form.querySelectorAll('input, button')) control.disabled = busy;
  }

  async function answer(runId, interaction, response, form) {
    setBusy(form, true);
    const what = `“${interaction.prompt}” (${runId})`;
    try {
      await api(
        'POST',
        `/api/v1/runs/${encodeURIComponent(runId)}/interactions/${encodeURIComponent(interaction.id)}`,
        response,
      );
      const verb = response.decision === 'approve' ? 'Approved' : response.decision === 'deny' ? 'Denied' : 'Answered';
      notice(`${verb}: ${what}`, 'ok');
    } catch (error) {
      if (error instanceof ApiError && error.status === 401)
        return showSignedIn(false, 'The token was refused. Sign in again.');
      notice(refusal(error, what), 'refused');
      // An answer someone else gave, or a Run that moved on, cannot be retried.
      if (!(error instanceof ApiError && error.status === 409)) setBusy(form, false);
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

  $('sign-in').addEventListener('submit', (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $('token').value.trim());
    $('token').value = '';
    showSignedIn(true);
  });
  $('sign-out').addEventListener('click', () => showSignedIn(false));

  takeTokenFromUrl();
  showSignedIn(Boolean(sessionStorage.getItem(TOKEN_KEY)));
})();

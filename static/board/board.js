// Small behaviours of the Board; every page also works without them.
(function () {
  "use strict";

  function checkboxes() {
    return Array.from(document.querySelectorAll('input[name="ids"][form="bulk-form"]'));
  }

  function updateSelectionButton() {
    const count = checkboxes().filter((box) => box.checked).length;
    const labels = { "data-selection-button": "Retry selected", "data-cancel-selection-button": "Cancel selected" };
    Object.entries(labels).forEach(([attribute, label]) => {
      const button = document.querySelector(`[${attribute}]`);
      if (button) button.textContent = count ? `${label} (${count})` : label;
    });
  }

  document.addEventListener("change", (event) => {
    const target = event.target;
    if (target.matches("[data-select-all]")) {
      checkboxes().forEach((box) => { box.checked = target.checked; });
    }
    if (target.matches("[data-select-all], input[name='ids']")) updateSelectionButton();
  });

  // A bulk action finished: its selection is spent.
  document.body.addEventListener("selection-cleared", () => {
    checkboxes().forEach((box) => { box.checked = false; });
    const all = document.querySelector("[data-select-all]");
    if (all) all.checked = false;
    updateSelectionButton();
  });

  document.body.addEventListener("htmx:afterSettle", updateSelectionButton);

  // A timed refresh ("every 10s") of a page nobody sees waits until it is
  // seen again. Not an hx-trigger filter: those are evaluated as script,
  // which the Content-Security-Policy forbids.
  document.body.addEventListener("htmx:confirm", (event) => {
    if (!event.detail.triggeringEvent && document.visibilityState !== "visible") {
      event.preventDefault();
    }
  });

  // A form that asks before it posts (data-confirm: the question).
  document.addEventListener("submit", (event) => {
    const form = event.target.closest("form[data-confirm]");
    if (form && !window.confirm(form.dataset.confirm)) event.preventDefault();
  });

  // A refreshed fragment keeps the <details> (a checkpoint) its reader opened.
  let opened = [];
  document.body.addEventListener("htmx:beforeSwap", () => {
    opened = Array.from(document.querySelectorAll("details[id][open]"), (d) => d.id);
  });
  document.body.addEventListener("htmx:afterSwap", () => {
    opened.forEach((id) => {
      const details = document.getElementById(id);
      if (details) details.open = true;
    });
  });

  // htmx swaps nothing from an error response, so show its notice here (the
  // 503 of an outage carries one); anything else (a 403 from an expired CSRF
  // token, a 500) or a lost connection still deserves a word, not silence.
  function say(text) {
    const notices = document.getElementById("notices");
    if (!notices) return;
    const notice = document.createElement("p");
    notice.className = "notice notice-error";
    notice.textContent = text;
    notices.replaceChildren(notice);
  }

  document.body.addEventListener("htmx:responseError", (event) => {
    const status = event.detail.xhr.status;
    const answer = new DOMParser().parseFromString(event.detail.xhr.responseText, "text/html");
    const notice = answer.querySelector("#notices .notice");
    if (notice) {
      say(notice.textContent.trim());
      return;
    }
    say(status === 403
      ? "The Board refused that (HTTP 403): reload the page and try again."
      : `That did not work (HTTP ${status}). Reload the page and try again.`);
  });

  document.body.addEventListener("htmx:sendError", () => {
    say("Switchboard did not answer. Check the connection; the page will catch up.");
  });

  document.addEventListener("click", (event) => {
    const copy = event.target.closest("[data-copy]");
    if (copy) {
      const field = document.querySelector(copy.dataset.copy);
      field.select();
      const done = () => { copy.textContent = "Copied"; };
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(field.value).then(done, () => {
          document.execCommand("copy");
          done();
        });
      } else {
        document.execCommand("copy");
        done();
      }
      return;
    }
    const close = event.target.closest("[data-close-panel]");
    if (close && window.htmx) {
      // With htmx the panel just closes; without it the link reloads the list.
      event.preventDefault();
      const panel = close.closest("#bulk");
      panel.outerHTML = '<div id="bulk"></div>';
    }
  });

  document.addEventListener("focusin", (event) => {
    if (event.target.matches("[data-select-on-focus]")) event.target.select();
  });
})();

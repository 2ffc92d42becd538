// The onceflow console: confirm an action, post it to the JSON API, and
// show what happened. Plain JavaScript, no build step.
"use strict";

(function () {
  const notice = document.getElementById("notice");
  const shown = sessionStorage.getItem("onceflow-notice");
  if (shown) {
    sessionStorage.removeItem("onceflow-notice");
    notice.textContent = shown;
    notice.hidden = false;
  }

  const dialog = document.getElementById("confirm");
  if (!dialog) {
    return; // read-only: no actions
  }
  const title = document.getElementById("confirm-title");
  const text = document.getElementById("confirm-text");
  const reason = document.getElementById("confirm-reason");
  const force = document.getElementById("confirm-force");
  const forceLabel = document.getElementById("confirm-force-label");
  const error = document.getElementById("confirm-error");
  const ok = document.getElementById("confirm-ok");
  let pending = null;

  document.querySelectorAll("button[data-action]").forEach(function (button) {
    button.addEventListener("click", function () {
      pending = button.dataset;
      title.textContent = button.textContent.trim() + "?";
      text.textContent = pending.text;
      reason.value = "";
      force.checked = false;
      // outbox messages have no lease
      forceLabel.hidden = pending.owner === undefined && pending.filter === undefined;
      error.hidden = true;
      ok.disabled = false;
      dialog.showModal();
    });
  });

  document.getElementById("confirm-cancel").addEventListener("click", function () {
    dialog.close();
  });

  ok.addEventListener("click", async function () {
    let body = {};
    if (pending.filter !== undefined) {
      body = { filter: JSON.parse(pending.filter), force: force.checked, reason: reason.value };
    } else if (pending.owner !== undefined) {
      body = { owner: pending.owner, force: force.checked, reason: reason.value };
    }
    ok.disabled = true;
    try {
      const resp = await fetch(new URL(pending.url, document.baseURI), {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify(body),
        credentials: "same-origin",
      });
      if (resp.ok) {
        let done = "done.";
        if (pending.filter !== undefined) {
          const report = await resp.json();
          done = report.done + " of " + report.matched + " done" +
            (report.skipped ? ", " + report.skipped.length + " skipped" : "") +
            (report.errors ? ", " + report.errors.length + " failed" : "") +
            (report.more ? "; more match: run it again" : "") + ".";
        }
        sessionStorage.setItem("onceflow-notice", title.textContent.replace(/\?$/, "") + ": " + done);
        location.reload();
        return;
      }
      let detail = resp.status + " " + resp.statusText;
      try {
        const problem = await resp.json();
        if (problem.detail) {
          detail = problem.detail;
        }
      } catch (e) {
        // not a problem document: keep the status
      }
      showError(detail);
    } catch (e) {
      showError("the request failed: " + e.message);
    }
  });

  function showError(detail) {
    error.textContent = detail;
    error.hidden = false;
    ok.disabled = false;
  }
})();

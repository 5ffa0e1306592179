// gpufleet dashboard glue (our own code; htmx and uPlot come from npm via `make assets`).
"use strict";

const csrfToken = () => document.querySelector('meta[name="csrf-token"]')?.content ?? "";

// Every htmx request carries the session's CSRF token: the head refuses a change without it
// (api.deps.session_principal), and a refresh is harmless with it.
document.addEventListener("htmx:configRequest", (event) => {
  event.detail.headers["X-CSRF-Token"] = csrfToken();
});

// A refresh that failed (head restarting, network) leaves the last good content and says so.
document.addEventListener("htmx:sendError", () => document.body.classList.add("stale"));
document.addEventListener("htmx:responseError", () => document.body.classList.add("stale"));
document.addEventListener("htmx:afterSwap", () => document.body.classList.remove("stale"));

function flash(message, isError) {
  const box = document.getElementById("flash");
  if (!box) return;
  box.textContent = message;
  box.className = isError ? "error" : "ok";
  box.hidden = false;
}

// Action buttons (<button class="action" data-action=URL data-confirm=TEXT [data-reason=required|optional]
// [data-reason-field=NAME] [data-body=JSON] [data-method=DELETE] [data-done=TEXT]>) call the REST API
// (POST unless data-method says otherwise) after the user
// confirms in the page's <dialog>: the same routes, checks and audit as the CLI. The page's live
// part is then refreshed at once (the "refresh" event its hx-trigger listens for).
async function runAction(button, reason) {
  const body = button.dataset.body ? JSON.parse(button.dataset.body) : {};
  if (button.dataset.reason) body[button.dataset.reasonField || "reason"] = reason;
  button.disabled = true;
  try {
    const answer = await fetch(button.dataset.action, {
      method: button.dataset.method || "POST",
      headers: { "Content-Type": "application/json", "X-CSRF-Token": csrfToken() },
      body: JSON.stringify(body),
      credentials: "same-origin",
    });
    if (answer.ok) {
      flash(button.dataset.done || "Done.", false);
    } else {
      let detail = `${answer.status} ${answer.statusText}`;
      try {
        const data = await answer.json();
        if (data.detail) detail = typeof data.detail === "string" ? data.detail : JSON.stringify(data.detail);
      } catch (_) { /* not JSON: keep the status line */ }
      flash(`Refused: ${detail}`, true);
    }
  } catch (error) {
    flash(`Could not reach the head node: ${error}`, true);
  } finally {
    button.disabled = false;
    refreshLive();
    // Once more a second later: an event sent while htmx is swapping the live part in (between the
    // old element leaving and the new one listening) reaches no one, and the page would then show
    // the state from before the action until the next 5 s poll.
    setTimeout(refreshLive, 1000);
  }
}

function refreshLive() {
  document.body.dispatchEvent(new Event("refresh"));
}

document.addEventListener("click", (event) => {
  if (event.target.id === "confirm-cancel") {
    document.getElementById("confirm").close("cancel");
    return;
  }
  const button = event.target.closest("button.action[data-action]");
  if (!button) return;
  const dialog = document.getElementById("confirm");
  const reasonRow = document.getElementById("confirm-reason-row");
  const reason = document.getElementById("confirm-reason");
  document.getElementById("confirm-text").textContent = button.dataset.confirm || "Are you sure?";
  reasonRow.hidden = !button.dataset.reason;
  reason.required = button.dataset.reason === "required";
  reason.value = "";
  dialog.returnValue = "";
  dialog.onclose = () => {
    if (dialog.returnValue === "ok") runAction(button, reason.value.trim());
    button.focus();
  };
  dialog.showModal();
  (button.dataset.reason ? reason : document.getElementById("confirm-ok")).focus();
});

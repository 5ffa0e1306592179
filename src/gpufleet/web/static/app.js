// gpufleet dashboard glue (our own code; htmx and uPlot come from npm via `make assets`).
// Every htmx request carries the session's CSRF token, read from the page's <meta name="csrf-token">:
// the head refuses a change without it (api.deps.session_principal).
document.addEventListener("htmx:configRequest", (event) => {
  const meta = document.querySelector('meta[name="csrf-token"]');
  if (meta) event.detail.headers["X-CSRF-Token"] = meta.content;
});
// A refresh that failed (head restarting, network) leaves the last good content and says so.
document.addEventListener("htmx:sendError", () => document.body.classList.add("stale"));
document.addEventListener("htmx:responseError", () => document.body.classList.add("stale"));
document.addEventListener("htmx:afterSwap", () => document.body.classList.remove("stale"));

// The workflow-jobs dashboard: plain modules, no build step, no network beyond
// this API. Every value from the API reaches the page as text (textContent),
// never as markup.

const TOKEN_KEY = "wfjobs-token";
const TERMINAL = new Set(["COMPLETED", "FAILED", "DEAD", "CANCELLED"]);
const STATUSES = ["QUEUED", "RUNNING", "WAITING", "COMPLETED", "FAILED", "DEAD", "CANCELLED"];
const FLEET_REFRESH_MS = 5000;

// ------------------------------------------------------------------ helpers

function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(node.dataset, value);
    // Through the CSSOM: the page's policy forbids inline style attributes.
    else if (key === "style") Object.assign(node.style, value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// A coloured pill with its own words, in the colour of a status.
function pill(text, colourOf) {
  return h("span", { class: `badge s-${colourOf}` }, text);
}

function badge(status) {
  const name = String(status || "").replace(/^TYPE_/, "");
  return h("span", { class: `badge s-${name}`, "data-status": name }, name || "?");
}

function ago(iso) {
  if (!iso) return "";
  const seconds = Math.round((Date.now() - Date.parse(iso)) / 1000);
  const future = seconds < 0;
  const s = Math.abs(seconds);
  const text =
    s < 5 ? "just now"
    : s < 60 ? `${s} s`
    : s < 3600 ? `${Math.floor(s / 60)} min`
    : s < 86400 ? `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`
    : `${Math.floor(s / 86400)} d`;
  if (text === "just now") return text;
  return future ? `in ${text}` : `${text} ago`;
}

// A time as "3 min ago", with the exact time on hover; kept fresh by tick().
function when(iso) {
  if (!iso) return h("span", { class: "muted" }, "—");
  const exact = new Date(iso);
  return h("time", { datetime: iso, title: exact.toString() }, ago(iso));
}

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "—";
  const s = Math.round(seconds);
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

function tick() {
  for (const node of document.querySelectorAll("time[datetime]")) {
    node.textContent = ago(node.getAttribute("datetime"));
  }
}

// Every second, as it shows seconds: a clock that jumps 15 s at a time looks stuck.
function tickClock() {
  document.getElementById("clock").textContent = new Date().toLocaleTimeString();
}

function json(value) {
  return JSON.stringify(value, null, 2);
}

function notice(text) {
  const box = document.getElementById("notice");
  box.textContent = text || "";
  box.hidden = !text;
}

// ------------------------------------------------------------------ the API

class ApiError extends Error {
  constructor(status, code, message) {
    super(`${code}: ${message}`);
    this.status = status;
    this.code = code;
  }
}

function headers(extra = {}) {
  const token = localStorage.getItem(TOKEN_KEY);
  return token ? { Authorization: `Bearer ${token}`, ...extra } : extra;
}

async function failure(response) {
  let code = `HTTP_${response.status}`;
  let message = response.statusText;
  try {
    const body = await response.json();
    code = body.code || code;
    message = body.message || message;
  } catch (_) {
    // Not JSON: keep the status line.
  }
  if (response.status === 401) askForToken(message);
  return new ApiError(response.status, code, message);
}

// A link to a job's page, wherever the page names a job.
function jobLink(jobId) {
  return h("a", { href: `#/jobs/${encodeURIComponent(jobId)}` }, jobId);
}

// A job's API path: the id is text from the page's URL, never a path of its own.
function jobPath(jobId) {
  return `/v1/workflow-runs/${encodeURIComponent(jobId)}`;
}

async function api(method, path, body) {
  const init = { method, headers: headers(body ? { "Content-Type": "application/json" } : {}) };
  if (body !== undefined) init.body = JSON.stringify(body);
  const response = await fetch(path, init);
  if (!response.ok) throw await failure(response);
  return response.status === 204 ? {} : response.json();
}

// Worth asking again: the server or the network failed, not the request.
function transient(error) {
  return !(error instanceof ApiError) || error.status >= 500 || error.status === 429;
}

// Whether a workflow has a stored definition. When that cannot be told, the
// answer is yes: what needs one is offered, and the API judges it.
async function stored(workflowName) {
  try {
    const response = await fetch(`/v1/workflows/${encodeURIComponent(workflowName)}`, { method: "HEAD", headers: headers() });
    return response.status !== 404;
  } catch (_) {
    return true;
  }
}

// Server-Sent Events over fetch (EventSource cannot send the token), resumed
// after the last event id when the stream is cut.
async function watch(path, onMessage, signal) {
  let lastId = "";
  let pause = 500;
  while (!signal.aborted) {
    try {
      const extra = lastId ? { "Last-Event-ID": lastId } : {};
      const response = await fetch(path, { headers: headers(extra), signal });
      if (!response.ok) throw await failure(response);
      pause = 500;
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      let fields = {};
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let end;
        while ((end = buffer.indexOf("\n")) >= 0) {
          let line = buffer.slice(0, end);
          buffer = buffer.slice(end + 1);
          if (line.endsWith("\r")) line = line.slice(0, -1);
          if (line === "") {
            if ("data" in fields) {
              const message = { event: fields.event || "message", id: fields.id || "", data: JSON.parse(fields.data) };
              if (message.id) lastId = message.id;
              onMessage(message);
              if (message.event === "end") return;
            }
            fields = {};
          } else if (!line.startsWith(":")) {
            const colon = line.indexOf(":");
            const name = colon < 0 ? line : line.slice(0, colon);
            const text = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
            fields[name] = name === "data" && "data" in fields ? `${fields.data}\n${text}` : text;
          }
        }
      }
    } catch (error) {
      if (signal.aborted) return;
      if (!transient(error)) throw error;
    }
    await new Promise((resolve) => setTimeout(resolve, pause));
    pause = Math.min(pause * 2, 5000);
  }
}

// ------------------------------------------------------------------ token

function askForToken(reason) {
  const dialog = document.getElementById("token-dialog");
  const why = document.getElementById("token-reason");
  why.textContent = reason || "";
  why.hidden = !reason;
  if (!dialog.open) dialog.showModal();
}

function setUpToken() {
  const dialog = document.getElementById("token-dialog");
  document.getElementById("token-button").addEventListener("click", () => askForToken(""));
  dialog.addEventListener("close", () => {
    const input = document.getElementById("token-input");
    if (dialog.returnValue === "save" && input.value.trim()) {
      localStorage.setItem(TOKEN_KEY, input.value.trim());
    } else if (dialog.returnValue === "clear") {
      localStorage.removeItem(TOKEN_KEY);
    }
    input.value = "";
    route();
  });
}

// ------------------------------------------------------------------ pages

let leave = () => {};

function page(...children) {
  const view = document.getElementById("view");
  view.replaceChildren(...children);
  return view;
}

async function fleetPage() {
  let timer = 0;
  let stopped = false;
  leave = () => {
    stopped = true;
    clearTimeout(timer);
  };
  const body = h("div", {}, h("p", { class: "muted" }, "Loading…"));
  page(h("h1", {}, "Fleet"), body);
  const refresh = async () => {
    try {
      const fleet = await api("GET", "/v1/fleet");
      if (stopped) return;
      body.replaceChildren(renderFleet(fleet));
      notice("");
    } catch (error) {
      if (!stopped) notice(error.message);
    }
    if (!stopped) timer = setTimeout(refresh, FLEET_REFRESH_MS);
  };
  await refresh();
}

function renderFleet(fleet) {
  const counts = fleet.jobs_by_status || {};
  const recent = fleet.jobs_by_status_last_5m || {};
  const tiles = h(
    "div",
    { class: "tiles", id: "status-tiles" },
    STATUSES.map((status) =>
      h(
        "a",
        { class: `tile s-${status}`, href: `#/jobs?status=${status}`, "data-status": status },
        h("div", { class: "label" }, status),
        h("div", { class: "n" }, String(counts[status] ?? 0)),
        h("div", { class: "muted" }, `+${recent[status] ?? 0} in 5 min`),
      ),
    ),
  );
  const completedPerMinute = ((recent.COMPLETED ?? 0) / 5).toFixed(1);
  const backlog = h(
    "section",
    { class: "panel" },
    h("h2", {}, "Backlog and throughput"),
    h(
      "dl",
      { class: "kv" },
      h("dt", {}, "Oldest claimable job waiting"),
      h("dd", { id: "oldest-queued" }, duration(fleet.oldest_queued_age_s)),
      h("dt", {}, "Completed per minute (last 5 min)"),
      h("dd", {}, completedPerMinute),
      h("dt", {}, "As of"),
      h("dd", {}, when(fleet.as_of)),
    ),
  );
  const sections = [backlog];
  if (fleet.outbox) {
    const outbox = fleet.outbox;
    const healthy = !outbox.failed && (outbox.oldest_pending_age_s ?? 0) < 60;
    sections.push(
      h(
        "section",
        { class: "panel", id: "outbox" },
        h("h2", {}, "Outbox"),
        h(
          "dl",
          { class: "kv" },
          h("dt", {}, "Health"),
          h("dd", { id: "outbox-health" }, healthy ? pill("OK", "COMPLETED") : pill("ATTENTION", "FAILED"), healthy ? " events flowing" : " events held back or failing"),
          h("dt", {}, "Waiting to publish"),
          h("dd", {}, String(outbox.pending)),
          h("dt", {}, "Oldest waiting"),
          h("dd", {}, duration(outbox.oldest_pending_age_s)),
          h("dt", {}, "Failed (dead letters)"),
          h("dd", { class: outbox.failed ? "error" : "" }, String(outbox.failed)),
        ),
      ),
    );
  }
  if (fleet.workers) {
    sections.push(
      h(
        "section",
        { class: "panel", id: "workers" },
        h("h2", {}, "Workers holding jobs"),
        fleet.workers.length === 0
          ? h("p", { class: "muted" }, "No job is running right now.")
          : h(
              "table",
              {},
              h("thead", {}, h("tr", {}, h("th", {}, "Worker"), h("th", {}, "Running"), h("th", {}, "Next lease ends"), h("th", {}, "Process"))),
              h(
                "tbody",
                {},
                fleet.workers.map((w) =>
                  h(
                    "tr",
                    {},
                    h("td", { class: "mono" }, w.worker),
                    h("td", {}, String(w.running)),
                    h("td", {}, when(w.first_lease_until)),
                    // A killed worker's jobs stay its own until their leases pass.
                    h("td", { class: w.live ? "" : "error" }, w.live ? "live" : "gone"),
                  ),
                ),
              ),
            ),
      ),
    );
  }
  return h("div", {}, tiles, h("div", { class: "grid", style: { marginTop: "1.2em" } }, sections));
}

async function jobsPage(params) {
  leave = () => {};
  const status = params.get("status") || "";
  const workflow = params.get("workflow") || "";
  const pageToken = params.get("page") || "";
  const filters = h(
    "form",
    {
      class: "inline panel",
      id: "filters",
      onsubmit: (event) => {
        event.preventDefault();
        const data = new FormData(event.target);
        const query = new URLSearchParams();
        for (const key of ["status", "workflow"]) if (data.get(key)) query.set(key, data.get(key));
        location.hash = `#/jobs?${query}`;
      },
    },
    h(
      "label",
      {},
      "Status",
      h("select", { name: "status" }, h("option", { value: "" }, "any"), STATUSES.map((s) => h("option", { value: s, selected: s === status }, s))),
    ),
    h("label", {}, "Workflow", h("input", { name: "workflow", value: workflow, placeholder: "any" })),
    h("button", { type: "submit" }, "Filter"),
  );
  const list = h("div", { class: "panel" }, h("p", { class: "muted" }, "Loading…"));
  page(h("h1", {}, "Jobs"), submitPanel(), filters, list);
  try {
    const query = new URLSearchParams();
    if (status) query.set("status", status);
    if (workflow) query.set("workflow_name", workflow);
    if (pageToken) query.set("page_token", pageToken);
    const answer = await api("GET", `/v1/workflow-runs?${query}`);
    const jobs = answer.jobs || [];
    const next = new URLSearchParams(params);
    next.set("page", answer.next_page_token || "");
    list.replaceChildren(
      jobs.length === 0
        ? h("p", { class: "muted" }, "No jobs match.")
        : h(
            "table",
            { id: "jobs-table" },
            h("thead", {}, h("tr", {}, ["Job", "Workflow", "Status", "Attempt", "Created", "Updated"].map((c) => h("th", {}, c)))),
            h(
              "tbody",
              {},
              jobs.map((job) =>
                h(
                  "tr",
                  { "data-job": job.job_id },
                  h("td", { class: "mono" }, jobLink(job.job_id)),
                  h("td", {}, job.workflow_name),
                  h("td", {}, badge(job.status)),
                  h("td", {}, `${job.attempt ?? 0} / ${job.max_attempts ?? "?"}`),
                  h("td", {}, when(job.created_at)),
                  h("td", {}, when(job.updated_at)),
                ),
              ),
            ),
          ),
      answer.next_page_token ? h("p", {}, h("a", { href: `#/jobs?${next}`, id: "next-page" }, "Next page →")) : "",
    );
    notice("");
  } catch (error) {
    list.replaceChildren(h("p", { class: "error" }, error.message));
  }
}

// Every stored workflow's name: the listing comes a page at a time.
async function workflowNames() {
  const names = [];
  const query = new URLSearchParams({ limit: "500" });
  for (;;) {
    const answer = await api("GET", `/v1/workflows?${query}`);
    names.push(...(answer.workflows || []).map((w) => w.name));
    if (!answer.next_page_token) return names;
    query.set("page_token", answer.next_page_token);
  }
}

function submitPanel() {
  const select = h("select", { name: "workflow", id: "submit-workflow", required: true });
  const input = h("textarea", { name: "input", id: "submit-input", rows: 3 }, '{"text": "hello"}');
  const result = h("span", { class: "muted" });
  workflowNames()
    .then((names) => {
      select.replaceChildren(...names.map((name) => h("option", { value: name }, name)));
    })
    .catch((error) => {
      result.textContent = error.message;
    });
  return h(
    "details",
    { class: "panel", id: "submit-panel" },
    h("summary", {}, "Submit a job"),
    h(
      "form",
      {
        onsubmit: async (event) => {
          event.preventDefault();
          let parsed;
          try {
            parsed = JSON.parse(input.value || "{}");
          } catch (error) {
            result.textContent = `input is not JSON: ${error.message}`;
            return;
          }
          try {
            const answer = await api("POST", "/v1/workflow-runs", { workflow_name: select.value, input: parsed });
            location.hash = `#/jobs/${answer.job.job_id}`;
          } catch (error) {
            result.textContent = error.message;
          }
        },
      },
      h("div", { class: "fields" }, h("label", {}, "Workflow", select), h("label", {}, "Input (JSON)", input)),
      h("div", { class: "actions" }, h("button", { class: "primary", type: "submit", id: "submit-job" }, "Submit"), result),
    ),
  );
}

// A link whose job id cannot even be decoded (a stray or malformed % escape).
function noSuchJob(raw) {
  page(
    h("p", {}, h("a", { href: "#/jobs" }, "← Jobs")),
    h("h1", { id: "job-title" }, "No such job"),
    h("p", { class: "error" }, `The link's job id "${raw}" is malformed: it holds a % that is not an escape.`),
  );
}

async function jobPage(jobId) {
  const controller = new AbortController();
  leave = () => controller.abort();
  const header = h("h1", { id: "job-title" }, "Job ", h("span", { class: "mono" }, jobId));
  const summary = h("section", { class: "panel", id: "job-summary" });
  const progress = h("section", { class: "panel", id: "job-progress", hidden: true });
  const explain = h("section", { class: "panel", id: "job-explain" });
  const actions = h("section", { class: "panel", id: "job-actions" });
  const timeline = h("ol", { class: "timeline", id: "timeline" });
  const checkpoints = h("section", { class: "panel", id: "job-checkpoints" });
  const attempts = h("section", { class: "panel", id: "job-attempts" });
  page(
    h("p", {}, h("a", { href: "#/jobs" }, "← Jobs")),
    header,
    summary,
    progress,
    h("div", { class: "grid" }, h("section", { class: "panel" }, h("h2", {}, "Timeline (live)"), timeline), h("div", {}, actions, explain)),
    checkpoints,
    attempts,
  );

  let refreshing = null;
  let running = null;
  let again = false;
  let shown = false;
  let missing = null;
  // One refresh at a time, the last asked for always run: answers arriving out
  // of order must never draw an older state over a newer one.
  const refresh = async () => {
    if (running) {
      again = true;
      return running;
    }
    running = (async () => {
      do {
        again = false;
        await refreshOnce();
      } while (again && !controller.signal.aborted);
    })();
    try {
      await running;
    } finally {
      running = null;
    }
  };
  const refreshOnce = async () => {
    try {
      const [answer, why] = await Promise.all([
        api("GET", jobPath(jobId)),
        api("GET", `${jobPath(jobId)}:explain`),
      ]);
      if (controller.signal.aborted) return;
      renderJob(answer.job, { header, summary, checkpoints, attempts, progress });
      renderExplain(why, explain);
      await renderActions(answer.job, why, actions, refresh);
      shown = true;
      notice("");
    } catch (error) {
      if (!shown && error instanceof ApiError && error.status === 404) missing = error;
      else notice(error.message);
    }
  };
  // Coalesce the bursts of events a settle brings into one refresh.
  const refreshSoon = () => {
    if (refreshing) return;
    refreshing = setTimeout(async () => {
      refreshing = null;
      await refresh();
    }, 150);
  };
  await refresh();
  if (missing) {
    // Nothing to watch: the watch would only answer 404 too.
    controller.abort();
    page(
      h("p", {}, h("a", { href: "#/jobs" }, "← Jobs")),
      h("h1", { id: "job-title" }, "No such job"),
      h("p", { class: "error", id: "job-missing" }, missing.message),
    );
    return;
  }
  watch(
    `${jobPath(jobId)}/events`,
    (message) => {
      if (message.event === "progress") {
        showProgress(progress, message.data);
        return;
      }
      if (message.event === "end") {
        if (message.data.gone) {
          // Job retention deleted it: a refresh would only answer 404.
          clearTimeout(refreshing);
          timeline.append(h("li", { class: "fresh", "data-event": "gone" }, h("span", {}, ""), pill("REMOVED", "CANCELLED"), h("span", { class: "muted" }, "the job was removed by job retention")));
          header.append(pill("REMOVED", "CANCELLED"));
          actions.replaceChildren(h("h2", {}, "Actions"), h("p", { class: "muted" }, "Nothing to do: the job was removed."));
          return;
        }
        timeline.append(h("li", { class: "fresh" }, h("span", {}, ""), badge(message.data.status), h("span", { class: "muted" }, "the job ended")));
        refreshSoon();
        return;
      }
      const event = message.data;
      timeline.append(
        h(
          "li",
          { class: "fresh", "data-event": event.type, "data-event-id": message.id },
          when(event.occurred_at),
          badge(event.type),
          h("span", {}, eventDetail(event)),
        ),
      );
      if (event.type !== "TYPE_STEP_CHECKPOINT") progress.hidden = true;
      refreshSoon();
    },
    controller.signal,
  ).catch((error) => notice(`live updates stopped: ${error.message}`));
}

function eventDetail(event) {
  const parts = [];
  if (event.step_name) parts.push(`step ${event.step_name}`);
  if (event.verdict) parts.push(event.verdict);
  if (event.error && event.error !== event.verdict) parts.push(event.error);
  if (event.reason) parts.push(event.reason);
  if (event.next_run_at) parts.push(`next run ${new Date(event.next_run_at).toLocaleTimeString()}`);
  if (event.resumed_from) parts.push(["resumes ", jobLink(event.resumed_from)]);
  if (event.resumed_by) parts.push(["resumed by ", jobLink(event.resumed_by)]);
  // Text and links, a dot between parts.
  return parts.flatMap((part, i) => (i ? [" · "] : []).concat(part));
}

function showProgress(section, report) {
  const percent = Math.round((report.fraction || 0) * 100);
  section.hidden = false;
  section.replaceChildren(
    h("h2", {}, `Progress of ${report.step_name}`),
    h("div", { class: "progress" }, h("div", { style: { width: `${percent}%` } })),
    h("span", {}, `${percent}%`, report.message ? ` · ${report.message}` : "", " · "),
    when(report.updated_at),
  );
}

function renderJob(job, parts) {
  parts.header.replaceChildren("Job ", h("span", { class: "mono" }, job.job_id), badge(job.status));
  const rows = [
    ["Workflow", job.workflow_name],
    ["Attempt", `${job.attempt ?? 0} of ${job.max_attempts ?? "?"}`],
    ["Created", when(job.created_at)],
    ["Updated", when(job.updated_at)],
    ["Owner", job.owner || "—"],
  ];
  if (job.status === "WAITING" && job.outstanding_step) rows.push(["Waiting on", job.outstanding_step]);
  // The reviewer's own deadline: past it the step fails or takes its fallback.
  if (job.status === "WAITING" && job.step_deadline) rows.push(["Answer by", h("span", { id: "step-deadline" }, when(job.step_deadline))]);
  if (job.status === "RUNNING" && job.lease_owner) {
    rows.push(["Held by", h("span", {}, job.lease_owner, " until ", when(job.lease_until))]);
  }
  if (job.verdict) rows.push(["Verdict", job.verdict]);
  if (job.error) rows.push(["Error", h("span", { class: "error" }, job.error)]);
  if (job.deadline) rows.push(["Deadline", when(job.deadline)]);
  if (job.resumed_from) rows.push(["Resumes", jobLink(job.resumed_from)]);
  if (job.resumed_by) rows.push(["Resumed by", jobLink(job.resumed_by)]);
  parts.summary.replaceChildren(h("dl", { class: "kv" }, rows.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])));
  if (TERMINAL.has(job.status)) parts.progress.hidden = true;
  const checkpoints = job.checkpoints || [];
  parts.checkpoints.replaceChildren(
    h("h2", {}, `Checkpoints (${checkpoints.length})`),
    checkpoints.length === 0
      ? h("p", { class: "muted" }, "No step has finished yet.")
      : h(
          "div",
          {},
          checkpoints.map((c) =>
            h("details", { "data-checkpoint": c.name }, h("summary", {}, c.name, c.skipped ? " (skipped)" : ""), h("pre", {}, json(c.response ?? {}))),
          ),
        ),
    job.result ? h("details", { open: true }, h("summary", {}, "Result"), h("pre", { id: "job-result" }, json(job.result))) : "",
    job.review_request && job.status === "WAITING" ? h("details", { open: true }, h("summary", {}, "What the reviewer is asked"), h("pre", {}, json(job.review_request))) : "",
  );
  const history = job.history || [];
  parts.attempts.replaceChildren(
    h("h2", {}, `Attempts (${history.length} ended)`),
    history.length === 0
      ? h("p", { class: "muted" }, "No attempt has ended yet.")
      : h(
          "table",
          {},
          h("thead", {}, h("tr", {}, ["#", "Worker", "Claimed", "Ended", "Outcome", "Steps", "Error"].map((c) => h("th", {}, c)))),
          h(
            "tbody",
            {},
            history.map((a) =>
              h(
                "tr",
                {},
                h("td", {}, String(a.attempt ?? 0)),
                h("td", { class: "mono" }, a.worker || "—"),
                h("td", {}, when(a.claimed_at)),
                h("td", {}, when(a.ended_at)),
                h("td", {}, a.outcome || ""),
                h("td", {}, (a.steps || []).join(", ")),
                h("td", { class: a.error ? "error" : "" }, a.error ? `${a.error} (${a.error_class || "?"})` : ""),
              ),
            ),
          ),
        ),
  );
}

function renderExplain(why, section) {
  const findings = (title, list) =>
    list && list.length
      ? [h("h2", {}, title), h("ul", {}, list.map((f) => h("li", {}, f.sentence)))]
      : [];
  const parts = [...findings("Why", why.why), ...findings("What happens next", why.next)];
  if (why.delivery) parts.push(h("p", { class: "muted" }, why.delivery.sentence));
  section.replaceChildren(...parts);
}

async function renderActions(job, why, section, refresh) {
  // Drawn again only when what can be done changes: a refresh (every event
  // brings one) must not wipe a form someone is filling in, or its focus.
  const signature = [job.status, job.outstanding_step, job.cancel_requested_at, job.resumed_by].join("|");
  if (section.dataset.signature === signature) return;
  section.dataset.signature = signature;
  // Kept across redraws: an action's own answer (a REJECTED verdict, a 409)
  // changes what can be done, and must still be readable after it.
  const result = section.querySelector("#action-result") || h("p", { class: "muted", id: "action-result" });
  const run = (name, label, method, path, body, style) =>
    h(
      "button",
      {
        class: style,
        type: "button",
        id: `action-${name}`,
        onclick: async (event) => {
          event.target.disabled = true;
          try {
            const answer = await api(method, path, body);
            result.textContent = `${label}: ${answer.outcome || "done"}`;
            if (answer.job && answer.job.job_id && answer.job.job_id !== job.job_id) {
              location.hash = `#/jobs/${answer.job.job_id}`;
              return;
            }
          } catch (error) {
            result.textContent = error.message;
          }
          event.target.disabled = false;
          await refresh();
        },
      },
      label,
    );
  const buttons = [];
  if (!TERMINAL.has(job.status) && !job.cancel_requested_at) {
    buttons.push(run("cancel", "Cancel", "POST", `${jobPath(job.job_id)}:cancel`, { reason: "cancelled from the dashboard" }, "danger"));
  }
  if (["FAILED", "DEAD", "CANCELLED"].includes(job.status) && !job.resumed_by) {
    // A job refused at submit has no snapshot of its own to run again (a
    // resume with it answers 409): explain then offers only the resume with
    // the workflow's current definition.
    const current = `wfjobs resume ${job.job_id} --current-definition`;
    if (!(why.actions || []).some((action) => action.command === current)) {
      buttons.push(run("resume", "Resume", "POST", `${jobPath(job.job_id)}:resume`, {}, ""));
    }
    if (await stored(job.workflow_name)) {
      buttons.push(run("resume-current", "Resume with the current definition", "POST", `${jobPath(job.job_id)}:resume`, { use_current_definition: true }, ""));
    }
  }
  const children = [h("h2", {}, "Actions")];
  if (job.status === "WAITING" && job.outstanding_step) {
    children.push(completeForm(job, refresh, result));
  }
  children.push(buttons.length ? h("div", { class: "actions" }, buttons) : null);
  if (job.cancel_requested_at && !TERMINAL.has(job.status)) {
    children.push(h("p", { id: "cancel-requested" }, "Cancel requested ", when(job.cancel_requested_at), ": its worker stops it within a heartbeat, or the sweeper once its lease passes."));
  } else if (!buttons.length && job.status !== "WAITING") {
    children.push(h("p", { class: "muted" }, "Nothing to do: the job has ended."));
  }
  children.push(result);
  section.replaceChildren(...children.filter(Boolean));
}

// The parked step's form, loaded into its place; a load the server or the
// network failed is tried again, with backoff and on demand, while the place
// is on the page: no event may come to redraw it while the job stays parked.
function completeForm(job, refresh, result) {
  const place = h("div", { id: "complete-place" }, h("p", { class: "muted" }, "Loading the step's form…"));
  let pause = 1000;
  let timer = 0;
  const load = async () => {
    clearTimeout(timer);
    let form;
    try {
      form = await api("GET", `${jobPath(job.job_id)}/steps/${encodeURIComponent(job.outstanding_step)}:form`);
    } catch (error) {
      if (!place.isConnected) return;
      const again = transient(error);
      place.replaceChildren(
        h("p", { class: "error", id: "complete-form-error" }, error.message, again ? " · trying again" : ""),
        again
          ? h("button", { type: "button", id: "complete-form-retry", onclick: (event) => { event.target.disabled = true; load(); } }, "Try again now")
          : null,
      );
      if (again) timer = setTimeout(() => place.isConnected && load(), pause);
      pause = Math.min(pause * 2, 10000);
      return;
    }
    if (place.isConnected) place.replaceChildren(stepForm(job, form, refresh, result));
  };
  // Once the place is on the page: the caller adds it right after this returns.
  setTimeout(load, 0);
  return place;
}

function stepForm(job, form, refresh, result) {
  const step = job.outstanding_step;
  const inputs = form.fields.map((field) => {
    const name = `field-${field.name}`;
    if (field.kind === "boolean") {
      return h("label", { class: "check" }, h("input", { type: "checkbox", name, "data-field": field.name, "data-kind": field.kind }), field.name);
    }
    if (field.kind === "enum") {
      return h("label", {}, field.name, h("select", { name, "data-field": field.name, "data-kind": field.kind }, field.choices.map((c) => h("option", { value: c }, c))));
    }
    if (field.kind === "json") {
      // Unnamed: the whole response is this one JSON value (a Struct, an Any).
      const label = field.name || "response";
      return h("label", {}, `${label} (${field.type}, JSON)`, h("textarea", { name, "data-field": field.name, "data-kind": field.kind, rows: field.name ? 2 : 6 }));
    }
    const type = field.kind === "string" ? "text" : "number";
    const step = field.kind === "integer" ? "1" : "any";
    return h("label", {}, `${field.name} (${field.type})`, h("input", { type, step: type === "number" ? step : undefined, name, "data-field": field.name, "data-kind": field.kind }));
  });
  return h(
    "form",
    {
      id: "complete-form",
      onsubmit: async (event) => {
        event.preventDefault();
        let response = {};
        try {
          for (const input of event.target.querySelectorAll("[data-field]")) {
            const { field, kind } = input.dataset;
            if (kind === "boolean") response[field] = input.checked;
            else if (kind === "json" && field === "") {
              if (input.value.trim()) response = JSON.parse(input.value);
            } else if (kind === "json") {
              if (input.value.trim()) response[field] = JSON.parse(input.value);
            } else if (kind === "integer" || kind === "number") {
              if (input.value !== "") response[field] = Number(input.value);
            } else if (input.value !== "") response[field] = input.value;
          }
        } catch (error) {
          result.textContent = `not JSON: ${error.message}`;
          return;
        }
        try {
          const answer = await api("POST", `${jobPath(job.job_id)}/steps/${encodeURIComponent(step)}:complete`, { response });
          result.textContent = `${step}: ${answer.outcome}${answer.message ? ` (${answer.message})` : ""}`;
        } catch (error) {
          result.textContent = error.message;
        }
        await refresh();
      },
    },
    h("p", {}, "The job waits for step ", h("strong", {}, step), ` (${form.response_type}).`),
    h("div", { class: "fields" }, inputs),
    h("button", { class: "primary", type: "submit", id: "complete-submit" }, `Complete ${step}`),
  );
}

// ------------------------------------------------------------------ routing

async function route() {
  leave();
  leave = () => {};
  notice("");
  const hash = location.hash.replace(/^#/, "") || "/";
  const [path, query] = hash.split("?");
  const params = new URLSearchParams(query || "");
  for (const link of document.querySelectorAll("nav a")) {
    link.classList.toggle("active", (link.dataset.nav === "jobs") === path.startsWith("/jobs"));
  }
  const job = path.match(/^\/jobs\/([^/]+)$/);
  if (job) {
    let jobId;
    try {
      jobId = decodeURIComponent(job[1]);
    } catch (_) {
      return noSuchJob(job[1]);
    }
    return jobPage(jobId);
  }
  if (path === "/jobs") return jobsPage(params);
  return fleetPage();
}

setUpToken();
window.addEventListener("hashchange", route);
setInterval(tick, 15000);
setInterval(tickClock, 1000);
tick();
tickClock();
route();

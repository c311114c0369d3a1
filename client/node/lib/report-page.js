// The delegation report as one self-contained HTML page: the Node.js twin of
// client/report_page.py (render_html, report_title, backend_colour), byte for byte.
//
// renderHtml(report) turns a delegation report, as the JSON both command lines write
// (--report-json, --json: top-level `model`, `partitioners`, `methods`), into one HTML file that
// needs nothing but a browser: the template, CSS, the page's script and the vendored
// @dagrejs/dagre are read from client/report_assets/ (the Python package's own copies, so the two
// implementations cannot drift apart) and inlined, and a Content-Security-Policy forbids every
// fetch (`default-src 'none'`; only the page's own inline scripts, by their SHA-256, and inline
// styles run).
//
// For the same report the page is the same bytes as Python's. The data goes into the page as
// JSON.stringify writes it; Python writes json.dumps(..., separators=(",", ":"),
// ensure_ascii=False). They agree on everything a report written by either command line holds
// (strings, integers below 2**53, booleans, null, arrays, objects whose keys are not integers),
// escapes included. They differ only on JSON no command line writes (a hand-edited report): a
// number with a fraction or an exponent that is an integer (`3.0`, `1e3`: Python keeps the
// float, JSON.parse the integer), integers beyond 2**53 (JavaScript rounds them), NaN and
// Infinity (Python reads them, JSON.parse refuses), lone UTF-16 surrogates, and objects with
// integer-like keys (JavaScript orders those first). See docs/cli.md.
//
// Every string of the report reaches the page as JSON data read by the script and inserted as
// text, never as markup.

import crypto from 'node:crypto';
import fs from 'node:fs';

/** The colour of each well-known backend's partitions (and of its legend swatch). */
export const BACKEND_COLOURS = Object.freeze({
  XnnpackBackend: '#2f7ed8',
  CoreMLBackend: '#8e44ad',
  VulkanBackend: '#e67e22',
  QnnBackend: '#16a085',
  MPSBackend: '#7f8c2d',
  EthosUBackend: '#c0398b',
  OpenvinoBackend: '#5b6bd6',
  NeuropilotBackend: '#b8860b',
  CudaBackend: '#4e9a06',
});
/** Colours for any other backend id, picked by a stable hash of the id. */
const OTHER_COLOURS = ['#1b9e77', '#d95f02', '#7570b3', '#66a61e', '#a6761d', '#1f78b4', '#b15928'];

const ASSETS = new URL('../../report_assets/', import.meta.url);

const isMapping = (v) => typeof v === 'object' && v !== null && !Array.isArray(v);
const own = (o, key) => (Object.hasOwn(o, key) ? o[key] : undefined);
/** Python's dict.get(key, fallback): the fallback only when the key is missing. */
const get = (o, key, fallback) => (Object.hasOwn(o, key) ? o[key] : fallback);

/** The fixed `#rrggbb` colour of `backendId`: the same in every report (and in Python's). */
export function backendColour(backendId) {
  if (Object.hasOwn(BACKEND_COLOURS, backendId)) return BACKEND_COLOURS[backendId];
  const first = crypto.createHash('sha256').update(backendId, 'utf8').digest()[0];
  return OTHER_COLOURS[first % OTHER_COLOURS.length];
}

function asset(name) {
  return fs.readFileSync(new URL(name, ASSETS), 'utf8');
}

/** `source` made safe inside <script>: no `</script` ends it early, and no source map comment
 *  points the browser at a file that is not there. */
export function inlineScript(source) {
  return source.replace(/(?<=^|\n)\/\/# sourceMappingURL=[^\n]*/g, '')
    .replaceAll('</script', '<\\/script');
}

/** `value` as JSON that cannot close its <script type="application/json">. */
function jsonScript(value) {
  return JSON.stringify(value).replaceAll('<', '\\u003c').replaceAll('>', '\\u003e')
    .replaceAll('&', '\\u0026');
}

/** Python's html.escape(text, quote=True). */
function escapeHtml(text) {
  return text.replaceAll('&', '&amp;').replaceAll('<', '&lt;').replaceAll('>', '&gt;')
    .replaceAll('"', '&quot;').replaceAll("'", '&#x27;');
}

/** Python's str() of a JSON scalar (what the Python side makes of a non-string id). */
function pyStr(v) {
  if (v === null || v === undefined) return 'None';
  if (v === true) return 'True';
  if (v === false) return 'False';
  return String(v);
}

/** Python's truthiness of a JSON value. */
const truthy = (v) => (Array.isArray(v) ? v.length > 0
  : isMapping(v) ? Object.keys(v).length > 0 : Boolean(v));

/** Python's order of str: by code point (JavaScript's default sorts UTF-16 code units). */
function byCodePoint(a, b) {
  const x = [...a];
  const y = [...b];
  for (let i = 0; i < Math.min(x.length, y.length); i += 1) {
    const d = x[i].codePointAt(0) - y[i].codePointAt(0);
    if (d !== 0) return d;
  }
  return x.length - y.length;
}


/** The backend ids the report's methods name (delegated, partitions, nodes), sorted. */
function backends(report) {
  const seen = new Set();
  for (const method of get(report, 'methods', [])) {
    for (const d of get(method, 'delegated', [])) seen.add(pyStr(get(d, 'backend_id', '')));
    for (const p of get(method, 'partitions', [])) seen.add(pyStr(get(p, 'backend_id', '')));
    for (const n of get(method, 'nodes', [])) {
      if (truthy(own(n, 'backend_id'))) seen.add(pyStr(n.backend_id));
    }
  }
  return [...seen].filter((b) => b).sort(byCodePoint);
}

/**
 * The title of `report`'s page: `Delegation report: MODEL (P1, P2)`.
 *
 * MODEL is the report's top-level `model` (the PT2 archive's file name; of a path, its last
 * part), P1, P2 its top-level `partitioners` (the hosted partitioners' names, in the order they
 * ran). Without `partitioners` the title names the backends the report's methods name
 * (delegated, partitions, nodes) instead; without `model` it names no model. It never names the
 * file the report was read from. (client/report_page.py's report_title.)
 */
export function reportTitle(report) {
  const model = own(report, 'model');
  const name = typeof model === 'string' ? model.split(/[\\/]/).at(-1) : '';
  const listed = own(report, 'partitioners');
  const partitioners = (Array.isArray(listed) ? listed : [])
    .map((p) => (isMapping(p) ? pyStr(get(p, 'name', '')) : pyStr(p)));
  let who = partitioners.filter((p) => p);
  if (who.length === 0) who = backends(report);
  const title = name ? `Delegation report: ${name}` : 'Delegation report';
  return who.length > 0 ? `${title} (${who.join(', ')})` : title;
}

/**
 * The report page for `report` (the JSON object --report-json writes), titled `title` (default,
 * when undefined or null: reportTitle(report)): one HTML document that fetches nothing, the same
 * bytes as client/report_page.py's render_html gives.
 *
 * Throws: TypeError when `report` is not an object or its `methods` is not a list.
 */
export function renderHtml(report, { title } = {}) {
  if (!isMapping(report)) throw new TypeError('the report must be a JSON object');
  const methods = own(report, 'methods');
  if (!(methods === undefined || Array.isArray(methods))) {
    throw new TypeError("the report's 'methods' must be a list");
  }
  const pageTitle = title ?? reportTitle(report);
  const colours = {};
  for (const b of backends(report)) colours[b] = backendColour(b);
  const data = { title: pageTitle, report, colours };
  const scripts = [inlineScript(asset('dagre.min.js')), inlineScript(asset('report.js'))];
  const hashes = scripts
    .map((s) => `'sha256-${crypto.createHash('sha256').update(s, 'utf8').digest('base64')}'`)
    .join(' ');
  const csp = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; " +
    `script-src ${hashes}; base-uri 'none'; form-action 'none'`;
  const values = {
    CSP: escapeHtml(csp),
    TITLE: escapeHtml(pageTitle),
    STYLE: asset('report.css').replaceAll('</style', '<\\/style'),
    DATA: jsonScript(data),
    DAGRE: scripts[0],
    SCRIPT: scripts[1],
  };
  // One pass: a placeholder-like string inside the report's data is left alone.
  return asset('template.html').replace(/\{\{([A-Z]+)\}\}/g, (_, key) => {
    if (!Object.hasOwn(values, key)) throw new Error(`unknown placeholder {{${key}}}`);
    return values[key];
  });
}

/** Write renderHtml(report, {title}) to `file` (UTF-8). */
export function writeReport(file, report, { title } = {}) {
  fs.writeFileSync(file, renderHtml(report, { title }), 'utf8');
}

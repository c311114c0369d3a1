#!/usr/bin/env node
// Open a delegation report page (a file:// HTML written by `remote-partitioner ... --report`) in
// headless Chromium through playwright-core, and print what it rendered as JSON on stdout:
// console errors and page errors, every request the page tried (there must be none), the time
// until the page said it was ready, the page's text, the drawn nodes with their fill colour,
// the legend's colours, the drawing's geometry (every module's box and labels, every node's box
// and label, in page pixels) and (with --expand) what clicking the first collapsed module did
// (with the geometry after it).
//
//   node tools/report-page.mjs PAGE.html [--screenshot OUT.png] [--expand] [--reveal]
//                              [--timeout MS]
//
// --reveal clicks, in the CPU list, the name of a CPU node the graph does not show yet and
// reports whether the graph then shows it, selected and on screen (its modules opened).
//
// Chromium: $CHROMIUM, else /usr/bin/chromium (Debian's package). Exit 0 when the page was
// read (the caller judges it), 1 when it could not be.

import path from 'node:path';
import { parseArgs } from 'node:util';
import { pathToFileURL } from 'node:url';

import { chromium } from 'playwright-core';

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    screenshot: { type: 'string' },
    expand: { type: 'boolean' },
    reveal: { type: 'boolean' },
    timeout: { type: 'string', default: '60000' },
  },
});
if (positionals.length !== 1) {
  process.stderr.write('usage: report-page.mjs PAGE.html [--screenshot OUT.png] [--expand]\n');
  process.exit(2);
}
const pageUrl = pathToFileURL(path.resolve(positionals[0])).href;
const timeout = Number(values.timeout);

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking',
    '--disable-component-update'],
});
const out = { console_errors: [], page_errors: [], requests: [] };
try {
  const context = await browser.newContext({ viewport: { width: 1500, height: 1000 } });
  // Every request but the page itself is recorded and refused: the page must need none.
  await context.route('**/*', (route) => {
    const url = route.request().url();
    if (url === pageUrl) return route.continue();
    out.requests.push(url);
    return route.abort();
  });
  const page = await context.newPage();
  page.on('console', (msg) => {
    if (msg.type() === 'error') out.console_errors.push(msg.text());
  });
  page.on('pageerror', (e) => out.page_errors.push(String(e && e.stack ? e.stack : e)));
  page.on('requestfailed', (r) => {
    if (r.url() !== pageUrl && !out.requests.includes(r.url())) out.requests.push(r.url());
  });
  const started = Date.now();
  await page.goto(pageUrl, { waitUntil: 'load', timeout });
  await page.waitForFunction(() => window.__report && window.__report.ready, null, { timeout });
  out.wall_ms = Date.now() - started;
  out.render_ms = await page.evaluate(() => window.__report.renderMs);
  out.title = await page.title();
  out.heading = await page.evaluate(() => document.getElementById('title').textContent);
  out.text = await page.evaluate(() => document.body.innerText);
  // All the text, folded parts included (innerText leaves closed <details> out).
  out.all_text = await page.evaluate(() => document.body.textContent);
  // On screen: inside its graph's box (the drawing is clipped to it) and in the viewport.
  await page.evaluate(() => {
    window.__onscreen = (g) => {
      const box = g.getBoundingClientRect();
      const host = g.closest('[data-graph]').getBoundingClientRect();
      return box.left >= host.left && box.right <= host.right && box.top >= host.top
        && box.bottom <= host.bottom && box.top >= 0 && box.bottom <= window.innerHeight;
    };
  });
  const snapshot = () => page.evaluate(() => ({
    visible: [...document.querySelectorAll('[data-graph]')].map((g) => Number(g.dataset.visible || 0)),
    nodes: [...document.querySelectorAll('[data-node]')].map((g) => ({
      name: g.dataset.node,
      backend: g.dataset.backend || null,
      partition: g.dataset.partition || null,
      cpu: g.dataset.cpu === 'true',
      fill: getComputedStyle(g.querySelector('rect')).fill,
      onscreen: window.__onscreen(g),
    })),
    clusters: [...document.querySelectorAll('[data-cluster]:not([data-open])')].map((g) => ({
      path: g.dataset.cluster, size: Number(g.dataset.size), onscreen: window.__onscreen(g),
    })),
  }));
  Object.assign(out, await snapshot());
  // Boxes as {left, top, right, bottom}, page pixels at the graph's current zoom. A node's
  // `module` and a module's `parent` are module paths ('' is the model itself).
  const geometry = () => page.evaluate(() => {
    const box = (e) => {
      const r = e.getBoundingClientRect();
      return { left: r.left, top: r.top, right: r.right, bottom: r.bottom };
    };
    const graphOf = (g) => g.closest('[data-graph]').dataset.graph;
    return {
      modules: [...document.querySelectorAll('[data-cluster]')].map((g) => ({
        graph: graphOf(g),
        path: g.dataset.cluster,
        parent: g.dataset.parent,
        open: g.hasAttribute('data-open'),
        box: box(g.querySelector('rect.box')),
        drawn: box(g), // the box, its title strip and its labels
        labels: [...g.querySelectorAll('text')].map((t) => ({ text: t.textContent, box: box(t) })),
      })),
      nodes: [...document.querySelectorAll('[data-node]')].map((g) => ({
        graph: graphOf(g),
        name: g.dataset.node,
        module: g.dataset.module,
        io: g.classList.contains('io'),
        box: box(g.querySelector('rect')),
        label: { text: g.querySelector('text').textContent, box: box(g.querySelector('text')) },
      })),
    };
  });
  out.geometry = await geometry();
  out.legend = await page.evaluate(() => Object.fromEntries(
    [...document.querySelectorAll('[data-legend-backend]')].map((s) => [
      s.dataset.legendBackend, getComputedStyle(s).backgroundColor])));
  if (values.screenshot) await page.screenshot({ path: values.screenshot });
  const reachable = out.clusters.filter((c) => c.onscreen);
  if (values.expand && reachable.length > 0) {
    // The largest module on screen, clicked as a user would.
    const target = reachable.reduce((a, b) => (b.size > a.size ? b : a));
    const renders = await page.evaluate(() => window.__report.renders);
    const t0 = Date.now();
    await page.click(`[data-cluster="${target.path}"]:not([data-open]) rect.box`);
    await page.waitForFunction((n) => window.__report.renders > n, renders, { timeout });
    const after = await snapshot();
    out.expanded = {
      path: target.path,
      ms: Date.now() - t0,
      visible_before: out.visible,
      visible_after: after.visible,
      nodes_after: after.nodes.length,
      onscreen_after: after.nodes.filter((n) => n.onscreen).length,
      still_collapsed: after.clusters.map((c) => c.path).includes(target.path),
      geometry: await geometry(),
    };
    // Click a drawn node of the module just opened: its details must show.
    const shown = after.nodes.filter((n) => n.onscreen);
    const inside = shown.find((n) => n.cpu) || shown[0];
    if (inside) {
      await page.click(`[data-node="${inside.name}"]`);
      out.expanded.details = await page.evaluate(() => document.getElementById('details').innerText);
    }
    if (values.screenshot) {
      await page.screenshot({ path: values.screenshot.replace(/\.png$/, '') + '-expanded.png' });
    }
  }
  if (values.reveal) {
    // The first CPU node not drawn yet (inside a closed module), else the first one.
    const index = await page.evaluate(() => {
      const links = [...document.querySelectorAll('.cpu-nodes .node-link')]
        .filter((a) => a.checkVisibility());
      const hidden = links.findIndex(
        (a) => !document.querySelector(`[data-node="${CSS.escape(a.textContent)}"]`));
      return links.length === 0 ? -1 : Math.max(hidden, 0);
    });
    if (index >= 0) {
      const link = page.locator('.cpu-nodes .node-link:visible').nth(index);
      const name = await link.innerText();
      const renders = await page.evaluate(() => window.__report.renders);
      const wasDrawn = await page.evaluate(
        (n) => Boolean(document.querySelector(`[data-node="${CSS.escape(n)}"]`)), name);
      await link.click();
      await page.waitForFunction((n) => window.__report.renders > n, renders, { timeout });
      out.revealed = await page.evaluate(([n, wasDrawn]) => {
        const g = document.querySelector(`[data-node="${CSS.escape(n)}"]`);
        return {
          name: n,
          was_drawn: wasDrawn,
          drawn: Boolean(g),
          selected: Boolean(g && g.classList.contains('selected')),
          onscreen: Boolean(g && window.__onscreen(g)),
          details: document.getElementById('details').innerText,
        };
      }, [name, wasDrawn]);
      if (values.screenshot) {
        await page.screenshot({ path: values.screenshot.replace(/\.png$/, '') + '-revealed.png' });
      }
    }
  }
} finally {
  await browser.close();
}
process.stdout.write(`${JSON.stringify(out)}\n`);

// The delegation report page. Reads the report from the JSON block #report-data, builds per
// method the summary, the CPU node list and the graph. The graph groups nodes by module hierarchy
// (nn_module_stack) into clusters; clusters beyond a budget start collapsed, and only what is
// expanded is laid out (dagre, compound mode). Every report string is inserted as text.
'use strict';
(() => {
  const DATA = JSON.parse(document.getElementById('report-data').textContent);
  const COLOURS = DATA.colours || {};
  const SVG_NS = 'http://www.w3.org/2000/svg';
  const CPU = '#d62728';
  const IO_FILL = '#e5e7eb';
  const CPU_FILL = '#ffffff';
  // How many boxes (nodes and collapsed modules) the first drawing of a graph may hold.
  const EXPAND_BUDGET = 140;
  // Edges of a box that feeds more boxes than this are not drawn (the box says how many).
  const HUB_FANOUT = 6;
  // How many node names the CPU list shows per operator and reason before "N more".
  const NAMES_SHOWN = 12;
  const status = { ready: false, renderMs: null, renders: 0, errors: [] };
  window.__report = status;

  // ------------------------------------------------------------------------------- helpers

  function el(tag, attrs = {}, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs)) {
      if (k === 'text') e.textContent = v;
      else if (k === 'class') e.className = v;
      else if (v !== undefined && v !== null) e.setAttribute(k, v);
    }
    for (const c of children) if (c !== null && c !== undefined) e.append(c);
    return e;
  }

  function svg(tag, attrs = {}) {
    const e = document.createElementNS(SVG_NS, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    return e;
  }

  const num = (v) => Number(v || 0);
  const shortOp = (op) => String(op || '').replace(/^aten\./, '').replace(/\.default$/, '');
  const isOperator = (n) => n.kind === 'call_function' && !/getitem/.test(n.op || '');
  const isWeight = (n) => n.kind === 'placeholder' && /^(p|b|c)_/.test(n.name);
  const colourOf = (backend) => COLOURS[backend] || '#888888';
  const plural = (k, word) => `${k} ${word}${k === 1 ? '' : 's'}`;
  const fmtPct = (part, whole) => (whole ? `${((100 * part) / whole).toFixed(1)}%` : '-');
  const sourceText = {
    REJECTION_SOURCE_PARTITIONER: 'reported by the partitioner',
    REJECTION_SOURCE_BACKEND_LOG: "from the backend's log",
    REJECTION_SOURCE_DERIVED: 'derived by the server: the partitioner gave no reason',
  };

  // The width in px of `text` as the graph draws it (11px in the page's font, 600 for module
  // titles: .graph text and .g-cluster text.title in report.css), measured on a canvas: boxes
  // are sized to what they hold, whichever fonts the browser has (the page loads none).
  const textCanvas = document.createElement('canvas').getContext('2d');
  const textWidths = new Map();
  let textFamily = null;
  function textWidth(text, bold = false) {
    const key = `${bold ? 'b' : 'r'}${text}`;
    if (!textWidths.has(key)) {
      textFamily = textFamily || getComputedStyle(document.documentElement).fontFamily || 'sans-serif';
      textCanvas.font = `${bold ? '600 ' : ''}11px ${textFamily}`;
      textWidths.set(key, Math.ceil(textCanvas.measureText(text).width));
    }
    return textWidths.get(key);
  }
  // `text` cut (with an ellipsis) to at most `max` px.
  function fitText(text, max, bold = false) {
    if (textWidth(text, bold) <= max) return text;
    let lo = 0;
    let hi = text.length;
    while (lo < hi) {
      const mid = Math.ceil((lo + hi) / 2);
      if (textWidth(`${text.slice(0, mid)}…`, bold) <= max) lo = mid;
      else hi = mid - 1;
    }
    return `${text.slice(0, lo)}…`;
  }
  // Horizontal room around a label inside its box, and the widest a node box grows.
  const PAD = 8;
  const NODE_MAX = 220;
  const HEAD = 18; // the height of an open module's title strip

  // ------------------------------------------------------------------------------- legend

  function legend() {
    const box = document.getElementById('legend');
    for (const backend of Object.keys(COLOURS)) {
      const sw = el('span', { class: 'swatch', 'data-legend-backend': backend });
      sw.style.background = colourOf(backend);
      box.append(el('span', { class: 'legend-item' }, sw, el('span', { text: backend })));
    }
    box.append(
      el('span', { class: 'legend-item' }, el('span', { class: 'swatch cpu' }),
        el('span', { text: 'CPU (not delegated)' })),
      el('span', { class: 'legend-item' }, el('span', { class: 'swatch io' }),
        el('span', { text: 'input / output / getitem' })),
      el('span', { class: 'legend-item' }, el('span', { class: 'swatch module' }),
        el('span', { text: 'module (click to expand)' })),
    );
  }

  // ------------------------------------------------------------------------------ details

  const details = document.getElementById('details');
  const tooltip = document.getElementById('tooltip');

  function showNode(view, n) {
    details.replaceChildren();
    details.append(el('h2', { class: 'mono', text: n.name }));
    const dl = el('dl');
    const row = (k, v) => {
      if (v === null || v === undefined || v === '') return;
      dl.append(el('dt', { text: k }), el('dd', {}, v));
    };
    row('operator', el('code', { text: n.op || n.kind }));
    row('kind', n.kind);
    if (n.backend_id) {
      const b = el('span', { class: 'badge', text: n.backend_id });
      b.style.background = colourOf(n.backend_id);
      row('backend', b);
      row('partition', n.partition);
    } else if (isOperator(n)) {
      row('backend', el('span', { class: 'badge cpu', text: 'CPU' }));
      row('reason', n.reason || '(no reason reported)');
      row('reason source', sourceText[n.reason_source] || n.reason_source);
    }
    row('shapes', n.shapes ? el('code', { text: n.shapes }) : null);
    const links = (names) => {
      if (!names || names.length === 0) return null;
      const span = el('span');
      names.forEach((name, i) => {
        if (i) span.append(', ');
        span.append(nodeLink(view, name));
      });
      return span;
    };
    row('inputs', links(n.inputs));
    row('users', links(view.users.get(n.name)));
    const stack = n.module_stack || [];
    if (stack.length) {
      const ul = el('ul', { class: 'mono' });
      for (const s of stack) ul.append(el('li', { text: `${s.path || '(model)'}: ${s.type}` }));
      row('module stack', ul);
    }
    details.append(dl);
    if (n.stack_trace) {
      details.append(el('h3', { text: 'stack trace' }), el('pre', { text: n.stack_trace }));
    }
  }

  function showCluster(c) {
    details.replaceChildren();
    details.append(el('h2', { class: 'mono', text: c.path || '(model)' }));
    const dl = el('dl');
    dl.append(el('dt', { text: 'module' }), el('dd', { class: 'mono', text: c.type || '' }));
    dl.append(el('dt', { text: 'nodes' }), el('dd', { text: String(c.size) }));
    for (const [who, count] of Object.entries(c.counts)) {
      dl.append(el('dt', { text: who }), el('dd', { text: String(count) }));
    }
    details.append(dl);
  }

  function nodeLink(view, name) {
    const b = el('button', { class: 'node-link mono', type: 'button', text: name });
    b.addEventListener('click', () => view.reveal(name));
    return b;
  }

  // -------------------------------------------------------------------------------- graph

  class GraphView {
    constructor(method, host, statusLine) {
      this.method = method;
      this.host = host;
      this.statusLine = statusLine;
      this.nodes = new Map();
      this.users = new Map();
      this.showWeights = false;
      this.matches = [];
      this.matchIndex = -1;
      this.selected = null;
      for (const n of method.nodes || []) this.nodes.set(n.name, n);
      for (const n of this.nodes.values()) {
        for (const i of n.inputs || []) {
          if (!this.users.has(i)) this.users.set(i, []);
          this.users.get(i).push(n.name);
        }
      }
      this.buildClusters();
      this.resetExpansion();
      this.svg = svg('svg', { role: 'img', 'aria-label': `graph of ${method.method}` });
      const defs = svg('defs');
      const marker = svg('marker', {
        id: `arrow-${method.method}`, viewBox: '0 0 10 10', refX: '9', refY: '5',
        markerWidth: '7', markerHeight: '7', orient: 'auto-start-reverse',
      });
      marker.append(svg('path', { d: 'M 0 0 L 10 5 L 0 10 z', fill: '#9ca3af' }));
      defs.append(marker);
      this.viewport = svg('g');
      this.svg.append(defs, this.viewport);
      host.append(this.svg);
      this.zoom = { x: 0, y: 0, k: 1 };
      this.bindPanZoom();
      this.bindPointer();
    }

    // The module tree: one cluster per module path, its nodes, its size and composition.
    buildClusters() {
      const root = { path: '', type: '', parent: null, children: [], members: [], depth: 0 };
      this.root = root;
      this.clusters = new Map([['', root]]);
      const clusterOf = new Map();
      for (const n of this.nodes.values()) {
        let parent = root;
        for (const s of n.module_stack || []) {
          if (!s.path) {
            root.type = root.type || s.type;
            continue;
          }
          let c = this.clusters.get(s.path);
          if (!c) {
            c = { path: s.path, type: s.type, parent, children: [], members: [],
              depth: parent.depth + 1 };
            this.clusters.set(s.path, c);
            parent.children.push(c);
          }
          parent = c;
        }
        clusterOf.set(n.name, parent);
      }
      // A weight (parameter, buffer or constant placeholder) joins the innermost module that
      // holds all its users: it sits next to the layer that reads it.
      const ancestors = (c) => {
        const chain = [];
        for (let x = c; x; x = x.parent) chain.unshift(x);
        return chain;
      };
      for (const n of this.nodes.values()) {
        if ((n.module_stack || []).length || !isWeight(n)) continue;
        const users = (this.users.get(n.name) || []).map((u) => clusterOf.get(u)).filter(Boolean);
        if (users.length === 0) continue;
        let common = ancestors(users[0]);
        for (const u of users.slice(1)) {
          const other = ancestors(u);
          let i = 0;
          while (i < common.length && i < other.length && common[i] === other[i]) i += 1;
          common = common.slice(0, i);
        }
        clusterOf.set(n.name, common[common.length - 1] || root);
      }
      this.clusterOf = clusterOf;
      for (const n of this.nodes.values()) clusterOf.get(n.name).members.push(n);
      const measure = (c) => {
        c.size = c.members.length;
        c.counts = {};
        for (const n of c.members) {
          if (!isOperator(n)) continue;
          const who = n.backend_id || 'CPU';
          c.counts[who] = (c.counts[who] || 0) + 1;
        }
        for (const child of c.children) {
          measure(child);
          c.size += child.size;
          for (const [who, k] of Object.entries(child.counts)) c.counts[who] = (c.counts[who] || 0) + k;
        }
      };
      measure(root);
    }

    // Expand breadth first while the drawing stays within budget. Siblings of one module type
    // (the 32 blocks of a transformer) open together or not at all, cheapest group first.
    resetExpansion() {
      for (const c of this.clusters.values()) c.expanded = false;
      this.root.expanded = true;
      let visible = this.root.members.length + this.root.children.length;
      let level = [...this.root.children];
      while (level.length) {
        const groups = new Map();
        for (const c of level) {
          const key = `${c.parent.path}\u0000${c.type}`;
          if (!groups.has(key)) groups.set(key, []);
          groups.get(key).push(c);
        }
        const cost = (cs) => cs.reduce((a, c) => a + c.members.length + c.children.length - 1, 0);
        const next = [];
        for (const cs of [...groups.values()].sort((a, b) => cost(a) - cost(b))) {
          if (visible + cost(cs) > EXPAND_BUDGET) continue;
          visible += cost(cs);
          for (const c of cs) {
            c.expanded = true;
            next.push(...c.children);
          }
        }
        level = next;
      }
    }

    expandLevel() {
      const collapsed = [];
      const walk = (c) => {
        for (const child of c.children) {
          if (child.expanded) walk(child);
          else collapsed.push(child);
        }
      };
      walk(this.root);
      for (const c of collapsed) c.expanded = true;
      this.render();
    }

    // What stands for node `name` in the drawing: itself, or its outermost collapsed module.
    representative(name) {
      const n = this.nodes.get(name);
      if (!n) return null;
      if (isWeight(n) && !this.showWeights) return null;
      const chain = [];
      for (let c = this.clusterOf.get(name); c; c = c.parent) chain.unshift(c);
      for (const c of chain) if (!c.expanded) return `c:${c.path}`;
      return `n:${name}`;
    }

    render() {
      const t0 = performance.now();
      const g = new dagre.graphlib.Graph({ compound: true });
      g.setGraph({ rankdir: 'TB', nodesep: 14, ranksep: 14, edgesep: 6, marginx: 16, marginy: 16 });
      g.setDefaultEdgeLabel(() => ({ minlen: 2 }));
      // Every box is as wide as the text it holds (measured). An open module's title is a node
      // of its own, 'head', inside the module and above all its contents (see below): dagre
      // then makes the module at least as wide as its title and lays nothing else over it.
      const addCluster = (c, parentId) => {
        for (const child of c.children) {
          const id = `c:${child.path}`;
          const type = String(child.type || '').split('.').pop();
          if (child.expanded) {
            const title = `▾ ${child.path} · ${type}`;
            g.setNode(id, { kind: 'open', cluster: child, title });
            g.setNode(`h:${child.path}`, { kind: 'head', cluster: child,
              width: textWidth(title, true) + 2 * PAD, height: HEAD });
            g.setParent(`h:${child.path}`, id);
          } else {
            const cpu = child.counts.CPU || 0;
            const title = `▸ ${child.path}`;
            const sub = `${type} · ${child.size} nodes${cpu ? ` · ${cpu} on CPU` : ''}`;
            const width = Math.max(130, textWidth(title, true) + 2 * PAD, textWidth(sub) + 2 * PAD);
            g.setNode(id, { kind: 'closed', cluster: child, title, sub, width, height: 46 });
          }
          if (parentId) g.setParent(id, parentId);
          if (child.expanded) addCluster(child, id);
        }
        for (const n of c.members) {
          if (isWeight(n) && !this.showWeights) continue;
          const label = fitText(n.kind === 'call_function' ? shortOp(n.op) : n.name, NODE_MAX - 2 * PAD);
          g.setNode(`n:${n.name}`, { kind: 'node', node: n, label,
            width: Math.max(24, textWidth(label) + 2 * PAD), height: 24 });
          if (parentId) g.setParent(`n:${n.name}`, parentId);
        }
      };
      addCluster(this.root, null);
      const targets = new Map(); // representative -> the representatives it feeds
      for (const n of this.nodes.values()) {
        const b = this.representative(n.name);
        if (!b) continue;
        for (const i of n.inputs || []) {
          const a = this.representative(i);
          if (!a || a === b) continue;
          if (!targets.has(a)) targets.set(a, new Set());
          targets.get(a).add(b);
        }
      }
      // A box that feeds many others (the rotary tables every layer reads, a mask) keeps its
      // edges out of the drawing and says how many it feeds: long edges across the whole graph
      // would tangle it and cost most of the layout time.
      for (const [a, bs] of targets) {
        if (bs.size > HUB_FANOUT) {
          const v = g.node(a);
          v.hub = bs.size;
          if (v.kind === 'node') {
            v.label = fitText(v.label, NODE_MAX - 2 * PAD - textWidth(` ⇉${bs.size}`));
            v.label = `${v.label} ⇉${bs.size}`;
            v.width = textWidth(v.label) + 2 * PAD;
          }
          continue;
        }
        for (const b of bs) g.setEdge(a, b);
      }
      this.addHeadEdges(g);
      const t1 = performance.now();
      dagre.layout(g);
      const t2 = performance.now();
      this.draw(g);
      const ms = performance.now() - t0;
      this.timing = { model: t1 - t0, layout: t2 - t1, draw: ms - (t2 - t0) };
      const boxes = g.nodes().filter((id) => ['node', 'closed'].includes(g.node(id).kind)).length;
      this.visible = boxes;
      this.host.dataset.visible = String(boxes);
      this.host.dataset.renders = String(num(this.host.dataset.renders) + 1);
      this.statusLine.textContent =
        `${boxes} boxes drawn of ${this.nodes.size} nodes, laid out in ${ms.toFixed(0)} ms`;
      this.host.dataset.timing = JSON.stringify(this.timing);
      status.renders += 1;
    }

    // Invisible edges that put each open module's title ('head') above the module's contents
    // and below whatever feeds the module from outside: from the title to the boxes of the module
    // that nothing else in it feeds, and from each box outside to the titles of the modules its
    // edges enter (an input then sits above the module it feeds, not beside it).
    addHeadEdges(g) {
      const chain = (v) => {
        const out = [];
        for (let p = g.parent(v); p; p = g.parent(p)) out.push(p);
        return out;
      };
      // What stands for a module's direct child `v` as an edge's end: an open module, its title.
      const entry = (v) => (g.node(v).kind === 'open' ? `h:${g.node(v).cluster.path}` : v);
      const fed = new Set(); // direct children of a module fed from inside that module
      const entering = [];
      for (const e of g.edges()) {
        const up = chain(e.v);
        let child = e.w;
        for (const p of chain(e.w)) {
          if (up.includes(p) && !(child === e.v || up.includes(child))) fed.add(child);
          child = p;
        }
        for (const p of chain(e.w)) {
          if (up.includes(p)) break;
          entering.push([e.v, `h:${g.node(p).cluster.path}`]);
        }
      }
      for (const [v, head] of entering) g.setEdge(v, head, { invisible: true, minlen: 2 });
      for (const id of g.nodes()) {
        if (g.node(id).kind !== 'open') continue;
        const head = `h:${g.node(id).cluster.path}`;
        for (const child of g.children(id)) {
          if (child === head || fed.has(child)) continue;
          g.setEdge(head, entry(child), { invisible: true, minlen: 1 });
        }
      }
    }

    draw(g) {
      this.viewport.replaceChildren();
      const layers = [svg('g'), svg('g'), svg('g')];
      this.viewport.append(...layers);
      this.elements = new Map();
      const open = g.nodes().filter((id) => g.node(id).kind === 'open')
        .sort((a, b) => g.node(a).cluster.depth - g.node(b).cluster.depth);
      for (const id of open) layers[0].append(this.drawOpen(g.node(id), g.node(`h:${g.node(id).cluster.path}`)));
      for (const e of g.edges()) {
        if (g.edge(e).invisible) continue;
        const pts = g.edge(e).points;
        const d = pts.map((p, i) => `${i ? 'L' : 'M'}${p.x.toFixed(1)} ${p.y.toFixed(1)}`).join(' ');
        layers[1].append(svg('path', {
          class: 'g-edge', d, 'marker-end': `url(#arrow-${this.method.method})`,
        }));
      }
      for (const id of g.nodes()) {
        const v = g.node(id);
        if (v.kind === 'node') layers[2].append(this.drawNode(v));
        else if (v.kind === 'closed') layers[2].append(this.drawClosed(v));
      }
      const box = g.graph();
      this.extent = { w: box.width || 0, h: box.height || 0 };
    }

    drawNode(v) {
      const n = v.node;
      const cpu = isOperator(n) && !n.backend_id;
      const io = !isOperator(n) && !n.backend_id;
      const cls = `g-node${cpu ? ' cpu' : ''}${io ? ' io' : ''}${this.selected === n.name ? ' selected' : ''}`;
      const gEl = svg('g', { class: cls, 'data-node': n.name,
        'data-module': this.clusterOf.get(n.name).path,
        transform: `translate(${v.x - v.width / 2},${v.y - v.height / 2})` });
      if (n.backend_id) {
        gEl.setAttribute('data-backend', n.backend_id);
        gEl.setAttribute('data-partition', n.partition || '');
      }
      if (cpu) gEl.setAttribute('data-cpu', 'true');
      const fill = n.backend_id ? colourOf(n.backend_id) : cpu ? CPU_FILL : IO_FILL;
      gEl.append(svg('rect', { width: v.width, height: v.height, rx: io ? 12 : 4, fill }));
      const t = svg('text', { x: v.width / 2, y: v.height / 2 + 4, 'text-anchor': 'middle',
        fill: n.backend_id ? '#ffffff' : cpu ? '#7f1d1d' : '#374151' });
      t.textContent = v.label;
      if (v.hub) gEl.setAttribute('data-hub', String(v.hub));
      gEl.append(t);
      this.elements.set(n.name, gEl);
      return gEl;
    }

    drawClosed(v) {
      const c = v.cluster;
      const cpuCount = c.counts.CPU || 0;
      const gEl = svg('g', {
        class: `g-cluster collapsed${cpuCount ? ' has-cpu' : ''}`, 'data-cluster': c.path,
        'data-parent': c.parent.path, 'data-size': String(c.size), transform: `translate(${v.x - v.width / 2},${v.y - v.height / 2})`,
      });
      gEl.append(svg('rect', { class: 'box', width: v.width, height: v.height, rx: 6 }));
      const title = svg('text', { class: 'title', x: PAD, y: 15 });
      title.textContent = v.title;
      const sub = svg('text', { class: 'sub', x: PAD, y: 29 });
      sub.textContent = v.sub;
      gEl.append(title, sub);
      // The module's composition: a bar split by backend, CPU hatched red.
      const ops = Object.values(c.counts).reduce((a, b) => a + b, 0);
      let x = PAD;
      const w = v.width - 2 * PAD;
      for (const [who, k] of Object.entries(c.counts).sort()) {
        const part = ops ? (w * k) / ops : 0;
        gEl.append(svg('rect', { x, y: 35, width: Math.max(part, 0), height: 5,
          fill: who === 'CPU' ? CPU : colourOf(who) }));
        x += part;
      }
      return gEl;
    }

    // An open module `v`: its box from its title (`head`, the topmost thing in it: the rank
    // dagre keeps above it holds nothing of the module) down.
    drawOpen(v, head) {
      const c = v.cluster;
      const gEl = svg('g', { class: 'g-cluster', 'data-cluster': c.path,
        'data-parent': c.parent.path, 'data-open': 'true' });
      const x = v.x - v.width / 2;
      const y = head.y - head.height / 2;
      const height = v.y + v.height / 2 - y;
      gEl.append(svg('rect', { class: 'box', x, y, width: v.width, height, rx: 6 }));
      // The whole name (the module is laid out at least as wide as it): names are what one
      // navigates by.
      gEl.append(svg('rect', { class: 'head', x, y, width: v.width, height: HEAD, rx: 6 }));
      const t = svg('text', { class: 'title', x: x + PAD, y: y + 13 });
      t.textContent = v.title;
      gEl.append(t);
      return gEl;
    }

    // ------------------------------------------------------------------ interaction

    bindPointer() {
      this.svg.addEventListener('click', (ev) => {
        if (this.dragged) return;
        const nodeEl = ev.target.closest('[data-node]');
        if (nodeEl) {
          this.select(nodeEl.getAttribute('data-node'));
          return;
        }
        const clusterEl = ev.target.closest('[data-cluster]');
        if (!clusterEl) return;
        const c = this.clusters.get(clusterEl.getAttribute('data-cluster'));
        if (clusterEl.hasAttribute('data-open')) {
          // Only the header strip collapses an open module (its box is mostly background).
          if (!ev.target.classList.contains('head') && !ev.target.classList.contains('title')) return;
          c.expanded = false;
        } else {
          c.expanded = true;
        }
        showCluster(c);
        // Keep the module where the user clicked it: its top-left corner stays put on screen.
        const before = clusterEl.getBoundingClientRect();
        this.render();
        const after = this.viewport.querySelector(`[data-cluster="${CSS.escape(c.path)}"]`);
        if (after) {
          const now = after.getBoundingClientRect();
          this.zoom.x += before.left - now.left;
          this.zoom.y += before.top - now.top;
          this.apply();
        }
      });
      this.svg.addEventListener('mousemove', (ev) => {
        const nodeEl = ev.target.closest('[data-node]');
        const clusterEl = nodeEl ? null : ev.target.closest('[data-cluster]:not([data-open])');
        let text = null;
        if (nodeEl) {
          const n = this.nodes.get(nodeEl.getAttribute('data-node'));
          const where = n.backend_id ? `${n.backend_id} ${n.partition || ''}`
            : isOperator(n) ? `CPU: ${n.reason || 'no reason reported'}` : n.kind;
          const hub = nodeEl.dataset.hub ? `\nfeeds ${nodeEl.dataset.hub} boxes (edges not drawn)` : '';
          text = `${n.name}  ${n.op}\n${n.shapes || ''}\n${where}${hub}`;
        } else if (clusterEl) {
          const c = this.clusters.get(clusterEl.getAttribute('data-cluster'));
          text = `${c.path} (${c.type})\n${c.size} nodes: click to expand`;
        }
        if (!text) {
          tooltip.hidden = true;
          return;
        }
        tooltip.textContent = text;
        tooltip.style.whiteSpace = 'pre-line';
        tooltip.style.left = `${ev.clientX + 14}px`;
        tooltip.style.top = `${ev.clientY + 14}px`;
        tooltip.hidden = false;
      });
      this.svg.addEventListener('mouseleave', () => { tooltip.hidden = true; });
    }

    bindPanZoom() {
      let start = null;
      this.svg.addEventListener('mousedown', (ev) => {
        start = { x: ev.clientX, y: ev.clientY, zx: this.zoom.x, zy: this.zoom.y };
        this.dragged = false;
      });
      window.addEventListener('mousemove', (ev) => {
        if (!start) return;
        const dx = ev.clientX - start.x;
        const dy = ev.clientY - start.y;
        if (Math.abs(dx) + Math.abs(dy) > 3) {
          this.dragged = true;
          this.host.classList.add('dragging');
        }
        this.zoom.x = start.zx + dx;
        this.zoom.y = start.zy + dy;
        this.apply();
      });
      window.addEventListener('mouseup', () => {
        start = null;
        this.host.classList.remove('dragging');
        setTimeout(() => { this.dragged = false; }, 0);
      });
      this.svg.addEventListener('wheel', (ev) => {
        ev.preventDefault();
        const r = this.svg.getBoundingClientRect();
        const px = ev.clientX - r.left;
        const py = ev.clientY - r.top;
        const k = Math.min(4, Math.max(0.05, this.zoom.k * Math.exp(-ev.deltaY / 400)));
        this.zoom.x = px - ((px - this.zoom.x) * k) / this.zoom.k;
        this.zoom.y = py - ((py - this.zoom.y) * k) / this.zoom.k;
        this.zoom.k = k;
        this.apply();
      }, { passive: false });
    }

    apply() {
      const z = this.zoom;
      this.viewport.setAttribute('transform', `translate(${z.x},${z.y}) scale(${z.k})`);
    }

    // Fit the width (at most 1:1, not below a readable scale), top aligned; `whole`: fit the
    // height too (the Fit button), down to a scale where the shape still shows.
    fit(whole = false) {
      const r = this.svg.getBoundingClientRect();
      let k = Math.min(1, (r.width - 20) / (this.extent.w || 1));
      const tall = Math.min(k, (r.height - 20) / (this.extent.h || 1));
      if (whole || tall >= 0.7) k = tall; // a small graph shows whole
      k = Math.max(whole ? 0.15 : 0.6, k);
      this.zoom = { k, x: Math.max(10, (r.width - this.extent.w * k) / 2), y: 10 };
      this.apply();
    }

    centerOn(name) {
      const e = this.elements.get(name);
      if (!e) return;
      const m = /translate\(([-\d.e]+),([-\d.e]+)\)/.exec(e.getAttribute('transform'));
      const r = this.svg.getBoundingClientRect();
      const k = Math.max(this.zoom.k, 0.8);
      this.zoom = { k, x: r.width / 2 - Number(m[1]) * k - 40, y: r.height / 2 - Number(m[2]) * k };
      this.apply();
    }

    select(name) {
      const n = this.nodes.get(name);
      if (!n) return;
      if (this.selected && this.elements.get(this.selected)) {
        this.elements.get(this.selected).classList.remove('selected');
      }
      this.selected = name;
      const e = this.elements.get(name);
      if (e) e.classList.add('selected');
      showNode(this, n);
    }

    // Expand the modules that hold `name`, draw, centre on it and select it.
    reveal(name) {
      const n = this.nodes.get(name);
      if (!n) return;
      if (isWeight(n)) this.showWeights = true;
      for (let c = this.clusterOf.get(name); c; c = c.parent) c.expanded = true;
      this.host.scrollIntoView({ block: 'nearest' });
      this.render();
      this.centerOn(name);
      this.select(name);
      const e = this.elements.get(name);
      if (e) {
        e.classList.add('flash');
        setTimeout(() => e.classList.remove('flash'), 2600);
      }
    }

    search(query) {
      const q = query.trim().toLowerCase();
      if (!q) return;
      if (q !== this.lastQuery) {
        this.lastQuery = q;
        this.matches = [...this.nodes.values()]
          .filter((n) => n.name.toLowerCase().includes(q) || String(n.op).toLowerCase().includes(q))
          .map((n) => n.name);
        this.matchIndex = -1;
      }
      if (this.matches.length === 0) {
        this.statusLine.textContent = `no node matches "${query}"`;
        return;
      }
      this.matchIndex = (this.matchIndex + 1) % this.matches.length;
      this.reveal(this.matches[this.matchIndex]);
      this.statusLine.textContent =
        `match ${this.matchIndex + 1} of ${this.matches.length} (Enter: next)`;
    }
  }

  // ------------------------------------------------------------------------------- method

  function summary(m) {
    const total = num(m.total_nodes);
    const delegated = m.delegated || [];
    const onCpu = total - delegated.reduce((a, d) => a + num(d.nodes), 0);
    const bar = el('div', { class: 'bar', title: 'share of operator nodes' });
    for (const d of delegated) {
      const s = el('span');
      s.style.width = fmtPct(num(d.nodes), total);
      s.style.background = colourOf(d.backend_id);
      bar.append(s);
    }
    const cpu = el('span', { class: 'cpu' });
    cpu.style.width = fmtPct(onCpu, total);
    bar.append(cpu);
    const table = el('table', { class: 'summary' },
      el('thead', {}, el('tr', {}, el('th', { text: 'where' }),
        el('th', { class: 'num', text: 'partitions' }), el('th', { class: 'num', text: 'nodes' }),
        el('th', { class: 'num', text: 'share' }))));
    const body = el('tbody');
    for (const d of delegated) {
      const sw = el('span', { class: 'swatch' });
      sw.style.background = colourOf(d.backend_id);
      body.append(el('tr', { 'data-backend': d.backend_id },
        el('td', {}, sw, ' ', d.backend_id), el('td', { class: 'num', text: String(num(d.partitions)) }),
        el('td', { class: 'num', text: String(num(d.nodes)) }),
        el('td', { class: 'num', text: fmtPct(num(d.nodes), total) })));
    }
    body.append(el('tr', { 'data-backend': 'CPU' },
      el('td', {}, el('span', { class: 'swatch cpu' }), ' CPU'), el('td', { class: 'num', text: '-' }),
      el('td', { class: 'num', text: String(onCpu) }), el('td', { class: 'num', text: fmtPct(onCpu, total) })));
    table.append(body);
    return { bar, table, onCpu, total };
  }

  function partitionsTable(m) {
    const parts = m.partitions || [];
    if (!parts.length) return null;
    const box = el('details', {}, el('summary', { text: `Partitions (${parts.length})` }));
    const table = el('table', {}, el('thead', {}, el('tr', {}, el('th', { text: 'partition' }),
      el('th', { text: 'backend' }), el('th', { class: 'num', text: 'nodes' }))));
    const body = el('tbody');
    for (const p of parts) {
      const sw = el('span', { class: 'swatch' });
      sw.style.background = colourOf(p.backend_id);
      body.append(el('tr', {}, el('td', { class: 'mono', text: p.id }),
        el('td', {}, sw, ' ', p.backend_id), el('td', { class: 'num', text: String(num(p.nodes)) })));
    }
    table.append(body);
    box.append(table);
    return box;
  }

  // The CPU nodes grouped by operator, then by reason.
  function cpuList(m, view) {
    const box = el('section', { class: 'cpu-nodes' });
    const nodes = (m.nodes || []).filter((n) => isOperator(n) && !n.backend_id);
    const fromList = nodes.length ? nodes : (m.cpu_nodes || []);
    if (fromList.length === 0 && (m.cpu_ops || []).length === 0) {
      box.append(el('h3', { text: 'On the CPU: nothing, every operator node was delegated' }));
      return box;
    }
    const byOp = new Map();
    for (const n of fromList) {
      if (!byOp.has(n.op)) byOp.set(n.op, []);
      byOp.get(n.op).push(n);
    }
    const total = fromList.length || (m.cpu_ops || []).reduce((a, o) => a + num(o.count), 0);
    const opCount = byOp.size || (m.cpu_ops || []).length;
    box.append(el('h3', { text: `On the CPU: ${plural(total, 'node')}, ${plural(opCount, 'operator')}` }));
    const grid = el('div', { class: 'cpu-ops' });
    if (byOp.size === 0) {
      for (const o of m.cpu_ops || []) {
        grid.append(el('div', { class: 'cpu-op' }, el('code', { text: o.op }), ` ×${num(o.count)}`,
          el('div', { class: 'reason', text: '(this server sent no per-node reasons)' })));
      }
    }
    const ops = [...byOp.entries()].sort((a, b) => b[1].length - a[1].length || a[0].localeCompare(b[0]));
    for (const [op, list] of ops) {
      const item = el('div', { class: 'cpu-op', 'data-op': op },
        el('code', { text: op }), ` ×${list.length}`);
      const byReason = new Map();
      for (const n of list) {
        const key = `${n.reason || '(no reason reported)'}\u0000${n.reason_source || ''}`;
        if (!byReason.has(key)) byReason.set(key, []);
        byReason.get(key).push(n.name);
      }
      for (const [key, names] of byReason) {
        const [reason, source] = key.split('\u0000');
        const div = el('div', { class: 'reason' }, reason);
        if (source) div.append(' ', el('span', { class: 'source', text: `(${sourceText[source] || source})` }));
        const who = el('div', { class: 'who' });
        const add = (list) => list.forEach((name) => {
          who.append(view ? nodeLink(view, name) : el('code', { text: name }), ' ');
        });
        add(names.slice(0, NAMES_SHOWN));
        if (names.length > NAMES_SHOWN) {
          // The rest stays in the page (searchable) but folded.
          const more = el('details', { class: 'more' },
            el('summary', { text: `${names.length - NAMES_SHOWN} more` }));
          const rest = el('div');
          more.append(rest);
          who.append(more);
          names.slice(NAMES_SHOWN).forEach((name) => {
            rest.append(view ? nodeLink(view, name) : el('code', { text: name }), ' ');
          });
        }
        item.append(div, who);
      }
      grid.append(item);
    }
    box.append(grid);
    return box;
  }

  function methodSection(m, index) {
    const s = summary(m);
    const head = el('summary', {}, el('h2', { class: 'mono', text: m.method }),
      el('span', { class: 'headline', text: `${s.total} operator nodes, ` +
        `${s.total - s.onCpu} delegated in ${(m.delegated || []).reduce((a, d) => a + num(d.partitions), 0)} ` +
        `partitions, ${s.onCpu} on the CPU` }));
    const section = el('details', { class: 'method', 'data-method': m.method }, head);
    if (index === 0) section.open = true;
    const body = el('div', { class: 'method-body' }, s.bar, s.table, partitionsTable(m));
    section.append(body);
    let view = null;
    if ((m.nodes || []).length) {
      const statusLine = el('span', { class: 'status' });
      const graph = el('div', { class: 'graph', 'data-graph': m.method });
      const button = (text, title, fn) => {
        const b = el('button', { type: 'button', text, title });
        b.addEventListener('click', fn);
        return b;
      };
      const searchBox = el('input', { type: 'search', placeholder: 'find a node or operator…',
        'aria-label': 'find a node' });
      const weights = el('input', { type: 'checkbox' });
      const toolbar = el('div', { class: 'toolbar' },
        button('Expand one level', 'expand every collapsed module on screen', () => view.expandLevel()),
        button('Reset', 'back to the first view', () => { view.resetExpansion(); view.render(); view.fit(); }),
        button('Fit', 'fit the whole drawing', () => view.fit(true)),
        el('label', {}, weights, ' weights'), searchBox, statusLine);
      body.append(el('h3', { text: 'Graph' }), toolbar, graph);
      view = new GraphView(m, graph, statusLine);
      weights.addEventListener('change', () => { view.showWeights = weights.checked; view.render(); });
      searchBox.addEventListener('keydown', (ev) => { if (ev.key === 'Enter') view.search(searchBox.value); });
      const first = () => {
        if (view.drawn) return;
        view.drawn = true;
        view.render();
        view.fit();
        // A small drawing gets a box its size rather than a screenful of white.
        const need = view.extent.h * view.zoom.k + 40;
        if (need < graph.clientHeight) graph.style.height = `${Math.max(200, need)}px`;
      };
      if (section.open) requestAnimationFrame(first);
      section.addEventListener('toggle', () => { if (section.open) first(); });
    } else {
      body.append(el('p', { class: 'empty', text:
        'No per-node data in this report (the server did not send nodes): no graph to draw.' }));
    }
    body.append(cpuList(m, view));
    return { section, view };
  }

  // --------------------------------------------------------------------------------- main

  function main() {
    legend();
    const host = document.getElementById('methods');
    const methods = (DATA.report && DATA.report.methods) || [];
    if (methods.length === 0) host.append(el('p', { class: 'empty', text: 'The report has no methods.' }));
    methods.forEach((m, i) => host.append(methodSection(m, i).section));
    // Ready once the first method's graph is drawn (two frames: the one that draws, and paint).
    requestAnimationFrame(() => requestAnimationFrame(() => {
      status.renderMs = performance.now();
      status.ready = true;
      document.body.dataset.ready = 'true';
    }));
  }

  try {
    main();
  } catch (e) {
    status.errors.push(String(e && e.stack ? e.stack : e));
    throw e;
  }
})();

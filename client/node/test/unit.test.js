// Unit tests of the parts that need no server: `node --test client/node/test` (or `npm test`).

import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

import grpc from '@grpc/grpc-js';
import protobuf from 'protobufjs';

import { checkArchive, zipEntries } from '../lib/archive.js';
import {
  ClientError, cpuNodes, digestOf, parseSpec, parseSpecValue, reportToJson, serviceConstructor,
} from '../lib/client.js';
import { BACKEND_COLOURS, backendColour, renderHtml, reportTitle } from '../lib/report-page.js';
import { describeError } from '../lib/status.js';

test('spec values: bool, int, float, string', () => {
  assert.deepEqual(parseSpecValue('true'), { bool_value: true });
  assert.deepEqual(parseSpecValue('false'), { bool_value: false });
  assert.deepEqual(parseSpecValue('42'), { int_value: '42' });
  assert.deepEqual(parseSpecValue('-7'), { int_value: '-7' });
  assert.deepEqual(parseSpecValue('9223372036854775807'), { int_value: '9223372036854775807' });
  assert.deepEqual(parseSpecValue('1.5'), { double_value: 1.5 });
  assert.deepEqual(parseSpecValue('2.'), { double_value: 2 });
  assert.deepEqual(parseSpecValue('.25'), { double_value: 0.25 });
  assert.deepEqual(parseSpecValue('1e-3'), { double_value: 0.001 });
  assert.deepEqual(parseSpecValue('True'), { bool_value: true });
  assert.deepEqual(parseSpecValue('FALSE'), { bool_value: false });
  assert.deepEqual(parseSpecValue('-inf'), { double_value: -Infinity });
  assert.ok(Number.isNaN(parseSpecValue('nan').double_value));
  assert.deepEqual(parseSpecValue('LinearConfig,ConvConfig'), {
    string_value: 'LinearConfig,ConvConfig',
  });
  assert.deepEqual(parseSpecValue(''), { string_value: '' });
  assert.deepEqual(parseSpecValue('1.2.3'), { string_value: '1.2.3' });
  assert.deepEqual(parseSpecValue('str:8'), { string_value: '8' });
  assert.throws(() => parseSpecValue('9223372036854775808'), ClientError);
});

test('spec entries keep order and refuse bad syntax', () => {
  assert.deepEqual(parseSpec(['b=1', 'a=x=y']), [
    { key: 'b', value: { int_value: '1' } },
    { key: 'a', value: { string_value: 'x=y' } },
  ]);
  assert.throws(() => parseSpec(['novalue']), (e) => e.exitCode === 2);
  assert.throws(() => parseSpec(['=1']), (e) => e.exitCode === 2);
  assert.throws(() => parseSpec(['a=1', 'a=2']), (e) => e.exitCode === 2);
});

test('digest: lowercase hex SHA-256 and size', () => {
  assert.deepEqual(digestOf(Buffer.alloc(0)), {
    hash: 'e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855',
    size_bytes: 0,
  });
});

test('the .proto loads and has every RPC', () => {
  const S = serviceConstructor();
  for (const m of ['ListPartitioners', 'FindMissingBlobs', 'UploadBlobs', 'ReadBlobs',
    'Partition', 'OpsToNotDecompose', 'TransformForPreDecomposition', 'Lower']) {
    assert.ok(S.service[m], m);
  }
  assert.equal(S.service.Lower.responseStream, true);
  assert.equal(S.service.UploadBlobs.requestStream, true);
});

test('status details: ErrorInfo, RetryInfo and BadRequest are decoded', () => {
  // Build the trailer with the same local .proto copies the client reads.
  const { Status, ErrorInfo, RetryInfo, BadRequest } = (() => {
    const r = new protobuf.Root();
    r.resolvePath = (_o, t) => (t.startsWith('google/protobuf/')
      ? t : fileURLToPath(new URL(`../proto/${t}`, import.meta.url)));
    r.loadSync(['google/rpc/status.proto', 'google/rpc/error_details.proto'], { keepCase: true });
    return {
      Status: r.lookupType('google.rpc.Status'),
      ErrorInfo: r.lookupType('google.rpc.ErrorInfo'),
      RetryInfo: r.lookupType('google.rpc.RetryInfo'),
      BadRequest: r.lookupType('google.rpc.BadRequest'),
    };
  })();
  const any = (T, obj) => ({
    type_url: `type.googleapis.com/${T.fullName.slice(1)}`,
    value: T.encode(T.fromObject(obj)).finish(),
  });
  const status = Status.encode(Status.fromObject({
    code: 8,
    message: 'too many calls',
    details: [
      any(ErrorInfo, { reason: 'OVERLOADED', domain: 'remote-partitioner', metadata: { a: 'b' } }),
      any(RetryInfo, { retry_delay: { seconds: 1, nanos: 500_000_000 } }),
      any(BadRequest, { field_violations: [{ field: 'f', description: 'd' }] }),
    ],
  })).finish();
  const md = new grpc.Metadata();
  md.set('grpc-status-details-bin', Buffer.from(status));
  const info = describeError({ code: 8, details: 'too many calls', metadata: md });
  assert.equal(info.code_name, 'RESOURCE_EXHAUSTED');
  assert.equal(info.reason, 'OVERLOADED');
  assert.equal(info.domain, 'remote-partitioner');
  assert.deepEqual(info.metadata, { a: 'b' });
  assert.equal(info.retry_delay_seconds, 1.5);
  assert.deepEqual(info.field_violations, [{ field: 'f', description: 'd' }]);

  const bare = describeError({ code: 14, details: 'down', metadata: new grpc.Metadata() });
  assert.equal(bare.code_name, 'UNAVAILABLE');
  assert.equal(bare.reason, null);
});

test('reportToJson: defaults left out as MessageToDict does, int64 as numbers, .proto order', () => {
  const report = {
    methods: [{
      cpu_ops: [], method: 'forward', total_nodes: 12,
      delegated: [{ nodes: 5, backend_id: 'XnnpackBackend', partitions: 2 }],
    }, { method: 'empty', total_nodes: 0, delegated: [], cpu_ops: [] }],
  };
  const json = reportToJson(report);
  assert.deepEqual(json, {
    methods: [
      { method: 'forward', total_nodes: 12,
        delegated: [{ backend_id: 'XnnpackBackend', partitions: 2, nodes: 5 }] },
      { method: 'empty' },
    ],
  });
  assert.deepEqual(Object.keys(json.methods[0]), ['method', 'total_nodes', 'delegated']);
  assert.deepEqual(Object.keys(json.methods[0].delegated[0]), ['backend_id', 'partitions', 'nodes']);
  assert.deepEqual(reportToJson(null), { methods: [] });
});

test('cpuNodes: the call_function nodes no backend took, in order', () => {
  const method = {
    nodes: [
      { name: 'x', op: 'placeholder', kind: 'placeholder', backend_id: '', reason: '' },
      { name: 'a', op: 'aten.add.Tensor', kind: 'call_function', backend_id: 'B', reason: '' },
      { name: 'c', op: 'aten.cumsum.default', kind: 'call_function', backend_id: '', reason: 'why' },
    ],
  };
  assert.deepEqual(cpuNodes(method), [{ name: 'c', op: 'aten.cumsum.default', reason: 'why' }]);
  assert.deepEqual(cpuNodes({}), []);
});

/** A zip file of `names` (stored, not compressed), as Python's zipfile would write it. */
function zipOf(names) {
  const locals = [];
  const centrals = [];
  let offset = 0;
  for (const name of names) {
    const n = Buffer.from(name);
    const data = Buffer.from('x');
    const local = Buffer.alloc(30);
    local.writeUInt32LE(0x04034b50, 0);
    local.writeUInt32LE(data.length, 18);
    local.writeUInt32LE(data.length, 22);
    local.writeUInt16LE(n.length, 26);
    const central = Buffer.alloc(46);
    central.writeUInt32LE(0x02014b50, 0);
    central.writeUInt32LE(data.length, 20);
    central.writeUInt32LE(data.length, 24);
    central.writeUInt16LE(n.length, 28);
    central.writeUInt32LE(offset, 42);
    locals.push(local, n, data);
    centrals.push(central, n);
    offset += 30 + n.length + data.length;
  }
  const cd = Buffer.concat(centrals);
  const end = Buffer.alloc(22);
  end.writeUInt32LE(0x06054b50, 0);
  end.writeUInt16LE(names.length, 8);
  end.writeUInt16LE(names.length, 10);
  end.writeUInt32LE(cd.length, 12);
  end.writeUInt32LE(offset, 16);
  return Buffer.concat([...locals, cd, end]);
}

test('checkArchive: a PT2 archive passes; not a zip, truncated, damaged or no archive_format fail', () => {
  const good = zipOf(['m/archive_format', 'm/models/model.json']);
  assert.deepEqual(zipEntries(good).map((e) => e.name), ['m/archive_format', 'm/models/model.json']);
  checkArchive('good.pt2', good);
  const refused = (data, words) => assert.throws(() => checkArchive('f.pt2', data),
    (e) => e instanceof ClientError && e.exitCode === 2 && e.message.includes(words), words);
  refused(Buffer.from('hello\n'), 'f.pt2 is not a PT2 archive');
  refused(Buffer.alloc(0), 'f.pt2 is not a PT2 archive');
  refused(good.subarray(0, good.length - 30), 'f.pt2 is not a PT2 archive');
  refused(zipOf(['a/b']), 'no archive_format entry');
  // The directory intact, the start of the file gone: no entry where the directory says.
  refused(good.subarray(40), 'is damaged');
});

test('reportTitle: the model and the partitioners, else the backends, never a file name', () => {
  const methods = [{
    delegated: [{ backend_id: 'XnnpackBackend' }],
    partitions: [{ backend_id: 'VulkanBackend' }],
    nodes: [{ backend_id: 'AcmeBackend' }, { backend_id: '' }, { name: 'x' }],
  }];
  assert.equal(reportTitle({ model: 'dir/sub\\model.pt2', partitioners: ['xnnpack', 'vulkan'], methods }),
    'Delegation report: model.pt2 (xnnpack, vulkan)');
  // Partitioners as objects (by name); empty names left out.
  assert.equal(reportTitle({ model: 'm.pt2', partitioners: [{ name: 'xnnpack' }, ''], methods: [] }),
    'Delegation report: m.pt2 (xnnpack)');
  // No partitioners: the backends the methods name, sorted.
  assert.equal(reportTitle({ model: 'm.pt2', methods }),
    'Delegation report: m.pt2 (AcmeBackend, VulkanBackend, XnnpackBackend)');
  assert.equal(reportTitle({ partitioners: [], methods }),
    'Delegation report (AcmeBackend, VulkanBackend, XnnpackBackend)');
  assert.equal(reportTitle({ model: 42, methods: [] }), 'Delegation report');
  assert.equal(reportTitle({ methods: [] }), 'Delegation report');
});

test('backendColour: fixed for the known backends, a stable palette pick for the others', () => {
  assert.equal(backendColour('XnnpackBackend'), '#2f7ed8');
  assert.equal(backendColour('VulkanBackend'), BACKEND_COLOURS.VulkanBackend);
  const other = backendColour('AcmeBackend');
  assert.match(other, /^#[0-9a-f]{6}$/);
  assert.equal(backendColour('AcmeBackend'), other);
  assert.ok(!Object.values(BACKEND_COLOURS).includes(other));
  assert.equal(backendColour('toString'), backendColour('toString')); // not Object.prototype's
  assert.match(backendColour('toString'), /^#[0-9a-f]{6}$/);
});

test('renderHtml: the CSP allows exactly the inlined scripts, by hash; data cannot close its script', () => {
  const evil = '</script><script>alert(1)</script> & {{TITLE}}';
  const report = {
    model: 'm.pt2', partitioners: ['xnnpack'],
    methods: [{ method: 'forward', total_nodes: 2, nodes: [{ name: evil, backend_id: 'AcmeBackend' }] }],
  };
  const page = renderHtml(report);
  const csp = page.match(/<meta http-equiv="Content-Security-Policy" content="([^"]*)">/)[1];
  assert.ok(csp.startsWith('default-src &#x27;none&#x27;; '), csp);
  const allowed = [...csp.matchAll(/&#x27;(sha256-[A-Za-z0-9+/=]+)&#x27;/g)].map((m) => m[1]);
  const scripts = [...page.matchAll(/<script>([\s\S]*?)<\/script>/g)].map((m) => m[1]);
  assert.equal(scripts.length, 2);
  assert.deepEqual(allowed, scripts.map((s) => `sha256-${createHash('sha256').update(s).digest('base64')}`));
  assert.ok(!scripts[0].includes('sourceMappingURL'));
  // The title, escaped; the report's strings only inside the JSON data, which parses back.
  assert.ok(page.includes('<title>Delegation report: m.pt2 (xnnpack)</title>'));
  assert.equal(page.split('</script>').length - 1, 3);
  const data = JSON.parse(page.match(/<script type="application\/json" id="report-data">(.*?)<\/script>/s)[1]);
  assert.deepEqual(data, {
    title: 'Delegation report: m.pt2 (xnnpack)', report,
    colours: { AcmeBackend: backendColour('AcmeBackend') },
  });
  // An explicit title, even an empty one, replaces the report's.
  assert.ok(renderHtml(report, { title: '<T> "q"' }).includes('<title>&lt;T&gt; &quot;q&quot;</title>'));
  assert.ok(renderHtml(report, { title: '' }).includes('<title></title>'));
  assert.throws(() => renderHtml({ methods: {} }), TypeError);
});

test('DigestCache: known once settled, forgotten when changed, shared with Python', async () => {
  const fs = await import('node:fs');
  const os = await import('node:os');
  const path = await import('node:path');
  const { setTimeout: sleep } = await import('node:timers/promises');
  const { DigestCache, RACY_NS } = await import('../lib/digest-cache.js');
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'digest-cache-'));
  try {
    const cache = new DigestCache(path.join(dir, 'cache'));
    const file = path.join(dir, 'model.pt2');
    const settled = async () => {
      const st = fs.statSync(file, { bigint: true });
      const t = st.mtimeNs > st.ctimeNs ? st.mtimeNs : st.ctimeNs;
      while (BigInt(Date.now()) * 1_000_000n <= t + 2n * RACY_NS) await sleep(10);
    };
    fs.writeFileSync(file, 'archive one');
    assert.equal(cache.lookup(file), null); // no entry
    const digest = digestOf(fs.readFileSync(file));
    cache.recordRead(file, cache.statusOf(file), digest);
    assert.equal(cache.lookup(file), null); // racy: recorded in the tick it was written in
    await settled();
    cache.recordRead(file, cache.statusOf(file), digest);
    assert.deepEqual(cache.lookup(file), digest);
    // The entry holds the integers as decimal strings (as the Python client writes them).
    const [name] = fs.readdirSync(path.join(dir, 'cache'));
    const entry = JSON.parse(fs.readFileSync(path.join(dir, 'cache', name), 'utf8'));
    assert.equal(name, createHash('sha256').update(fs.realpathSync(file)).digest('hex'));
    for (const f of ['dev', 'ino', 'size', 'mtime_ns', 'ctime_ns', 'recorded_ns']) {
      assert.match(entry[f], /^\d+$/);
    }
    const fd = fs.openSync(file, 'r+'); // changed in place, the same size
    fs.writeSync(fd, 'A', 0);
    fs.closeSync(fd);
    assert.equal(cache.lookup(file), null);
    // A file this process wrote is known at once, through a link too.
    const out = path.join(dir, 'out.pte');
    fs.writeFileSync(out, 'a program');
    await cache.recordWritten(out, digestOf(Buffer.from('a program')));
    fs.symlinkSync(out, path.join(dir, 'link.pte'));
    assert.deepEqual(cache.lookup(path.join(dir, 'link.pte')), digestOf(Buffer.from('a program')));
    fs.writeFileSync(path.join(dir, 'cache', name), '{not json');
    assert.equal(cache.lookup(file), null);
    assert.equal(cache.lookup(dir), null); // not a regular file
    assert.equal(DigestCache.fromEnvironment({ REMOTE_PARTITIONER_DIGEST_CACHE: 'off' }), null);
    assert.equal(DigestCache.fromEnvironment({ XDG_CACHE_HOME: '/x' }).directory,
      path.join('/x', 'remote-partitioner', 'digests'));
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
});

// Unit tests of the parts that need no server: `node --test client/node/test` (or `npm test`).

import assert from 'node:assert/strict';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

import grpc from '@grpc/grpc-js';
import protobuf from 'protobufjs';

import {
  ClientError, digestOf, parseSpec, parseSpecValue, reportToJson, serviceConstructor,
} from '../lib/client.js';
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

test('reportToJson: the shape of MessageToDict (defaults left out, int64 as strings)', () => {
  const report = {
    methods: [{
      method: 'forward', total_nodes: 12, cpu_ops: [],
      delegated: [{ backend_id: 'XnnpackBackend', partitions: 2, nodes: 5 }],
    }, { method: 'empty', total_nodes: 0, delegated: [], cpu_ops: [] }],
  };
  assert.deepEqual(reportToJson(report), {
    methods: [
      { method: 'forward', total_nodes: '12',
        delegated: [{ backend_id: 'XnnpackBackend', partitions: '2', nodes: '5' }] },
      { method: 'empty' },
    ],
  });
  assert.deepEqual(reportToJson(null), {});
});

#!/usr/bin/env node
// remote-partitioner (Node.js): list the partitioners a server hosts, or lower a PT2 archive to a
// .pte on the server. Exit codes: 0 ok, 1 error (the server refused, or a local failure after
// the arguments were accepted), 2 usage error, 3 server unreachable (UNAVAILABLE).

import fs from 'node:fs';
import { parseArgs } from 'node:util';

import {
  ClientError,
  RemotePartitionerClient,
  RpcError,
  parseSpec,
  readToken,
  reportToJson,
  specValueToJs,
} from '../lib/client.js';

const USAGE = `usage:
  remote-partitioner list  --target HOST:PORT [common options]
  remote-partitioner lower MODEL.pt2 -o OUT.pte --partitioner NAME [--spec KEY=VALUE ...]
                           [--partitioner NAME [--spec KEY=VALUE ...] ...]
                           [--report-only] [--skip-ir-validity-check]
                           [--report-json REPORT.json] --target HOST:PORT [common options]

common options:
  --target HOST:PORT     the server (any gRPC target: host:port, dns:///name:port, ...)
  --token-file FILE      send "authorization: Bearer <token>", the file's first token line
  --tls                  connect with TLS, trusting the system's root certificates
  --tls-ca PEM           connect with TLS, trusting these root certificates
  --tls-cert PEM         client certificate chain (mutual TLS; with --tls-key)
  --tls-key PEM          client private key (mutual TLS)
  --timeout SECONDS      deadline of each call (default: none)
  --request-id ID        x-request-id sent with every call (default: a fresh one)
  --json                 print JSON on stdout (errors too)
  -h, --help             this text

--report-json FILE writes the delegation report as JSON (the shape Python's MessageToDict
gives); \`remote-partitioner report FILE -o report.html\` (Python CLI) turns it into the page.

--spec KEY=VALUE belongs to the --partitioner before it (with one --partitioner, to it). VALUE
"true"/"false" (any case) is a bool, an integer an int, a number with "." or an exponent (or
inf, nan) a float, anything else a string; "str:TEXT" is always the string TEXT.

exit codes: 0 ok, 1 error (server refusal or local failure), 2 usage error,
            3 server unreachable (UNAVAILABLE)`;

const COMMON = {
  target: { type: 'string' },
  'token-file': { type: 'string' },
  tls: { type: 'boolean' },
  'tls-ca': { type: 'string' },
  'tls-cert': { type: 'string' },
  'tls-key': { type: 'string' },
  timeout: { type: 'string' },
  'request-id': { type: 'string' },
  json: { type: 'boolean' },
  help: { type: 'boolean', short: 'h' },
};

const LOWER = {
  ...COMMON,
  output: { type: 'string', short: 'o' },
  partitioner: { type: 'string', multiple: true },
  spec: { type: 'string', multiple: true },
  'report-only': { type: 'boolean' },
  'skip-ir-validity-check': { type: 'boolean' },
  'report-json': { type: 'string' },
};

const usage = (message) => new ClientError(message, 2);

function parse(argv, options) {
  try {
    return parseArgs({ args: argv, options, allowPositionals: true, strict: true, tokens: true });
  } catch (e) {
    throw usage(e.message);
  }
}

function connect(values) {
  if (!values.target) throw usage('--target HOST:PORT is required');
  let timeoutSeconds = null;
  if (values.timeout !== undefined) {
    timeoutSeconds = Number(values.timeout);
    if (!(timeoutSeconds > 0)) throw usage(`--timeout wants a positive number of seconds`);
  }
  const pem = (option) => {
    if (!values[option]) return null;
    try {
      return fs.readFileSync(values[option]);
    } catch (e) {
      throw usage(`cannot read --${option}: ${e.message}`);
    }
  };
  const [ca, cert, key] = [pem('tls-ca'), pem('tls-cert'), pem('tls-key')];
  if ((cert === null) !== (key === null)) throw usage('--tls-cert and --tls-key go together');
  const requestId = values['request-id'];
  if (requestId !== undefined && !/^[A-Za-z0-9._-]{1,64}$/.test(requestId)) {
    throw usage('--request-id wants 1 to 64 characters of [A-Za-z0-9._-]');
  }
  const token = values['token-file'] ? readToken(values['token-file']) : null;
  try {
    return new RemotePartitionerClient(values.target, {
      token, tls: Boolean(values.tls), ca, cert, key, timeoutSeconds, requestId,
    });
  } catch (e) {
    throw usage(`bad --target ${JSON.stringify(values.target)}: ${e.message}`);
  }
}

// ------------------------------------------------------------------------------------ list

function partitionerJson(p) {
  return {
    name: p.name,
    backend_id: p.backend_id,
    class_name: p.class_name,
    description: p.description,
    backend_module: p.backend_module,
    overridden_hooks: p.overridden_hooks,
    spec_keys: p.spec_keys.map((k) => ({
      name: k.name,
      type: k.type,
      default: specValueToJs(k.default),
      doc: k.doc,
    })),
  };
}

const TYPE_NAMES = {
  SPEC_TYPE_BOOL: 'bool',
  SPEC_TYPE_INT: 'int',
  SPEC_TYPE_DOUBLE: 'float',
  SPEC_TYPE_STRING: 'str',
  SPEC_TYPE_BYTES: 'bytes',
};

async function list(argv) {
  const { values, positionals } = parse(argv, COMMON);
  if (values.help) return help();
  if (positionals.length > 0) throw usage(`list takes no arguments: ${positionals.join(' ')}`);
  const client = connect(values);
  try {
    const r = await client.listPartitioners();
    const partitioners = r.partitioners.map(partitionerJson);
    if (values.json) {
      print(JSON.stringify({ partitioners, versions: r.versions }, null, 2));
      return 0;
    }
    const v = r.versions;
    print(`server ${v.server} (api ${v.api}): torch ${v.torch}, executorch ${v.executorch}, ` +
      `export schema ${v.export_schema}`);
    for (const p of partitioners) {
      print(`\n${p.name}  ${p.backend_id}  ${p.class_name}`);
      if (p.description) print(`  ${p.description}`);
      const hooks = p.overridden_hooks.map((h) => h.replace(/^HOOK_/, '').toLowerCase());
      print(`  hooks: ${hooks.join(', ') || '-'}`);
      if (p.spec_keys.length === 0) {
        print('  spec keys: none');
        continue;
      }
      print('  spec keys:');
      for (const k of p.spec_keys) {
        const def = k.default === null ? '' : ` = ${JSON.stringify(k.default)}`;
        print(`    ${k.name}: ${TYPE_NAMES[k.type] ?? k.type}${def}${k.doc ? `  -- ${k.doc}` : ''}`);
      }
    }
    return 0;
  } finally {
    client.close();
  }
}

// ----------------------------------------------------------------------------------- lower

/** PartitionerRefs from the ordered --partitioner / --spec tokens. */
function partitionerRefs(tokens) {
  const refs = [];
  const pending = []; // --spec given before any --partitioner
  for (const t of tokens) {
    if (t.kind !== 'option') continue;
    if (t.name === 'partitioner') {
      if (!t.value) throw usage('--partitioner wants a name');
      refs.push({ name: t.value, spec: [] });
    } else if (t.name === 'spec') {
      (refs.length > 0 ? refs[refs.length - 1].spec : pending).push(t.value);
    }
  }
  if (refs.length === 0) throw usage('--partitioner NAME is required');
  if (pending.length > 0) {
    if (refs.length > 1) throw usage('with several --partitioner, put each --spec after its own');
    refs[0].spec.unshift(...pending);
  }
  return refs.map((r) => ({ name: r.name, spec: parseSpec(r.spec) }));
}

/** The report as JSON, fields in the .proto's order. */
function reportJson(report) {
  return {
    methods: (report?.methods ?? []).map((m) => ({
      method: m.method,
      total_nodes: m.total_nodes,
      delegated: m.delegated.map((d) => ({
        backend_id: d.backend_id, partitions: d.partitions, nodes: d.nodes,
      })),
      cpu_ops: m.cpu_ops.map((o) => ({ op: o.op, count: o.count })),
    })),
  };
}

function printReport(report) {
  for (const m of report?.methods ?? []) {
    const delegated = m.delegated.reduce((n, d) => n + Number(d.nodes), 0);
    print(`method ${m.method}: ${m.total_nodes} operator nodes, ${delegated} delegated`);
    for (const d of m.delegated) {
      print(`  ${d.backend_id}: ${d.partitions} partition(s), ${d.nodes} node(s)`);
    }
    if (m.cpu_ops.length === 0) {
      print('  on CPU: none');
    } else {
      print('  on CPU:');
      for (const op of m.cpu_ops) print(`    ${op.op} x${op.count}`);
    }
  }
}

async function lower(argv) {
  const { values, positionals, tokens } = parse(argv, LOWER);
  if (values.help) return help();
  if (positionals.length !== 1) throw usage('lower takes one MODEL.pt2 argument');
  const reportOnly = Boolean(values['report-only']);
  if (!values.output && !reportOnly) throw usage('-o OUT.pte is required (or --report-only)');
  const partitioners = partitionerRefs(tokens);
  const [model] = positionals;
  let archive;
  try {
    archive = fs.readFileSync(model);
  } catch (e) {
    throw usage(`cannot read ${JSON.stringify(model)}: ${e.message}`);
  }
  const client = connect(values);
  try {
    const { report, pte } = await client.lower(
      archive, partitioners, reportOnly ? null : values.output, {
        report_only: reportOnly,
        skip_ir_validity_check: Boolean(values['skip-ir-validity-check']),
      },
    );
    if (values['report-json']) {
      try {
        fs.writeFileSync(values['report-json'], `${JSON.stringify(reportToJson(report), null, 2)}\n`);
      } catch (e) {
        throw new ClientError(`cannot write --report-json: ${e.message}`, 1);
      }
    }
    if (values.json) {
      print(JSON.stringify({
        output: pte ? values.output : null,
        pte,
        report: reportJson(report),
        uploaded: { blobs: client.stats.blobs_uploaded, bytes: client.stats.bytes_uploaded },
        request_id: client.requestId,
      }, null, 2));
      return 0;
    }
    printReport(report);
    if (pte) print(`wrote ${values.output} (${pte.size_bytes} bytes, sha256 ${pte.hash})`);
    return 0;
  } finally {
    client.close();
  }
}

// ------------------------------------------------------------------------------------ main

function print(line) {
  process.stdout.write(`${line}\n`);
}

function help() {
  print(USAGE);
  return 0;
}

function reportError(e, json) {
  if (e instanceof RpcError) {
    const i = e.info;
    if (json) {
      print(JSON.stringify({ error: i }, null, 2));
    } else {
      const lines = [`error: ${i.code_name} (${i.code}): ${i.message}`];
      if (i.reason) lines.push(`  reason: ${i.reason}${i.domain ? ` (${i.domain})` : ''}`);
      for (const [k, v] of Object.entries(i.metadata)) {
        if (k === 'traceback' || v === '') continue;
        lines.push(`  ${k}: ${v}`);
      }
      for (const f of i.field_violations) lines.push(`  field ${f.field}: ${f.description}`);
      if (i.retry_delay_seconds !== null) lines.push(`  retry after: ${i.retry_delay_seconds}s`);
      if (i.request_id) lines.push(`  request id: ${i.request_id}`);
      if (i.details_error) lines.push(`  (${i.details_error})`);
      if (i.metadata.traceback) lines.push('  server traceback:', i.metadata.traceback.trimEnd());
      process.stderr.write(`${lines.join('\n')}\n`);
    }
    return i.code_name === 'UNAVAILABLE' ? 3 : 1;
  }
  const code = e instanceof ClientError ? e.exitCode : 1;
  const message = e instanceof Error ? e.message : String(e);
  if (json) {
    print(JSON.stringify({ error: { code_name: code === 2 ? 'USAGE' : 'CLIENT', message } }));
  } else {
    process.stderr.write(`error: ${message}\n`);
    if (code === 2) process.stderr.write('(remote-partitioner --help for usage)\n');
  }
  return code;
}

async function main(argv) {
  const [command, ...rest] = argv;
  const json = rest.includes('--json');
  try {
    switch (command) {
      case 'list':
        return await list(rest);
      case 'lower':
        return await lower(rest);
      case '-h':
      case '--help':
      case 'help':
        return help();
      case undefined:
        throw usage('a command is required: list or lower');
      default:
        throw usage(`unknown command ${JSON.stringify(command)}: list or lower`);
    }
  } catch (e) {
    return reportError(e, json);
  }
}

process.exitCode = await main(process.argv.slice(2));

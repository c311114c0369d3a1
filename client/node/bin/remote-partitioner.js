#!/usr/bin/env node
// remote-partitioner (Node.js): the client commands of the Python `remote-partitioner` command
// line (list, partition, lower, report), with the same options, defaults, spec syntax, text
// output, --json schema and exit codes; its reference is docs/cli.md at the repository's root.
// Not here: `serve` (the server is Python). The HTML page (`report`, `--report`) is
// lib/report-page.js's, the same bytes as the Python CLI's.
//
// Exit codes: 0 ok; 1 the server refused, the partitioner raised, no answer within --timeout, or
// a local failure after the upload began; 2 usage error (found before anything is uploaded);
// 3 the server could not be reached. A closed stdout (`list | head -2`) ends quietly with 1.

import fs from 'node:fs';
import { createRequire } from 'node:module';
import os from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';

import { checkArchive } from '../lib/archive.js';
import {
  ClientError,
  RemotePartitionerClient,
  RpcError,
  cpuNodes,
  digestOf,
  listToJson,
  parseSpec,
  readToken,
  reportToJson,
} from '../lib/client.js';
import { DigestCache } from '../lib/digest-cache.js';
import { writeReport } from '../lib/report-page.js';
import { DOMAIN } from '../lib/status.js';

/** Where `serve` listens by default, and so where the commands call unless --target says. */
export const DEFAULT_TARGET = '127.0.0.1:50051';
const REQUEST_ID = /^[A-Za-z0-9._-]{1,64}$/;
// A target that is a plain HOST:PORT ([V6]:PORT too), what `serve --address` takes.
const HOST_PORT = /^(\[[0-9A-Fa-f:.]+\]|[^\s/:,[\]]+):\d+$/;
const COMMANDS = ['list', 'partition', 'lower', 'report'];

const COMMON_HELP = `common options:
  --target TARGET         the server: any gRPC target (host:port, dns:///name:port, ...)
                          (default: ${DEFAULT_TARGET})
  --token-file FILE       send 'authorization: Bearer <token>', the file's first line that
                          is neither blank nor a # comment
  --tls                   connect with TLS, trusting the system's root certificates
  --tls-ca PEM            connect with TLS, trusting these root certificates
  --tls-cert PEM          client certificate chain (mutual TLS; with --tls-key)
  --tls-key PEM           client private key (mutual TLS)
  --timeout SECONDS       deadline of each call, in seconds (none: wait as long as it takes)
  --request-id ID         x-request-id sent with every call, 1 to 64 of [A-Za-z0-9._-]
                          (none: a fresh one)
  --json                  print the result as JSON on stdout, an error as JSON on stderr
  -h, --help              this text`;

const MODEL_HELP = `  MODEL.pt2               a PT2 archive written by torch.export.save
  --partitioner NAME      a hosted partitioner (see \`list\`); repeat for several, applied in
                          order (required)
  --spec KEY=VALUE        a spec entry of the --partitioner before it; repeatable. VALUE:
                          true/false a bool, 12 an int, 1.5 / 1e-3 / inf / nan a float,
                          str:TEXT the string TEXT, anything else a string
  --skip-ir-validity-check
                          do not verify the edge program's IR after lowering (ExecuTorch's
                          EdgeCompileConfig(_check_ir_validity=False)); for programs the
                          check refuses wrongly`;

const REPORT_HELP = `  --report REPORT.html    also write the delegation report as one self-contained HTML page
  --report-json REPORT.json
                          also write the delegation report as JSON (what \`report\` reads)`;

const HELP = {
  main: `usage: remote-partitioner [-h] [--version] {list,partition,lower,report} ...

The Node.js client of remote-partitioner: list, partition, lower; report turns a saved report
into its page. The command line's reference: docs/cli.md (the server, \`serve\`, is the Python
CLI's).

commands:
  list                    list the hosted partitioners and quantizers and the server's versions
  partition               report what the partitioners would delegate in a .pt2 archive
  lower                   lower a .pt2 archive into a .pte on the server
  report                  turn a delegation report's JSON into its HTML page, offline

options:
  -h, --help              this text
  --version               print this client's version (and node's, grpc-js'), exit`,
  list: `usage: remote-partitioner list [options]

List the partitioners and quantizers the server hosts, their spec keys, and the server's
torch / ExecuTorch versions.

${COMMON_HELP}`,
  partition: `usage: remote-partitioner partition MODEL.pt2 --partitioner NAME [--spec KEY=VALUE ...]
                                    [--partitioner NAME [--spec KEY=VALUE ...] ...] [options]

Report what the partitioners would delegate in a .pt2 archive.

${MODEL_HELP}
${REPORT_HELP}

${COMMON_HELP}`,
  lower: `usage: remote-partitioner lower MODEL.pt2 -o OUT.pte --partitioner NAME [--spec KEY=VALUE ...]
                                [--partitioner NAME [--spec KEY=VALUE ...] ...] [options]

Lower a .pt2 archive into a .pte on the server.

${MODEL_HELP}
  -o, --output OUT.pte    where to write the .pte (required unless --report-only)
  --report-only           only the delegation report, no .pte (the same as \`partition\`)
${REPORT_HELP}

${COMMON_HELP}`,
  report: `usage: remote-partitioner report [-h] -o REPORT.html [--title TITLE] REPORT.json

Turn a delegation report's JSON (--report-json, or the --json output of partition or lower, of
either client) into its self-contained HTML page. No server is involved.

  REPORT.json             the JSON that --report-json wrote or --json printed
  -o, --output REPORT.html
                          where to write the page (required)
  --title TITLE           the page's title (default: 'Delegation report: MODEL
                          (PARTITIONERS)' from the report's own model and partitioners)
  -h, --help              this text`,
};

const COMMON = {
  target: { type: 'string', default: DEFAULT_TARGET },
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

const PARTITION = {
  ...COMMON,
  partitioner: { type: 'string', multiple: true },
  spec: { type: 'string', multiple: true },
  'skip-ir-validity-check': { type: 'boolean' },
  report: { type: 'string' },
  'report-json': { type: 'string' },
};

const LOWER = {
  ...PARTITION,
  output: { type: 'string', short: 'o' },
  'report-only': { type: 'boolean' },
};

const usage = (message) => new ClientError(message, 2);

/** A usage error argparse's top-level parser reports (`remote-partitioner: error: ...`). */
function unrecognized(args) {
  const error = usage(`unrecognized arguments: ${args.join(' ')}`);
  error.fromParser = true;
  error.topLevel = true;
  return error;
}

/** A failure as the command line reports it (the --json error object's fields). */
class Failure {
  constructor(message, { kind, exitCode, code = null, reason = null, detail = null }) {
    Object.assign(this, { message, kind, exitCode, code, reason, detail });
  }
}

function parse(argv, options) {
  try {
    return parseArgs({ args: argv, options, allowPositionals: true, strict: true, tokens: true });
  } catch (e) {
    const error = usage(e.message);
    error.fromParser = true; // argparse prints its usage line before such an error
    throw error;
  }
}

function connect(values) {
  let timeoutSeconds = null;
  if (values.timeout !== undefined) {
    timeoutSeconds = Number(values.timeout);
    if (!(timeoutSeconds > 0 && Number.isFinite(timeoutSeconds))) {
      throw usage(`argument --timeout: wants a positive number of seconds, got ` +
        `'${values.timeout}'`);
    }
  }
  const requestId = values['request-id'];
  if (requestId !== undefined && !REQUEST_ID.test(requestId)) {
    throw usage('--request-id wants 1 to 64 characters of [A-Za-z0-9._-]');
  }
  const pem = (option) => {
    if (!values[option]) return null;
    try {
      return fs.readFileSync(values[option]);
    } catch (e) {
      throw usage(`cannot read --${option} ${values[option]}: ${e.message}`);
    }
  };
  const [ca, cert, key] = [pem('tls-ca'), pem('tls-cert'), pem('tls-key')];
  if ((cert === null) !== (key === null)) throw usage('--tls-cert and --tls-key go together');
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

const TYPE_NAMES = {
  SPEC_TYPE_BOOL: 'bool',
  SPEC_TYPE_INT: 'int',
  SPEC_TYPE_DOUBLE: 'float',
  SPEC_TYPE_STRING: 'str',
  SPEC_TYPE_BYTES: 'bytes',
};

function formatDefault(k) {
  if (k.default === null) return '';
  const v = k.default;
  const text = k.type === 'SPEC_TYPE_DOUBLE' && typeof v === 'number' && Number.isInteger(v)
    ? v.toFixed(1) : JSON.stringify(v);
  return ` = ${text}`;
}

/** `list`'s text, line by line (as the Python CLI's list_lines). */
export function listLines(listing) {
  const versions = (v = {}) => `server ${v.server} (api ${v.api}): torch ${v.torch}, ` +
    `executorch ${v.executorch}, export schema ${v.export_schema}, ` +
    `python hash seed ${v.python_hash_seed || '?'}`;
  const where = (env) => (env ? `  [environment ${env}]` : '');
  const own = listing.environment ? `environment ${listing.environment}: ` : '';
  const lines = [own + versions(listing.versions ?? {})];
  for (const env of listing.environments ?? []) {
    lines.push(`environment ${env.name}: ` +
      (env.error ? `not available: ${env.error}` : versions(env.versions ?? {})));
  }
  for (const p of listing.partitioners) {
    lines.push('', `${p.name}  ${p.backend_id}  ${p.class_name}${where(p.environment)}`);
    if (p.description) lines.push(`  ${p.description}`);
    const hooks = p.overridden_hooks.map((h) => h.replace(/^HOOK_/, '').toLowerCase());
    lines.push(`  hooks: ${hooks.join(', ') || '-'}`);
    lines.push(...specKeyLines(p.spec_keys));
  }
  for (const q of listing.quantizers ?? []) {
    lines.push('', `quantizer ${q.name}  ${q.backend_id}  ${q.class_name}${where(q.environment)}`);
    if (q.description) lines.push(`  ${q.description}`);
    lines.push(...specKeyLines(q.spec_keys));
  }
  return lines;
}

function specKeyLines(keys) {
  if (keys.length === 0) return ['  spec keys: none'];
  const lines = ['  spec keys:'];
  for (const k of keys) {
    const doc = k.doc ? `  -- ${k.doc}` : '';
    lines.push(`    ${k.name}: ${TYPE_NAMES[k.type] ?? k.type}${formatDefault(k)}${doc}`);
  }
  return lines;
}

async function list(argv) {
  const { values, positionals } = parse(argv, COMMON);
  if (values.help) return help('list');
  if (positionals.length > 0) {
    throw unrecognized(positionals);
  }
  const client = connect(values);
  let listing;
  try {
    listing = listToJson(await client.listPartitioners());
  } finally {
    client.close();
  }
  if (values.json) print(JSON.stringify(listing, null, 2));
  else listLines(listing).forEach((line) => print(line));
  return 0;
}

// ------------------------------------------------------------------- partition and lower

/** [{name, spec}] from the ordered --partitioner / --spec tokens: each --spec belongs to the
 *  --partitioner before it. */
export function partitionerRefs(tokens) {
  const refs = [];
  for (const t of tokens) {
    if (t.kind !== 'option') continue;
    if (t.name === 'partitioner') {
      if (!t.value) throw usage('--partitioner wants a name');
      refs.push({ name: t.value, spec: [] });
    } else if (t.name === 'spec') {
      if (refs.length === 0) {
        throw usage(`--spec ${t.value} comes before any --partitioner: put each --spec after ` +
          'the --partitioner it belongs to');
      }
      refs[refs.length - 1].spec.push(t.value);
    }
  }
  if (refs.length === 0) throw usage('--partitioner NAME is required');
  return refs.map((r) => ({ name: r.name, spec: parseSpec(r.spec) }));
}

/** Refuses, before anything is sent, an output path that cannot be written. */
export function checkWritable(file, option) {
  let stat = null;
  try {
    stat = fs.statSync(file);
  } catch {
    stat = null;
  }
  if (stat?.isDirectory()) throw usage(`${option} ${file} is a directory; give a file path`);
  const parent = path.dirname(path.normalize(file));
  let parentStat = null;
  try {
    parentStat = fs.statSync(parent);
  } catch {
    parentStat = null;
  }
  if (!parentStat?.isDirectory()) {
    throw usage(`${option} ${file}: the directory ${parent} does not exist; create it first or ` +
      'choose another path');
  }
  try {
    fs.accessSync(parent, fs.constants.W_OK | fs.constants.X_OK);
    if (stat !== null) fs.accessSync(file, fs.constants.W_OK);
  } catch {
    throw usage(`${option} ${file} cannot be written (no permission)`);
  }
}

/** The C library's words for the errors reading a file gives (what Python prints). */
const STRERROR = {
  ENOENT: 'No such file or directory',
  EACCES: 'Permission denied',
  EISDIR: 'Is a directory',
  ENOTDIR: 'Not a directory',
};

const GETITEM = '_operator.getitem';
const NAMES_SHOWN = 3;
const plural = (n, word) => `${n} ${word}${n === 1 ? '' : 's'}`;

function cpuNodesByOp(nodes) {
  const groups = new Map();
  for (const n of nodes) {
    if (n.op === GETITEM) continue;
    if (!groups.has(n.op)) groups.set(n.op, []);
    groups.get(n.op).push([n.name, n.reason]);
  }
  return [...groups.entries()].sort((a, b) => (b[1].length - a[1].length)
    || (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
}

/** The text report, line by line (as the Python CLI's report_lines). */
export function reportLines(saved) {
  const lines = [];
  for (const m of saved.methods) {
    const delegated = (m.delegated ?? []).reduce((n, d) => n + (d.nodes ?? 0), 0);
    lines.push(`method ${m.method ?? ''}: ${plural(m.total_nodes ?? 0, 'node')}, ${delegated} delegated`);
    for (const d of m.delegated ?? []) {
      lines.push(`  ${d.backend_id ?? ''}: ${plural(d.nodes ?? 0, 'node')} in ` +
        `${plural(d.partitions ?? 0, 'partition')}`);
    }
    if ((m.cpu_ops ?? []).length > 0) {
      lines.push('  left on the CPU:');
      for (const op of m.cpu_ops) lines.push(`    ${String(op.count ?? 0).padStart(5)}  ${op.op ?? ''}`);
    }
    const groups = cpuNodesByOp(m.cpu_nodes);
    if (groups.length > 0) lines.push('  why:');
    for (const [op, nodes] of groups) {
      const byReason = new Map();
      for (const [name, reason] of nodes) {
        if (!byReason.has(reason)) byReason.set(reason, []);
        byReason.get(reason).push(name);
      }
      for (const [reason, names] of byReason) {
        const more = names.length > NAMES_SHOWN ? ` +${names.length - NAMES_SHOWN} more` : '';
        lines.push(`    ${op}: ${reason} (${names.slice(0, NAMES_SHOWN).join(', ')}${more})`);
      }
    }
  }
  return lines;
}

async function partitionOrLower(command, argv) {
  const { values, positionals, tokens } = parse(argv, command === 'lower' ? LOWER : PARTITION);
  if (values.help) return help(command);
  if (positionals.length === 0) throw usage('the following arguments are required: MODEL.pt2');
  if (positionals.length > 1) throw unrecognized(positionals.slice(1));
  const reportOnly = command === 'partition' || Boolean(values['report-only']);
  const partitioners = partitionerRefs(tokens);
  if (!reportOnly) {
    if (!values.output) throw usage('-o OUT.pte is required (or --report-only)');
    checkWritable(values.output, '-o');
  }
  if (values.report) checkWritable(values.report, '--report');
  if (values['report-json']) checkWritable(values['report-json'], '--report-json');
  const [model] = positionals;
  // Neither hash again an archive hashed before, nor download a .pte the output holds.
  const digests = DigestCache.fromEnvironment();
  const before = digests?.statusOf(model) ?? null;
  let archive;
  try {
    archive = fs.readFileSync(model);
  } catch (e) {
    throw usage(`cannot read ${model}: ${STRERROR[e.code] ?? e.message}`);
  }
  checkArchive(model, archive);
  let archiveDigest = digests?.lookup(model) ?? null;
  if (archiveDigest === null || archiveDigest.size_bytes !== archive.length) {
    archiveDigest = digestOf(archive);
    digests?.recordRead(model, before, archiveDigest);
  }
  let held = reportOnly ? null : digests?.lookup(values.output) ?? null;
  const client = connect(values);
  let answer;
  try {
    for (;;) {
      answer = await client.lower(archive, partitioners, reportOnly ? null : values.output, {
        report_only: reportOnly,
        skip_ir_validity_check: Boolean(values['skip-ir-validity-check']),
        archive_digest: archiveDigest,
        held_pte: held,
      });
      // Kept only if the output did not change while the call ran; else its bytes come.
      const still = answer.held ? digests.lookup(values.output) : null;
      if (!answer.held || (still !== null && still.hash === held.hash)) break;
      held = null;
    }
  } finally {
    client.close();
  }
  if (answer.pte && !answer.held) await digests?.recordWritten(values.output, answer.pte);
  const wire = reportToJson(answer.report);
  const received = answer.report?.methods ?? [];
  const saved = {
    model: path.basename(model),
    partitioners: partitioners.map((p) => p.name),
    methods: wire.methods.map((m, i) => ({ ...m, cpu_nodes: cpuNodes(received[i] ?? {}) })),
  };
  const output = answer.pte
    ? { path: values.output, bytes: answer.pte.size_bytes, sha256: answer.pte.hash } : null;
  if (values.report) writeReport(values.report, saved);
  if (values['report-json']) {
    fs.writeFileSync(values['report-json'], `${JSON.stringify(saved, null, 2)}\n`);
  }
  if (values.json) {
    print(JSON.stringify(output ? { ...saved, output } : saved, null, 2));
    return 0;
  }
  reportLines(saved).forEach((line) => print(line));
  if (output && answer.held) {
    print(`kept ${output.path} (${plural(output.bytes, 'byte')}, sha256 ${output.sha256}): it ` +
      'already held this .pte');
  } else if (output) {
    print(`wrote ${output.path} (${plural(output.bytes, 'byte')}, sha256 ${output.sha256})`);
  }
  if (values.report) print(`wrote ${values.report} (open it in a browser)`);
  if (values['report-json']) print(`wrote ${values['report-json']}`);
  return 0;
}

// ---------------------------------------------------------------------------------- report

const REPORT_OPTIONS = { '-o': 'output', '--output': 'output', '--title': 'title' };
const ARGPARSE_NAMES = { output: '-o/--output', title: '--title' };

/** `report`'s arguments as argparse reads them: {help, file, output, title, extra}. */
export function reportArgs(argv) {
  const args = { help: false, file: undefined, output: undefined, title: undefined, extra: [] };
  const positional = (a) => {
    if (args.file === undefined) args.file = a;
    else args.extra.push(a);
  };
  for (let i = 0; i < argv.length; i += 1) {
    const a = argv[i];
    if (a === '--') {
      argv.slice(i + 1).forEach(positional);
      break;
    }
    if (a === '-h' || a === '--help') {
      args.help = true;
      continue;
    }
    const [name, inline] = a.startsWith('--') ? a.split(/=(.*)/s) : [a.slice(0, 2), a.slice(2)];
    const dest = REPORT_OPTIONS[name];
    if (dest !== undefined) {
      let value = inline === '' && !a.startsWith('--') ? undefined : inline;
      if (value === undefined) {
        const next = argv[i + 1];
        if (next === undefined || (next.startsWith('-') && !/^-\d+$|^-\d*\.\d+$/.test(next))) {
          const error = usage(`argument ${ARGPARSE_NAMES[dest]}: expected one argument`);
          error.fromParser = true;
          throw error;
        }
        value = next;
        i += 1;
      }
      args[dest] = value;
    } else if (a.startsWith('-') && a !== '-') {
      args.extra.push(a);
    } else {
      positional(a);
    }
  }
  return args;
}

/** Python's repr() of a file name, as its OSError messages quote it. */
function pyRepr(text) {
  const quote = text.includes("'") && !text.includes('"') ? '"' : "'";
  const body = [...text].map((c) => {
    if (c === '\\' || c === quote) return `\\${c}`;
    const special = { '\n': '\\n', '\r': '\\r', '\t': '\\t' }[c];
    if (special) return special;
    const code = c.codePointAt(0);
    return code < 0x20 || code === 0x7f ? `\\x${code.toString(16).padStart(2, '0')}` : c;
  }).join('');
  return `${quote}${body}${quote}`;
}

/** The report JSON at `file`, refused as the Python CLI refuses it (usage errors). */
function readReportJson(file) {
  let text;
  try {
    text = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true }).decode(fs.readFileSync(file));
  } catch (e) {
    if (e.code) {
      const errno = os.constants.errno[e.code];
      const words = STRERROR[e.code];
      if (errno !== undefined && words !== undefined) {
        throw usage(`cannot read ${file}: [Errno ${errno}] ${words}: ${pyRepr(file)}`);
      }
    }
    throw usage(`cannot read ${file}: ${e.message}`);
  }
  let saved;
  try {
    saved = JSON.parse(text);
  } catch (e) {
    throw usage(`cannot read ${file}: ${e.message}`);
  }
  const isObject = typeof saved === 'object' && saved !== null && !Array.isArray(saved);
  if (!isObject || !Array.isArray(Object.hasOwn(saved, 'methods') ? saved.methods : undefined)) {
    throw usage(`${file} holds no delegation report (no 'methods' list)`);
  }
  return saved;
}

/** `report`: the HTML page of a report saved as JSON; no server involved. */
function report(argv) {
  const args = reportArgs(argv);
  if (args.help) return help('report');
  const missing = [
    ...(args.file === undefined ? ['REPORT.json'] : []),
    ...(args.output === undefined ? ['-o/--output'] : []),
  ];
  if (missing.length > 0) {
    const error = usage(`the following arguments are required: ${missing.join(', ')}`);
    error.fromParser = true;
    throw error;
  }
  if (args.extra.length > 0) throw unrecognized(args.extra);
  checkWritable(args.output, '-o');
  const saved = readReportJson(args.file);
  writeReport(args.output, saved, { title: args.title }); // undefined: the report's own title
  print(`wrote ${args.output}`);
  return 0;
}

// ------------------------------------------------------------------------------------ main

function print(line) {
  process.stdout.write(`${line}\n`);
}

function help(command) {
  print(HELP[command]);
  return 0;
}

function version() {
  const require = createRequire(import.meta.url);
  const own = require('../package.json').version;
  const grpcJs = require('@grpc/grpc-js/package.json').version;
  print(`remote-partitioner ${own} (Node.js client; node ${process.versions.node}, ` +
    `@grpc/grpc-js ${grpcJs}; the server's torch and executorch: \`list\`)`);
  return 0;
}

/** What went wrong, in the command line's words (the same as the Python CLI's). */
function failure(e, values) {
  if (e instanceof RpcError) {
    const i = e.info;
    const reason = i.domain === DOMAIN ? i.reason : null;
    if (reason === 'PARTITIONER_RAISED') {
      const type = i.metadata.exception_type ?? 'Exception';
      const message = i.metadata.exception_message ?? i.message;
      return new Failure(`the partitioner raised ${message ? `${type}: ${message}` : type}`,
        { kind: 'partitioner', exitCode: 1, reason });
    }
    const code = i.code_name;
    if (code === 'UNAVAILABLE' && reason === null) {
      // `serve --address` takes HOST:PORT only: suggest it for such a target alone.
      const start = HOST_PORT.test(values.target)
        ? ` Start one with: remote-partitioner serve --address ${values.target}` : '';
      return new Failure(`cannot reach ${values.target}: is a server running there?${start}`,
        { kind: 'unreachable', exitCode: 3, code, detail: i.message });
    }
    if (code === 'DEADLINE_EXCEEDED' && reason === null && values.timeout) {
      return new Failure(`no answer within the --timeout of ${values.timeout} s (each call's ` +
        'deadline); give more, or leave --timeout out to wait as long as it takes',
      { kind: 'deadline', exitCode: 1, code, detail: i.message });
    }
    return new Failure(`the server refused: ${code}: ${i.message}${reason ? ` [${reason}]` : ''}`,
      { kind: 'server', exitCode: code === 'UNAVAILABLE' ? 3 : 1, code, reason });
  }
  if (e instanceof ClientError && e.exitCode === 2) {
    return new Failure(e.message, { kind: 'usage', exitCode: 2 });
  }
  return new Failure(e instanceof Error ? e.message : String(e), { kind: 'client', exitCode: 1 });
}

function printError(command, f, json) {
  if (json) {
    process.stderr.write(`${JSON.stringify({
      error: {
        exit_code: f.exitCode, kind: f.kind, code: f.code, reason: f.reason,
        message: f.message, detail: f.detail,
      },
    })}\n`);
    return;
  }
  process.stderr.write(`remote-partitioner${command ? ` ${command}` : ''}: error: ${f.message}\n`);
  if (f.detail) process.stderr.write(`  (gRPC: ${f.detail})\n`);
}

async function main(argv) {
  const [command, ...rest] = argv;
  const json = rest.includes('--json');
  // The values failure() needs, before (or without) a successful parse.
  const values = { target: DEFAULT_TARGET, timeout: undefined };
  for (let i = 0; i < rest.length; i += 1) {
    const [name, inline] = rest[i].split(/=(.*)/s);
    if (name === '--target' || name === '--timeout') {
      values[name.slice(2)] = inline !== undefined ? inline : rest[i + 1];
    }
  }
  try {
    switch (command) {
      case 'list':
        return await list(rest);
      case 'partition':
      case 'lower':
        return await partitionOrLower(command, rest);
      case 'report':
        return report(rest);
      case '-h':
      case '--help':
      case 'help':
        return help('main');
      case '--version':
        return version();
      case undefined:
        throw usage('the following arguments are required: command (list, partition, lower, ' +
          'report)');
      default:
        throw usage(`invalid choice: ${JSON.stringify(command)} (choose from list, partition, ` +
          'lower, report; serve is the Python CLI\'s)');
    }
  } catch (e) {
    const f = failure(e, values);
    const known = COMMANDS.includes(command) ? command : '';
    if (!json && (e.fromParser || !known) && f.kind === 'usage') {
      process.stderr.write(`usage: remote-partitioner ${known || '{list,partition,lower,report}'} ` +
        `... (remote-partitioner ${known ? `${known} ` : ''}--help)\n`);
    }
    printError(e.topLevel ? '' : known, f, json);
    return f.exitCode;
  }
}

// The reader of stdout went away (`list | head -2`): end quietly, as the Python CLI does.
process.stdout.on('error', (e) => {
  if (e.code === 'EPIPE') process.exit(1);
  throw e;
});

process.exitCode = await main(process.argv.slice(2));

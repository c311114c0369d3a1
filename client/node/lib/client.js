// A small client of remote_partitioner.v1.RemotePartitioner: content-addressed blob upload and
// the `Lower` call, over @grpc/grpc-js with the .proto loaded at run time.

import { createHash, randomUUID } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';

import grpc from '@grpc/grpc-js';
import protoLoader from '@grpc/proto-loader';
import protobuf from 'protobufjs';

import { describeError } from './status.js';

const HERE = path.dirname(fileURLToPath(import.meta.url));

/** The contract, read from the repository (relative to this package). */
export const PROTO_PATH = path.resolve(
  HERE, '..', '..', '..', 'proto', 'remote_partitioner', 'v1', 'remote_partitioner.proto',
);

/** Recommended upload chunk size: 1 MiB. */
export const CHUNK_BYTES = 1 << 20;

/** The server's message size bound (64 MiB) and its keepalive expectations: ping every 60 s
 *  at most once per 30 s, drop after 20 s without an answer (as the Python client does). */
export const CHANNEL_OPTIONS = Object.freeze({
  'grpc.max_receive_message_length': 64 << 20,
  'grpc.max_send_message_length': 64 << 20,
  'grpc.keepalive_time_ms': 60_000,
  'grpc.keepalive_timeout_ms': 20_000,
});

/** How many times a call refused with OVERLOADED + RetryInfo is retried, and the longest wait. */
export const MAX_RETRIES = 5;
export const MAX_RETRY_DELAY_SECONDS = 30;

/** The options the package loads the .proto with. */
export const LOADER_OPTIONS = Object.freeze({
  keepCase: true,
  longs: Number, // every int64 of the API (sizes, offsets, counts) fits in 2^53
  enums: String,
  bytes: Buffer,
  defaults: true,
  oneofs: true,
});

let service = null;
let apiRoot = null;

function apiType(name) {
  if (apiRoot === null) {
    apiRoot = new protobuf.Root();
    apiRoot.loadSync(PROTO_PATH, { keepCase: true });
  }
  return apiRoot.lookupType(`remote_partitioner.v1.${name}`);
}

/** How messages become JSON: proto field names, enums by name, bytes as base64, and every
 *  64-bit integer as a JSON number (not protobuf JSON's decimal string). */
const JSON_OPTIONS = Object.freeze({
  longs: Number, enums: String, bytes: String, arrays: true, objects: true, oneofs: false,
  json: true,
});

/**
 * A DelegationReport (as the client received it) as the wire part of the CLI's report JSON:
 * proto field names, default values left out (as Python's `MessageToDict` leaves them out),
 * int64 as numbers, enums by name. Always has `methods` (maybe empty).
 */
export function reportToJson(report) {
  const type = apiType('DelegationReport');
  const object = type.toObject(type.fromObject(report ?? {}), { ...JSON_OPTIONS, defaults: false });
  const out = inProtoOrder(type, withoutDefaults(type, object));
  return { methods: out.methods ?? [] };
}

/** The CPU call_function nodes of a received method report, in graph order, as
 *  {name, op, reason} (the report JSON's `cpu_nodes`). */
export function cpuNodes(method) {
  return (method.nodes ?? [])
    .filter((n) => n.kind === 'call_function' && !n.backend_id)
    .map((n) => ({ name: n.name, op: n.op, reason: n.reason ?? '' }));
}

/**
 * A ListPartitionersResponse as `list --json` prints it: every field (defaults included),
 * int64 as numbers, enums by name, each spec key as {name, type, default, doc} with `default`
 * the plain value (null when the key has none).
 */
export function listToJson(response) {
  const type = apiType('ListPartitionersResponse');
  const out = inProtoOrder(
    type, type.toObject(type.fromObject(response), { ...JSON_OPTIONS, defaults: true }),
  );
  const valueType = apiType('SpecValue');
  const hosted = [
    ...out.partitioners.map((p, j) => [p, response.partitioners[j]]),
    ...(out.quantizers ?? []).map((q, j) => [q, response.quantizers[j]]),
  ];
  hosted.forEach(([p, received_p]) => {
    p.spec_keys = p.spec_keys.map((k, i) => {
      const received = received_p.spec_keys[i].default;
      let value = null;
      if (received && received.value) {
        const v = valueType.toObject(valueType.fromObject(received), {
          ...JSON_OPTIONS, defaults: false,
        });
        value = v[received.value] ?? null;
      }
      return { name: k.name, type: k.type, default: value, doc: k.doc };
    });
  });
  for (const [field, value] of Object.entries(out)) if (value === null) delete out[field];
  return out;
}

/** `object` (of message `type`) with its fields in the .proto's order, as the Python CLI
 *  prints them (protobufjs puts repeated fields first); recursively, in place. */
function inProtoOrder(type, object) {
  const entries = type.fieldsArray
    .filter((f) => Object.hasOwn(object, f.name))
    .map((f) => [f, object[f.name]]);
  for (const key of Object.keys(object)) delete object[key];
  for (const [field, value] of entries) {
    const sub = field.resolvedType instanceof protobuf.Type ? field.resolvedType : null;
    if (sub && Array.isArray(value)) value.forEach((v) => inProtoOrder(sub, v));
    else if (sub && value !== null) inProtoOrder(sub, value);
    object[field.name] = value;
  }
  return object;
}

/** `object` (of message `type`) without the proto3 default values MessageToDict leaves out. */
function withoutDefaults(type, object) {
  for (const field of type.fieldsArray) {
    const value = object[field.name];
    if (value === undefined) continue;
    const sub = field.resolvedType instanceof protobuf.Type ? field.resolvedType : null;
    if (field.repeated) {
      if (value.length === 0) delete object[field.name];
      else if (sub) value.forEach((v) => withoutDefaults(sub, v));
    } else if (sub) {
      if (value !== null) withoutDefaults(sub, value);
    } else {
      const zeroEnum = field.resolvedType instanceof protobuf.Enum
        && field.resolvedType.values[value] === 0;
      if (value === 0 || value === '' || value === false || value === null
          || zeroEnum) {
        delete object[field.name];
      }
    }
  }
  return object;
}

/** The generated service constructor of remote_partitioner.v1.RemotePartitioner. */
export function serviceConstructor() {
  if (service === null) {
    const definition = protoLoader.loadSync(PROTO_PATH, LOADER_OPTIONS);
    service = grpc.loadPackageDefinition(definition).remote_partitioner.v1.RemotePartitioner;
  }
  return service;
}

/** An error of this client (not of the server). `exitCode` is what the CLI exits with. */
/**
 * Where the .pte for `outputPath` goes: the file it names through symbolic links (as Python's
 * os.path.realpath: a missing file's directory resolved, a dangling link followed), whether it
 * is (or will be) a regular file, and an existing regular file's mode (else null).
 */
async function pteTarget(outputPath) {
  let target = path.resolve(outputPath);
  for (let hops = 0; hops < 40; hops += 1) {
    let st;
    try {
      st = await fs.promises.lstat(target);
    } catch (e) {
      if (e.code !== 'ENOENT') throw e;
      const dir = await fs.promises.realpath(path.dirname(target)).catch(() => path.dirname(target));
      return { target: path.join(dir, path.basename(target)), regular: true, mode: null };
    }
    if (st.isSymbolicLink()) {
      target = path.resolve(path.dirname(target), await fs.promises.readlink(target));
      continue;
    }
    const real = await fs.promises.realpath(target);
    return st.isFile()
      ? { target: real, regular: true, mode: st.mode & 0o7777 }
      : { target: real, regular: false, mode: null };
  }
  throw new ClientError(`${outputPath}: too many levels of symbolic links`);
}

export class ClientError extends Error {
  constructor(message, exitCode = 1) {
    super(message);
    this.name = 'ClientError';
    this.exitCode = exitCode;
  }
}

/** A call refused by the server: `.info` is `describeError()` of the gRPC error. */
export class RpcError extends Error {
  constructor(err) {
    const info = describeError(err);
    super(`${info.code_name}: ${info.message}`);
    this.name = 'RpcError';
    this.info = info;
    this.cause = err;
  }
}

const VISIBLE_ASCII = /^[\x21-\x7e]+$/;

/**
 * The bearer token in a token file: its first line that is neither blank nor a `#` comment,
 * trimmed (the format the server's --token-file and the Python client's read_token use).
 */
export function readToken(file) {
  let text;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (e) {
    throw new ClientError(`cannot read token file ${JSON.stringify(file)}: ${e.message}`, 2);
  }
  const lines = text.split(/\r?\n/);
  for (let i = 0; i < lines.length; i += 1) {
    const line = lines[i].trim();
    if (!line || line.startsWith('#')) continue;
    if (!VISIBLE_ASCII.test(line)) {
      throw new ClientError(
        `token file ${JSON.stringify(file)}, line ${i + 1}: a token must be visible ASCII ` +
          'characters without whitespace', 2,
      );
    }
    return line;
  }
  throw new ClientError(`token file ${JSON.stringify(file)} holds no token`, 2);
}

/** The content address of `data`: lowercase hex SHA-256 and size. */
export function digestOf(data) {
  return { hash: createHash('sha256').update(data).digest('hex'), size_bytes: data.length };
}

const INT = /^[+-]?\d+$/;
const FLOAT = /^[+-]?(?:\d+\.\d*|\.\d+|\d+(?=[eE]))(?:[eE][+-]?\d+)?$/;
const SPECIAL_FLOAT = /^([+-]?)(inf|infinity|nan)$/i;
const INT64_MIN = -(2n ** 63n);
const INT64_MAX = 2n ** 63n - 1n;

/**
 * A `SpecValue` from command-line text, as the Python CLI parses it: `true`/`false` (any case)
 * -> bool_value; an integer (optional sign, digits) -> int_value; a decimal number with a point
 * or an exponent, or inf/infinity/nan -> double_value; anything else -> string_value. A `str:`
 * prefix forces a string (`str:8` is the string "8"), for a string key whose value would
 * otherwise parse as a bool or a number.
 */
export function parseSpecValue(text) {
  if (text.startsWith('str:')) return { string_value: text.slice(4) };
  const lower = text.toLowerCase();
  if (lower === 'true') return { bool_value: true };
  if (lower === 'false') return { bool_value: false };
  if (INT.test(text)) {
    const n = BigInt(text);
    if (n < INT64_MIN || n > INT64_MAX) throw new ClientError(`--spec value ${text} is outside the int64 range`, 2);
    return { int_value: n.toString() }; // protobufjs takes an int64 as a decimal string, exactly
  }
  if (FLOAT.test(text)) return { double_value: Number(text) };
  const special = SPECIAL_FLOAT.exec(text);
  if (special) {
    const x = special[2].toLowerCase() === 'nan' ? NaN : Infinity;
    return { double_value: special[1] === '-' ? -x : x };
  }
  return { string_value: text };
}

/** A `SpecEntry` list from `KEY=VALUE` strings, in order. */
export function parseSpec(entries) {
  const seen = new Set();
  return entries.map((entry) => {
    const eq = entry.indexOf('=');
    if (eq <= 0) throw new ClientError(`--spec wants KEY=VALUE, got ${JSON.stringify(entry)}`, 2);
    const key = entry.slice(0, eq);
    if (seen.has(key)) {
      throw new ClientError(`--spec key ${JSON.stringify(key)} given twice for one --partitioner`, 2);
    }
    seen.add(key);
    return { key, value: parseSpecValue(entry.slice(eq + 1)) };
  });
}

/** A plain JS value of a received `SpecValue` (null when unset). */
export function specValueToJs(v) {
  if (!v || !v.value) return null;
  const x = v[v.value];
  return Buffer.isBuffer(x) ? x.toString('base64') : x;
}

/**
 * A connection to one server.
 *
 * options: token (bearer token), tls (use TLS with the system roots), ca (PEM Buffer of root
 * certificates; implies TLS), cert and key (PEM Buffers of a client certificate chain and its
 * private key, for mutual TLS), timeoutSeconds (per-call deadline), requestId (x-request-id; a fresh one by default).
 */
/** The request header that routes a call to an environment (proto/transport.py's
 * ENVIRONMENT_METADATA_KEY). */
export const ENVIRONMENT_HEADER = 'x-remote-partitioner-environment';

export class RemotePartitionerClient {
  constructor(target, options = {}) {
    const Service = serviceConstructor();
    const credentials = options.tls || options.ca || options.cert || options.key
      ? grpc.credentials.createSsl(options.ca ?? null, options.key ?? null, options.cert ?? null)
      : grpc.credentials.createInsecure();
    this.stub = new Service(target, credentials, CHANNEL_OPTIONS);
    this.token = options.token ?? null;
    this.timeoutSeconds = options.timeoutSeconds ?? null;
    this.requestId = options.requestId ?? randomUUID().replaceAll('-', '');
    this.stats = { rpcs: 0, blobs_uploaded: 0, bytes_uploaded: 0 };
    this.serverRequestId = null;
    // The environment hosting the partitioners of the lowering in progress ('' the default
    // one): every call but ListPartitioners carries it in ENVIRONMENT_HEADER (see lower).
    this.environment = '';
  }

  close() {
    this.stub.close();
  }

  metadata(environment = this.environment) {
    const md = new grpc.Metadata();
    if (this.token) md.set('authorization', `Bearer ${this.token}`);
    md.set('x-request-id', this.requestId);
    if (environment) md.set(ENVIRONMENT_HEADER, environment);
    return md;
  }

  callOptions() {
    return this.timeoutSeconds ? { deadline: Date.now() + this.timeoutSeconds * 1000 } : {};
  }

  /** Remembers the server's x-request-id (initial metadata, sent on success and error). */
  watch(call) {
    call.on('metadata', (md) => {
      const rid = md.get('x-request-id');
      if (rid.length > 0) this.serverRequestId = String(rid[0]);
    });
    return call;
  }

  rpcError(err) {
    const e = new RpcError(err);
    if (e.info.request_id === null) e.info.request_id = this.serverRequestId ?? null;
    return e;
  }

  unary(method, request, environment = this.environment) {
    this.stats.rpcs += 1;
    return new Promise((resolve, reject) => {
      this.watch(this.stub[method](
        request, this.metadata(environment), this.callOptions(), (err, response) => {
          if (err) reject(this.rpcError(err));
          else resolve(response);
        },
      ));
    });
  }

  /** ListPartitionersResponse. */
  listPartitioners() {
    return this.unary('ListPartitioners', {}, '');
  }

  /**
   * Sends this client's later calls to the environment that hosts `partitioners` (as the
   * listing, asked without the header, places them; as the Python LowerClient.environment_of).
   * Names the listing does not know are left to the server to refuse.
   */
  async useEnvironmentOf(partitioners) {
    const listing = await this.listPartitioners();
    const where = new Map(listing.partitioners.map((p) => [p.name, p.environment ?? '']));
    const known = partitioners.filter((p) => where.has(p.name));
    const envs = new Set(known.map((p) => where.get(p.name)));
    if (envs.size > 1) {
      const named = known.map((p) => `${p.name} (${where.get(p.name) || 'default'})`).join(', ');
      throw new ClientError(`the partitioners are hosted in different environments: ${named}; ` +
        'one lowering runs in one environment');
    }
    this.environment = envs.size === 1 ? [...envs][0] : (listing.environment ?? '');
  }

  /** The subset of `digests` the server lacks. */
  async findMissingBlobs(digests) {
    const r = await this.unary('FindMissingBlobs', { digests });
    return r.missing_digests;
  }

  /**
   * Uploads blobs on one UploadBlobs stream: each blob as consecutive chunks of at most
   * `chunkBytes` from offset 0 (an empty blob as one empty chunk). `blobs` is a list of
   * {digest, data}. Resolves to the committed digests.
   */
  uploadBlobs(blobs, chunkBytes = CHUNK_BYTES) {
    this.stats.rpcs += 1;
    return new Promise((resolve, reject) => {
      let settled = false;
      const call = this.watch(this.stub.UploadBlobs(
        this.metadata(), this.callOptions(), (err, response) => {
          settled = true;
          if (err) reject(this.rpcError(err));
          else resolve(response.committed_digests);
        },
      ));
      const chunks = function* chunks() {
        for (const { digest, data } of blobs) {
          if (data.length === 0) {
            yield { digest, offset: 0, data: Buffer.alloc(0) };
            continue;
          }
          for (let off = 0; off < data.length; off += chunkBytes) {
            yield { digest, offset: off, data: data.subarray(off, off + chunkBytes) };
          }
        }
      }();
      const pump = () => {
        for (;;) {
          if (settled) return; // the server ended the call early (an error)
          const { value, done } = chunks.next();
          if (done) {
            call.end();
            return;
          }
          if (!call.write(value)) {
            call.once('drain', pump);
            return;
          }
        }
      };
      pump();
    });
  }

  /** Uploads `data` unless the server holds it already; returns its digest. */
  async ensureBlob(data, digest = digestOf(data)) {
    const missing = await this.findMissingBlobs([digest]);
    if (missing.length > 0) await this.uploadCounted([{ digest, data }]);
    return digest;
  }

  async uploadCounted(blobs) {
    const committed = await this.uploadBlobs(blobs);
    const got = new Set(committed.map((d) => `${d.hash}/${d.size_bytes}`));
    for (const { digest, data } of blobs) {
      if (!got.has(`${digest.hash}/${digest.size_bytes}`)) {
        throw new ClientError(`the server did not commit blob ${digest.hash}`);
      }
      this.stats.blobs_uploaded += 1;
      this.stats.bytes_uploaded += data.length;
    }
  }

  /**
   * Lowers a PT2 archive on the server (`Lower`) and writes the `.pte` to `outputPath` (unless
   * `options.report_only`). Uploads the archive when the server lacks it, and again if the
   * server lost it before the call (BLOB_MISSING); waits and retries when the server is
   * OVERLOADED and sends a RetryInfo. Resolves to {report, pte, held} (pte: the verified
   * digest, or null when report_only). `options.archive_digest`: the archive's digest when the
   * caller knows it; `options.held_pte`: the digest of the .pte `outputPath` holds, which is
   * then neither sent nor written when the lowering's .pte is that one (`held` true).
   */
  async lower(archive, partitioners, outputPath, options = {}) {
    await this.useEnvironmentOf(partitioners);
    const digest = await this.ensureBlob(archive, options.archive_digest ?? digestOf(archive));
    const request = {
      archive: digest,
      partitioners,
      options: {
        skip_ir_validity_check: Boolean(options.skip_ir_validity_check),
        report_only: Boolean(options.report_only),
      },
    };
    if (options.held_pte) request.held_pte = options.held_pte;
    let reuploaded = false;
    for (let attempt = 0; ; attempt += 1) {
      try {
        return await this.lowerOnce(request, outputPath);
      } catch (e) {
        if (!(e instanceof RpcError)) throw e;
        const { reason, retry_delay_seconds: delay } = e.info;
        if (reason === 'BLOB_MISSING' && !reuploaded) {
          reuploaded = true;
          await this.uploadCounted([{ digest, data: archive }]);
          continue;
        }
        if (reason === 'OVERLOADED' && delay !== null && attempt < MAX_RETRIES) {
          await sleep(Math.min(delay, MAX_RETRY_DELAY_SECONDS) * 1000);
          continue;
        }
        throw e;
      }
    }
  }

  async lowerOnce(request, outputPath) {
    // As the Python CLI: the .pte goes to a temporary file beside the file `outputPath` names
    // (through symbolic links), renamed over it once whole and verified, with an existing
    // file's mode; an output that is not a regular file (/dev/null, a pipe) is written after.
    // Resolved before the call starts: between the call's start and the loop below nothing
    // listens for its 'error' event, and a fast error (a bad spec) would then be thrown as an
    // unhandled event instead of rejecting.
    const out = outputPath && !request.options.report_only ? await pteTarget(outputPath) : null;
    const tmp = out && out.regular ? `${out.target}.tmp-${process.pid}` : null;
    this.stats.rpcs += 1;
    const call = this.watch(this.stub.Lower(request, this.metadata(), this.callOptions()));
    let report = null;
    let pte = null;
    let received = 0;
    let hash = null;
    let fh = null;
    const parts = [];
    let ok = false;
    try {
      let first = true;
      for await (const msg of call) {
        if (first) {
          first = false;
          report = msg.report;
          if (msg.pte && !request.options.report_only) {
            pte = { hash: msg.pte.hash, size_bytes: Number(msg.pte.size_bytes) };
            if (out === null) throw new ClientError('no output path for the .pte');
            if (tmp !== null) fh = await fs.promises.open(tmp, 'w');
            hash = createHash('sha256');
          }
        }
        const data = msg.data;
        if (data && data.length > 0) {
          if (hash === null) throw new ClientError('the server sent .pte bytes without a digest');
          if (Number(msg.offset) !== received) {
            throw new ClientError(`.pte chunk at offset ${msg.offset}, expected ${received}`);
          }
          if (received + data.length > pte.size_bytes) {
            throw new ClientError(`the .pte is longer than its digest's ${pte.size_bytes} bytes`);
          }
          hash.update(data);
          if (fh !== null) await fh.write(data);
          else parts.push(data);
          received += data.length;
        }
      }
      if (first) throw new ClientError('the server ended Lower without a response');
      const held = request.held_pte;
      if (pte !== null && received === 0 && held && held.hash === pte.hash
          && Number(held.size_bytes) === pte.size_bytes) {
        ok = true; // (the output holds it: the temporary file is removed, nothing written)
        if (fh !== null) {
          await fh.close();
          fh = null;
          await fs.promises.rm(tmp, { force: true });
        }
        return { report, pte, held: true };
      }
      if (pte !== null) {
        if (received !== pte.size_bytes) {
          throw new ClientError(`received ${received} bytes of a ${pte.size_bytes}-byte .pte`);
        }
        const got = hash.digest('hex');
        if (got !== pte.hash) {
          throw new ClientError(`the .pte's SHA-256 is ${got}, its digest says ${pte.hash}`);
        }
        if (fh !== null) {
          if (out.mode !== null) await fh.chmod(out.mode);
          await fh.close();
          fh = null;
          await fs.promises.rename(tmp, out.target);
        } else {
          await fs.promises.writeFile(out.target, Buffer.concat(parts));
        }
      } else if (!request.options.report_only) {
        throw new ClientError('the server sent no .pte digest');
      }
      ok = true;
      return { report, pte, held: false };
    } catch (e) {
      call.cancel();
      if (e && typeof e.code === 'number' && !(e instanceof ClientError)) throw this.rpcError(e);
      throw e;
    } finally {
      if (fh !== null) await fh.close().catch(() => {});
      if (!ok && tmp !== null) await fs.promises.rm(tmp, { force: true }).catch(() => {});
    }
  }
}

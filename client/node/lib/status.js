// Decoding of the rich error status a server attaches to a failed call: the
// `grpc-status-details-bin` trailer holds a serialized `google.rpc.Status` whose `details` are
// `google.protobuf.Any` messages (ErrorInfo, RetryInfo, BadRequest, ...). The two .proto files
// under ../proto/google/rpc are unmodified copies of Google's (Apache-2.0).

import path from 'node:path';
import { fileURLToPath } from 'node:url';

import protobuf from 'protobufjs';

const PROTO_DIR = path.join(path.dirname(fileURLToPath(import.meta.url)), '..', 'proto');

/** The ErrorInfo domain of this service's errors. */
export const DOMAIN = 'remote-partitioner';

/** gRPC status code numbers to names. */
export const CODE_NAMES = Object.freeze([
  'OK', 'CANCELLED', 'UNKNOWN', 'INVALID_ARGUMENT', 'DEADLINE_EXCEEDED', 'NOT_FOUND',
  'ALREADY_EXISTS', 'PERMISSION_DENIED', 'RESOURCE_EXHAUSTED', 'FAILED_PRECONDITION', 'ABORTED',
  'OUT_OF_RANGE', 'UNIMPLEMENTED', 'INTERNAL', 'UNAVAILABLE', 'DATA_LOSS', 'UNAUTHENTICATED',
]);

let types = null;

function loadTypes() {
  if (types === null) {
    const root = new protobuf.Root();
    // google/protobuf/{any,duration}.proto are built into protobufjs; resolve the rest here.
    root.resolvePath = (_origin, target) =>
      target.startsWith('google/protobuf/') ? target : path.join(PROTO_DIR, target);
    root.loadSync(['google/rpc/status.proto', 'google/rpc/error_details.proto'], { keepCase: true });
    types = {
      root,
      Status: root.lookupType('google.rpc.Status'),
    };
  }
  return types;
}

function typeFor(typeUrl) {
  const name = typeUrl.slice(typeUrl.lastIndexOf('/') + 1);
  try {
    return loadTypes().root.lookupType(name);
  } catch {
    return null;
  }
}

function durationSeconds(d) {
  if (!d) return 0;
  return Number(d.seconds || 0) + Number(d.nanos || 0) / 1e9;
}

/**
 * Describes a grpc-js ServiceError: its code, message and, when the trailer carries a
 * `google.rpc.Status`, the ErrorInfo (reason, domain, metadata), the RetryInfo delay and the
 * BadRequest field violations. Never throws: an undecodable trailer is reported as such.
 */
export function describeError(err) {
  const code = typeof err.code === 'number' ? err.code : 2;
  const out = {
    code,
    code_name: CODE_NAMES[code] ?? String(code),
    message: err.details ?? err.message ?? String(err),
    reason: null,
    domain: null,
    metadata: {},
    retry_delay_seconds: null,
    field_violations: [],
    request_id: null,
  };
  const md = err.metadata;
  if (md && typeof md.get === 'function') {
    const rid = md.get('x-request-id');
    if (rid.length > 0) out.request_id = String(rid[0]);
    const bins = md.get('grpc-status-details-bin');
    if (bins.length > 0) {
      try {
        const { Status } = loadTypes();
        const status = Status.toObject(Status.decode(bins[0]), { longs: Number, defaults: true });
        if (status.message) out.message = status.message;
        for (const any of status.details ?? []) {
          const T = typeFor(any.type_url);
          if (T === null) continue;
          const detail = T.toObject(T.decode(any.value), { longs: Number, defaults: true });
          switch (T.fullName) {
            case '.google.rpc.ErrorInfo':
              out.reason = detail.reason || null;
              out.domain = detail.domain || null;
              out.metadata = { ...(detail.metadata ?? {}) };
              break;
            case '.google.rpc.RetryInfo':
              out.retry_delay_seconds = durationSeconds(detail.retry_delay);
              break;
            case '.google.rpc.BadRequest':
              for (const v of detail.field_violations ?? []) {
                out.field_violations.push({ field: v.field, description: v.description });
              }
              break;
            default:
              break;
          }
        }
      } catch (e) {
        out.details_error = `cannot decode grpc-status-details-bin: ${e.message}`;
      }
    }
  }
  return out;
}

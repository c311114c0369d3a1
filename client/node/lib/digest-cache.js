// Digests of local files remembered by the files' identity and status, shared with the Python
// command line: the same directory, the same entries (client/digest_cache.py states the
// rules; docs/cli.md, "The digest cache"). An entry is used only while the file's device,
// inode, size, modification and change times (nanoseconds) are unchanged and those times are
// older than the entry by more than the timestamp granularity (git's rule for racy entries).
// Entries hold these integers as decimal strings: JavaScript numbers would round them.

import { createHash } from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

/** The environment variable naming the cache's directory, or `off`. */
export const ENVIRONMENT_VARIABLE = 'REMOTE_PARTITIONER_DIGEST_CACHE';
/** An entry is racy unless the file's times are older than it by this much (ns). */
export const RACY_NS = 50_000_000n;
/** The same, for a file system whose times are whole seconds. */
export const RACY_WHOLE_SECONDS_NS = 2_000_000_000n;
/** Entries kept; past this, the least recently recorded are removed. */
export const MAX_ENTRIES = 4096;

const FIELDS = ['dev', 'ino', 'size', 'mtime_ns', 'ctime_ns'];
const SECOND = 1_000_000_000n;

function nowNs() {
  return BigInt(Date.now()) * 1_000_000n; // (milliseconds: an entry only looks older)
}

function status(st) {
  return { dev: st.dev, ino: st.ino, size: st.size, mtime_ns: st.mtimeNs, ctime_ns: st.ctimeNs };
}

function sameStatus(a, b) {
  return FIELDS.every((f) => a[f] === b[f]);
}

function racyMargin(s) {
  return s.mtime_ns % SECOND === 0n && s.ctime_ns % SECOND === 0n ? RACY_WHOLE_SECONDS_NS : RACY_NS;
}

function latest(s) {
  return s.mtime_ns > s.ctime_ns ? s.mtime_ns : s.ctime_ns;
}

function statOf(real) {
  try {
    const st = fs.statSync(real, { bigint: true });
    return st.isFile() ? status(st) : null;
  } catch {
    return null;
  }
}

function realPath(file) {
  try {
    return fs.realpathSync(file);
  } catch {
    return path.resolve(file);
  }
}

export class DigestCache {
  constructor(directory) {
    this.directory = directory;
  }

  /** The cache the environment names (null when `off`), else the user's cache directory's. */
  static fromEnvironment(env = process.env) {
    const named = env[ENVIRONMENT_VARIABLE] ?? '';
    if (named.toLowerCase() === 'off') return null;
    if (named) return new DigestCache(named);
    const base = env.XDG_CACHE_HOME || path.join(os.homedir(), '.cache');
    return new DigestCache(path.join(base, 'remote-partitioner', 'digests'));
  }

  entryPath(real) {
    return path.join(this.directory, createHash('sha256').update(real, 'utf8').digest('hex'));
  }

  /** The digest of the regular file `file` if an entry for it is usable, else null. */
  lookup(file) {
    const real = realPath(file);
    const s = statOf(real);
    if (s === null) return null;
    let entry;
    try {
      entry = JSON.parse(fs.readFileSync(this.entryPath(real), 'utf8'));
    } catch {
      return null;
    }
    if (entry === null || typeof entry !== 'object' || entry.path !== real) return null;
    if (!FIELDS.every((f) => entry[f] === s[f].toString())) return null;
    let recorded;
    try {
      recorded = BigInt(entry.recorded_ns);
    } catch {
      return null;
    }
    if (typeof entry.sha256 !== 'string') return null;
    if (latest(s) >= recorded - racyMargin(s)) return null; // racy
    return { hash: entry.sha256, size_bytes: Number(s.size) };
  }

  /** Records `digest` (of `data`, just read from `file`) when the file's status did not change
   *  while it was hashed; `before` is the status taken before reading. */
  recordRead(file, before, digest) {
    const real = realPath(file);
    if (before === null || before.size !== BigInt(digest.size_bytes)) return;
    const after = statOf(real);
    if (after !== null && sameStatus(before, after)) this.write(real, before, digest.hash);
  }

  /** The status of `file` now (to pass to `recordRead`), or null if it is no regular file. */
  statusOf(file) {
    return statOf(realPath(file));
  }

  /** Records `digest` for `file`, which this process has just written whole (and verified) and
   *  renamed into place; waits (at most the racy margin) for the entry to be usable at once. */
  async recordWritten(file, digest) {
    const real = realPath(file);
    const s = statOf(real);
    if (s === null || s.size !== BigInt(digest.size_bytes)) return;
    const wait = latest(s) + racyMargin(s) + 1_000_000n - nowNs();
    if (wait > 0n && wait <= RACY_NS + 1_000_000n) await sleep(Number(wait / 1_000_000n) + 1);
    const again = statOf(real);
    if (again !== null && sameStatus(s, again)) this.write(real, s, digest.hash);
  }

  write(real, s, sha256) {
    const entry = { path: real };
    for (const f of FIELDS) entry[f] = s[f].toString();
    entry.sha256 = sha256;
    entry.recorded_ns = nowNs().toString();
    const target = this.entryPath(real);
    const tmp = `${target}.tmp-${process.pid}`;
    try {
      fs.mkdirSync(this.directory, { recursive: true });
      fs.writeFileSync(tmp, JSON.stringify(entry));
      fs.renameSync(tmp, target);
    } catch {
      try {
        fs.rmSync(tmp, { force: true });
      } catch {
        // (nothing to remove)
      }
      return;
    }
    this.prune();
  }

  prune() {
    let names;
    try {
      names = fs.readdirSync(this.directory).filter((n) => !n.includes('.tmp-'));
    } catch {
      return;
    }
    if (names.length <= MAX_ENTRIES) return;
    const aged = [];
    for (const n of names) {
      try {
        aged.push([fs.statSync(path.join(this.directory, n), { bigint: true }).mtimeNs, n]);
      } catch {
        // (removed meanwhile)
      }
    }
    aged.sort((a, b) => (a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0));
    for (const [, n] of aged.slice(0, aged.length - MAX_ENTRIES)) {
      try {
        fs.rmSync(path.join(this.directory, n), { force: true });
      } catch {
        // (removed meanwhile)
      }
    }
  }
}

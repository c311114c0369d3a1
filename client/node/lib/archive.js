// Cheap local checks of a PT2 archive (what torch.export.save writes: a zip file) before it is
// uploaded: the zip's central directory is read from its end (nothing is decompressed), it must
// name an `archive_format` entry, and every entry must lie inside the file and start with a
// local header where the directory says. The same checks,
// with the same messages, as the Python CLI's read_archive.

import { ClientError } from './client.js';

const EOCD = 0x06054b50;
const ZIP64_LOCATOR = 0x07064b50;
const ZIP64_EOCD = 0x06064b50;
const CENTRAL = 0x02014b50;
const LOCAL_HEADER = 0x04034b50;
const EOCD_BYTES = 22;
const MAX_COMMENT = 0xffff;
const LOCAL_HEADER_BYTES = 30;

class NotZip extends Error {}

function u64(buf, at) {
  return Number(buf.readBigUInt64LE(at));
}

function need(buf, at, bytes) {
  if (at < 0 || at + bytes > buf.length) throw new NotZip();
}

/** The entries of the zip file in `buf`: [{name, offset, compressedSize}]. Throws NotZip. */
export function zipEntries(buf) {
  let eocd = -1;
  for (let i = buf.length - EOCD_BYTES; i >= Math.max(0, buf.length - EOCD_BYTES - MAX_COMMENT);
    i -= 1) {
    if (buf.readUInt32LE(i) === EOCD) {
      eocd = i;
      break;
    }
  }
  if (eocd < 0) throw new NotZip();
  let count = buf.readUInt16LE(eocd + 10);
  let cdSize = buf.readUInt32LE(eocd + 12);
  let cdOffset = buf.readUInt32LE(eocd + 16);
  let cdEnd = eocd;
  const locator = eocd - 20;
  if (locator >= 0 && buf.readUInt32LE(locator) === ZIP64_LOCATOR) {
    const z = locator - 56; // the zip64 end record, right before its locator
    need(buf, z, 56);
    if (buf.readUInt32LE(z) !== ZIP64_EOCD) throw new NotZip();
    [count, cdSize, cdOffset] = [u64(buf, z + 32), u64(buf, z + 40), u64(buf, z + 48)];
    cdEnd = z;
  }
  // Bytes before (or missing from) the start: the directory is right before its end record,
  // and every offset moves by as much (as Python's zipfile reads it).
  const concat = cdEnd - cdSize - cdOffset;
  need(buf, cdOffset + concat, cdSize);
  const entries = [];
  let at = cdOffset + concat;
  for (let n = 0; n < count; n += 1) {
    need(buf, at, 46);
    if (buf.readUInt32LE(at) !== CENTRAL) throw new NotZip();
    let compressedSize = buf.readUInt32LE(at + 20);
    const uncompressed = buf.readUInt32LE(at + 24);
    const [nameLen, extraLen, commentLen] = [
      buf.readUInt16LE(at + 28), buf.readUInt16LE(at + 30), buf.readUInt16LE(at + 32)];
    let offset = buf.readUInt32LE(at + 42);
    need(buf, at + 46, nameLen + extraLen + commentLen);
    const name = buf.toString('utf8', at + 46, at + 46 + nameLen);
    // A zip64 extra field holds, in this order, the sizes and offset too large for 32 bits.
    for (let e = at + 46 + nameLen; e + 4 <= at + 46 + nameLen + extraLen;) {
      const [id, size] = [buf.readUInt16LE(e), buf.readUInt16LE(e + 2)];
      if (id === 0x0001) {
        let f = e + 4;
        const next = () => {
          need(buf, f, 8);
          const v = u64(buf, f);
          f += 8;
          return v;
        };
        if (uncompressed === 0xffffffff) next();
        if (compressedSize === 0xffffffff) compressedSize = next();
        if (offset === 0xffffffff) offset = next();
      }
      e += 4 + size;
    }
    entries.push({ name, offset: offset + concat, compressedSize });
    at += 46 + nameLen + extraLen + commentLen;
  }
  return entries;
}

/**
 * Checks that `data` (the bytes of the file `file`) is a PT2 archive; throws a ClientError
 * (exit 2) saying what is wrong: not a zip file or truncated, a zip file without an
 * `archive_format` entry, or entries that reach past the file's end.
 */
export function checkArchive(file, data) {
  const hint = "write one with torch.export.save(exported_program, 'model.pt2')";
  let entries;
  try {
    entries = zipEntries(data);
  } catch (e) {
    if (!(e instanceof NotZip) && !(e instanceof RangeError)) throw e;
    throw new ClientError(`${file} is not a PT2 archive (not a zip file, or truncated: no zip ` +
      `directory at its end); ${hint}`, 2);
  }
  if (!entries.some((x) => x.name.split('/').pop() === 'archive_format')) {
    throw new ClientError(`${file} is a zip file but not a PT2 archive (no archive_format ` +
      `entry); ${hint}`, 2);
  }
  if (entries.some((x) => x.offset + LOCAL_HEADER_BYTES + x.compressedSize > data.length)) {
    throw new ClientError(`${file} is truncated: its entries reach past its ${data.length} bytes`,
      2);
  }
  if (entries.some((x) => x.offset < 0 || data.readUInt32LE(x.offset) !== LOCAL_HEADER)) {
    throw new ClientError(`${file} is damaged: its zip directory points where no entry begins; ` +
      `${hint}`, 2);
  }
}

// What the models page reads of a GGUF file's header before uploading it: that it is
// one (the magic), and its general.basename, the name `ficc models add` gives it.
// Only the first few MiB are read; the server reads the whole header once verified.

const MAGIC = 0x46554747; // "GGUF", little-endian
// The versions the server's reader takes (ficc_core.models.gguf): little-endian 2 and 3.
const VERSIONS = [2, 3];
const HEAD_BYTES = 4 << 20;
// The magic, the version and the two counts.
const FIXED_HEAD = 24;
// Sizes of the fixed-size value types (GGUF's type numbers).
const FIXED = { 0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8 };
const STRING = 8;
const ARRAY = 9;

class OutOfHead extends Error {}

class Reader {
  constructor(buffer) {
    this.view = new DataView(buffer);
    this.at = 0;
  }

  need(count) {
    if (this.at + count > this.view.byteLength) throw new OutOfHead();
  }

  u32() {
    this.need(4);
    const value = this.view.getUint32(this.at, true);
    this.at += 4;
    return value;
  }

  u64() {
    this.need(8);
    const value = Number(this.view.getBigUint64(this.at, true));
    this.at += 8;
    return value;
  }

  string() {
    const length = this.u64();
    this.need(length);
    const bytes = new Uint8Array(this.view.buffer, this.at, length);
    this.at += length;
    return new TextDecoder().decode(bytes);
  }

  skip(type) {
    if (type === STRING) {
      this.string();
    } else if (type === ARRAY) {
      const items = this.u32();
      const count = this.u64();
      if (items === STRING) {
        for (let i = 0; i < count; i++) this.string();
      } else if (FIXED[items]) {
        this.need(count * FIXED[items]);
        this.at += count * FIXED[items];
      } else {
        throw new OutOfHead(); // nested arrays: not worth following for a name
      }
    } else if (FIXED[type]) {
      this.need(FIXED[type]);
      this.at += FIXED[type];
    } else {
      throw new OutOfHead();
    }
  }
}

// {gguf: whether `file` starts as a GGUF does, basename: its general.basename or null,
// refused: why a file with the magic is no GGUF the server reads (a version other than
// 2 or 3, as `ficc models add` says it; a header cut before its counts), else null}.
export async function ggufHead(file) {
  const buffer = await file.slice(0, HEAD_BYTES).arrayBuffer();
  const reader = new Reader(buffer);
  try {
    if (reader.u32() !== MAGIC) return { gguf: false, basename: null, refused: null };
    const version = reader.u32();
    if (!VERSIONS.includes(version)) {
      const refused = `unsupported GGUF version ${version} (2 and 3 are read; big-endian files are not)`;
      return { gguf: false, basename: null, refused };
    }
    reader.u64(); // tensors
    const pairs = reader.u64();
    for (let i = 0; i < pairs; i++) {
      const key = reader.string();
      const type = reader.u32();
      if (key === "general.basename" && type === STRING) {
        return { gguf: true, basename: reader.string().trim() || null, refused: null };
      }
      reader.skip(type);
    }
  } catch (error) {
    if (!(error instanceof OutOfHead)) throw error;
    // The whole file was read and it ends before its counts: no reader takes it.
    if (reader.at >= 4 && reader.at < FIXED_HEAD && buffer.byteLength === file.size) {
      return { gguf: false, basename: null, refused: `its GGUF header is truncated (${file.size} bytes)` };
    }
  }
  return { gguf: reader.at >= 4, basename: null, refused: null };
}
